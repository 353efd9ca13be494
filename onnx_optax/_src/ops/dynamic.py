"""The ops of ai.onnx whose output's shape depends on the values of an input.

NonZero, Unique and Compress. XLA compiles static shapes, so the input that
sets the output's size is read while tracing (``register(..., static=...)``):
a constant, an initializer, or a graph input fed with a concrete value (one
compilation per value); one computed from the values fed is refused, naming
the node. These ops then compute that input on the host with numpy, exactly;
Compress's data may still be traced (its condition alone sets the size).
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from onnx_optax._src.ops.arrays import NotStaticError, _axis, _xp, check_size, is_static
from onnx_optax._src.ops.registry import Node, register


def _require_static(node: Node, value: Any, position: int) -> np.ndarray:
    """``value`` as a host array, else a refusal naming the node and what to do."""
    if not is_static(value):
        raise NotStaticError(
            f"{node.where}: the size of its output depends on the values of input "
            f"{node.input_name(position)}, which are known only when the graph runs, and XLA "
            "compiles static shapes; make that input a constant or an initializer, or compute "
            "this step outside the model"
        )
    return np.asarray(value)


@register("NonZero", static=(0,))
def _non_zero(node: Node, x: Any) -> Any:
    """The indices of the non-zero elements, int64 of shape [rank, n], in row-major order.

    A scalar gives shape [0, n] (n is 0 or 1), as ONNX's shape inference says;
    onnxruntime gives [1, n].
    """
    x = _require_static(node, x, 0)
    count = int(np.count_nonzero(x))
    check_size(node, [x.ndim, count], np.int64)
    if x.ndim == 0:
        return np.zeros((0, count), np.int64)
    return np.asarray(np.nonzero(x), np.int64).reshape(x.ndim, count)


@register("Unique", static=(0,))
def _unique(node: Node, x: Any) -> tuple[Any, Any, Any, Any]:
    """Y, indices (first occurrences), inverse_indices and counts, as ONNX defines them.

    Without ``axis`` the elements of the flattened input, else its slices along
    ``axis``; ``sorted`` (default 1) sorts them ascending (slices
    lexicographically), ``sorted=0`` keeps the order of their first occurrence. NaNs
    are one value, sorted last, as onnx's reference (numpy) has them; onnxruntime
    counts a NaN as equal to the value before it.
    """
    x = _require_static(node, x, 0)
    axis = node.get("axis")
    if axis is None:
        rows = x.reshape(-1)
    else:
        axis = _axis(int(axis), x.ndim, node.where)
        rows = np.moveaxis(x, axis, 0)
        rows = rows.reshape(rows.shape[0], math.prod(rows.shape[1:]))  # -1 fails when empty
    n = rows.shape[0]
    check_size(node, [n], np.int64, "indices")  # the bounds of every output
    check_size(node, x.shape, x.dtype)
    if axis is None:
        values, first, inverse, counts = np.unique(
            rows, return_index=True, return_inverse=True, return_counts=True
        )
    else:
        values, first, inverse, counts = np.unique(
            rows, return_index=True, return_inverse=True, return_counts=True, axis=0
        )
    inverse = np.asarray(inverse).reshape(-1)
    if not int(node.get("sorted", 1)):  # by first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        values, first, counts, inverse = values[order], first[order], counts[order], rank[inverse]
    if axis is None:
        y = values
    else:
        slices = np.moveaxis(x, axis, 0)
        y = np.moveaxis(values.reshape(values.shape[0], *slices.shape[1:]), 0, axis)
    as_int = [np.asarray(v, np.int64) for v in (first, inverse, counts)]
    return np.asarray(y, x.dtype), as_int[0], as_int[1], as_int[2]


@register("Compress", static=(1,))
def _compress(node: Node, x: Any, condition: Any) -> Any:
    """The slices of ``x`` along ``axis`` (the flattened ``x`` without it) where
    ``condition`` is true; a condition shorter than the axis leaves out the rest."""
    condition = _require_static(node, condition, 1).astype(bool)
    if condition.ndim != 1:
        raise ValueError(f"{node.where}: condition must be 1-D, got shape {list(condition.shape)}")
    axis = node.get("axis")
    if axis is None:
        x = x.reshape(-1)
        axis = 0
    else:
        axis = _axis(int(axis), np.ndim(x), node.where)
    length = np.shape(x)[axis]
    if condition.size > length:
        raise ValueError(
            f"{node.where}: condition holds {condition.size} values; axis {axis} of the "
            f"input holds {length}"
        )
    keep = np.flatnonzero(condition)
    shape = list(np.shape(x))
    shape[axis] = keep.size
    check_size(node, shape, x.dtype)
    if _xp(x) is np:
        return np.take(x, keep, axis=axis)
    return jnp.take(x, keep, axis=axis)
