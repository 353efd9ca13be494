"""``onnx-optax demo``: train a small model with each ONNX optimizer."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import onnx_optax


def _optimizers() -> dict[str, optax.GradientTransformation]:
    return {
        "onnx adagrad": onnx_optax.adagrad(0.1),
        "onnx adam": onnx_optax.adam(0.01),
        "onnx momentum": onnx_optax.momentum(0.05, alpha=0.9, beta=1.0, norm_coefficient=0.0),
        "onnx nesterov": onnx_optax.nesterov(0.05, alpha=0.9, beta=1.0, norm_coefficient=0.0),
    }


def run_demo(epochs: int, seed: int, output: str | None) -> int:
    """Logistic regression on a synthetic two-class problem, one run per optimizer."""
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((512, 8)).astype(np.float32)
    labels = (features @ rng.standard_normal(8) > 0).astype(np.float32)

    def loss_fn(params: dict[str, jax.Array]) -> jax.Array:
        logits = features @ params["w"] + params["b"]
        return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, labels))

    print(f"{'optimizer':<16}{'first loss':>12}{'final loss':>12}{'ms/step':>10}")
    for name, tx in _optimizers().items():
        params = {"w": jnp.zeros(8), "b": jnp.zeros(())}
        state = tx.init(params)

        @jax.jit
        def step(params: dict[str, jax.Array], state: optax.OptState, tx=tx) -> tuple:  # type: ignore[no-untyped-def]
            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state, loss

        losses = []
        params, state, loss = step(params, state)  # compile
        start = time.perf_counter()
        for _ in range(epochs):
            params, state, loss = step(params, state)
            losses.append(float(loss))
        per_step = (time.perf_counter() - start) / max(epochs, 1) * 1e3
        print(f"{name:<16}{losses[0]:>12.4f}{losses[-1]:>12.4f}{per_step:>10.3f}")
    del output
    return 0
