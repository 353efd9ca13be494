"""Spatial ops of ai.onnx that move pixels by index: Col2Im, DeformConv and RoiAlign.

Col2Im sums sliding blocks back into an image: the image position of every
block element is computed on the host from the static shapes, and one
scatter-add puts them in place. DeformConv and RoiAlign sample their input
bilinearly at traced points: the taps of every point are gathered at once
(``sampling.sample_taps``, no loop over output positions) and weighted, so both
are differentiable in the input and in the points' coordinates. RoiAlign's
average over many points per bin (``sampling_ratio`` 0) is separable: per roi,
a weight matrix over X's rows and one over its columns, no gather of each point.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from onnx_optax._src.ops.arrays import check_at_run, check_size, int_list, same_dtype, xp_of
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.sampling import grid_taps, sample_taps, work_dtype
from onnx_optax._src.ops.values import canonical
from onnx_optax._src.ops.windows import attr_ints, bias_check, group_of, kernel_of, window_spans

# ----------------------------------------------------------------------------- Col2Im


def _block_counts(
    node: Node,
    image: list[int],
    block: list[int],
    strides: list[int],
    dilations: list[int],
    pads: list[int],
) -> list[int]:
    """Blocks per axis: ``(image + pad_begin + pad_end - span) // stride + 1``, each >= 1."""
    rank = len(image)
    counts = [
        (size + pads[i] + pads[i + rank] - span) // s + 1
        for i, (size, span, s) in enumerate(
            zip(image, window_spans(block, dilations), strides, strict=True)
        )
    ]
    if any(c < 1 for c in counts):
        raise ValueError(
            f"{node.where}: block_shape {block} (dilations {dilations}) spans more than "
            f"image_shape {image} padded by {pads}"
        )
    return counts


@register("Col2Im", static=(1, 2))
def _col2im(node: Node, x: Any, image_shape: Any, block_shape: Any) -> Any:
    """``Y[n, c, p] = sum of x[n, c * K + k, l]`` over the blocks ``l`` and block elements
    ``k`` (``K`` per block) that land on image position ``p``:
    ``p = l_pos * stride - pad_begin + k_pos * dilation`` on each axis, inside the image."""
    if np.ndim(image_shape) != 1 or np.ndim(block_shape) != 1:  # as onnxruntime
        raise ValueError(
            f"{node.where}: image_shape of shape {list(np.shape(image_shape))} and block_shape "
            f"of shape {list(np.shape(block_shape))} must be 1-D"
        )
    image, block = int_list(image_shape), int_list(block_shape)
    rank = len(image)
    if rank < 1 or len(block) != rank:
        raise ValueError(
            f"{node.where}: image_shape {image} and block_shape {block} must name the same "
            "spatial axes (at least one)"
        )
    if any(d < 1 for d in image) or any(d < 1 for d in block):
        raise ValueError(
            f"{node.where}: image_shape {image} and block_shape {block} must be positive"
        )
    strides = attr_ints(node, "strides", rank, 1, 1)
    dilations = attr_ints(node, "dilations", rank, 1, 1)
    pads = attr_ints(node, "pads", 2 * rank, 0, 0)
    counts = _block_counts(node, image, block, strides, dilations, pads)
    k, length = math.prod(block), math.prod(counts)
    if np.ndim(x) != 3 or x.shape[1] % k or x.shape[2] != length:
        raise ValueError(
            f"{node.where}: input of shape {list(np.shape(x))} must be (N, C x {k}, {length}) "
            f"for block_shape {block} and {counts} blocks"
        )
    n, c = x.shape[0], x.shape[1] // k
    dtype = canonical(x.dtype)
    check_size(node, [n, c, *image], dtype)
    check_size(node, [k, length, rank], np.int64, "index table")
    offsets = np.stack(np.unravel_index(np.arange(k), block), axis=-1)  # (K, r)
    starts = np.stack(np.unravel_index(np.arange(length), counts), axis=-1)  # (L, r)
    at = (
        starts[None] * np.asarray(strides)
        - np.asarray(pads[:rank])
        + offsets[:, None] * np.asarray(dilations)
    )  # (K, L, r)
    inside = np.all((at >= 0) & (at < np.asarray(image)), axis=-1).reshape(-1)
    source = np.flatnonzero(inside)
    target = np.ravel_multi_index(tuple(at.reshape(-1, rank)[inside].T), image)
    # positions first: each block element moves one contiguous row of N x C values
    rows = jnp.moveaxis(jnp.asarray(x).reshape(n, c, k * length), 2, 0)[source]
    out = jnp.zeros((math.prod(image), n, c), dtype).at[target].add(rows)
    return jnp.moveaxis(out, 0, 2).reshape(n, c, *image)


# ----------------------------------------------------------------------------- DeformConv


def _deform_geometry(
    node: Node, x: Any, w: Any
) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """The kernel, the output's spatial sizes, strides, dilations and begin pads."""
    if np.ndim(x) < 3 or np.ndim(w) != np.ndim(x):
        raise ValueError(
            f"{node.where}: DeformConv needs X (N, C, ...) and W of the same rank, got shapes "
            f"{list(np.shape(x))} and {list(np.shape(w))}"
        )
    kernel = kernel_of(node, w)
    rank = len(kernel)
    strides = attr_ints(node, "strides", rank, 1, 1)
    dilations = attr_ints(node, "dilations", rank, 1, 1)
    pads = attr_ints(node, "pads", 2 * rank, 0, 0)
    out = []
    for i, (size, span, s) in enumerate(
        zip(x.shape[2:], window_spans(kernel, dilations), strides, strict=True)
    ):
        padded = size + pads[i] + pads[i + rank]
        if padded < span:
            raise ValueError(
                f"{node.where}: the kernel {kernel} (dilations {dilations}) spans more than X "
                f"of shape {list(x.shape)} padded by {pads}"
            )
        out.append((padded - span) // s + 1)
    return kernel, out, strides, dilations, pads[:rank]


def _deform_points(
    kernel: list[int], out: list[int], strides: list[int], dilations: list[int], begin: list[int]
) -> np.ndarray:
    """The undeformed sampling points, ``(K, P, r)``: ``o * stride - pad + k * dilation``."""
    offsets = np.stack(np.unravel_index(np.arange(math.prod(kernel)), kernel), axis=-1)
    starts = np.stack(np.unravel_index(np.arange(math.prod(out)), out), axis=-1)
    return (
        starts[None] * np.asarray(strides)
        - np.asarray(begin)
        + offsets[:, None] * np.asarray(dilations)
    ).astype(np.float64)


@register("DeformConv")
def _deform_conv(node: Node, x: Any, w: Any, offset: Any, b: Any = None, mask: Any = None) -> Any:
    """``Y[n, m, o] = B[m] + sum_{c, k} W[m, c, k] * mask[n, g, k, o] * X[n, c](p_k(o) + offset)``.

    ``p_k(o) = o * stride - pad_begin + k * dilation``; ``offset[n, g, k, i, o]``
    moves the point of kernel element ``k`` along axis ``i`` for the channels of
    offset group ``g``; ``X[n, c](p)`` is bilinear between the pixels around
    ``p``, pixels outside X reading 0. Channels and output channels are split
    into ``group`` groups as in Conv.
    """
    same_dtype(node, x, w, offset, b, mask)
    kernel, out, strides, dilations, begin = _deform_geometry(node, x, w)
    rank, k, p = len(kernel), math.prod(kernel), math.prod(out)
    group = group_of(node)
    groups = int(node.get("offset_group", 1))
    n, c, *spatial = x.shape
    m = w.shape[0]
    if c != w.shape[1] * group or m % group:
        raise ValueError(
            f"{node.where}: X of shape {list(x.shape)} and W of shape {list(w.shape)} do not "
            f"fit group {group} (X's channels must be W.shape[1] x group, W.shape[0] a multiple "
            "of group)"
        )
    if groups < 1 or c % groups:
        raise ValueError(
            f"{node.where}: offset_group {groups} must be positive and divide X's {c} channels"
        )
    for name, value, per in (("offset", offset, groups * k * rank), ("mask", mask, groups * k)):
        if value is not None and tuple(value.shape) != (n, per, *out):
            raise ValueError(
                f"{node.where}: {name} of shape {list(value.shape)} must be {[n, per, *out]} "
                f"(offset_group {groups}, kernel {kernel}, output {out})"
            )
    bias_check(node, b, m)
    dtype = canonical(x.dtype)
    check_size(node, [n, m, *out], dtype)
    check_size(node, [n, c, k, p], dtype, "sampled columns")
    check_size(node, [k, p, rank], np.float64, "sampling points")
    work = work_dtype(x.dtype)
    points = _deform_points(kernel, out, strides, dilations, begin)  # (K, P, r)
    moves = jnp.asarray(offset).astype(work).reshape(n * groups, k, rank, p)
    taps = []
    for axis, size in enumerate(spatial):
        at = jnp.asarray(points[:, :, axis], work) + moves[:, :, axis, :]  # (n*g, K, P)
        index, weights = grid_taps(at.reshape(n * groups, k * p), size, "linear", "zeros", True)
        taps.append((index, weights))
    data = jnp.asarray(x).astype(work).reshape(n * groups, c // groups, *spatial)
    cols = sample_taps(node, data, taps, exact=False).reshape(n, groups, c // groups, k, p)
    if mask is not None:
        cols = cols * jnp.asarray(mask).astype(work).reshape(n, groups, 1, k, p)
    cols = cols.reshape(n, group, c // group, k, p)
    kernels = jnp.asarray(w).astype(work).reshape(group, m // group, c // group, k)
    y = jnp.einsum("ngckp,gmck->ngmp", cols, kernels, precision="highest").reshape(n, m, *out)
    if b is not None:
        y = y + jnp.asarray(b).astype(work).reshape((1, m) + (1,) * rank)
    return y.astype(dtype)


# ----------------------------------------------------------------------------- RoiAlign

_ROI_MODES = ("avg", "max")
_ROI_COORDINATES = ("half_pixel", "output_half_pixel")


def _roi_attrs(node: Node) -> tuple[str, bool, int, int, int, float]:
    mode = node.get("mode", "avg")
    # opset 10 has no coordinate_transformation_mode: its rois are output_half_pixel
    coordinates = node.get("coordinate_transformation_mode", "output_half_pixel")
    for name, value, allowed in (
        ("mode", mode, _ROI_MODES),
        ("coordinate_transformation_mode", coordinates, _ROI_COORDINATES),
    ):
        if value not in allowed:
            raise ValueError(
                f"{node.where}: {name} {value!r} is not one of {', '.join(map(repr, allowed))}"
            )
    height, width = int(node.get("output_height", 1)), int(node.get("output_width", 1))
    ratio = int(node.get("sampling_ratio", 0))
    if height < 1 or width < 1 or ratio < 0:
        raise ValueError(
            f"{node.where}: output_height {height} and output_width {width} must be positive, "
            f"sampling_ratio {ratio} non-negative"
        )
    scale = float(node.get("spatial_scale", 1.0))
    return mode, coordinates == "half_pixel", height, width, ratio, scale


def _roi_axis(
    start: Any, length: Any, bins: int, grid: Any, most: int, size: int
) -> tuple[Any, Any, Any]:
    """One axis of the sample points of every roi: indices and weights ``(R, bins, most, 2)``
    of the two pixels around each point, and which points exist (``(R, 1, most)``).

    Point ``j`` of bin ``b`` sits at ``start + (b + (j + 0.5) / grid) * length / bins``; one
    more than a pixel outside the axis reads 0; otherwise it is clamped to the axis.
    """
    step = length / bins  # (R,)
    j = jnp.arange(most, dtype=step.dtype)
    at = (
        start[:, None, None]
        + jnp.arange(bins, dtype=step.dtype)[None, :, None] * step[:, None, None]
        + (j[None, None, :] + 0.5) * (step / jnp.maximum(grid, 1))[:, None, None]
    )
    away = (at < -1.0) | (at > size)
    at = jnp.maximum(at, 0)
    low = jnp.floor(at)
    last = low >= size - 1
    low = jnp.where(last, size - 1, low)
    frac = jnp.where(last, 0, at - low)
    index = jnp.stack([low, jnp.minimum(low + 1, size - 1)], axis=-1).astype(np.int32)
    weights = jnp.where(away[..., None], 0, jnp.stack([1 - frac, frac], axis=-1))
    exists = j[None, None, :] < grid[:, None, None]
    return index, weights, exists


def _roi_pool_gathered(
    mode: str, x: Any, batch: Any, rows: Any, cols: Any, grid_h: Any, grid_w: Any
) -> Any:
    """avg or max over every bin's points, each point's four weighted pixels gathered."""
    (row_at, row_w, row_ok), (col_at, col_w, col_ok) = rows, cols
    n, c, h, w = x.shape
    r = row_at.shape[0]
    where = row_at[:, :, :, :, None, None, None] * w + col_at[:, None, None, None]
    weight = row_w[:, :, :, :, None, None, None] * col_w[:, None, None, None]
    pixels = x.transpose(0, 2, 3, 1).reshape(n * h * w, c)  # rows of channels
    first = batch.reshape(r, 1, 1, 1, 1, 1, 1) * (h * w)
    values = pixels[(first + where).reshape(r, -1)].reshape(*where.shape, c)
    values = values * weight[..., None]
    exists = (row_ok[:, :, :, None, None] & col_ok[:, None, None, :, :])[..., None]
    if mode == "avg":
        count = jnp.maximum(grid_h * grid_w, 1).astype(x.dtype).reshape(r, 1, 1, 1)
        y = jnp.where(exists, values.sum(axis=(3, 6)), 0).sum(axis=(2, 4)) / count
    else:
        best = jnp.where(exists, values.max(axis=(3, 6)), -jnp.inf).max(axis=(2, 4))
        y = jnp.where(jnp.any(exists, axis=(2, 4)), best, 0)
    return y.transpose(0, 3, 1, 2)


def _axis_weights(at: Any, weights: Any, exists: Any, grid: Any, size: int) -> Any:
    """``(R, bins, size)``: each pixel's weight summed over a bin's points, over their count."""
    r, bins, _, _ = at.shape
    share = jnp.where(exists[..., None], weights, 0) / jnp.maximum(grid, 1).reshape(r, 1, 1, 1)
    roi = jnp.arange(r, dtype=np.int32).reshape(r, 1, 1, 1)
    row = jnp.arange(bins, dtype=np.int32).reshape(1, bins, 1, 1)
    return jnp.zeros((r, bins, size), share.dtype).at[roi, row, at].add(share)


def _roi_average_separable(
    x: Any, batch: Any, rows: Any, cols: Any, grid_h: Any, grid_w: Any
) -> Any:
    """avg as ``A_h[r] @ X[batch[r], c] @ A_w[r]^T``: a point's weight is its row's weight times
    its column's (the points form a grid, one outside X when its row or column is), so the
    average needs no gather of every point (a bin of many points, sampling_ratio 0)."""
    n = x.shape[0]
    along_h = _axis_weights(rows[0], rows[1], rows[2], grid_h, x.shape[2])  # (R, out_h, H)
    along_w = _axis_weights(cols[0], cols[1], cols[2], grid_w, x.shape[3])  # (R, out_w, W)
    pick = (batch[:, None] == jnp.arange(n, dtype=np.int32)).astype(x.dtype)  # (R, N)
    weighted = jnp.einsum("rph,rn,nchw->rcpw", along_h, pick, x, precision="highest")
    return jnp.einsum("rcpw,rqw->rcpq", weighted, along_w, precision="highest")


@register("RoiAlign")
def _roi_align(node: Node, x: Any, rois: Any, batch_indices: Any) -> Any:
    """Per roi and output bin, the average (or max) of bilinear samples on a regular grid.

    ``roi = rois[r] * spatial_scale`` (less 0.5 with half_pixel); a bin is
    ``1/output`` of it; it holds ``sampling_ratio`` (else ``ceil(roi / output)``)
    points per axis. max takes, per point, the largest of its four weighted pixels,
    as onnxruntime does.
    """
    mode, half_pixel, out_h, out_w, ratio, scale = _roi_attrs(node)
    same_dtype(node, x, rois)
    if np.ndim(x) != 4:
        raise ValueError(f"{node.where}: X of shape {list(np.shape(x))} must be (N, C, H, W)")
    r = rois.shape[0] if np.ndim(rois) == 2 else -1
    if np.ndim(rois) != 2 or rois.shape[1] != 4 or tuple(np.shape(batch_indices)) != (r,):
        raise ValueError(
            f"{node.where}: rois of shape {list(np.shape(rois))} and batch_indices of shape "
            f"{list(np.shape(batch_indices))} must be (num_rois, 4) and (num_rois,)"
        )
    n, c, h, w = x.shape
    if h * w == 0 and r:
        raise ValueError(f"{node.where}: X of shape {list(x.shape)} has no pixels to sample")
    dtype = canonical(x.dtype)
    check_size(node, [r, c, out_h, out_w], dtype)
    check_at_run(
        f"{node.where}: batch_indices hold {{}}, outside [0, {n})",
        (batch_indices < 0) | (batch_indices >= n),
        batch_indices,
    )
    # onnxruntime: "All 'rois' values must be finite"
    check_at_run(f"{node.where}: rois hold {{}}, not finite", ~xp_of(rois).isfinite(rois), rois)
    if r == 0 or c == 0:
        return jnp.zeros((r, c, out_h, out_w), dtype)
    work = work_dtype(x.dtype)
    xp = np if isinstance(rois, np.ndarray) else jnp
    box = xp.asarray(rois).astype(work) * work.type(scale) - work.type(0.5 if half_pixel else 0)
    start_w, start_h, end_w, end_h = (box[:, i] for i in range(4))
    length_h, length_w = end_h - start_h, end_w - start_w
    if not half_pixel:
        length_h, length_w = xp.maximum(length_h, 1.0), xp.maximum(length_w, 1.0)
    most = []
    grids = []
    for length, bins, size, name in ((length_h, out_h, h, "height"), (length_w, out_w, w, "width")):
        if ratio:
            grids.append(xp.full(r, ratio, work))
            most.append(ratio)
            continue
        grid = xp.ceil(length / bins)
        # the points per bin are set by the rois: known ones give the most any needs, traced
        # ones get room for a roi as large as X, a larger one is refused after the run
        bound = int(np.max(grid)) if xp is np else -(-size // bins)
        most.append(max(bound, 1))
        check_at_run(
            f"{node.where}: a roi needs {{}} sampling points per bin along the {name}, more "
            f"than the {most[-1]} its rois, traced, were given room for (rois within X); "
            "set sampling_ratio",
            grid > most[-1],
            grid.astype(np.int32),
        )
        grids.append(grid)
    check_size(node, [r, max(out_h, out_w), max(most), 2], work, "sampling points")
    grid_h, grid_w = (jnp.asarray(g) for g in grids)
    rows = _roi_axis(jnp.asarray(start_h), jnp.asarray(length_h), out_h, grid_h, most[0], h)
    cols = _roi_axis(jnp.asarray(start_w), jnp.asarray(length_w), out_w, grid_w, most[1], w)
    data = jnp.asarray(x).astype(work)
    batch = jnp.asarray(batch_indices).astype(np.int32).clip(0, n - 1)
    gathered = r * out_h * most[0] * 4 * out_w * most[1] * c
    separable = r * c * out_h * w + r * n * out_h * h
    if mode == "avg" and gathered > 4 * separable:  # many points per bin: X's rows weighted
        check_size(node, [r, c, out_h, w], work, "weighted rows")
        y = _roi_average_separable(data, batch, rows, cols, grid_h, grid_w)
    else:
        check_size(node, [r, out_h, most[0], 2, out_w, most[1], 2, c], work, "sampled pixels")
        y = _roi_pool_gathered(mode, data, batch, rows, cols, grid_h, grid_w)
    return y.astype(dtype)
