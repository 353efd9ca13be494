"""Shape and layout ops of ai.onnx, and the ops that make tensors.

Shape, Size, Reshape, Flatten, Transpose, Squeeze/Unsqueeze, Concat, Split,
Slice, Expand, Tile, Pad, CenterCropPad, DepthToSpace/SpaceToDepth, Trilu, and
Identity, Constant, ConstantOfShape, Range, EyeLike (the ops that read or write
by index are ``indexing``'s). Shape-valued inputs are static
(``register(..., static=...)``), and these ops compute with numpy on static
values, so shape arithmetic folds while tracing. A new op that moves, cuts or
makes tensors goes here.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src.onnx_tensors import refuse_narrowing, tensor_dtype
from onnx_optax._src.ops.arrays import (
    HOST_FOLD_ELEMENTS,
    axes_of,
    check_scalar_like,
    check_size,
    check_vector,
    int_list,
    norm_axes,
    norm_axis,
    same_dtype,
    xp_of,
)
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import canonical, is_static


@register("Identity")
def _identity(node: Node, x: Any) -> Any:
    del node
    return x


@register("Constant")
def _constant(node: Node) -> Any:
    given = [name for name, value in node.attrs.items() if value is not None]
    if len(given) != 1:
        raise ValueError(f"{node.where}: a Constant has exactly one value attribute, got {given}")
    (name,) = given
    value = node[name]
    if name == "value":
        return value  # already read by read_tensor
    if name in ("value_float", "value_floats"):
        return np.asarray(value, np.float32)
    if name in ("value_int", "value_ints"):
        return np.asarray(value, np.int64)
    raise ValueError(
        f"{node.where}: Constant attribute '{name}' (strings, sparse) is not supported"
    )


@register("ConstantOfShape", static=(0,))
def _constant_of_shape(node: Node, shape: Any) -> Any:
    value = node.get("value")  # ONNX's default: a float32 zero
    fill = (np.zeros((), np.float32) if value is None else np.asarray(value)).reshape(-1)
    if fill.size != 1:
        raise ValueError(f"{node.where}: attribute 'value' must hold one element, got {fill.size}")
    dims = int_list(shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"{node.where}: negative dimension in shape {dims}")
    check_size(node, dims, fill.dtype)
    if math.prod(dims) > HOST_FOLD_ELEMENTS:  # big fills are computed on the device
        refuse_narrowing(f"{node.where}: attribute 'value'", fill)
        return jnp.full(dims, fill[0], canonical(fill.dtype))
    return np.full(dims, fill[0], fill.dtype)


@register("Range", static=(0, 1, 2))
def _range(node: Node, start: Any, limit: Any, delta: Any) -> Any:
    """``start + i * delta`` for i < max(ceil((limit - start) / delta), 0), as ONNX defines it.

    Integer bounds are counted in Python integers (exact where ``limit - start``
    overflows int64) and the values computed in one array of the output's type,
    whose wrap-around arithmetic is exact for values that fit it.
    """
    for name, value in (("start", start), ("limit", limit), ("delta", delta)):
        check_scalar_like(node, value, name)
    same_dtype(node, start, limit, delta)
    dtype = np.dtype(start.dtype)
    start, limit, delta = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    if delta == 0:
        raise ValueError(f"{node.where}: delta is 0")
    if np.issubdtype(dtype, np.integer):
        first, step = int(start), int(delta)
        count = max(-((first - int(limit)) // step), 0)  # ceil of the exact quotient
    else:
        with np.errstate(over="ignore"):  # the difference in the type, as onnxruntime
            steps = float(limit - start) / float(delta)
        if not math.isfinite(steps):
            raise ValueError(
                f"{node.where}: start {start}, limit {limit} and delta {delta} give no finite "
                "number of elements"
            )
        count = max(math.ceil(steps), 0)
    check_size(node, [count], dtype)
    out = np.arange(count, dtype=dtype)
    with np.errstate(over="ignore"):
        out *= delta
        out += start
    return out


@register("Shape")
def _shape(node: Node, x: Any) -> Any:
    dims = np.asarray(np.shape(x), np.int64)
    rank = len(dims)
    start = int(node.get("start", 0))
    end = node.get("end")
    start = min(max(start + rank if start < 0 else start, 0), rank)
    stop = rank if end is None else int(end)
    stop = min(max(stop + rank if stop < 0 else stop, 0), rank)
    return dims[start:stop]


@register("Size")
def _size(node: Node, x: Any) -> Any:
    del node
    return np.asarray(math.prod(np.shape(x)), np.int64)


def _reshaped(node: Node, shape: tuple[int, ...], dims: list[int]) -> list[int]:
    """Reshape's target: 0 copies the input's dimension (unless allowzero), -1 is inferred."""
    allowzero = node.get("allowzero", 0)
    if not allowzero:
        if any(d == 0 and i >= len(shape) for i, d in enumerate(dims)):
            raise ValueError(
                f"{node.where}: shape {dims} copies a dimension (0) beyond the input's rank "
                f"{len(shape)}"
            )
        dims = [shape[i] if d == 0 else d for i, d in enumerate(dims)]
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise ValueError(f"{node.where}: shape {dims} has more than one -1 or a negative size")
    size, known = math.prod(shape), math.prod(d for d in dims if d != -1)
    if -1 in dims:
        if known == 0 or size % known:
            raise ValueError(
                f"{node.where}: cannot infer the -1 in {dims} for shape {list(shape)} "
                f"({size} elements)"
            )
        dims = [size // known if d == -1 else d for d in dims]
    if math.prod(dims) != size:
        raise ValueError(f"{node.where}: cannot reshape shape {list(shape)} to {dims}")
    return dims


@register("Reshape", static=(1,))
def _reshape(node: Node, x: Any, shape: Any = None) -> Any:
    check_vector(node, shape, "shape")
    dims = _reshaped(node, np.shape(x), int_list(node.get("shape") if shape is None else shape))
    return xp_of(x).reshape(x, dims)


@register("Flatten")
def _flatten(node: Node, x: Any) -> Any:
    rank = np.ndim(x)
    axis = int(node["axis"])
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis <= rank:
        raise ValueError(f"{node.where}: axis {node['axis']} is out of range for rank {rank}")
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@register("Transpose")
def _transpose(node: Node, x: Any) -> Any:
    perm = node.get("perm")
    perm = list(range(np.ndim(x)))[::-1] if perm is None else list(perm)
    if sorted(perm) != list(range(np.ndim(x))):
        raise ValueError(f"{node.where}: perm {perm} is not a permutation of rank {np.ndim(x)}")
    return xp_of(x).transpose(x, perm)


@register("Squeeze", static=(1,))
def _squeeze(node: Node, x: Any, axes: Any = None) -> Any:
    check_vector(node, axes, "axes")
    picked = axes_of(node, axes)
    if picked is None:
        picked = [i for i, d in enumerate(x.shape) if d == 1]
    picked_ = norm_axes(picked, np.ndim(x), node.where)
    if any(x.shape[a] != 1 for a in picked_):
        raise ValueError(f"{node.where}: cannot squeeze axes {picked} of shape {list(x.shape)}")
    return xp_of(x).squeeze(x, axis=picked_) if picked_ else x


@register("Unsqueeze", static=(1,))
def _unsqueeze(node: Node, x: Any, axes: Any = None) -> Any:
    check_vector(node, axes, "axes", scalar=True)
    picked = axes_of(node, axes)
    if picked is None:
        raise ValueError(f"{node.where}: Unsqueeze needs axes")
    rank = np.ndim(x) + len(picked)
    shape = list(np.shape(x))
    for a in sorted(norm_axes(picked, rank, node.where)):
        shape.insert(a, 1)
    return xp_of(x).reshape(x, shape)


@register("Concat")
def _concat(node: Node, *xs: Any) -> Any:
    xs = tuple(x for x in xs if x is not None)
    same_dtype(node, *xs)
    axis = norm_axis(int(node["axis"]), np.ndim(xs[0]), node.where)
    shapes = [list(np.shape(x)) for x in xs]
    rest = [s[:axis] + s[axis + 1 :] for s in shapes]
    if any(len(s) != len(shapes[0]) or r != rest[0] for s, r in zip(shapes, rest, strict=True)):
        raise ValueError(f"{node.where}: cannot concatenate shapes {shapes} on axis {axis}")
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    check_size(node, out, xs[0].dtype)
    return xp_of(*xs).concatenate(xs, axis=axis)


@register("Split", static=(1,))
def _split(node: Node, x: Any, split: Any = None) -> Any:
    axis = norm_axis(int(node["axis"]), np.ndim(x), node.where)
    check_vector(node, split, "split")
    size = x.shape[axis]
    sizes = int_list(split) if split is not None else node.get("split")
    n = node.n_outputs
    if node.opset >= 18 and (split is None) == (node.get("num_outputs") is None):
        raise ValueError(  # onnx's shape inference, run by onnxruntime
            f"{node.where}: Split of opset {node.opset} takes the split input or num_outputs: "
            f"{'both' if split is not None else 'neither'} given"
        )
    if sizes is None:
        parts = int(node.get("num_outputs", n))
        if parts < 1:
            raise ValueError(f"{node.where}: num_outputs is {parts}; it must be at least 1")
        if parts != n:  # before a list of num_outputs sizes is made (2**62 of them, say)
            raise ValueError(f"{node.where}: num_outputs is {parts}, but the node has {n} outputs")
        chunk = -(-size // parts)
        if size - chunk * (parts - 1) < 0:  # as onnxruntime: "a negative final split"
            raise ValueError(
                f"{node.where}: num_outputs {parts} cuts axis {axis} of size {size} into "
                f"chunks of {chunk}, which leaves the last one {size - chunk * (parts - 1)}"
            )
        sizes = [max(min(chunk, size - i * chunk), 0) for i in range(parts)]
    sizes = [int(s) for s in sizes]
    if sum(sizes) != size or len(sizes) != n or min(sizes, default=0) < 0:
        raise ValueError(
            f"{node.where}: split {sizes} does not cut axis {axis} of size {size} into {n}"
        )
    offsets = np.cumsum([0, *sizes])
    xp = xp_of(x)
    return tuple(
        xp.take(x, np.arange(offsets[i], offsets[i + 1]), axis=axis)
        if xp is np
        else lax.slice_in_dim(x, int(offsets[i]), int(offsets[i + 1]), axis=axis)
        for i in range(n)
    )


@register("Slice", static=(1, 2, 3, 4))
def _slice(
    node: Node, x: Any, starts: Any = None, ends: Any = None, axes: Any = None, steps: Any = None
) -> Any:
    if node.opset < 10:
        starts, ends, axes = node.get("starts"), node.get("ends"), node.get("axes")
    else:
        for name, value in (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps)):
            check_vector(node, value, name)
    rank = np.ndim(x)
    starts_, ends_ = int_list(starts), int_list(ends)
    axes_ = list(range(len(starts_))) if axes is None else int_list(axes)
    steps_ = [1] * len(starts_) if steps is None else int_list(steps)
    if not len(starts_) == len(ends_) == len(axes_) == len(steps_):
        raise ValueError(f"{node.where}: starts, ends, axes and steps differ in length")
    index: list[Any] = [slice(None)] * rank
    for start, end, axis, step in zip(
        starts_, ends_, norm_axes(axes_, rank, node.where), steps_, strict=True
    ):
        dim = x.shape[axis]
        if step == 0:
            raise ValueError(f"{node.where}: a step is 0")
        # a step beyond the axis picks the first element alone: the same with a small step
        step = max(min(step, max(dim, 1)), -max(dim, 1))
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        index[axis] = slice(start, None if end < 0 else end, step)
    return x[tuple(index)]


@register("Expand", static=(1,))
def _expand(node: Node, x: Any, shape: Any) -> Any:
    try:
        target = np.broadcast_shapes(np.shape(x), tuple(int_list(shape)))
    except ValueError:
        raise ValueError(
            f"{node.where}: shape {list(np.shape(x))} does not expand to {int_list(shape)}"
        ) from None
    check_size(node, target, x.dtype)
    return xp_of(x).broadcast_to(x, target)


@register("Tile", static=(1,))
def _tile(node: Node, x: Any, repeats: Any) -> Any:
    check_vector(node, repeats, "repeats")
    reps = int_list(repeats)
    if len(reps) != np.ndim(x):
        raise ValueError(f"{node.where}: repeats {reps} do not match rank {np.ndim(x)}")
    if any(r < 0 for r in reps):
        raise ValueError(f"{node.where}: negative repeats {reps}")
    check_size(node, [d * r for d, r in zip(np.shape(x), reps, strict=True)], x.dtype)
    return xp_of(x).tile(x, reps)


def _check_pads(node: Node, mode: str, shape: Any, widths: list[tuple[int, int]]) -> None:
    """Refuses pads the mode cannot fill: reflect pads at most size - 1, an empty axis none."""
    for axis, (dim, (lo, hi)) in enumerate(zip(shape, widths, strict=True)):
        most = dim - 1 if mode == "reflect" else (0 if dim == 0 else None)
        if most is not None and max(lo, hi) > most:
            raise ValueError(
                f"{node.where}: {mode} pads {[lo, hi]} on axis {axis} of size {dim}; that mode "
                f"pads at most {max(most, 0)} there"
            )


@register("Pad", static=(1, 3))
def _pad(node: Node, x: Any, pads: Any = None, value: Any = None, axes: Any = None) -> Any:
    rank = np.ndim(x)
    if node.opset < 11:
        amounts = [int(p) for p in node.get("pads") or node.get("paddings")]
        fill = np.asarray(node.get("value", 0.0), x.dtype)
    else:
        if np.ndim(pads) != 1 and not (np.ndim(pads) == 2 and np.shape(pads)[0] == 1):
            raise ValueError(
                f"{node.where}: pads of shape {list(np.shape(pads))} must be 1-D (or [1, n])"
            )
        amounts = int_list(pads)
        fill = np.zeros((), x.dtype) if value is None else value
    picked = (
        list(range(rank)) if axes is None else list(norm_axes(int_list(axes), rank, node.where))
    )
    if len(amounts) != 2 * len(picked):
        raise ValueError(f"{node.where}: pads {amounts} do not fit {len(picked)} axes")
    widths = [[0, 0] for _ in range(rank)]
    for i, axis in enumerate(picked):
        widths[axis] = [amounts[i], amounts[i + len(picked)]]
    for axis, (lo, hi) in enumerate(widths):
        if x.shape[axis] + lo + hi < 0:  # onnxruntime: a negative output dimension
            raise ValueError(
                f"{node.where}: pads {amounts} leave axis {axis} of size {x.shape[axis]} with "
                f"{x.shape[axis] + lo + hi}"
            )
    for axis, (lo, hi) in enumerate(widths):  # a crop past the data eats the far padding
        d = x.shape[axis]
        if -lo > d:
            widths[axis] = [-d, hi + lo + d]
        elif -hi > d:
            widths[axis] = [lo + hi + d, -d]
    # negative pads crop
    crop = tuple(slice(max(-lo, 0), x.shape[a] - max(-hi, 0)) for a, (lo, hi) in enumerate(widths))
    x = x[crop]
    widths_ = [(max(lo, 0), max(hi, 0)) for lo, hi in widths]
    check_size(node, [d + lo + hi for d, (lo, hi) in zip(x.shape, widths_, strict=True)], x.dtype)
    mode = node.get("mode", "constant")
    if mode != "constant":
        _check_pads(node, mode, x.shape, widths_)
    xp = xp_of(x, value)
    if mode == "constant":
        if is_static(fill) and xp is jnp:
            return jnp.pad(x, widths_, constant_values=np.asarray(fill).reshape(()))
        if xp is np:
            return np.pad(x, widths_, constant_values=np.asarray(fill).reshape(()))
        padded = jnp.pad(x, widths_)
        mask = np.pad(np.zeros(x.shape, bool), widths_, constant_values=True)
        return jnp.where(mask, jnp.reshape(fill, ()).astype(x.dtype), padded)
    if mode not in ("reflect", "edge", "wrap"):
        raise ValueError(f"{node.where}: unknown mode {mode!r}")
    return xp.pad(x, widths_, mode=mode)


@register("CenterCropPad", static=(1,))
def _center_crop_pad(node: Node, x: Any, shape: Any) -> Any:
    """Each of ``axes`` cut or zero-padded to its size in ``shape``, centred.

    An axis of ``d`` cut to ``s < d`` keeps ``[(d - s) // 2, (d - s) // 2 + s)``;
    one padded to ``s > d`` gets ``(s - d) // 2`` zeros before and the rest after.
    """
    rank = np.ndim(x)
    check_vector(node, shape, "shape")
    given = node.get("axes")
    axes = list(range(rank)) if given is None else list(norm_axes(given, rank, node.where))
    sizes = int_list(shape)
    if len(sizes) != len(axes):
        raise ValueError(
            f"{node.where}: shape {sizes} holds {len(sizes)} sizes for {len(axes)} axes "
            f"({axes}) of an input of shape {list(np.shape(x))}"
        )
    if any(s < 0 for s in sizes):
        raise ValueError(f"{node.where}: shape {sizes} holds a negative size")
    out = list(np.shape(x))
    for axis, size in zip(axes, sizes, strict=True):
        out[axis] = size
    check_size(node, out, x.dtype)
    crop = [slice(None)] * rank
    widths = [(0, 0)] * rank
    for axis, size in zip(axes, sizes, strict=True):
        dim = x.shape[axis]
        if size < dim:
            start = (dim - size) // 2
            crop[axis] = slice(start, start + size)
        elif size > dim:
            before = (size - dim) // 2
            widths[axis] = (before, size - dim - before)
    cropped = x[tuple(crop)]
    return xp_of(x).pad(cropped, widths) if any(w != (0, 0) for w in widths) else cropped


def _blocks(node: Node, x: Any) -> tuple[int, int, int, int, int]:
    """blocksize and the N, C, H, W of a rank-4 input; a clear error for anything else."""
    b = int(node["blocksize"])
    if b < 1:
        raise ValueError(f"{node.where}: blocksize is {b}; it must be at least 1")
    if np.ndim(x) != 4:
        raise ValueError(f"{node.where}: the input has shape {list(np.shape(x))}; it needs rank 4")
    n, c, h, w = np.shape(x)
    return b, n, c, h, w


@register("DepthToSpace")
def _depth_to_space(node: Node, x: Any) -> Any:
    b, n, c, h, w = _blocks(node, x)
    if c % (b * b):
        raise ValueError(f"{node.where}: {c} channels do not divide into blocks of {b}x{b}")
    mode = node.get("mode", "DCR")
    if mode not in ("DCR", "CRD"):  # onnxruntime refuses any other
        raise ValueError(f"{node.where}: mode {mode!r} must be 'DCR' or 'CRD'")
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@register("SpaceToDepth")
def _space_to_depth(node: Node, x: Any) -> Any:
    b, n, c, h, w = _blocks(node, x)
    if h % b or w % b:
        raise ValueError(f"{node.where}: height {h} and width {w} are not multiples of {b}")
    if node.get("mode", "DCR") == "CRD":
        y = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 1, 3, 5, 2, 4)
        return y.reshape(n, c * b * b, h // b, w // b)
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


@register("Trilu", static=(1,))
def _trilu(node: Node, x: Any, k: Any = None) -> Any:
    """The upper (``upper=1``) or lower triangle of the last two axes, shifted by ``k``."""
    if np.ndim(x) < 2:
        raise ValueError(f"{node.where}: the input has shape {list(np.shape(x))}; it needs rank 2")
    check_scalar_like(node, k, "k")
    shift = 0 if k is None else int(np.asarray(k).reshape(()))
    rows, cols = np.shape(x)[-2:]
    r = np.arange(rows).reshape(rows, 1)
    c = np.arange(cols).reshape(1, cols)
    keep = (c - r >= shift) if node.get("upper", 1) else (c - r <= shift)
    xp = xp_of(x)
    return xp.where(keep, x, xp.zeros((), x.dtype))


@register("EyeLike")
def _eye_like(node: Node, x: Any) -> Any:
    """Ones on the ``k``-th diagonal of a matrix of ``x``'s shape, in ``dtype`` or ``x``'s."""
    if np.ndim(x) != 2:
        raise ValueError(f"{node.where}: the input has shape {list(np.shape(x))}; it needs rank 2")
    code = node.get("dtype")
    dtype = np.dtype(x.dtype) if code is None else tensor_dtype(int(code), node.where)
    rows, cols = np.shape(x)
    check_size(node, [rows, cols], dtype)
    eye = np.eye(rows, cols, int(node.get("k", 0)), dtype=bool)
    if rows * cols > HOST_FOLD_ELEMENTS:  # a big one is made on the device
        return jnp.asarray(eye).astype(canonical(dtype))
    return eye.astype(dtype)
