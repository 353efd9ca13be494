"""Convolutions of values held channels-last (N, ..., C), as the channels-last graph pass
(``graph/passes/channels_last.py``) holds them: which convs have such a lowering, the
CPU's lowerings (a depthwise conv as tap sums with their derivatives written out, a 1x1
conv as one product over C) and XLA's own elsewhere.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import linear_call

from onnx_optax._src.ops.convolution import (
    PATCHES_ELEMENTS,
    Geometry,
    by_platform,
    conv_geometry,
    in_float32,
    nhwc_native_conv,
    nhwc_patches,
    output_sizes,
    padded_windows,
)
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.windows import window_spans

# The channels-last pass (graph/passes/channels_last.py) keeps whole regions of a network
# (N, ..., C): a conv there reads X and writes Y channels-last, with no transpose around
# it. On CPU a depthwise conv is then a sum of the taps' slices times a weight per
# channel, each a contiguous row of C; a 1x1 conv one product over C; a small k x k conv
# one product of the stacked taps; the rest XLA's own conv, channels-last. Elsewhere
# (GPU) XLA's own conv, channels-last.


def lowers_channels_last(x: Any, w: Any, group: int) -> bool:
    """Whether a conv of X (N, C, ...; shape and dtype) by W has a channels-last lowering:
    floats, 1 to 3 spatial axes, nothing empty, and one group or one input channel a
    group (depthwise)."""
    shape = tuple(x.shape)
    if not jnp.issubdtype(x.dtype, jnp.floating) or not 3 <= len(shape) <= 5:
        return False
    if 0 in shape or 0 in np.shape(w) or np.ndim(w) != len(shape):
        return False
    # Grouped convs of several channels a group stay channels-first: batched over the
    # groups channels-last, XLA:CPU copied X and Y to put the groups first (ShuffleNet's
    # 1x1 convs of 4 groups: 33 copies, 2.8 of its 9 ms), and a block-diagonal W made
    # it slower still (14 ms).
    return group == 1 or w.shape[1] == 1


def convolve_channels_last(node: Node, x: Any, w: Any, b: Any = None) -> Any:
    """A Conv node on X held channels-last (N, ..., C); Y channels-last (N, ..., M).

    The checks are Conv's own, on X's shape (N, C, ...); only for a conv
    :func:`lowers_channels_last` takes."""
    n, *spatial, c = x.shape
    geometry = conv_geometry(node, jax.ShapeDtypeStruct((n, c, *spatial), x.dtype), w, b)
    y = by_platform(
        x,
        w,
        cpu=lambda x, w: _cpu_channels_last(x, w, geometry),
        default=lambda x, w: nhwc_native_conv(x, w, geometry, tap_products=False),
    )
    return y if b is None else y + b


def _cpu_channels_last(x: Any, w: Any, geometry: Geometry) -> Any:
    """The CPU's channels-last lowering (see the section's comment)."""
    per_group, kernel = w.shape[1], w.shape[2:]
    if geometry.group > 1:  # one input channel a group (lowers_channels_last)
        return nhwc_depthwise(x, w, geometry)
    if math.prod(kernel) == 1:
        return nhwc_pointwise(x, w, geometry)
    positions = math.prod(output_sizes(x.shape[1:-1], kernel, geometry))
    stacked = x.shape[0] * per_group * math.prod(kernel) * positions
    if stacked <= PATCHES_ELEMENTS:
        return nhwc_patches(x, w, geometry)
    return nhwc_native_conv(x, w, geometry)


@in_float32
def nhwc_pointwise(x: Any, w: Any, geometry: Geometry) -> Any:
    """A 1x1 conv of one group on X (N, ..., C) as one product over C: the rows of the
    (strided, padded) X (positions, C) by W (M, C) transposed."""
    m = w.shape[0]
    windows, out = padded_windows(x, w.shape[2:], geometry, channels_last=True)
    rows = windows[0].reshape((-1, x.shape[-1]))
    y = lax.dot_general(rows, w.reshape((m, -1)), (((1,), (1,)), ((), ())))
    return y.reshape((x.shape[0], *out, m))


@in_float32
def nhwc_depthwise(x: Any, w: Any, geometry: Geometry) -> Any:
    """A conv of one input channel a group (depthwise; M = C x multiplier) on X
    (N, ..., C) as a sum over the taps of the tap's slice times its weights, a row of M
    broadcast over the positions: one fused loop reading X's rows as they lie. A
    multiplier above 1 repeats each channel first. Its gradient: see
    ``_depthwise_gradient``."""
    m = w.shape[0]
    if m != x.shape[-1]:
        x = jnp.repeat(x, m // x.shape[-1], axis=-1)
    return _depthwise(x, w, geometry)


def _tap_sum(x: Any, w: Any, geometry: Geometry) -> Any:
    """sum over the taps of X's slice (N, ..., C) times the tap's row of W (C, 1, ...)."""
    c = w.shape[0]
    windows, _ = padded_windows(x, w.shape[2:], geometry, channels_last=True)
    # The taps' rows of C, one after the other in one flat vector: as a (taps, C) matrix
    # XLA laid the transpose out column-major and its loop over the output read each
    # tap's weights strided, unvectorized (V3-Small's 5x5 sums over [1, 7, 7, 576]:
    # 0.5 ms); a flat vector has one layout.
    taps = lax.split(w.reshape((c, len(windows))).T.reshape(-1), [c] * len(windows))
    y = None
    for window, tap in zip(windows, taps, strict=True):
        term = window * tap.reshape((1,) * (x.ndim - 1) + (c,))
        y = term if y is None else y + term
    return y


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _depthwise(x: Any, w: Any, geometry: Geometry) -> Any:
    return _tap_sum(x, w, geometry)


@_depthwise.defjvp
def _depthwise_tangent(geometry: Geometry, primals: Any, tangents: Any) -> tuple[Any, Any]:
    """The tangent of ``_tap_sum``, linear in dX and in dW, each with its own transpose
    (``linear_call``): JAX's transpose of the slices was a pad a tap, and of the
    products a sum a tap (450 of the 1,305 kernels of PaddleOCR's classifier's training
    step). Forward mode computes the tangent as it is."""
    (x, w), (dx, dw) = primals, tangents
    x_cotangent = functools.partial(_x_cotangent, geometry, x.shape[1:-1])
    w_cotangent = functools.partial(_w_cotangent, geometry, w.shape[2:])
    in_x = linear_call(functools.partial(_x_tangent, geometry), x_cotangent, w, dx)
    in_w = linear_call(functools.partial(_w_tangent, geometry), w_cotangent, x, dw)
    return _tap_sum(x, w, geometry), in_x + in_w


def _x_tangent(geometry: Geometry, w: Any, dx: Any) -> Any:
    return _tap_sum(dx, w, geometry)


def _w_tangent(geometry: Geometry, x: Any, dw: Any) -> Any:
    return _tap_sum(x, dw, geometry)


def _x_cotangent(geometry: Geometry, sizes: Sequence[int], w: Any, dy: Any) -> Any:
    """dX of ``_tap_sum`` for dY: itself a depthwise sum, of dY dilated by the strides and
    padded by the kernel's span, by W flipped, then cropped back to X (a negative pad of
    the forward's becomes zeros)."""
    kernel, n = w.shape[2:], len(w.shape[2:])
    spans = window_spans(kernel, geometry.dilations)
    strides, padding = geometry.strides, geometry.padding
    dilated = [(p - 1) * s + 1 for p, s in zip(dy.shape[1:-1], strides, strict=True)]
    padded = [size + lo + hi for size, (lo, hi) in zip(sizes, padding, strict=True)]
    back = Geometry(
        [1] * n,
        [(span - 1, p - d) for span, p, d in zip(spans, padded, dilated, strict=True)],
        strides,
        geometry.dilations,
        geometry.group,
    )
    dx = _tap_sum(dy, jnp.flip(w, tuple(range(2, 2 + n))), back)
    crop = [(0, 0, 0), *((-lo, -hi, 0) for lo, hi in padding), (0, 0, 0)]
    return lax.pad(dx, np.zeros((), dx.dtype), crop)


def _w_cotangent(geometry: Geometry, kernel: Sequence[int], x: Any, dy: Any) -> Any:
    """dW of ``_tap_sum`` for dY: per tap, the sum over the positions of the tap's slice
    of X times dY, all taps in one reduction (``lax.reduce`` of as many operands: one
    kernel; stacked, XLA wrote each tap's products out first)."""
    windows, _ = padded_windows(x, kernel, geometry, channels_last=True)
    products = tuple(window * dy for window in windows)
    zeros = tuple(np.zeros((), dy.dtype) for _ in products)
    sums = lax.reduce(products, zeros, _added, tuple(range(dy.ndim - 1)))  # taps x (C,)
    return jnp.stack(sums, axis=1).reshape((x.shape[-1], 1, *kernel))


def _added(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(u + v for u, v in zip(a, b, strict=True))
