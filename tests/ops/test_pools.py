"""MaxPool's values and gradient as one reduce_window per spatial axis (issue 21).

``pools.max_pool`` computes the windows' maxima axis by axis (``_separable_max``).
Expected values here are JAX's single ``lax.reduce_window`` over the whole window,
written out in the test with the pads computed from the ONNX spec, and its gradient:
ties go to the same element. Inputs are small integers as floats, so windows tie
often (as after a Relu).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from onnx_optax._src.ops import pools
from onnx_optax._src.ops.registry import Node

# name -> (X's shape, attributes, the pads a whole-window reduce_window takes: ceil_mode's
# extra end pad included)
POOLS: dict[str, tuple[tuple[int, ...], dict[str, Any], list[tuple[int, int]]]] = {
    "3x3 stride 2 (SqueezeNet)": ((2, 3, 11, 11), dict(kernel_shape=[3, 3], strides=[2, 2]), []),
    "3x3 stride 2 pads 1 (ResNet)": (
        (1, 2, 9, 8),
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        [(1, 1), (1, 1)],
    ),
    "2x2 stride 2 ceil_mode (MTCNN)": (
        (1, 3, 7, 9),
        dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
        [(0, 1), (0, 1)],
    ),
    "3x2 dilation 2x1, asymmetric pads": (
        (2, 2, 10, 7),
        dict(kernel_shape=[3, 2], dilations=[2, 1], pads=[2, 0, 1, 1]),
        [(2, 1), (0, 1)],
    ),
    "1-D": ((2, 3, 13), dict(kernel_shape=[4], strides=[3], pads=[1, 2]), [(1, 2)]),
    "3-D": ((1, 2, 5, 6, 5), dict(kernel_shape=[2, 3, 2], strides=[1, 2, 2]), []),
    "a 1x1 window": ((1, 2, 4, 4), dict(kernel_shape=[1, 1]), []),
}


def _node(attrs: dict[str, Any]) -> Node:
    full = dict(
        auto_pad="NOTSET", ceil_mode=0, dilations=None, pads=None, storage_order=0, strides=None
    )
    return Node({**full, **attrs}, 22, "node 'p' (ai.onnx.MaxPool)", 1)


def _whole_window(x: Any, attrs: dict[str, Any], pads: list[tuple[int, int]]) -> Any:
    n = x.ndim - 2
    return lax.reduce_window(
        x,
        -jnp.inf,
        lax.max,
        window_dimensions=(1, 1, *attrs["kernel_shape"]),
        window_strides=(1, 1, *attrs.get("strides", [1] * n)),
        padding=[(0, 0), (0, 0), *(pads or [(0, 0)] * n)],
        window_dilation=(1, 1, *attrs.get("dilations", [1] * n)),
    )


def _inputs(case: str) -> tuple[Any, Node, Any]:
    shape, attrs, _ = POOLS[case]
    rng = np.random.default_rng(sorted(POOLS).index(case))
    x = jnp.asarray(rng.integers(-2, 3, shape).astype(np.float64))
    return x, _node(attrs), rng


@pytest.mark.parametrize("case", POOLS)
def test_max_pool_equals_one_reduce_window(case: str) -> None:
    _, attrs, pads = POOLS[case]
    with jax.enable_x64(True):
        x, node, _ = _inputs(case)
        x = x.at[(0,) * x.ndim].set(jnp.nan)  # a NaN wins its windows, as in one reduce_window
        got = jax.jit(lambda x: pools.max_pool(node, x))(x)
        np.testing.assert_array_equal(got, _whole_window(x, attrs, pads))


# JAX has no gradient for a pool with dilated windows, whole or axis by axis
@pytest.mark.parametrize("case", [c for c in POOLS if "dilations" not in POOLS[c][1]])
def test_max_pool_gradient_goes_where_one_reduce_window_sends_it(case: str) -> None:
    _, attrs, pads = POOLS[case]
    with jax.enable_x64(True):
        x, node, rng = _inputs(case)
        r = jnp.asarray(rng.standard_normal(_whole_window(x, attrs, pads).shape))
        grad = jax.jit(jax.grad(lambda x: jnp.sum(pools.max_pool(node, x) * r)))(x)
        expected = jax.grad(lambda x: jnp.sum(_whole_window(x, attrs, pads) * r))(x)
        np.testing.assert_array_equal(grad, expected)


def test_max_pool_runs_one_reduce_window_per_pooled_axis() -> None:
    shape, attrs, _ = POOLS["3x3 stride 2 (SqueezeNet)"]
    node = _node(attrs)
    jaxpr = jax.make_jaxpr(lambda x: pools.max_pool(node, x))(jnp.ones(shape, jnp.float32))
    windows = [
        e.params["window_dimensions"] for e in jaxpr.eqns if "reduce_window" in str(e.primitive)
    ]
    assert windows == [(1, 1, 1, 3), (1, 1, 3, 1)]  # the last axis first


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [2, 3], "strides": [2, 1], "ceil_mode": 1},
        {"kernel_shape": [3, 2], "dilations": [2, 1], "pads": [0, 1, 2, 0]},
        {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    ],
)
def test_a_channels_last_max_pool_is_max_pools_values_and_gradient(attrs: dict[str, Any]) -> None:
    """``max_pool_channels_last`` (running maxima of slices) against ``max_pool``
    (reduce_window) in float64: the same values, the gradient to the same elements (ties
    included: a ReLU's zeros), a NaN kept."""
    node = _node(attrs)
    rng = np.random.default_rng(len(str(attrs)))
    with jax.enable_x64(True):
        x = np.maximum(rng.normal(size=(2, 3, 9, 8)), 0.0)  # ties at 0
        x[0, 1, 4, 4] = np.nan
        nchw = lambda x: pools.max_pool(node, x)  # noqa: E731

        def nhwc(x: Any) -> Any:
            return jnp.moveaxis(pools.max_pool_channels_last(node, jnp.moveaxis(x, 1, -1)), -1, 1)

        np.testing.assert_array_equal(nhwc(jnp.asarray(x)), nchw(jnp.asarray(x)))
        finite = jnp.asarray(np.nan_to_num(x))
        r = jnp.asarray(rng.normal(size=nchw(finite).shape))
        ours = jax.grad(lambda x: jnp.sum(nhwc(x) * r))(finite)
        if "dilations" in attrs:  # JAX has no VJP of a dilated reduce_window max
            np.testing.assert_allclose(jnp.sum(ours), jnp.sum(r))  # each window's to one
            return
        theirs = jax.grad(lambda x: jnp.sum(nchw(x) * r))(finite)
        np.testing.assert_array_equal(ours, theirs)
