"""Convolutions of values held channels-last (ops/nhwc_convolution.py): the depthwise tap
sums and their written-out derivatives against XLA's grouped conv, in float64."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from onnx_optax._src.ops import convolution, nhwc_convolution

# (X channels-last, kernel, strides, dilations, pads per axis, multiplier)
DEPTHWISE = {
    "3x3": ((2, 9, 8, 3), (3, 3), (1, 1), (1, 1), [(1, 1), (1, 1)], 1),
    "3x2 stride 2x1 dilation 1x2 crop, multiplier 2": (
        (2, 11, 10, 4),
        (3, 2),
        (2, 1),
        (1, 2),
        [(0, 2), (1, -1)],
        2,
    ),
    "5x5 stride 2": ((1, 7, 6, 5), (5, 5), (2, 2), (1, 1), [(2, 2), (2, 2)], 1),
    "1-D stride 3 dilation 2": ((2, 12, 4), (3,), (3,), (2,), [(1, 0)], 1),
}


@pytest.mark.parametrize("case", DEPTHWISE)
def test_the_channels_last_depthwise_sum_and_its_derivatives_are_xlas_conv(case: str) -> None:
    """``nhwc_depthwise`` (its tangent and cotangents written out: ``_depthwise_tangent``)
    against XLA's grouped conv, in float64: the values, the gradients in X and W and the
    forward-mode tangent."""
    shape, kernel, strides, dilations, pads, multiplier = DEPTHWISE[case]
    rng = np.random.default_rng(len(case))
    with jax.enable_x64(True):
        x = jnp.asarray(rng.normal(size=shape))
        w = jnp.asarray(rng.normal(size=(shape[-1] * multiplier, 1, *kernel)))
        n = len(kernel)
        geometry = convolution.Geometry(list(strides), pads, [1] * n, list(dilations), shape[-1])

        def xla(x: Any, w: Any) -> Any:
            return jnp.moveaxis(convolution.native_conv(jnp.moveaxis(x, -1, 1), w, geometry), 1, -1)

        def ours(x: Any, w: Any) -> Any:
            return nhwc_convolution.nhwc_depthwise(x, w, geometry)

        np.testing.assert_allclose(ours(x, w), xla(x, w), rtol=1e-12, atol=1e-12)
        r = jnp.asarray(rng.normal(size=xla(x, w).shape))
        mine = jax.grad(lambda *a: jnp.sum(ours(*a) * r), (0, 1))(x, w)
        theirs = jax.grad(lambda *a: jnp.sum(xla(*a) * r), (0, 1))(x, w)
        for a, b in zip(mine, theirs, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        tangents = (jnp.asarray(rng.normal(size=x.shape)), jnp.asarray(rng.normal(size=w.shape)))
        np.testing.assert_allclose(
            jax.jvp(ours, (x, w), tangents)[1], jax.jvp(xla, (x, w), tangents)[1], rtol=1e-12
        )


def test_the_depthwise_gradient_is_a_few_kernels_not_a_pad_and_a_sum_a_tap() -> None:
    """dX one depthwise sum, dW one reduction of 9 operands: no pad a tap."""
    geometry = convolution.Geometry([1, 1], [(1, 1), (1, 1)], [1, 1], [1, 1], 16)
    x, w = jnp.ones((2, 10, 10, 16), jnp.float32), jnp.ones((16, 1, 3, 3), jnp.float32)
    grad = jax.grad(lambda x, w: jnp.sum(nhwc_convolution.nhwc_depthwise(x, w, geometry)), (0, 1))
    text = jax.jit(grad).lower(x, w).as_text()
    assert text.count("stablehlo.pad") <= 3 and text.count("stablehlo.reduce") == 1
