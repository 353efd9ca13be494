"""The ops of ai.onnx whose output's shape depends on the values of an input.

NonZero, Unique, Compress and NonMaxSuppression. XLA compiles static shapes, so the input that
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

from onnx_optax._src.ops.arrays import check_size, norm_axis, xp_of
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import NotStaticError, is_static


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
        axis = norm_axis(int(axis), x.ndim, node.where)
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
        axis = norm_axis(int(axis), np.ndim(x), node.where)
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
    if xp_of(x) is np:
        return np.take(x, keep, axis=axis)
    return jnp.take(x, keep, axis=axis)


def _box_edges(boxes: np.ndarray, center_point_box: int) -> tuple[np.ndarray, ...]:
    """x_min, x_max, y_min, y_max of each box, in the boxes' dtype."""
    if center_point_box:  # [x_center, y_center, width, height]
        half_w, half_h = boxes[:, 2] / 2, boxes[:, 3] / 2
        return (
            boxes[:, 0] - half_w,
            boxes[:, 0] + half_w,
            boxes[:, 1] - half_h,
            boxes[:, 1] + half_h,
        )
    # [y1, x1, y2, x2], either corner first
    return (
        np.minimum(boxes[:, 1], boxes[:, 3]),
        np.maximum(boxes[:, 1], boxes[:, 3]),
        np.minimum(boxes[:, 0], boxes[:, 2]),
        np.maximum(boxes[:, 0], boxes[:, 2]),
    )


def _overlaps(edges: tuple[np.ndarray, ...], one: int, threshold: float) -> np.ndarray:
    """Whether each box's IoU with box ``one`` is over ``threshold`` (empty boxes: never)."""
    x0, x1, y0, y1 = edges
    ix0, ix1 = np.maximum(x0, x0[one]), np.minimum(x1, x1[one])
    iy0, iy1 = np.maximum(y0, y0[one]), np.minimum(y1, y1[one])
    inter = (ix1 - ix0) * (iy1 - iy0)
    area = (x1 - x0) * (y1 - y0)
    union = area + area[one] - inter
    valid = (ix1 > ix0) & (iy1 > iy0) & (inter > 0) & (area > 0) & (area[one] > 0) & (union > 0)
    with np.errstate(all="ignore"):
        iou = inter / np.where(valid, union, 1)
    return valid & (iou > threshold)


@register("NonMaxSuppression", static=(0, 1, 2, 3, 4))
def _non_max_suppression(
    node: Node,
    boxes: Any,
    scores: Any,
    max_boxes: Any = None,
    iou_threshold: Any = None,
    score_threshold: Any = None,
) -> Any:
    """selected_indices [n, 3] (batch, class, box), int64: for each batch and class, boxes
    taken by score (descending; of equal scores the lower index first), each kept unless
    its IoU with one kept before is over ``iou_threshold``, at most ``max_boxes`` of them;
    with ``score_threshold``, only boxes scoring over it."""
    boxes = _require_static(node, boxes, 0)
    scores = _require_static(node, scores, 1)
    for position, value in ((2, max_boxes), (3, iou_threshold), (4, score_threshold)):
        if value is not None and np.size(value) > 1:
            raise ValueError(
                f"{node.where}: input {node.input_name(position)} must hold one value, got "
                f"{np.size(value)}"
            )
    if boxes.ndim != 3 or boxes.shape[2] != 4:
        raise ValueError(
            f"{node.where}: boxes must be of shape [batches, boxes, 4], got {list(boxes.shape)}"
        )
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ValueError(
            f"{node.where}: scores must be of shape [batches, classes, boxes] = "
            f"[{boxes.shape[0]}, classes, {boxes.shape[1]}], got {list(scores.shape)}"
        )

    def scalar(value: Any) -> Any:  # an absent or empty input: None
        return None if value is None or np.size(value) == 0 else np.ravel(value)[0]

    limit = int(scalar(max_boxes) or 0)  # absent: 0, no box selected
    iou = scalar(iou_threshold)
    iou = 0.0 if iou is None else float(iou)
    if not 0 <= iou <= 1:  # as onnxruntime
        raise ValueError(f"{node.where}: iou_threshold {iou} must be in [0, 1]")
    floor = scalar(score_threshold)
    batches, classes, count = scores.shape
    limit = min(max(limit, 0), count)
    check_size(node, [batches * classes * limit, 3], np.int64)
    center = int(node.get("center_point_box", 0))
    if center not in (0, 1):
        raise ValueError(f"{node.where}: center_point_box {center} must be 0 or 1")
    selected: list[tuple[int, int, int]] = []
    for b in range(batches):
        edges = _box_edges(boxes[b], center)
        for c in range(classes):
            score = scores[b, c]
            order = np.lexsort((np.arange(count), -score.astype(np.float64)))
            if floor is not None:
                order = order[score[order] > floor]
            alive = np.ones(count, bool)
            taken = 0
            for i in order:
                if taken == limit:
                    break
                if not alive[i]:
                    continue
                selected.append((b, c, int(i)))
                taken += 1
                alive &= ~_overlaps(edges, int(i), iou)
    return np.asarray(selected, np.int64).reshape(len(selected), 3)
