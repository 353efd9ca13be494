"""Sampling a tensor at traced points (GridSample, DeformConv, RoiAlign): the taps of each
point along an axis with their weights, gathered for all points at once.

Each point is a few taps per spatial axis (1 nearest, 2 linear, 4 cubic): :func:`grid_taps`
gives them with their weights (reflected or clamped at the borders as the padding mode
says), :func:`sample_taps` gathers their combinations from X flattened over its spatial
axes and sums them weighted. The coordinates are traced values, so the result is
differentiable in X and, for linear and cubic, in the points.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src.ops.arrays import check_size
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import canonical

CUBIC_A = -0.75  # Keys' coefficient, as onnxruntime and PyTorch


def _reflect(x: Any, lo: float, hi: float) -> Any:
    """``x`` reflected at ``lo`` and ``hi`` until it lies between them (identity inside).

    A point ``d`` past a border lands at ``d mod (hi - lo)`` from it after an even
    number of bounces, from the other border after an odd one.
    """
    span = hi - lo
    if span <= 0:
        return jnp.full_like(x, lo)
    below = x < lo
    past = jnp.where(below, lo - x, x - hi)
    bounces = jnp.floor(jnp.maximum(past, 0) / span)
    rest = past - bounces * span
    even = bounces % 2 == 0
    from_lo, from_hi = lo + rest, hi - rest
    out = jnp.where(below == even, from_lo, from_hi)
    return jnp.where((x >= lo) & (x <= hi), x, out)


def _cubic_weights(t: Any) -> list[Any]:
    """Keys' cubic weights of the taps at -1, 0, 1, 2 for a point ``t`` in [0, 1) past tap 0.

    ``k(s) = (a+2)|s|^3 - (a+3)|s|^2 + 1`` for ``|s| <= 1``,
    ``a|s|^3 - 5a|s|^2 + 8a|s| - 4a`` for ``1 < |s| < 2``.
    """
    a = CUBIC_A

    def near(s: Any) -> Any:
        return ((a + 2) * s - (a + 3)) * s * s + 1

    def far(s: Any) -> Any:
        return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def grid_taps(x: Any, size: int, mode: str, padding: str, align: bool) -> tuple[Any, Any]:
    """Indices and weights, each ``x.shape + (taps,)``, of pixel coordinates ``x`` on an axis.

    The coordinate is first brought inside the axis' borders (``[0, size-1]`` with
    align_corners, else ``[-0.5, size-0.5]``) by the padding mode (border clamps,
    reflection reflects; nearest rounds half to even first), then each tap outside
    the axis reads 0 (zeros), the nearest pixel (border) or its reflection.
    Cubic with border clamps the taps alone, as onnxruntime and PyTorch do (onnx's
    reference clamps the coordinate too, which moves the taps' weights).
    """
    lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
    if mode == "nearest":
        x = jnp.round(x)
    outside = (x < lo) | (x > hi)
    if padding == "border" and mode != "cubic":
        x = jnp.where(outside, jnp.clip(x, 0, size - 1), x)
    elif padding == "reflection":
        x = _reflect(x, lo, hi)
    if mode == "nearest":
        index = jnp.trunc(x)[..., None]
        weights = jnp.ones_like(index)
    else:
        base = jnp.floor(x)
        t = x - base
        first = 0 if mode == "linear" else -1
        offsets = np.arange(first, 2 - first, dtype=np.dtype(x.dtype))
        index = base[..., None] + offsets
        weights = jnp.stack([1 - t, t] if mode == "linear" else _cubic_weights(t), axis=-1)
    if padding == "zeros":
        weights = jnp.where((index >= 0) & (index <= size - 1), weights, 0)
    elif padding == "reflection":
        index = jnp.trunc(_reflect(index, lo, hi))
    index = jnp.clip(index, 0, size - 1).astype(np.int32)
    return index, weights


def sample_taps(node: Node, data: Any, taps: list[tuple[Any, Any]], exact: bool) -> Any:
    """``sum over tap combinations of prod_i w_i * data[b, c, i_1, ..., i_r]``, shape (B, C, Q).

    ``data`` is ``(B, C, *S)``; ``taps`` holds, per spatial axis, indices and
    weights of shape ``(B, Q, k_i)``. ``exact``: the weights are 0 or 1 (nearest),
    so the values are picked, not multiplied (exact for any dtype).
    """
    b, c, *spatial = data.shape
    q = taps[0][0].shape[1]
    rank = len(spatial)
    strides = [math.prod(spatial[i + 1 :]) for i in range(rank)]
    flat: Any = 0
    weight: Any = 1
    for i, (index, w) in enumerate(taps):
        shape = [b, q] + [1] * rank
        shape[2 + i] = index.shape[-1]
        flat = flat + index.reshape(shape) * strides[i]
        weight = weight * w.reshape(shape)
    count = math.prod(index.shape[-1] for index, _ in taps)
    check_size(node, [b, c, q, count], data.dtype, "gathered taps")
    if math.prod([b, c, q, *spatial]) == 0:  # nothing to pick, or every tap outside X
        return jnp.zeros((b, c, q), data.dtype)
    # channels last: each tap gathers one contiguous row of C values (and its gradient
    # scatters one), not C separate elements
    rows = jnp.moveaxis(data.reshape(b, c, math.prod(spatial)), 1, 2)  # (B, S, C)
    values = jax.vmap(lambda d, i: jnp.take(d, i, axis=0, mode="clip"))(
        rows, flat.reshape(b, q * count)
    ).reshape(b, q, count, c)
    weight = weight.reshape(b, q, count, 1)
    if exact:
        picked = jnp.where(weight > 0, values, jnp.zeros((), values.dtype)).sum(axis=2)
    else:
        picked = (values * weight.astype(values.dtype)).sum(axis=2)
    return jnp.moveaxis(picked, 2, 1)


def work_dtype(*dtypes: Any) -> np.dtype:
    """float64 when an input is, else float32 (half types are computed in float32)."""
    wide = any(np.dtype(d) == np.float64 for d in dtypes)
    return canonical(np.float64 if wide else np.float32)
