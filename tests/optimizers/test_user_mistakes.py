"""Mistakes a user coming from optax or PyTorch makes, each explained in the error."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import onnx_optax


def test_optax_names_point_to_onnx_names() -> None:
    with pytest.raises(
        TypeError, match=r"onnx_optax\.adam\(\).*'b1'.*b1 is called alpha.*eps is called epsilon"
    ):
        onnx_optax.adam(0.1, b1=0.9, eps=1e-8)  # type: ignore[call-arg]


def test_momentum_without_attributes_says_what_they_are() -> None:
    with pytest.raises(
        TypeError,
        match=r"onnx_optax\.momentum\(\) missing.*optax\.sgd\(lr, momentum=m\) is alpha=m, beta=1\.0",
    ):
        onnx_optax.momentum(0.1)  # type: ignore[call-arg]


def test_op_errors_name_the_public_op() -> None:
    with pytest.raises(TypeError, match=r"^onnx_optax\.ops\.momentum\(\) missing") as info:
        onnx_optax.ops.momentum(0.1, 0, 1.0, 1.0, 1.0)  # type: ignore[call-arg]
    assert "momentum_op" not in str(info.value)


def test_negative_initial_accumulator_value_is_refused() -> None:
    with pytest.raises(ValueError, match=r"initial_accumulator_value must be >= 0\.0, got -1\.0"):
        onnx_optax.adagrad(0.1, initial_accumulator_value=-1.0)


@pytest.mark.parametrize(
    ("count", "error", "message"),
    [
        (jnp.float32(2.0), TypeError, "state.count must be an int32 scalar"),
        (jnp.zeros(2, jnp.int32), TypeError, "state.count must be an int32 scalar"),
        (jnp.int32(-3), ValueError, "state.count is -3; an update count is >= 0"),
    ],
)
def test_bad_count_is_refused(count: jax.Array, error: type, message: str) -> None:
    tx = onnx_optax.adam(0.1)
    state = tx.init(jnp.ones(2))._replace(count=count)
    with pytest.raises(error, match=message):
        tx.update(jnp.ones(2), state)


def test_tree_mismatch_says_which_side_differs() -> None:
    tx = onnx_optax.adam(0.1, norm_coefficient=0.1)
    params = {"a": jnp.ones(2), "b": jnp.ones(2)}
    state = tx.init(params)
    with pytest.raises(ValueError, match="the gradients differ from the params and the state"):
        tx.update({"a": jnp.ones(2)}, state, params)
    other = tx.init({"a": jnp.ones(2)})
    with pytest.raises(ValueError, match="the state differs from the gradients and the params"):
        tx.update(params, other, params)


def test_float64_without_x64_is_refused_without_a_warning() -> None:
    tx = onnx_optax.adam(0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match=r"params\['w'\] is float64, which needs 64-bit JAX"):
            tx.init({"w": np.ones(3)})
        state = tx.init({"w": np.ones(3, np.float32)})
        with pytest.raises(TypeError, match=r"updates\['w'\] is float64, which needs 64-bit JAX"):
            tx.update({"w": np.ones(3)}, state)


def test_count_beyond_int64_says_so() -> None:
    x = np.ones(2)
    with (
        jax.enable_x64(True),
        pytest.raises(ValueError, match="does not fit int64, the ONNX type of T"),
    ):
        onnx_optax.ops.adam(1.0, 2**63, x, x, x, x)


def test_inject_hyperparams_keeps_options_static() -> None:
    tx = optax.inject_hyperparams(onnx_optax.adam)(learning_rate=0.1)
    state = tx.init({"w": jnp.ones(2)})
    assert "initial_count" not in state.hyperparams
    assert "pack_leaves_below" not in state.hyperparams
    assert int(state.inner_state.count) == 1
