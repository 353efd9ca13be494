"""A training step of an attached ONNX model vs the same network and optimizer in JAX.

The networks of ``graph_step.py`` (an MLP 784-1024-1024-10, batch 256, and a
small CNN, batch 64) are written as inference ONNX models (logits out), made
trainable with ``onnx_optax.training.attach`` (softmax cross-entropy, Adam 1e-3)
and stepped by ``training.Session.step``: feed checks, one jitted XLA
computation of forward, ``Gradient``, the Adam node and T + 1 with the state
donated, and the loss brought back to the host. The reference is the same
network written in jax.numpy, ``jax.value_and_grad`` + ``onnx_optax.adam`` +
``optax.apply_updates`` in one ``jax.jit`` with params and state donated, its
loss brought back to the host too. Both take the same host (numpy) batches. A
second MLP row carries a training recipe: Adam on a warmup-cosine schedule after
global-norm clipping, written into the model by ``attach`` (R computed from T,
the gradients clipped, all as ONNX ops) against optax's ``clip_by_global_norm``
chained with the same schedule by hand.
Medians over rounds in which the versions take turns, after a warm-up. Run::

    .venv/bin/python benchmarks/training_step.py [--rounds 20] [--repeat 10]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import optax
from onnx import TensorProto, helper, numpy_helper

import onnx_optax
from onnx_optax import training

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import graph_step


def inference_model(net: dict[str, Any]) -> onnx.ModelProto:
    """The network without its loss node: an inference model whose output is the logits."""
    nodes = list(net["nodes"][:-1])
    logits = nodes[-1].output[0]
    x = net["inputs"]["X"]
    graph = helper.make_graph(
        nodes,
        "net",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", *x.shape[1:]])],
        [helper.make_tensor_value_info(logits, TensorProto.FLOAT, ["N", 10])],
        initializer=[numpy_helper.from_array(v, n) for n, v in net["params"].items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _median_times(fns: dict[str, Callable[[], Any]], rounds: int, repeat: int) -> dict[str, float]:
    for fn in fns.values():
        fn()
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            times[name].append((time.perf_counter() - start) / repeat)
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench(net: dict[str, Any], rounds: int, repeat: int, recipe: bool) -> dict[str, float]:
    """Medians of a step of both versions: Adam 1e-3, or with ``recipe`` Adam on a
    warmup-cosine schedule after global-norm clipping (in the model: ONNX ops
    computing R from T and clipping the gradients; by hand: the same schedule
    and ``optax.clip_by_global_norm`` chained before the optimizer)."""
    x = net["inputs"]["X"]
    labels = net["inputs"]["labels"]
    if recipe:
        schedule = training.schedules.warmup_cosine_decay_schedule(0.0, 1e-3, 100, 10_000)
        tx = onnx_optax.adam(schedule)
        clip: float | None = 1.0
        by_hand_tx = optax.chain(optax.clip_by_global_norm(1.0), tx)
    else:
        tx, clip = onnx_optax.adam(1e-3), None
        by_hand_tx = tx
    attached_model = training.attach(
        inference_model(net), loss="softmax_cross_entropy", optimizer=tx, clip_global_norm=clip
    )
    session = training.Session(attached_model)
    tx = by_hand_tx

    @jax.jit
    def _step(params: Any, state: Any, x: jax.Array, labels: jax.Array) -> Any:
        loss, grads = jax.value_and_grad(net["by_hand"])(params, x, labels)
        updates, state = tx.update(grads, state, params)
        return loss, optax.apply_updates(params, updates), state

    step = jax.jit(_step, donate_argnums=(0, 1))
    params = {k: jnp.asarray(v) for k, v in net["params"].items()}
    carry = [params, tx.init(params)]

    def by_hand() -> float:
        loss, carry[0], carry[1] = step(carry[0], carry[1], x, labels.astype(np.int32))
        return float(loss)

    feeds = {"X": x, "target": labels}

    def attached() -> float:
        return float(session.step(feeds)["loss"])

    # Same numbers first: the comparison is meaningless otherwise.
    check = training.Session(session.to_model())
    first = [float(check.step(feeds)["loss"]) for _ in range(3)]
    fresh = [params := {k: jnp.asarray(v) for k, v in net["params"].items()}, tx.init(params)]
    expected = []
    for _ in range(3):
        loss, fresh[0], fresh[1] = _step(fresh[0], fresh[1], x, labels.astype(np.int32))
        expected.append(float(loss))
    np.testing.assert_allclose(first, expected, rtol=1e-4)

    return _median_times({"hand": by_hand, "attached": attached}, rounds, repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    print(
        f"JAX {jax.__version__} on {jax.devices()[0].device_kind}; medians of {args.rounds} rounds"
    )
    print(
        "| network | optimizer | JAX + onnx_optax by hand | attached ONNX model, Session.step "
        "| ratio |"
    )
    print("|---|---|---|---|---|")
    mlp, cnn = graph_step.mlp(), graph_step.cnn()
    for net, recipe in ((mlp, False), (mlp, True), (cnn, False)):
        t = bench(net, args.rounds, args.repeat, recipe)
        optimizer = "Adam, warmup-cosine R, clipped to norm 1" if recipe else "Adam 1e-3"
        print(
            f"| {net['name']} | {optimizer} | {t['hand'] * 1e3:.2f} ms | "
            f"{t['attached'] * 1e3:.2f} ms | {t['attached'] / t['hand']:.2f}x |"
        )


if __name__ == "__main__":
    onnx_optax.reuse_host_memory()  # as the onnx-optax command does (docs/performance.md)
    main()
