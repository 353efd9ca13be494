"""Extreme values: each expected result is the formula itself, in the tensors' precision.

The oracle evaluates the ONNX formula in the tensors' dtype with XLA's
flush-to-zero arithmetic (subnormal inputs read as 0, subnormal results written
as 0), so float32 overflow (1e30 ** 2 = inf), NaN and Inf propagation and 0/0
come out as the formula says. Non-finite outputs must match in kind; finite ones
to within rounding. A second test pins down, per optimizer, which outputs a NaN
or an Inf gradient turns into NaN (as docs/reliability.md's "Exactness" lists).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.support.optimizers import INT32_MAX, NAMES, OPTIMIZERS

DEFAULT_ATTRIBUTES: dict[str, dict[str, Any]] = {
    "adagrad": {"decay_factor": 0.1, "epsilon": 1e-6, "norm_coefficient": 0.0},
    "adam": {
        "alpha": 0.9,
        "beta": 0.999,
        "epsilon": 1e-6,
        "norm_coefficient": 0.0,
        "norm_coefficient_post": 0.0,
    },
    "momentum": {"alpha": 0.9, "beta": 0.5, "norm_coefficient": 0.0},
    "nesterov": {"alpha": 0.9, "beta": 0.5, "norm_coefficient": 0.0},
}
SUBNORMAL = {"float32": 1e-40, "float64": 1e-310}
GRADIENTS = {
    "zero": lambda dtype: 0.0,
    "1e-30": lambda dtype: 1e-30,
    "1e30": lambda dtype: 1e30,
    "subnormal": lambda dtype: SUBNORMAL[dtype],
    "+inf": lambda dtype: np.inf,
    "-inf": lambda dtype: -np.inf,
    "nan": lambda dtype: np.nan,
}


def _expect_like_formula(ours: Any, expected: np.ndarray, dtype: str) -> None:
    ours = np.asarray(ours, np.float64)
    expected = np.asarray(expected, np.float64)
    assert np.array_equal(np.isnan(ours), np.isnan(expected)), (ours, expected)
    inf = np.isinf(expected)
    assert np.array_equal(ours[inf], expected[inf]), (ours, expected)
    finite = np.isfinite(expected)
    assert np.all(np.isfinite(ours[finite])), (ours, expected)
    eps = float(np.finfo(dtype).eps)
    np.testing.assert_allclose(
        ours[finite], expected[finite], rtol=64 * eps, atol=np.finfo(dtype).tiny
    )


def _run_case(
    name: str, dtype: str, R: float, T: int, tensors: list[np.ndarray], attributes: dict[str, Any]
) -> None:
    optimizer = OPTIMIZERS[name]
    with jax.enable_x64(dtype == "float64"):
        outputs = optimizer.op(np.asarray(R, dtype), T, *tensors, **attributes)
    with np.errstate(all="ignore"):
        expected = optimizer.oracle(
            R, T, *tensors, **attributes, dtype=np.dtype(dtype).type, flush_subnormals=True
        )
    for ours, exp in zip(outputs, expected, strict=True):
        _expect_like_formula(ours, exp, dtype)


def _inputs(name: str, dtype: str, gradient: float) -> list[np.ndarray]:
    x = np.array([1.0, -2.0, 0.0, 3.0], dtype)
    g = np.full(4, gradient, dtype) * np.array([1.0, -1.0, 1.0, 1.0], dtype)
    states = [np.array([0.0, 0.5, 0.0, 2.0], dtype) for _ in OPTIMIZERS[name].state_names]
    return [x, g, *states]


@pytest.mark.parametrize("T", [0, 1, 7])
@pytest.mark.parametrize("gradient", list(GRADIENTS))
@pytest.mark.parametrize("name", NAMES)
def test_extreme_gradients(name: str, gradient: str, T: int, dtype: str) -> None:
    value = GRADIENTS[gradient](dtype)
    _run_case(name, dtype, 0.1, T, _inputs(name, dtype, value), DEFAULT_ATTRIBUTES[name])


@pytest.mark.parametrize("name", NAMES)
def test_epsilon_zero_with_zero_gradient_is_zero_over_zero(name: str, dtype: str) -> None:
    """With epsilon = 0, a zero gradient on a zero accumulator is 0/0 = NaN, as written."""
    attributes = dict(DEFAULT_ATTRIBUTES[name])
    if "epsilon" in attributes:
        attributes["epsilon"] = 0.0
    _run_case(name, dtype, 0.1, 1, _inputs(name, dtype, 0.0), attributes)


@pytest.mark.parametrize("coefficients", [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)])
@pytest.mark.parametrize("T", [0, 1, 5])
@pytest.mark.parametrize("name", ["adam", "momentum", "nesterov"])
def test_alpha_and_beta_at_zero_and_one(
    name: str, coefficients: tuple[float, float], T: int, dtype: str
) -> None:
    """Adam at alpha = 1 and T > 0 divides by 1 - 1**T = +0: an infinite step, as written."""
    attributes = {**DEFAULT_ATTRIBUTES[name], "alpha": coefficients[0], "beta": coefficients[1]}
    _run_case(name, dtype, 0.1, T, _inputs(name, dtype, 0.5), attributes)


@pytest.mark.parametrize("name", NAMES)
def test_learning_rate_zero_leaves_x_unchanged(name: str, dtype: str) -> None:
    inputs = _inputs(name, dtype, 0.5)
    _run_case(name, dtype, 0.0, 3, inputs, DEFAULT_ATTRIBUTES[name])
    with jax.enable_x64(dtype == "float64"):
        outputs = OPTIMIZERS[name].op(
            np.asarray(0.0, dtype), 3, *inputs, **DEFAULT_ATTRIBUTES[name]
        )
    np.testing.assert_array_equal(np.asarray(outputs[0]), inputs[0])


@pytest.mark.parametrize("name", NAMES)
def test_count_at_the_int32_limit(name: str) -> None:
    """The count saturates at 2**31 - 1 and every factor of the formula stays finite."""
    optimizer = OPTIMIZERS[name]
    attributes = DEFAULT_ATTRIBUTES[name]
    tx = optimizer.transform(0.1, attributes, initial_count=INT32_MAX)
    x, g, *_ = _inputs(name, "float32", 0.5)
    params = jnp.asarray(x)
    state = tx.init(params)
    states = [np.zeros(4, np.float32) for _ in optimizer.state_names]
    for _ in range(3):
        updates, state = jax.jit(tx.update)(jnp.asarray(g), state, params)
        assert int(state.count) == INT32_MAX
        assert np.all(np.isfinite(np.asarray(updates)))
        expected = optimizer.oracle(0.1, INT32_MAX, np.asarray(params), g, *states, **attributes)
        params = optax.apply_updates(params, updates)
        # Three float32 steps from X ~ 1: within 1e-5 of the float64 formula.
        np.testing.assert_allclose(np.asarray(params), expected[0], rtol=1e-5, atol=1e-5)
        states = list(expected[1:])
    # The op with T beyond int32 (64-bit JAX): the bias factors are still finite.
    with jax.enable_x64(True):
        outputs = optimizer.op(
            np.float64(0.1),
            2**62,
            x.astype(np.float64),
            g.astype(np.float64),
            *(s.astype(np.float64) for s in states),
            **attributes,
        )
        assert all(np.all(np.isfinite(np.asarray(o))) for o in outputs)


# Which outputs become NaN or infinite for a NaN or an Inf gradient (every other
# input finite, epsilon > 0, T > 0): the formula propagates them this way.
PROPAGATION = {
    # name: {gradient: (X_new, *state_new) kinds}
    "adagrad": {"nan": ("nan", "nan"), "+inf": ("nan", "inf")},
    "adam": {"nan": ("nan", "nan", "nan"), "+inf": ("nan", "inf", "inf")},
    "momentum": {"nan": ("nan", "nan"), "+inf": ("inf", "inf")},
    "nesterov": {"nan": ("nan", "nan"), "+inf": ("inf", "inf")},
}


def _kind(value: float) -> str:
    return "nan" if np.isnan(value) else "inf" if np.isinf(value) else "finite"


@pytest.mark.parametrize("gradient", ["nan", "+inf"])
@pytest.mark.parametrize("name", NAMES)
def test_which_outputs_become_non_finite(name: str, gradient: str) -> None:
    inputs = _inputs(name, "float32", GRADIENTS[gradient]("float32"))
    outputs = OPTIMIZERS[name].op(np.float32(0.1), 3, *inputs, **DEFAULT_ATTRIBUTES[name])
    first = tuple(_kind(float(np.asarray(o)[0])) for o in outputs)
    assert first == PROPAGATION[name][gradient]


@pytest.mark.parametrize("name", NAMES)
def test_subnormal_gradient_acts_as_zero(name: str, dtype: str) -> None:
    """XLA reads subnormal numbers as zero: a subnormal gradient is a zero gradient."""
    optimizer = OPTIMIZERS[name]
    with jax.enable_x64(dtype == "float64"):
        tiny = optimizer.op(
            np.asarray(0.1, dtype),
            3,
            *_inputs(name, dtype, SUBNORMAL[dtype]),
            **DEFAULT_ATTRIBUTES[name],
        )
        zero = optimizer.op(
            np.asarray(0.1, dtype), 3, *_inputs(name, dtype, 0.0), **DEFAULT_ATTRIBUTES[name]
        )
    for a, b in zip(tiny, zero, strict=True):
        np.testing.assert_array_equal(np.abs(np.asarray(a)), np.abs(np.asarray(b)))
