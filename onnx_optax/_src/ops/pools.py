"""Pools of ai.onnx: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool and MaxUnpool.

Each reads its windows as the convolutions do (``windows.pool_geometry``: kernel,
strides, dilations, pads, ceil_mode), checked in Python ints before lax is called.
A new pool goes here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src.ops.arrays import cast_to, check_at_run, check_size, check_vector
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import canonical, is_static
from onnx_optax._src.ops.windows import (
    attr_ints,
    check_pooled_input,
    empty_output,
    pool_geometry,
)


def _taps_on_x(
    x: Any,
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    padding: Sequence[Any],
    extra: Sequence[Any],
    axis: int,
    include_pad: bool,
    dtype: Any,
) -> Any:
    """How many taps of each window along one spatial axis fall on X (or, with
    ``include_pad``, on X and its pads; never on the extra end pads), as an in-graph
    1-D reduce_window over ones shaped to broadcast against the output."""
    size, (lo, hi), more = x.shape[2 + axis], padding[axis], extra[axis][1]
    length, pad = (size + lo + hi, (0, more)) if include_pad else (size, (lo, hi + more))
    taps = lax.reduce_window(
        jnp.ones((length,), dtype),
        np.asarray(0, dtype),
        lax.add,
        window_dimensions=(kernel[axis],),
        window_strides=(strides[axis],),
        padding=(pad,),
        window_dilation=(dilations[axis],),
    )
    return taps.reshape((-1,) + (1,) * (len(kernel) - 1 - axis))


def _pool_window(
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    padding: Sequence[Any],
    extra: Sequence[Any],
) -> dict[str, Any]:
    pads = [(0, 0), (0, 0)] + [(p[0], p[1] + e[1]) for p, e in zip(padding, extra, strict=True)]
    return dict(
        window_dimensions=(1, 1, *kernel),
        window_strides=(1, 1, *strides),
        padding=pads,
        window_dilation=(1, 1, *dilations),
    )


def _flat_indices(node: Node, shape: Sequence[int], column_major: bool) -> Any:
    """Each element's index in the flattened X (spatial axes column-major if asked), in-graph."""
    dtype = canonical(np.int64)
    if math.prod(shape) - 1 > np.iinfo(dtype).max:
        raise ValueError(
            f"{node.where}: X of shape {list(shape)} has more elements than int32 indices "
            "reach; enable 64-bit JAX (jax.config.update('jax_enable_x64', True))"
        )
    spatial = list(shape[2:])
    if column_major:
        steps = [math.prod(spatial[:i]) for i in range(len(spatial))]
    else:
        steps = [math.prod(spatial[i + 1 :]) for i in range(len(spatial))]
    image = math.prod(spatial)
    steps = [shape[1] * image, image, *steps]
    flat = lax.broadcasted_iota(dtype, tuple(shape), 0) * np.asarray(steps[0], dtype)
    for axis in range(1, len(shape)):
        flat = flat + lax.broadcasted_iota(dtype, tuple(shape), axis) * np.asarray(
            steps[axis], dtype
        )
    return flat


def _separable_max(x: Any, low: Any, window: dict[str, Any]) -> Any:
    """The windows' maxima (``lax.reduce_window``) as one reduce_window per spatial axis.

    A window is the product of its axes' windows, so the maximum over it is the
    maximum along each axis in turn: the same values, and the gradient goes to the same
    element. JAX's goes to a window's first maximum in row-major order; reduced along
    the last axis first, it goes to the first row holding the maximum, then to the
    first maximum in that row, the same element (the other order picks the first
    column). An element that several windows pick sums their gradients in another
    order (float rounding apart, the same), and a window holding a NaN sends its
    gradient elsewhere than one reduce_window does (neither to the NaN). XLA:CPU
    runs the passes faster than one window over several axes (light_squeezenet's
    3x3 pool on [1, 64, 111, 111]: 0.19 against 0.44 ms; MTCNN onet at batch 1, 0.84x
    the time).
    """
    rank = x.ndim
    for axis in reversed(range(2, rank)):  # the last axis first: see above

        def along(name: str, identity: Any, axis: int = axis) -> list[Any]:
            return [value if a == axis else identity for a, value in enumerate(window[name])]

        dimensions, strides = along("window_dimensions", 1), along("window_strides", 1)
        dilations, padding = along("window_dilation", 1), along("padding", (0, 0))
        if (dimensions, strides, padding) != ([1] * rank, [1] * rank, [(0, 0)] * rank):
            x = lax.reduce_window(
                x,
                low,
                lax.max,
                window_dimensions=dimensions,
                window_strides=strides,
                padding=padding,
                window_dilation=dilations,
            )
    return x


def _check_storage_order(node: Node) -> None:
    order = int(node.get("storage_order", 0))
    if order not in (0, 1):  # onnxruntime refuses any other
        raise ValueError(
            f"{node.where}: storage_order {order} must be 0 (row major) or 1 (column major)"
        )


def max_pool_channels_last(node: Node, x: Any) -> Any:
    """MaxPool of one output on float X held channels-last (N, ..., C), its output so
    too; None where :func:`max_pool` has more to do (a window that can miss X, an empty
    output).

    The windows' maxima one spatial axis at a time, the last first (as
    ``_separable_max``), each a running maximum over the window's strided slices of X
    padded with -inf: a select keeping the earlier tap on ties (its gradient goes where
    ``reduce_window``'s does) and a NaN (as ``lax.max``). Channels-last, a
    ``reduce_window`` made XLA:CPU read garbage (light_vgg19's logits NaN in 2 runs of 8).
    """
    _check_storage_order(node)
    shape = (x.shape[0], x.shape[-1], *x.shape[1:-1])
    kernel, strides, dilations, padding, extra, sizes = pool_geometry(
        node, jax.ShapeDtypeStruct(shape, x.dtype)
    )
    check_size(node, [*shape[:2], *sizes], x.dtype)
    if node.n_outputs != 1 or 0 in sizes or 0 in shape:
        return None
    if any(d > size for d, size in zip(dilations, shape[2:], strict=True)):
        return None
    low = np.asarray(-np.inf, x.dtype)
    for axis in reversed(range(len(kernel))):
        (lo, hi), more = padding[axis], extra[axis][1]
        config = [(0, 0, 0)] * x.ndim
        config[1 + axis] = (lo, hi + more, 0)
        padded = lax.pad(x, low, config)
        y = None
        for tap in range(kernel[axis]):
            start = tap * dilations[axis]
            end = start + (sizes[axis] - 1) * strides[axis] + 1
            window = lax.slice_in_dim(padded, start, end, strides[axis], axis=1 + axis)
            y = window if y is None else jnp.where((y >= window) | jnp.isnan(y), y, window)
        x = y
    return x


@register("MaxPool")
def max_pool(node: Node, x: Any) -> Any:
    _check_storage_order(node)
    kernel, strides, dilations, padding, extra, sizes = pool_geometry(node, x)
    out_shape = [*x.shape[:2], *sizes]
    check_size(node, out_shape, x.dtype)
    if node.n_outputs > 1:
        check_size(node, out_shape, np.int64, "Indices output")
    if 0 in out_shape:
        return (empty_output(out_shape, x.dtype), cast_to(np.zeros(out_shape, np.int64), np.int64))[
            : node.n_outputs
        ]
    low = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    window = _pool_window(kernel, strides, dilations, padding, extra)
    values = _separable_max(x, np.asarray(low, x.dtype), window)
    # Taps dilated past a short axis can miss X: onnxruntime gives such a window the lowest
    # finite value and index -1 (checked in-graph per axis only where that can happen)
    on_x: Any = None
    for axis, (size, d) in enumerate(zip(x.shape[2:], dilations, strict=True)):
        if d > size:
            taps = _taps_on_x(x, kernel, strides, dilations, padding, extra, axis, False, np.int32)
            on_x = taps > 0 if on_x is None else on_x & (taps > 0)
    if on_x is not None:
        lowest = np.finfo(x.dtype).min if jnp.issubdtype(x.dtype, jnp.floating) else low
        values = jnp.where(on_x, values, np.asarray(lowest, x.dtype))
    if node.n_outputs == 1:
        return values
    # Indices: each maximum's position in the flattened input (first one on ties)
    flat = _flat_indices(node, x.shape, bool(node.get("storage_order", 0)))

    def pick(a: Any, b: Any) -> Any:
        (va, ia), (vb, ib) = a, b
        take_b = (vb > va) | ((vb == va) & (ib < ia))
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    _, indices = lax.reduce_window(
        (x, flat),
        (np.asarray(low, x.dtype), np.asarray(np.iinfo(flat.dtype).max, flat.dtype)),
        pick,
        **window,
    )
    if on_x is not None:
        indices = jnp.where(on_x, indices, np.asarray(-1, indices.dtype))
    return values, cast_to(indices, np.int64)


@register("AveragePool")
def average_pool(node: Node, x: Any) -> Any:
    """The windows' sums (``lax.reduce_window`` in x's dtype) over their element counts.

    The count of a window is a product of 1-D counts, one per spatial axis, each
    a small in-graph ``reduce_window`` over ones: the input's positions, or with
    ``count_include_pad`` the padded ones (never ceil_mode's extra end). A count
    that is the same for every window is one number.
    """
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{node.where}: AveragePool needs a floating-point X, got {x.dtype}")
    include = bool(node.get("count_include_pad", 0))
    kernel, strides, dilations, padding, extra, sizes = pool_geometry(node, x)
    out_shape = [*x.shape[:2], *sizes]
    check_size(node, out_shape, x.dtype)
    if 0 in out_shape:
        return empty_output(out_shape, x.dtype)
    window = _pool_window(kernel, strides, dilations, padding, extra)
    total = lax.reduce_window(x, np.asarray(0, x.dtype), lax.add, **window)
    wide = np.dtype(np.float64 if x.dtype == np.float64 else np.float32)  # counts are exact
    count: Any = np.asarray(1, wide)
    for axis, (k, (lo, hi), (_, more)) in enumerate(zip(kernel, padding, extra, strict=True)):
        if not (more if include else lo or hi or more):
            count = count * np.asarray(k, wide)  # every window of this axis is whole
        else:
            taps = _taps_on_x(x, kernel, strides, dilations, padding, extra, axis, include, wide)
            count = count * taps
    if not is_static(count):
        # a window whose dilated taps all miss X sums to 0: onnxruntime's 0, not 0 / 0
        count = jnp.maximum(count, np.asarray(1, wide))
    return total / count.astype(x.dtype)


@register("GlobalAveragePool")
def _global_average_pool(node: Node, x: Any) -> Any:
    check_pooled_input(node, x)
    return jnp.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@register("GlobalMaxPool")
def _global_max_pool(node: Node, x: Any) -> Any:
    check_pooled_input(node, x)
    if x.shape[0] == 0:
        return empty_output([*x.shape[:2]] + [1] * (x.ndim - 2), x.dtype)
    return jnp.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@register("MaxUnpool", static=(2,))
def _max_unpool(node: Node, x: Any, indices: Any, output_shape: Any = None) -> Any:
    """MaxPool's inverse: zeros of ``(N, C, (D - 1) * stride - pad_begin - pad_end +
    kernel, ...)`` holding ``x`` at ``indices`` (flat into that whole tensor, as MaxPool's
    second output), the rest zero; an ``output_shape`` as large or larger pads it with
    zeros at the end of each axis (as onnx's node cases and reference; onnxruntime
    instead reads the indices into ``output_shape``)."""
    check_pooled_input(node, x)
    n = x.ndim - 2
    kernel = attr_ints(node, "kernel_shape", n, 1, 1)
    strides = attr_ints(node, "strides", n, 1, 1)
    pads = attr_ints(node, "pads", 2 * n, 0, 0)
    if tuple(np.shape(indices)) != tuple(x.shape):
        raise ValueError(
            f"{node.where}: indices of shape {list(np.shape(indices))} must have X's shape "
            f"{list(x.shape)}"
        )
    inferred = [*x.shape[:2]] + [
        (size - 1) * s - pads[i] - pads[n + i] + k
        for i, (size, s, k) in enumerate(zip(x.shape[2:], strides, kernel, strict=True))
    ]
    check_vector(node, output_shape, "output_shape")
    shape = inferred if output_shape is None else [int(d) for d in np.reshape(output_shape, -1)]
    if len(shape) != x.ndim or any(d < i for d, i in zip(shape, inferred, strict=True)):
        raise ValueError(
            f"{node.where}: output_shape {shape} must have X's rank and be at least {inferred} "
            "on each axis"
        )
    check_size(node, shape, x.dtype)
    total = math.prod(inferred)
    # onnxruntime takes no negative index ("Index value out of bounds")
    if not np.issubdtype(np.dtype(indices.dtype), np.integer):
        raise TypeError(f"{node.where}: indices must be integers, got {indices.dtype}")
    flat = jnp.asarray(indices).reshape(-1)
    check_at_run(
        f"{node.where}: indices hold {{}}, outside [0, {total})", (flat < 0) | (flat >= total), flat
    )
    y = jnp.zeros(total, x.dtype).at[flat].set(jnp.asarray(x).reshape(-1), mode="drop")
    y = y.reshape(inferred)
    return jnp.pad(y, [(0, d - i) for d, i in zip(shape, inferred, strict=True)])
