"""Bad input fails at trace time with a clear TypeError/ValueError naming the argument.

The catalogue below is one row per bad input: a label, the call, the exception
type and a pattern the message must contain. Every row runs eagerly; rows whose
inputs are arrays also run under ``jax.jit``, where the same Python error must
come out of tracing (never an XLA error, never a silently wrong number).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import onnx_optax
from onnx_optax import ops

f32 = np.float32
X = np.ones((3,), f32)
X2 = np.ones((2, 2), f32)
R = f32(0.1)
MOMENTUM = {"alpha": 0.9, "beta": 1.0, "norm_coefficient": 0.0, "mode": "standard"}


def _raises(fn: Callable[[], Any], error: type[Exception], pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        fn()


# (label, call, exception, pattern, also under jit)
OP_CASES: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    ("adagrad: no tensors", lambda: ops.adagrad(R, 0), TypeError, r"3\*n tensors.*got 0"),
    ("adagrad: 4 tensors", lambda: ops.adagrad(R, 0, X, X, X, X), TypeError, r"got 4"),
    ("adam: 5 tensors", lambda: ops.adam(R, 0, X, X, X, X, X), TypeError, r"4\*n tensors.*got 5"),
    ("momentum: 2 tensors", lambda: ops.momentum(R, 0, X, X, **MOMENTUM), TypeError, r"got 2"),
    ("G shape differs", lambda: ops.adagrad(R, 0, X, X2, X), ValueError, r"input G has shape"),
    (
        "H_2 shape differs",
        lambda: ops.adam(R, 0, X, X2, X, X2, X, X2, X, X),
        ValueError,
        r"input H_2 has shape \(3,\) but X_2 has shape \(2, 2\)",
    ),
    (
        "integer X",
        lambda: ops.adagrad(R, 0, np.ones(3, np.int32), X, X),
        TypeError,
        r"input X has dtype int32.*floating point",
    ),
    (
        "bool G",
        lambda: ops.adagrad(R, 0, X, np.ones(3, bool), X),
        TypeError,
        r"input G has dtype bool",
    ),
    (
        "complex V",
        lambda: ops.momentum(R, 0, X, X, X.astype(np.complex64), **MOMENTUM),
        TypeError,
        r"input V has dtype complex64",
    ),
    (
        "mixed float dtypes",
        lambda: ops.adagrad(R, 0, X, X.astype(np.float16), X),
        TypeError,
        r"input G has dtype float16 but X has float32",
    ),
    ("string tensor", lambda: ops.adagrad(R, 0, "x", X, X), TypeError, r"input X must be a tensor"),
    ("None tensor", lambda: ops.adagrad(R, 0, X, None, X), TypeError, r"input G must be a tensor"),
    (
        "R not scalar",
        lambda: ops.adagrad(np.ones(1, f32), 0, X, X, X),
        ValueError,
        r"R must be a scalar",
    ),
    (
        "R integer array",
        lambda: ops.adagrad(np.int32(1), 0, X, X, X),
        TypeError,
        r"R must be a floating",
    ),
    ("R bool", lambda: ops.adagrad(True, 0, X, X, X), TypeError, r"R must be a floating"),
    ("R string", lambda: ops.adagrad("0.1", 0, X, X, X), TypeError, r"input R must be a tensor"),
    (
        "T not scalar",
        lambda: ops.adagrad(R, np.zeros(2, np.int64), X, X, X),
        ValueError,
        r"T must be a scalar",
    ),
    ("T float", lambda: ops.adagrad(R, 1.0, X, X, X), TypeError, r"T must be an integer"),
    ("T float array", lambda: ops.adagrad(R, f32(1), X, X, X), TypeError, r"T must be an integer"),
    ("T bool", lambda: ops.adagrad(R, True, X, X, X), TypeError, r"T must be an integer"),
    (
        "T negative",
        lambda: ops.adam(R, -1, X, X, X, X),
        ValueError,
        r"T is an update count and must be >= 0",
    ),
    (
        "T too large for int32",
        lambda: ops.adam(R, 2**31, X, X, X, X),
        ValueError,
        r"enable 64-bit JAX",
    ),
    (
        "unknown mode",
        lambda: ops.momentum(R, 0, X, X, X, **{**MOMENTUM, "mode": "nestrov"}),
        ValueError,
        r"mode must be 'standard' or 'nesterov', got 'nestrov'",
    ),
    (
        "mode not a string",
        lambda: ops.momentum(R, 0, X, X, X, **{**MOMENTUM, "mode": 1}),
        TypeError,
        r"mode must be the string",
    ),
    (
        "negative epsilon",
        lambda: ops.adagrad(R, 0, X, X, X, epsilon=-1e-6),
        ValueError,
        r"epsilon must be >= 0",
    ),
    (
        "NaN epsilon",
        lambda: ops.adam(R, 0, X, X, X, X, epsilon=float("nan")),
        ValueError,
        r"epsilon must be finite",
    ),
    (
        "inf epsilon",
        lambda: ops.adagrad(R, 0, X, X, X, epsilon=float("inf")),
        ValueError,
        r"epsilon must be finite",
    ),
    (
        "adam alpha > 1",
        lambda: ops.adam(R, 1, X, X, X, X, alpha=1.5),
        ValueError,
        r"alpha must be <= 1",
    ),
    (
        "adam beta < 0",
        lambda: ops.adam(R, 1, X, X, X, X, beta=-0.1),
        ValueError,
        r"beta must be >= 0",
    ),
    (
        "negative decay",
        lambda: ops.adagrad(R, 1, X, X, X, decay_factor=-0.1),
        ValueError,
        r"decay_factor must be >= 0",
    ),
    (
        "attribute string",
        lambda: ops.adagrad(R, 0, X, X, X, epsilon="1e-6"),
        TypeError,
        r"attribute epsilon must be a real number",
    ),
    (
        "attribute bool",
        lambda: ops.adam(R, 0, X, X, X, X, alpha=True),
        TypeError,
        r"attribute alpha must be a real number",
    ),
    (
        "unknown attribute",
        lambda: ops.adagrad(R, 0, X, X, X, learning_rate=0.1),
        TypeError,
        r"unexpected keyword argument 'learning_rate'",
    ),
    (
        "missing required momentum attribute",
        lambda: ops.momentum(R, 0, X, X, X, alpha=0.9, beta=1.0, mode="standard"),
        TypeError,
        r"missing 1 required keyword-only argument: 'norm_coefficient'",
    ),
]


@pytest.mark.parametrize(
    ("label", "call", "error", "pattern"), OP_CASES, ids=[c[0] for c in OP_CASES]
)
def test_op_bad_input(
    label: str, call: Callable[[], Any], error: type[Exception], pattern: str
) -> None:
    _raises(call, error, pattern)


def test_op_errors_under_jit() -> None:
    """The checks run on abstract values too: the same errors come out of tracing."""
    _raises(
        lambda: jax.jit(lambda x, g: ops.adagrad(R, 0, x, g, x))(X, X2),
        ValueError,
        r"input G has shape",
    )
    _raises(
        lambda: jax.jit(lambda t: ops.adagrad(R, t, X, X, X))(1.0),
        TypeError,
        r"T must be an integer",
    )
    _raises(
        lambda: jax.jit(lambda r: ops.adagrad(r, 0, X, X, X))(np.ones(2, f32)),
        ValueError,
        r"R must be a scalar",
    )
    _raises(
        lambda: jax.jit(lambda e: ops.adagrad(R, 0, X, X, X, epsilon=e))(1e-6),
        TypeError,
        r"attribute epsilon must be a constant",
    )


def test_op_accepts_traced_R_and_T() -> None:
    out = jax.jit(lambda r, t: ops.adam(r, t, X, X, X, X))(R, 3)
    assert out[0].shape == (3,)


def test_large_T_works_with_x64() -> None:
    with jax.enable_x64(True):
        x_new, _, _ = ops.adam(R, 2**40, X, X, X, X)
        assert np.all(np.isfinite(np.asarray(x_new)))


PARAMS = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
GRADS = jax.tree.map(jnp.ones_like, PARAMS)
FACTORIES: dict[str, Callable[..., Any]] = {
    "adagrad": onnx_optax.adagrad,
    "adam": onnx_optax.adam,
    "momentum": lambda lr, **kw: onnx_optax.momentum(
        lr, **{"alpha": 0.9, "beta": 1.0, "norm_coefficient": 0.0, **kw}
    ),
    "nesterov": lambda lr, **kw: onnx_optax.nesterov(
        lr, **{"alpha": 0.9, "beta": 1.0, "norm_coefficient": 0.0, **kw}
    ),
}

TRANSFORM_CASES: list[tuple[str, Callable[[Callable[..., Any]], Any], type[Exception], str]] = [
    (
        "params missing when norm_coefficient reads X",
        lambda make: make(0.1, norm_coefficient=0.01).update(
            GRADS, make(0.1, norm_coefficient=0.01).init(PARAMS)
        ),
        ValueError,
        r"norm_coefficient.*needs the parameters",
    ),
    (
        "updates and state trees differ",
        lambda make: make(0.1).update({"w": GRADS["w"]}, make(0.1).init(PARAMS)),
        ValueError,
        r"updates \(gradients\) and state\.\w+ have different tree structures",
    ),
    (
        "params tree differs",
        lambda make: make(0.1, norm_coefficient=0.1).update(
            GRADS, make(0.1).init(PARAMS), {"w": PARAMS["w"]}
        ),
        ValueError,
        r"updates \(gradients\) and params have different tree structures",
    ),
    (
        "update leaf shape differs from state",
        lambda make: make(0.1).update({**GRADS, "b": jnp.zeros(4)}, make(0.1).init(PARAMS)),
        ValueError,
        r"updates\['b'\] has shape \(4,\) but state\.\w+\['b'\] has shape \(3,\)",
    ),
    (
        "integer params at init",
        lambda make: make(0.1).init({"w": jnp.ones(3, jnp.int32)}),
        TypeError,
        r"params\['w'\] has dtype int32",
    ),
    (
        "integer gradient",
        lambda make: make(0.1).update(
            {**GRADS, "b": jnp.zeros(3, jnp.int32)}, make(0.1).init(PARAMS)
        ),
        TypeError,
        r"updates\['b'\] must be a floating-point array",
    ),
    (
        "state of another optimizer",
        lambda make: make(0.1).update(GRADS, optax.sgd(0.1).init(PARAMS)),
        TypeError,
        r"state must be a",
    ),
    (
        "learning rate not scalar",
        lambda make: make(jnp.ones(2)),
        ValueError,
        r"learning_rate must be a scalar",
    ),
    (
        "learning rate string",
        lambda make: make("0.1"),
        TypeError,
        r"learning_rate must be a real number",
    ),
    (
        "negative initial_count",
        lambda make: make(0.1, initial_count=-1),
        ValueError,
        r"initial_count must be in",
    ),
    (
        "float initial_count",
        lambda make: make(0.1, initial_count=1.0),
        TypeError,
        r"initial_count must be an integer",
    ),
    (
        "initial_count over int32",
        lambda make: make(0.1, initial_count=2**31),
        ValueError,
        r"initial_count must be in",
    ),
    (
        "integer accumulator dtype",
        lambda make: make(0.1, accumulator_dtype=jnp.int32),
        TypeError,
        r"accumulator_dtype must be a floating dtype",
    ),
    (
        "unknown accumulator dtype",
        lambda make: make(0.1, accumulator_dtype="float33"),
        TypeError,
        r"accumulator_dtype must be a floating dtype",
    ),
    (
        "schedule returns a vector",
        lambda make: make(lambda count: jnp.ones(2)).update(GRADS, make(0.1).init(PARAMS)),
        ValueError,
        r"schedule returned shape \(2,\)",
    ),
    (
        "unknown hyperparameter",
        lambda make: make(0.1, learning_rate_decay=0.1),
        TypeError,
        r"unexpected keyword argument",
    ),
]


@pytest.mark.parametrize("optimizer", list(FACTORIES))
@pytest.mark.parametrize(
    ("label", "call", "error", "pattern"), TRANSFORM_CASES, ids=[c[0] for c in TRANSFORM_CASES]
)
def test_transform_bad_input(
    optimizer: str, label: str, call: Callable[..., Any], error: type[Exception], pattern: str
) -> None:
    _raises(lambda: call(FACTORIES[optimizer]), error, pattern)


HYPERPARAMETER_CASES = [
    (
        onnx_optax.adagrad,
        {"epsilon": -1.0},
        ValueError,
        r"onnx_optax.adagrad: epsilon must be >= 0",
    ),
    (onnx_optax.adagrad, {"decay_factor": -0.5}, ValueError, r"decay_factor must be >= 0"),
    (
        onnx_optax.adagrad,
        {"initial_accumulator_value": float("nan")},
        ValueError,
        r"initial_accumulator_value must be finite",
    ),
    (
        onnx_optax.adam,
        {"epsilon": float("inf")},
        ValueError,
        r"onnx_optax.adam: epsilon must be finite",
    ),
    (onnx_optax.adam, {"alpha": 1.01}, ValueError, r"alpha must be <= 1"),
    (onnx_optax.adam, {"beta": -0.01}, ValueError, r"beta must be >= 0"),
    (
        onnx_optax.adam,
        {"norm_coefficient_post": "0.1"},
        TypeError,
        r"norm_coefficient_post must be a real number",
    ),
    (
        onnx_optax.momentum,
        {"alpha": float("nan"), "beta": 1.0, "norm_coefficient": 0.0},
        ValueError,
        r"onnx_optax.momentum: alpha must be finite",
    ),
    (
        onnx_optax.nesterov,
        {"alpha": 0.9, "beta": jnp.ones(2), "norm_coefficient": 0.0},
        ValueError,
        r"onnx_optax.nesterov: beta must be a scalar, got shape \(2,\)",
    ),
]


@pytest.mark.parametrize(("factory", "kwargs", "error", "pattern"), HYPERPARAMETER_CASES)
def test_hyperparameter_out_of_range(
    factory: Callable[..., Any], kwargs: dict[str, Any], error: type[Exception], pattern: str
) -> None:
    _raises(lambda: factory(0.1, **kwargs), error, pattern)


def test_transform_errors_under_jit() -> None:
    tx = onnx_optax.adam(0.1, norm_coefficient=0.01)
    state = tx.init(PARAMS)
    _raises(lambda: jax.jit(tx.update)(GRADS, state), ValueError, r"needs the parameters")


def test_momentum_mode_errors() -> None:
    _raises(
        lambda: onnx_optax.momentum(
            0.1, alpha=0.9, beta=1.0, norm_coefficient=0.0, mode="Nesterov"
        ),
        ValueError,
        r"mode must be 'standard' or 'nesterov', got 'Nesterov'",
    )
    _raises(
        lambda: onnx_optax.momentum(0.1, alpha=0.9, beta=1.0, norm_coefficient=0.0, mode=None),
        TypeError,
        r"mode must be the string",
    )
    _raises(lambda: onnx_optax.momentum(0.1, alpha=0.9, beta=1.0), TypeError, r"norm_coefficient")


def test_traced_norm_coefficient_needs_params() -> None:
    """Under inject_hyperparams the coefficient is data: params are required."""
    tx = optax.inject_hyperparams(onnx_optax.adagrad)(learning_rate=0.1)
    state = tx.init(PARAMS)
    _raises(lambda: jax.jit(tx.update)(GRADS, state), ValueError, r"needs the parameters")
    updates, _ = jax.jit(tx.update)(GRADS, state, PARAMS)
    assert jax.tree.structure(updates) == jax.tree.structure(PARAMS)
