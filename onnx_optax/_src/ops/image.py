"""Image ops of ai.onnx: Resize, Upsample (Resize of opset 10), GridSample and AffineGrid.

Resize is separable: each resized axis is one gather of a few taps per output
position and their weighted sum. The taps and weights (nearest, linear, cubic,
with antialias and ``exclude_outside``) are computed on the host from the
output shape, so the output shape, and with it ``scales``, ``sizes`` and
``roi``, must be known while tracing: XLA compiles static shapes. The gather is
differentiable in the input, so a Resize trains like any other op.

GridSample samples at traced points (the grid): the taps of all points are
gathered at once (``sampling.sample_taps``, also DeformConv's and RoiAlign's
in ``spatial``), differentiable in X and in the grid. AffineGrid transforms a base
grid, computed on the host from the static size, by theta.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from onnx_optax._src.ops.arrays import check_size, check_vector, norm_axes
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.sampling import grid_taps, sample_taps, work_dtype
from onnx_optax._src.ops.values import canonical

_MODES = ("nearest", "linear", "cubic")
_COORDINATES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "tf_crop_and_resize",
)
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_POLICIES = ("stretch", "not_larger", "not_smaller")


def _attrs(node: Node) -> tuple[str, str, str]:
    mode = node.get("mode", "nearest")
    if node.opset < 11:  # opset 10: asymmetric coordinates, onnxruntime's nearest pixel
        coordinates, nearest = "asymmetric", "simple"
    else:
        coordinates = node.get("coordinate_transformation_mode", "half_pixel")
        nearest = node.get("nearest_mode", "round_prefer_floor")
    for name, value, allowed in (
        ("mode", mode, _MODES),
        ("coordinate_transformation_mode", coordinates, _COORDINATES),
        ("nearest_mode", nearest, (*_NEAREST, "simple")),
        ("keep_aspect_ratio_policy", node.get("keep_aspect_ratio_policy", "stretch"), _POLICIES),
    ):
        if value not in allowed:
            raise ValueError(
                f"{node.where}: {name} {value!r} is not one of {', '.join(map(repr, allowed))}"
            )
    if coordinates == "tf_half_pixel_for_nn" and node.opset >= 13:
        raise ValueError(
            f"{node.where}: coordinate_transformation_mode 'tf_half_pixel_for_nn' "
            "was removed at opset 13"
        )
    if coordinates == "half_pixel_symmetric" and node.opset < 19:
        raise ValueError(
            f"{node.where}: coordinate_transformation_mode 'half_pixel_symmetric' needs opset 19"
        )
    return mode, coordinates, nearest


def _given(value: Any) -> bool:
    """An optional input that is present and not empty (opset 11 passes empty scales)."""
    return value is not None and np.size(value) > 0


def _known(value: Any) -> np.ndarray | None:
    return np.asarray(value) if _given(value) else None


def _plan(
    node: Node, shape: tuple[int, ...], scales: Any, sizes: Any, roi: Any
) -> tuple[list[float], list[int], list[tuple[float, float]]]:
    """Per axis: the scale, the output length and the region (start, end) of the input."""
    rank = len(shape)
    axes_attr = node.get("axes")
    axes = list(range(rank)) if axes_attr is None else list(norm_axes(axes_attr, rank, node.where))
    if (scales is None) == (sizes is None):
        raise ValueError(f"{node.where}: give exactly one of scales and sizes")
    given = scales if scales is not None else sizes
    if given.size != len(axes):
        raise ValueError(
            f"{node.where}: {'scales' if scales is not None else 'sizes'} hold {given.size} "
            f"values for {len(axes)} axes of an input of shape {list(shape)}"
        )
    factors = [1.0] * rank
    lengths = list(shape)
    if scales is not None:
        values = [float(s) for s in scales.reshape(-1)]
        if any(not s > 0 or not math.isfinite(s) for s in values):
            raise ValueError(f"{node.where}: scales {values} must be positive and finite")
        for axis, s in zip(axes, values, strict=True):
            factors[axis] = s
            lengths[axis] = math.floor(shape[axis] * s)
    else:
        wanted = [int(s) for s in sizes.reshape(-1)]
        if any(s < 0 for s in wanted):
            raise ValueError(f"{node.where}: sizes {wanted} hold a negative size")
        if any(shape[a] == 0 and s > 0 for a, s in zip(axes, wanted, strict=True)):
            raise ValueError(f"{node.where}: cannot resize an empty axis to {wanted}")
        ratios = [s / shape[a] if shape[a] else 1.0 for a, s in zip(axes, wanted, strict=True)]
        policy = node.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            one = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [one] * len(axes)
            wanted = [int(one * shape[a] + 0.5) for a in axes]
        for axis, s, r in zip(axes, wanted, ratios, strict=True):
            if r <= 0 and shape[axis]:  # onnxruntime: "Scale value should be greater than 0"
                raise ValueError(
                    f"{node.where}: sizes {[int(v) for v in sizes.reshape(-1)]} ({policy}) give "
                    f"axis {axis} of size {shape[axis]} the scale {r}; it must be positive"
                )
            factors[axis], lengths[axis] = r, s
    regions = [(0.0, 1.0)] * rank
    if roi is not None:
        values = [float(v) for v in roi.reshape(-1)]
        if len(values) != 2 * len(axes):
            raise ValueError(
                f"{node.where}: roi holds {len(values)} values; it needs 2 x {len(axes)} (a start "
                "and an end per axis)"
            )
        for i, axis in enumerate(axes):
            regions[axis] = (values[i], values[i + len(axes)])
    return factors, lengths, regions


def _source(
    mode: str, out: np.ndarray, scale: float, n_in: int, n_out: int, region: tuple[float, float]
) -> np.ndarray:
    """The input coordinate of each output position (``coordinate_transformation_mode``).

    ``width`` is the output length before rounding (``scale * n_in`` from scales):
    align_corners and tf_crop_and_resize divide by it, as onnx's reference does
    (onnxruntime divides by the rounded length, which differs when the product is
    not whole).
    """
    width = scale * n_in
    if mode == "half_pixel":
        return (out + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        return offset + (out + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (out + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(out)
    if mode == "align_corners":
        return out * (n_in - 1) / (width - 1) if width != 1 else np.zeros_like(out)
    if mode == "asymmetric":
        return out / scale
    if mode == "tf_half_pixel_for_nn":
        return (out + 0.5) / scale
    start, end = region  # tf_crop_and_resize
    if width != 1:
        return start * (n_in - 1) + out * (end - start) * (n_in - 1) / (width - 1)
    return np.full_like(out, start * (n_in - 1) + (end - start) * (n_in - 1) / 2)


def _nearest(mode: str, x: np.ndarray, scale: float) -> np.ndarray:
    if mode == "round_prefer_floor":
        return np.ceil(x - 0.5)
    if mode == "round_prefer_ceil":
        return np.floor(x + 0.5)
    if mode == "floor":
        return np.floor(x)
    if mode == "ceil":
        return np.ceil(x)
    return np.ceil(x) if scale < 1 else np.trunc(x)  # simple (opset 10)


def _kernel(mode: str, a: float, t: np.ndarray) -> np.ndarray:
    """The linear (support 1) or cubic (Keys, support 2) kernel at distances ``t``."""
    t = np.abs(t)
    if mode == "linear":
        return np.clip(1 - t, 0, 1)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _taps(
    node: Node, interpolation: str, x: np.ndarray, n_in: int, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """Indices and weights, each ``[n_out, taps]``, of the inputs each output sums."""
    support = 1 if interpolation == "linear" else 2
    stretch = min(scale, 1.0) if node.get("antialias", 0) else 1.0
    first = math.floor(-support / stretch) + 1
    offsets = np.arange(first, 2 - first)
    base = np.floor(x)
    ratio = x - base
    whole = ratio == 0  # an integer coordinate counts as 1 past the pixel before it
    base = np.where(whole, base - 1, base)
    ratio = np.where(whole, 1.0, ratio)
    weights = _kernel(
        interpolation,
        float(node.get("cubic_coeff_a", -0.75)),
        stretch * (offsets[None, :] - ratio[:, None]),
    )
    weights = weights / weights.sum(axis=1, keepdims=True)
    index = base[:, None].astype(np.int64) + offsets[None, :]
    if node.get("exclude_outside", 0):
        weights = np.where((index < 0) | (index >= n_in), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return np.clip(index, 0, n_in - 1), weights


def _resize_axis(
    node: Node,
    y: Any,
    axis: int,
    n_out: int,
    scale: float,
    region: tuple[float, float],
    mode: str,
    coordinates: str,
    nearest: str,
    dtype: np.dtype,
) -> Any:
    n_in = y.shape[axis]
    x = _source(coordinates, np.arange(n_out, dtype=np.float64), scale, n_in, n_out, region)
    outside = (x < 0) | (x > n_in - 1) if coordinates == "tf_crop_and_resize" else None
    if mode == "nearest":
        index = np.clip(_nearest(nearest, x, scale), 0, max(n_in - 1, 0)).astype(np.int64)
        out = jnp.take(y, index, axis=axis)
    else:
        index, weights = _taps(node, mode, x, n_in, scale)
        shape = [*y.shape[:axis], n_out, index.shape[1], *y.shape[axis + 1 :]]
        check_size(node, shape, dtype, "intermediate")
        gathered = jnp.take(y, index.reshape(-1), axis=axis).reshape(shape)
        w = weights.reshape([n_out, index.shape[1]] + [1] * (y.ndim - axis - 1)).astype(dtype)
        out = (gathered * w).sum(axis=axis + 1)
    if outside is not None and outside.any():
        mask = outside.reshape([n_out] + [1] * (y.ndim - axis - 1))
        fill = np.asarray(node.get("extrapolation_value", 0.0), dtype)
        out = jnp.where(mask, fill, out)
    return out


@register("Resize", static=(1, 2, 3))
def _resize(node: Node, x: Any, roi: Any = None, scales: Any = None, sizes: Any = None) -> Any:
    """Resize of opsets 10 to 19 (opset 10: ``X, scales``; later: ``X, roi, scales, sizes``)."""
    if node.opset < 11:
        scales, roi = roi, None
    mode, coordinates, nearest = _attrs(node)
    scales_ = _known(scales)
    sizes_ = _known(sizes)
    roi_ = _known(roi) if coordinates == "tf_crop_and_resize" else None
    if coordinates == "tf_crop_and_resize" and roi_ is None:
        raise ValueError(
            f"{node.where}: coordinate_transformation_mode 'tf_crop_and_resize' needs roi"
        )
    shape = tuple(np.shape(x))
    factors, lengths, regions = _plan(node, shape, scales_, sizes_, roi_)
    check_size(node, lengths, x.dtype)
    dtype = np.dtype(x.dtype)
    integer = not np.issubdtype(dtype, np.floating)
    work = dtype if dtype.itemsize >= 4 and not integer else np.dtype(np.float32)
    work = canonical(work)
    y = jnp.asarray(x)
    if mode != "nearest":
        y = y.astype(work)
    for axis in range(len(shape)):
        identity = (
            lengths[axis] == shape[axis]
            and factors[axis] == 1.0
            and regions[axis] == (0.0, 1.0)
            and coordinates != "tf_half_pixel_for_nn"
        )
        if identity:
            continue
        y = _resize_axis(
            node,
            y,
            axis,
            lengths[axis],
            factors[axis],
            regions[axis],
            mode,
            coordinates,
            nearest,
            work if mode != "nearest" else canonical(dtype),
        )
    if mode != "nearest" and integer:
        info = np.iinfo(dtype)
        y = jnp.clip(jnp.round(y), info.min, info.max)
    return y.astype(canonical(dtype))


# ----------------------------------------------------------------------------- GridSample

# GridSample samples X at one point per output position, given by the grid. Each point is
# a few taps per spatial axis (1 nearest, 2 linear, 4 cubic); their combinations are
# gathered from X flattened over its spatial axes (one gather of all taps of all points)
# and summed with the products of the axes' weights. The coordinates are traced values, so
# the output is differentiable in X and, for linear and cubic, in the grid.

_GRID_MODES = {16: ("bilinear", "nearest", "bicubic"), 20: ("linear", "nearest", "cubic")}
_GRID_PADDING = ("zeros", "border", "reflection")


def _grid_attrs(node: Node) -> tuple[str, str, bool]:
    """The mode (its opset 20 name), padding_mode and align_corners of a GridSample."""
    allowed = _GRID_MODES[16 if node.opset < 20 else 20]
    mode = node.get("mode", allowed[0])
    padding = node.get("padding_mode", "zeros")
    for name, value, choices in (("mode", mode, allowed), ("padding_mode", padding, _GRID_PADDING)):
        if value not in choices:
            raise ValueError(
                f"{node.where}: {name} {value!r} is not one of {', '.join(map(repr, choices))} "
                f"at opset {node.opset}"
            )
    align = int(node.get("align_corners", 0))
    if align not in (0, 1):
        raise ValueError(f"{node.where}: align_corners {align} must be 0 or 1")
    return {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode), padding, bool(align)


def _grid_shapes(node: Node, x: Any, grid: Any) -> None:
    rank = np.ndim(x) - 2
    if rank < 1 or np.ndim(grid) != rank + 2 or grid.shape[0] != x.shape[0]:
        raise ValueError(
            f"{node.where}: X of shape {list(np.shape(x))} and grid of shape "
            f"{list(np.shape(grid))} must be (N, C, D1, ..., Dr) and (N, D1_out, ..., Dr_out, r)"
        )
    if grid.shape[-1] != rank:
        raise ValueError(
            f"{node.where}: grid of shape {list(grid.shape)} must end in {rank} coordinates "
            f"for X's {rank} spatial axes"
        )
    if node.opset < 20 and rank != 2:
        raise ValueError(
            f"{node.where}: GridSample at opset {node.opset} takes 4-D X; N-D needs opset 20"
        )


@register("GridSample")
def _grid_sample(node: Node, x: Any, grid: Any) -> Any:
    """``Y[n, c, o] = sum_taps w * X[n, c, taps(u(grid[n, o]))]``, ``u`` the pixel coordinate.

    grid holds normalized coordinates in reverse axis order (``grid[..., 0]`` is
    the last axis): ``u = (g + 1) / 2 * (size - 1)`` with align_corners, else
    ``u = ((g + 1) * size - 1) / 2``; :func:`grid_taps` gives each axis' taps.
    """
    mode, padding, align = _grid_attrs(node)
    _grid_shapes(node, x, grid)
    if np.issubdtype(np.dtype(x.dtype), np.complexfloating) or np.dtype(x.dtype).kind in "OSU":
        raise TypeError(f"{node.where}: GridSample of X of type {x.dtype} is not supported")
    n, c, *spatial = x.shape
    out_spatial = list(grid.shape[1:-1])
    dtype = canonical(x.dtype)
    check_size(node, [n, c, *out_spatial], dtype)
    if math.prod([n, c, *out_spatial]) == 0 or math.prod(spatial) == 0:
        return jnp.zeros((n, c, *out_spatial), dtype)
    work = work_dtype(x.dtype, grid.dtype)
    q = math.prod(out_spatial)
    points = jnp.asarray(grid).astype(work).reshape(n, q, len(spatial))
    taps = []
    for axis, size in enumerate(spatial):
        g = points[:, :, len(spatial) - 1 - axis]
        u = (g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2
        taps.append(grid_taps(u, size, mode, padding, align))
    exact = mode == "nearest"
    data = jnp.asarray(x) if exact else jnp.asarray(x).astype(work)
    y = sample_taps(node, data, taps, exact)
    return y.reshape(n, c, *out_spatial).astype(dtype)


# ----------------------------------------------------------------------------- AffineGrid


def _base_axis(size: int, align: bool) -> np.ndarray:
    """Normalized pixel centers of an axis: ``linspace(-1, 1, size)`` with align_corners,
    else ``(2i + 1) / size - 1``."""
    if align:
        return np.linspace(-1.0, 1.0, size) if size > 1 else np.full(size, -1.0)
    return (2 * np.arange(size) + 1) / size - 1


@register("AffineGrid", static=(1,))
def _affine_grid(node: Node, theta: Any, size: Any) -> Any:
    """``grid[n, d, h, w] = theta[n] @ (x_w, y_h, z_d, 1)``, the normalized base grid
    transformed (2-D: ``theta`` (N, 2, 3) and size (N, C, H, W); 3-D: (N, 3, 4), 5 sizes)."""
    check_vector(node, size, "size")
    dims = [int(d) for d in np.asarray(size).reshape(-1)]
    align = int(node.get("align_corners", 0))
    if align not in (0, 1):
        raise ValueError(f"{node.where}: align_corners {align} must be 0 or 1")
    if len(dims) not in (4, 5) or any(d < 0 for d in dims):
        raise ValueError(
            f"{node.where}: size {dims} must be (N, C, H, W) or (N, C, D, H, W), non-negative"
        )
    rank = len(dims) - 2
    if tuple(np.shape(theta)) != (dims[0], rank, rank + 1):
        raise ValueError(
            f"{node.where}: theta of shape {list(np.shape(theta))} must be "
            f"{[dims[0], rank, rank + 1]} for size {dims}"
        )
    spatial = dims[2:]
    dtype = canonical(theta.dtype)
    check_size(node, [dims[0], *spatial, rank], dtype)
    check_size(node, [*spatial, rank + 1], np.float64, "base grid")
    axes = [_base_axis(s, bool(align)) for s in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")
    base = np.stack([*mesh[::-1], np.ones(spatial)], axis=-1).reshape(-1, rank + 1)
    work = work_dtype(theta.dtype)
    grid = jnp.einsum(
        "pk,nik->npi",
        jnp.asarray(base, work),
        jnp.asarray(theta).astype(work),
        precision="highest",
    )
    return grid.reshape(dims[0], *spatial, rank).astype(dtype)


# ----------------------------------------------------------------------------- Upsample


@register("Upsample", static=(1,))
def _upsample(node: Node, x: Any, scales: Any = None) -> Any:
    """Resize of opset 10 (asymmetric coordinates, nearest or linear) by ``scales``: the
    attribute before opset 9, the input after (the op is deprecated since opset 10)."""
    if node.opset < 7:
        raise ValueError(f"{node.where}: Upsample before opset 7 (experimental) is not supported")
    if node.opset < 9:
        scales = np.asarray(node["scales"], np.float32)
    mode = {"bilinear": "linear"}.get(node["mode"], node["mode"])
    if mode not in ("nearest", "linear"):
        raise ValueError(f"{node.where}: mode {node['mode']!r} is not 'nearest' or 'linear'")
    if scales is None or np.size(scales) != np.ndim(x):
        raise ValueError(
            f"{node.where}: scales must hold one factor per axis of X of shape "
            f"{list(np.shape(x))}, got {None if scales is None else np.asarray(scales).tolist()}"
        )
    factors = np.asarray(scales, np.float32).reshape(-1)
    if not np.all(factors >= 1):  # onnxruntime: "Scale value should be greater than or equal to 1"
        raise ValueError(
            f"{node.where}: scales {factors.tolist()}: Upsample needs each at least 1 (and finite)"
        )
    as_resize = dataclasses.replace(node, attrs={**node.attrs, "mode": mode}, opset=10)
    return _resize(as_resize, x, np.asarray(scales, np.float32))
