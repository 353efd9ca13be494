"""Indexing ops of ai.onnx: Gather, GatherElements, GatherND, ScatterND, ScatterElements
(and Scatter), OneHot, ReverseSequence, TensorScatter: elements picked or written by index.

An index outside its axis is refused naming the node: while tracing when the indices
are static, else after the run (``arrays.checked_indices``); nothing is clamped
silently. A new op that reads or writes tensors by index goes here.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from onnx_optax._src.ops.arrays import (
    check_at_run,
    check_scalar_like,
    check_size,
    check_vector,
    checked_indices,
    int_check,
    is_int,
    norm_axis,
    same_dtype,
    xp_of,
)
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import canonical


@register("Gather")
def _gather(node: Node, x: Any, indices: Any) -> Any:
    axis = norm_axis(int(node["axis"]), np.ndim(x), node.where)
    shape = np.shape(x)
    check_size(node, [*shape[:axis], *np.shape(indices), *shape[axis + 1 :]], x.dtype)
    indices = checked_indices(node, indices, shape[axis], "indices")
    if xp_of(x, indices) is np:
        return np.take(x, indices, axis=axis)
    return jnp.take(x, indices, axis=axis, mode="clip")  # out of range: raised after the run


@register("GatherElements")
def _gather_elements(node: Node, x: Any, indices: Any) -> Any:
    axis = norm_axis(int(node["axis"]), np.ndim(x), node.where)
    if np.ndim(indices) != np.ndim(x):
        raise ValueError(
            f"{node.where}: indices of shape {list(np.shape(indices))} do not match the rank of "
            f"data {list(np.shape(x))}"
        )
    shape, ishape = np.shape(x), np.shape(indices)
    if any(i > d for a, (i, d) in enumerate(zip(ishape, shape, strict=True)) if a != axis):
        raise ValueError(
            f"{node.where}: indices of shape {list(ishape)} are longer than data {list(shape)} "
            f"off axis {axis}"
        )
    check_size(node, ishape, x.dtype)
    indices = checked_indices(node, indices, shape[axis], "indices")
    # off the axis, indices shorter than data read its leading part (never broadcast)
    x = x[tuple(slice(None) if a == axis else slice(0, i) for a, i in enumerate(ishape))]
    return jnp.take_along_axis(x, indices, axis=axis, mode="clip")


def _checked_tuple(node: Node, indices: Any, dims: tuple[int, ...]) -> tuple[Any, ...]:
    """The last axis of ``indices`` as one index per leading axis of ``dims``, negative ones
    counted from the end; one outside its axis is an error naming the node (as Gather's)."""
    int_check(node, indices, "indices")
    bound = np.asarray(dims, np.int64).astype(canonical(indices.dtype))
    check_at_run(
        f"{node.where}: indices hold {{}}, outside the axes {list(dims)} they index",
        (indices < -bound) | (indices >= bound),
        indices,
    )
    xp = xp_of(indices)
    fixed = xp.where(indices < 0, indices + bound, indices)
    return tuple(fixed[..., j] for j in range(len(dims)))


def _batch_dims(node: Node, data: Any, indices: Any) -> tuple[int, int]:
    """GatherND's ``batch_dims`` and the index depth ``m``, checked against the shapes."""
    b = int(node.get("batch_dims", 0))
    rank, shape, ishape = np.ndim(data), np.shape(data), np.shape(indices)
    if np.ndim(indices) < 1:
        raise ValueError(f"{node.where}: indices must have rank at least 1")
    m = ishape[-1]
    if not 0 <= b < min(rank, np.ndim(indices)) or ishape[:b] != shape[:b]:
        raise ValueError(
            f"{node.where}: batch_dims {b} does not fit data {list(shape)} and indices "
            f"{list(ishape)} (their first batch_dims axes must agree)"
        )
    if not 1 <= m <= rank - b:
        raise ValueError(
            f"{node.where}: indices of depth {m} cannot index data {list(shape)} past "
            f"batch_dims {b}"
        )
    return b, m


@register("GatherND")
def _gather_nd(node: Node, data: Any, indices: Any) -> Any:
    b, m = _batch_dims(node, data, indices)
    shape, ishape = np.shape(data), np.shape(indices)
    out = [*ishape[:-1], *shape[b + m :]]
    check_size(node, out, data.dtype)
    batch = math.prod(shape[:b])
    flat = jnp.reshape(jnp.asarray(data), (batch, *shape[b:]))
    idx = jnp.reshape(indices, (batch, -1, m))
    where = _checked_tuple(node, idx, tuple(shape[b : b + m]))
    rows = np.arange(batch).reshape(batch, 1)
    picked = flat.at[(rows, *where)].get(mode="clip")  # out of range: raised after the run
    return jnp.reshape(picked, out)


_SCATTER = {
    "none": lambda at, u: at.set(u, mode="drop"),
    "add": lambda at, u: at.add(u, mode="drop"),
    "mul": lambda at, u: at.multiply(u, mode="drop"),
    "max": lambda at, u: at.max(u, mode="drop"),
    "min": lambda at, u: at.min(u, mode="drop"),
}


def _reduction_of(node: Node) -> Any:
    reduction = node.get("reduction", "none")
    if reduction not in _SCATTER:
        raise ValueError(
            f"{node.where}: reduction {reduction!r} is not one of {', '.join(map(repr, _SCATTER))}"
        )
    return _SCATTER[reduction]


@register("ScatterND")
def _scatter_nd(node: Node, data: Any, indices: Any, updates: Any) -> Any:
    apply = _reduction_of(node)
    same_dtype(node, data, updates)
    shape, ishape = np.shape(data), np.shape(indices)
    m = ishape[-1] if ishape else 0
    if not ishape or not 1 <= m <= len(shape):
        raise ValueError(
            f"{node.where}: indices of shape {list(ishape)} cannot index data {list(shape)}"
        )
    want = [*ishape[:-1], *shape[m:]]
    if list(np.shape(updates)) != want:
        raise ValueError(
            f"{node.where}: updates have shape {list(np.shape(updates))}; indices "
            f"{list(ishape)} into data {list(shape)} need {want}"
        )
    where = _checked_tuple(node, indices, tuple(shape[:m]))
    return apply(jnp.asarray(data).at[where], updates)


@register("ScatterElements", "Scatter")
def _scatter_elements(node: Node, data: Any, indices: Any, updates: Any) -> Any:
    apply = _reduction_of(node)
    same_dtype(node, data, updates)
    rank = np.ndim(data)
    axis = norm_axis(int(node["axis"]), rank, node.where)
    shape, ishape = np.shape(data), np.shape(indices)
    if np.shape(updates) != ishape or len(ishape) != rank:
        raise ValueError(
            f"{node.where}: indices {list(ishape)} and updates {list(np.shape(updates))} must "
            f"have one shape, of the rank of data {list(shape)}"
        )
    if any(i > d for a, (i, d) in enumerate(zip(ishape, shape, strict=True)) if a != axis):
        raise ValueError(
            f"{node.where}: indices {list(ishape)} are larger than data {list(shape)} off axis "
            f"{axis}"
        )
    fixed = checked_indices(node, indices, shape[axis], "indices")
    grid = list(np.indices(ishape, sparse=True))
    grid[axis] = fixed
    return apply(jnp.asarray(data).at[tuple(grid)], updates)


@register("OneHot", static=(1,))
def _one_hot(node: Node, indices: Any, depth: Any, values: Any) -> Any:
    """``values[1]`` where an index (negative ones from ``-depth``) hits, else ``values[0]``;
    an index outside ``[-depth, depth)`` gives a row of ``values[0]``, as ONNX says."""
    check_scalar_like(node, depth, "depth")  # onnx's type inference, which onnxruntime runs
    check_vector(node, values, "values")
    if np.size(depth) != 1 or np.size(values) != 2:
        raise ValueError(
            f"{node.where}: depth must hold one value and values two, got {np.size(depth)} "
            f"and {np.size(values)}"
        )
    n = int(np.asarray(depth).reshape(()))
    if n < 1:
        raise ValueError(f"{node.where}: depth is {n}; it must be at least 1")
    rank = np.ndim(indices) + 1
    axis = norm_axis(int(node.get("axis", -1)), rank, node.where)
    out = list(np.shape(indices))
    out.insert(axis, n)
    check_size(node, out, values.dtype)
    index = jnp.asarray(indices)
    if not is_int(index):
        index = jnp.trunc(index)
    index = index.astype(canonical(np.int64))
    index = jnp.where(index < 0, index + n, index)
    shape = [1] * rank
    shape[axis] = n
    hit = jnp.expand_dims(index, axis) == jnp.arange(n, dtype=index.dtype).reshape(shape)
    pair = jnp.reshape(values, (2,))
    return jnp.where(hit, pair[1], pair[0])


@register("ReverseSequence")
def _reverse_sequence(node: Node, x: Any, lengths: Any) -> Any:
    """Each batch entry ``b`` with its first ``sequence_lens[b]`` steps along ``time_axis``
    reversed, the rest kept (a gather; differentiable in x)."""
    rank = np.ndim(x)
    if rank < 2:
        raise ValueError(f"{node.where}: input of shape {list(np.shape(x))} needs rank >= 2")
    batch = norm_axis(int(node["batch_axis"]), rank, node.where)
    time = norm_axis(int(node["time_axis"]), rank, node.where)
    if {batch, time} != {0, 1}:
        raise ValueError(
            f"{node.where}: batch_axis {batch} and time_axis {time} must be 0 and 1, either way"
        )
    int_check(node, lengths, "sequence_lens")
    if tuple(np.shape(lengths)) != (x.shape[batch],):
        raise ValueError(
            f"{node.where}: sequence_lens of shape {list(np.shape(lengths))} must hold one "
            f"length per batch entry ({x.shape[batch]})"
        )
    steps = x.shape[time]
    check_at_run(
        f"{node.where}: sequence_lens hold {{}}, outside [0, {steps}]",
        (lengths < 0) | (lengths > steps),
        lengths,
    )
    shape = [1] * rank
    shape[time] = steps
    t = jnp.arange(steps).reshape(shape)
    shape[time], shape[batch] = 1, x.shape[batch]
    n = jnp.asarray(lengths).astype(t.dtype).reshape(shape)
    source = jnp.broadcast_to(jnp.where(t < n, n - 1 - t, t), x.shape)
    return jnp.take_along_axis(jnp.asarray(x), source, axis=time)


@register("TensorScatter")
def _tensor_scatter(node: Node, cache: Any, update: Any, write_indices: Any = None) -> Any:
    """``cache`` with ``update`` written along ``axis`` from ``write_indices[b]`` on for each
    batch entry b (0 when absent); ``circular`` mode wraps around the axis, ``linear``
    must stay within it (checked). Differentiable in both tensors."""
    mode = node["mode"]
    if mode not in ("linear", "circular"):
        raise ValueError(f"{node.where}: mode {mode!r} is not 'linear' or 'circular'")
    same_dtype(node, cache, update)
    rank = np.ndim(cache)
    axis = norm_axis(int(node["axis"]), rank, node.where)
    if axis == 0:
        raise ValueError(f"{node.where}: axis 0 is the batch axis; the sequence axis follows it")
    room, given = cache.shape[axis], list(np.shape(update))
    fits = len(given) == rank and all(
        u == c for i, (u, c) in enumerate(zip(given, cache.shape, strict=True)) if i != axis
    )
    steps = given[axis] if fits else 0
    if not fits or steps > room:
        raise ValueError(
            f"{node.where}: update of shape {list(np.shape(update))} does not fit past_cache of "
            f"shape {list(cache.shape)} (the same but at most as long on axis {axis})"
        )
    batch = cache.shape[0]
    if write_indices is None:
        write_indices = np.zeros(batch, np.int64)
    int_check(node, write_indices, "write_indices")
    if tuple(np.shape(write_indices)) != (batch,):
        raise ValueError(
            f"{node.where}: write_indices of shape {list(np.shape(write_indices))} must hold "
            f"one index per batch entry ({batch})"
        )
    start = jnp.asarray(write_indices)
    top = room if mode == "circular" else room - steps
    check_at_run(
        f"{node.where}: write_indices hold {{}}, outside [0, {top}] ({mode} mode, {steps} "
        f"steps into {room})",
        (start < 0) | (start > top),
        start,
    )
    positions = start[:, None] + jnp.arange(steps, dtype=start.dtype)
    if mode == "circular":
        positions = positions % room
    moved = jnp.moveaxis(jnp.asarray(cache), axis, 1)
    rows = jnp.arange(batch)[:, None]
    out = moved.at[rows, positions].set(jnp.moveaxis(jnp.asarray(update), axis, 1))
    return jnp.moveaxis(out, 1, axis)
