"""Ops and transformations against the float64 oracle, and against each other.

Random shapes (0-d, empty, 1-d, n-d), random attributes, T in {0, 1, 2, 7, 1000},
one and several tensors, float32 and float64, under jit and without.
"""

from __future__ import annotations

import itertools
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.support.optimizers import (
    NAMES,
    OPTIMIZERS,
    Optimizer,
    assert_close_to_oracle,
    keyed_rng,
    random_state_tensor,
)

SHAPES = [(), (0,), (1,), (7,), (3, 4), (2, 3, 4), (2, 0, 3)]
COUNTS = [0, 1, 2, 7, 1000]


def _problem(
    optimizer: Optimizer, dtype: str, n_tensors: int, rng: np.random.Generator
) -> dict[str, Any]:
    shapes = [SHAPES[i] for i in rng.integers(0, len(SHAPES), size=n_tensors)]
    return {
        "attributes": optimizer.draw_attributes(rng),
        "R": np.asarray(rng.uniform(0.01, 0.5), dtype=dtype),
        "xs": [rng.standard_normal(s).astype(dtype) for s in shapes],
        "gs": [rng.standard_normal(s).astype(dtype) for s in shapes],
        "states": [
            [random_state_tensor(rng, name, s, dtype) for s in shapes]
            for name in optimizer.state_names
        ],
    }


def _oracle_outputs(optimizer: Optimizer, problem: dict[str, Any], T: int) -> list[np.ndarray]:
    """The op's outputs in ONNX order, from the oracle run tensor by tensor."""
    per_tensor = [
        optimizer.oracle(
            float(problem["R"]),
            T,
            x,
            g,
            *[s[i] for s in problem["states"]],
            **problem["attributes"],
        )
        for i, (x, g) in enumerate(zip(problem["xs"], problem["gs"], strict=True))
    ]
    return [out[k] for k in range(len(per_tensor[0])) for out in per_tensor]


def _op_inputs(problem: dict[str, Any]) -> list[np.ndarray]:
    return [*problem["xs"], *problem["gs"], *(t for s in problem["states"] for t in s)]


def _scale(problem: dict[str, Any]) -> float:
    arrays = _op_inputs(problem)
    return max([1.0] + [float(np.max(np.abs(a))) for a in arrays if a.size])


@pytest.mark.parametrize("use_jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("n_tensors", [1, 3])
@pytest.mark.parametrize("T", COUNTS)
@pytest.mark.parametrize("name", NAMES)
def test_op_matches_oracle(name: str, T: int, n_tensors: int, use_jit: bool, dtype: str) -> None:
    optimizer = OPTIMIZERS[name]
    problem = _problem(optimizer, dtype, n_tensors, keyed_rng("op", name, T, n_tensors, dtype))

    def run(R: Any, T: Any, *inputs: Any) -> Any:
        return optimizer.op(R, T, *inputs, **problem["attributes"])

    fn = jax.jit(run) if use_jit else run
    outputs = fn(problem["R"], T, *_op_inputs(problem))
    expected = _oracle_outputs(optimizer, problem, T)
    assert len(outputs) == len(expected) == n_tensors * (1 + len(optimizer.state_names))
    for out, exp in zip(outputs, expected, strict=True):
        assert out.dtype == jnp.dtype(dtype)
        assert out.shape == exp.shape
        assert_close_to_oracle(out, exp, dtype, scale=_scale(problem))


def _transform_inputs(
    optimizer: Optimizer, problem: dict[str, Any], T: int
) -> tuple[optax.GradientTransformationExtraArgs, Any, Any]:
    attributes = problem["attributes"]
    tx = optimizer.transform(jnp.asarray(problem["R"]), attributes)
    state = optimizer.state(jnp.asarray(T, jnp.int32), problem["states"])
    params = problem["xs"] if optimizer.reads_params(attributes) else None
    return tx, state, params


@pytest.mark.parametrize("use_jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("n_tensors", [1, 3])
@pytest.mark.parametrize("T", COUNTS)
@pytest.mark.parametrize("name", NAMES)
def test_transform_matches_op(name: str, T: int, n_tensors: int, use_jit: bool, dtype: str) -> None:
    """apply_updates(params, updates) is the op's X_new, the new state its V/H.

    The update is computed alone (eager or jitted) and applied with
    ``optax.apply_updates`` afterwards.
    """
    optimizer = OPTIMIZERS[name]
    problem = _problem(optimizer, dtype, n_tensors, keyed_rng("tx", name, T, n_tensors, dtype))
    attributes = problem["attributes"]
    tx, state, params = _transform_inputs(optimizer, problem, T)
    update = jax.jit(tx.update) if use_jit else tx.update
    updates, new_state = update(problem["gs"], state, params)

    outputs = optimizer.op(problem["R"], T, *_op_inputs(problem), **attributes)
    x_new = optax.apply_updates(problem["xs"], updates)
    op_x, op_states = outputs[:n_tensors], outputs[n_tensors:]
    if attributes.get("norm_coefficient_post", 0.0):
        # Adam with a post decay returns X_final - X, and X + (X_final - X) may
        # round differently from X_final: 1 ulp. The last rounding is of a sum
        # with X, so an ulp is X's or X_new's. Otherwise the update is exactly
        # -step and X_new = X - step (the kernels round the step apart from the
        # subtraction, which XLA would otherwise fuse into one FMA in the op).
        for x, actual, expected in zip(problem["xs"], x_new, op_x, strict=True):
            ulp = np.spacing(np.maximum(np.abs(x), np.abs(np.asarray(expected))))
            assert np.all(np.abs(np.asarray(actual) - np.asarray(expected)) <= ulp)
    else:
        chex.assert_trees_all_equal(x_new, list(op_x))
    for k, name_ in enumerate(optimizer.state_names):
        chex.assert_trees_all_equal(
            getattr(new_state, name_), list(op_states[k * n_tensors : (k + 1) * n_tensors])
        )
    assert int(new_state.count) == T + 1
    chex.assert_trees_all_equal_dtypes(updates, problem["gs"])
    # And both match the oracle.
    expected = _oracle_outputs(optimizer, problem, T)
    for out, exp in zip(x_new, expected[:n_tensors], strict=True):
        assert_close_to_oracle(out, exp, dtype, scale=_scale(problem))


@pytest.mark.parametrize("T", [0, 7])
@pytest.mark.parametrize("name", NAMES)
def test_fused_training_step_matches_op_bit_for_bit(name: str, T: int, dtype: str) -> None:
    """update + apply_updates compiled together give exactly the op's outputs.

    This is how a training step runs (one jitted function); XLA then evaluates
    the transformation and the op with the same fused arithmetic.
    """
    optimizer = OPTIMIZERS[name]
    problem = _problem(optimizer, dtype, 3, keyed_rng("fused", name, T, dtype))
    attributes = {
        **problem["attributes"],
        **({"norm_coefficient_post": 0.0} if name == "adam" else {}),
    }
    problem["attributes"] = attributes
    tx, state, _ = _transform_inputs(optimizer, problem, T)

    @jax.jit
    def step(xs: Any, gs: Any, state: Any) -> Any:
        updates, state = tx.update(gs, state, xs)
        return optax.apply_updates(xs, updates), state

    x_new, new_state = step(problem["xs"], problem["gs"], state)
    outputs = optimizer.op(problem["R"], T, *_op_inputs(problem), **attributes)
    chex.assert_trees_all_equal(x_new, list(outputs[:3]))
    for k, name_ in enumerate(optimizer.state_names):
        chex.assert_trees_all_equal(
            getattr(new_state, name_), list(outputs[3 * (k + 1) : 3 * (k + 2)])
        )


def _run_oracle_steps(
    optimizer: Optimizer,
    attributes: dict[str, Any],
    learning_rate: Any,
    params: list[np.ndarray],
    grads: list[list[np.ndarray]],
    initial_count: int,
) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    xs = [p.astype(np.float64) for p in params]
    states = [[np.zeros_like(x) for x in xs] for _ in optimizer.state_names]
    for step, gs in enumerate(grads):
        T = initial_count + step
        R = learning_rate(T) if callable(learning_rate) else learning_rate
        for i, g in enumerate(gs):
            out = optimizer.oracle(float(R), T, xs[i], g, *[s[i] for s in states], **attributes)
            xs[i] = out[0]
            for k, s in enumerate(states):
                s[i] = out[1 + k]
    return xs, states


@pytest.mark.parametrize("schedule", [False, True], ids=["constant", "schedule"])
@pytest.mark.parametrize("name", NAMES)
def test_many_steps_match_oracle(name: str, schedule: bool, dtype: str) -> None:
    """60 updates in a row stay within tolerance of the oracle run."""
    optimizer = OPTIMIZERS[name]
    rng = keyed_rng("steps", name, schedule, dtype)
    steps = 60
    attributes = optimizer.draw_attributes(rng)
    shapes = [(5,), (2, 3), ()]
    params = [rng.standard_normal(s).astype(dtype) for s in shapes]
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(steps)]

    if schedule:

        def learning_rate(count: jax.Array) -> jax.Array:
            return jnp.asarray(0.1, dtype) / (1 + count.astype(dtype) * jnp.asarray(0.05, dtype))

        def oracle_lr(count: int) -> float:
            return 0.1 / (1 + count * 0.05)

    else:
        learning_rate = oracle_lr = 0.05  # type: ignore[assignment]
    tx = optimizer.transform(learning_rate, attributes)
    state = tx.init(params)
    step = jax.jit(
        lambda p, s, g: (lambda u_s: (optax.apply_updates(p, u_s[0]), u_s[1]))(tx.update(g, s, p))
    )
    p = params
    for g in grads:
        p, state = step(p, state, g)
    expected_x, expected_states = _run_oracle_steps(
        optimizer, attributes, oracle_lr, params, grads, optimizer.default_initial_count
    )
    scale = max(
        [1.0]
        + [
            float(np.max(np.abs(a)))
            for a in [*expected_x, *itertools.chain(*expected_states)]
            if a.size
        ]
    )
    for actual, expected in zip(p, expected_x, strict=True):
        assert actual.dtype == jnp.dtype(dtype)
        assert_close_to_oracle(actual, expected, dtype, scale=scale, steps=steps)
    for k, name_ in enumerate(optimizer.state_names):
        for actual, expected in zip(getattr(state, name_), expected_states[k], strict=True):
            assert_close_to_oracle(actual, expected, dtype, scale=scale, steps=steps)
    assert int(state.count) == optimizer.default_initial_count + steps
