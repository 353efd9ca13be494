"""Reductions of ai.onnx: the Reduce* ops, ArgMax/ArgMin, TopK, CumSum/CumProd and Det.

The Reduce* ops read their axes from an input (newer opsets) or an attribute
(older ones).

To add a reduction: an entry in the table below, giving its function and, where
reducing an empty axis has a value, that value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src.ops.arrays import (
    axes_of,
    cast_to,
    check_size,
    check_vector,
    flag,
    norm_axes,
    norm_axis,
    xp_of,
    xp_sized,
)
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import canonical


def _reduction(
    fn: Callable[..., Any], empty: Callable[[Any], Any] | None = None
) -> Callable[..., Any]:
    def run(node: Node, x: Any, axes: Any = None) -> Any:
        check_vector(node, axes, "axes")
        picked = axes_of(node, axes)
        keepdims = bool(node.get("keepdims", 1))
        if not picked:
            if node.get("noop_with_empty_axes", 0):
                return x
            picked = list(range(np.ndim(x)))
        picked_ = norm_axes(picked, np.ndim(x), node.where)
        # an empty X reduces to an output larger than itself: sized before anything fills it
        shape = [1 if a in picked_ else d for a, d in enumerate(x.shape)]
        xp = xp_sized(node, shape if keepdims else _kept(x.shape, picked_), x.dtype, x)
        if any(x.shape[a] == 0 for a in picked_) and empty is not None:
            out = xp.full(shape, empty(x.dtype), x.dtype)
            return out if keepdims else out.reshape(_kept(x.shape, picked_))
        return fn(xp, x, picked_, keepdims)

    return run


def _kept(shape: Any, axes: Any) -> list[int]:
    return [d for a, d in enumerate(shape) if a not in axes]


def _low(dtype: Any) -> Any:
    if np.dtype(dtype) == np.bool_:
        return False
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def _high(dtype: Any) -> Any:
    if np.dtype(dtype) == np.bool_:
        return True
    return np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).max


def _logsumexp(xp: Any, x: Any, axes: Any, keepdims: bool) -> Any:
    if xp is np:
        top = np.max(x, axis=axes, keepdims=True)
        out = np.log(np.sum(np.exp(x - top), axis=axes, keepdims=True)) + top
        return out if keepdims else np.squeeze(out, axis=axes)
    return jax.nn.logsumexp(x, axis=axes, keepdims=keepdims)


for _name, _reduce, _empty in [
    ("ReduceSum", lambda xp, x, a, k: xp.sum(x, axis=a, keepdims=k), None),
    ("ReduceMean", lambda xp, x, a, k: xp.mean(x, axis=a, keepdims=k), None),
    ("ReduceMax", lambda xp, x, a, k: xp.max(x, axis=a, keepdims=k), _low),
    ("ReduceMin", lambda xp, x, a, k: xp.min(x, axis=a, keepdims=k), _high),
    ("ReduceProd", lambda xp, x, a, k: xp.prod(x, axis=a, keepdims=k), None),
    ("ReduceL1", lambda xp, x, a, k: xp.sum(xp.abs(x), axis=a, keepdims=k), None),
    (
        "ReduceL2",
        lambda xp, x, a, k: xp.sqrt(xp.sum(xp.square(x), axis=a, keepdims=k)).astype(x.dtype),
        None,
    ),
    ("ReduceSumSquare", lambda xp, x, a, k: xp.sum(xp.square(x), axis=a, keepdims=k), None),
    ("ReduceLogSum", lambda xp, x, a, k: xp.log(xp.sum(x, axis=a, keepdims=k)), lambda d: -np.inf),
    ("ReduceLogSumExp", _logsumexp, lambda d: -np.inf),
]:
    register(_name, static=(1,))(_reduction(_reduce, _empty))


def _arg(fn_name: str) -> Callable[..., Any]:
    def run(node: Node, x: Any) -> Any:
        axis = norm_axis(int(node["axis"]), np.ndim(x), node.where)
        keepdims = bool(node["keepdims"])
        if x.shape[axis] == 0:
            raise ValueError(
                f"{node.where}: axis {axis} of X of shape {list(x.shape)} is empty; it has no "
                f"{fn_name[3:]}imum to point at"
            )
        xp = xp_of(x)
        if node.get("select_last_index", 0):
            flipped = xp.flip(x, axis=axis)
            index = x.shape[axis] - 1 - getattr(xp, fn_name)(flipped, axis=axis, keepdims=keepdims)
        else:
            index = getattr(xp, fn_name)(x, axis=axis, keepdims=keepdims)
        return cast_to(index, np.int64)

    return run


register("ArgMax")(_arg("argmax"))
register("ArgMin")(_arg("argmin"))


def _cumulative(name: str, unit: int) -> Callable[..., Any]:
    """CumSum or CumProd along ``axis`` (an input), ``exclusive`` and ``reverse``."""

    def run(node: Node, x: Any, axis: Any) -> Any:
        if np.size(axis) != 1 or np.ndim(axis) > 1:  # onnxruntime: "0D or 1D"
            raise ValueError(
                f"{node.where}: axis of shape {list(np.shape(axis))} must be a scalar or hold "
                "one value in 1-D"
            )
        a = norm_axis(int(np.asarray(axis).reshape(())), np.ndim(x), node.where)
        reverse, exclusive = flag(node, "reverse"), flag(node, "exclusive")
        xp = xp_of(x)
        y = xp.flip(x, axis=a) if reverse else x
        y = getattr(xp, name)(y, axis=a, dtype=y.dtype)
        if exclusive and x.shape[a]:
            first = list(x.shape)
            first[a] = 1
            kept = [slice(None)] * np.ndim(x)
            kept[a] = slice(0, x.shape[a] - 1)
            y = xp.concatenate([xp.full(first, unit, y.dtype), y[tuple(kept)]], axis=a)
        return xp.flip(y, axis=a) if reverse else y

    return run


register("CumSum", static=(1,))(_cumulative("cumsum", 0))
register("CumProd", static=(1,))(_cumulative("cumprod", 1))


@register("TopK", static=(1,))
def _top_k(node: Node, x: Any, k: Any = None) -> Any:
    """The ``k`` largest (or smallest) along ``axis``, sorted; of equal values, the lower
    index comes first, as ONNX says (a stable sort)."""
    if node.opset < 10:
        k = np.asarray([node["k"]], np.int64)
    if np.shape(k) != (1,):  # the schema's "1-D tensor of one value", as onnxruntime checks
        raise ValueError(f"{node.where}: K must be 1-D of one value, got shape {list(np.shape(k))}")
    count = int(np.asarray(k).reshape(()))
    axis = norm_axis(int(node.get("axis", -1)), np.ndim(x), node.where)
    if not 0 <= count <= x.shape[axis]:
        raise ValueError(
            f"{node.where}: K is {count}; axis {axis} of X of shape {list(x.shape)} holds "
            f"{x.shape[axis]}"
        )
    out = list(x.shape)
    out[axis] = count
    check_size(node, out, x.dtype)
    check_size(node, out, np.int64, "indices")
    order = jnp.argsort(x, axis=axis, stable=True, descending=bool(node.get("largest", 1)))
    index = lax.slice_in_dim(order, 0, count, axis=axis)
    return jnp.take_along_axis(x, index, axis=axis), index.astype(canonical(np.int64))


@register("Det")
def _det(node: Node, x: Any) -> Any:
    """The determinant of each ``[M, M]`` matrix of ``[*, M, M]`` (LU; float16 and bfloat16
    computed in float32); differentiable."""
    if np.ndim(x) < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(
            f"{node.where}: X of shape {list(np.shape(x))} must be [*, M, M] (square matrices)"
        )
    x = jnp.asarray(x)
    work = x.dtype if np.dtype(x.dtype).itemsize >= 4 else np.dtype(np.float32)
    return jnp.linalg.det(x.astype(work)).astype(x.dtype)
