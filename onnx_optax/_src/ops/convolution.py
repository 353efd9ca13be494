"""How a convolution is computed (Conv, and ConvInteger and QLinearConv through it).

The lowering choices live here, on the CPU: small groups as shifted multiply-adds
(:func:`shifted_conv`), large groups, 1x1 kernels and small convolutions as one
matrix product of the stacked taps (:func:`patches_conv`), the rest channels-last
(:func:`channels_last_conv`); XLA's own elsewhere (:func:`native_conv`).
:func:`convolve` checks a Conv node's geometry and picks one (:func:`grouped_conv`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src.ops.arrays import check_size, same_dtype
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.windows import (
    bias_check,
    conv_window,
    group_of,
    kernel_of,
    pads_or_auto_pad,
    window_spans,
)


class Geometry(NamedTuple):
    """Where a convolution's taps read X (N, C, ...): per spatial axis the stride, the
    (begin, end) pads (negative: a crop), X's dilation (a ConvTranspose's strides) and the
    kernel's; and the groups."""

    strides: Sequence[int]
    padding: Sequence[tuple[int, int]]
    lhs_dilation: Sequence[int]
    dilations: Sequence[int]
    group: int

    def on_axes(self, kept: Sequence[int]) -> Geometry:
        """The geometry of the spatial axes ``kept`` (0-based) alone."""
        return Geometry(
            [self.strides[d] for d in kept],
            [self.padding[d] for d in kept],
            [self.lhs_dilation[d] for d in kept],
            [self.dilations[d] for d in kept],
            self.group,
        )


# Grouped convolutions on CPU: XLA:CPU's native grouped conv (feature_group_count > 1)
# runs 3-33x slower than the same sum written as shifted multiply-adds, and its
# gradient 2-110x slower (benchmarks/grouped_conv.py). On CPU a group of at most
# SHIFTED_CHANNELS input channels, whose window has at most SHIFTED_TERMS taps x
# channels, is therefore lowered as that sum; a group of more channels as a matrix
# product batched over the groups (``patches_conv``), if its window has at most
# SHIFTED_TERMS taps: as one product a tap it was 2-3x faster than native for 1x1
# kernels, 0.8x native's forward for 3x3, but a gradient 50x faster. (At 8 channels a
# group the products' forward was 2-3x slower than the sum's.) Elsewhere (GPU) the
# native conv.
SHIFTED_CHANNELS = 8
SHIFTED_TERMS = 128


# Every lowering here computes the same values; which one runs is a matter of speed. The
# graphs compile for JAX's default backend (``graph.jit.jit_graph``), so on a CPU-only
# JAX the CPU's lowering is the one traced: ``lax.platform_dependent`` traced and
# differentiated every branch, 6.2 of the 11 s that tracing PaddleOCR's classifier's
# training step took. Elsewhere, or inside ``every_platform()`` (lowering for another
# platform than the default, as an export for a GPU made on a CPU), both branches.
_EVERY_PLATFORM: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "every_platform", default=False
)


@contextlib.contextmanager
def every_platform() -> Iterator[None]:
    """Convolutions traced meanwhile hold each platform's lowering (see ``by_platform``)."""
    token = _EVERY_PLATFORM.set(True)
    try:
        yield
    finally:
        _EVERY_PLATFORM.reset(token)


def by_platform(*args: Any, cpu: Callable[..., Any], default: Callable[..., Any]) -> Any:
    """``cpu(*args)`` where the graphs compile for the CPU (JAX's default backend), else
    ``lax.platform_dependent`` of both lowerings."""
    if jax.default_backend() == "cpu" and not _EVERY_PLATFORM.get():
        return cpu(*args)
    return lax.platform_dependent(*args, cpu=cpu, default=default)


def native_conv(
    x: Any,
    w: Any,
    geometry: Geometry,
    channels_last: bool = False,
) -> Any:
    """XLA's conv of X (N, C, ...) by W (M, C/group, ...), the axes ``_flat_axes`` names
    dropped; ``channels_last``: through ``channels_last_conv``."""
    # The barrier keeps XLA from seeing a weight that is a broadcast constant (an
    # exporter's ConstantOfShape): XLA:CPU then lowered the conv followed by a reduction
    # to code that read garbage (NaN, 0 or -3.9e34 instead of the mean; light_squeezenet's
    # last GlobalAveragePool came out 0 or inf). For a weight that is an argument it
    # changes nothing.
    squeezed = _without_flat_axes(
        lambda x, w, g: native_conv(x, w, g, channels_last), x, w, geometry, first=2
    )
    if squeezed is not None:
        return squeezed
    if channels_last:
        return channels_last_conv(x, w, geometry)
    return lax.conv_general_dilated(
        x,
        lax.optimization_barrier(w),
        window_strides=geometry.strides,
        padding=geometry.padding,
        lhs_dilation=geometry.lhs_dilation,
        rhs_dilation=geometry.dilations,
        feature_group_count=geometry.group,
    )


def channels_last_conv(
    x: Any,
    w: Any,
    geometry: Geometry,
) -> Any:
    """``native_conv`` computed channels-last: y = T_back(conv(T_x(x), T_w(w))).

    X (N, C, ...) is transposed to (N, ..., C), W (M, C/group, ...) to (..., C/group, M),
    XLA convolves those (dimension numbers NHWC, HWIO, NHWC and their 1-D and 3-D
    analogues) and the result goes back to (N, M, ...). XLA:CPU runs a convolution of
    a kernel larger than 1x1 1.5x faster so (light_resnet50: 80 against 53 ms).

    The barrier is on W's transpose (then XLA folds the transpose of a constant weight
    at compile time) and on the result: without the latter XLA:CPU fused a conv whose
    weight is a broadcast constant with the reduction that follows into one YNNPACK
    fusion, dropping the barrier on the weight, and read garbage (light_squeezenet's
    mean came out -8e28, its softmax NaN; tests/graph/test_xla_cpu.py).
    """
    n = x.ndim - 2
    y = nhwc_native_conv(jnp.transpose(x, (0, *range(2, 2 + n), 1)), w, geometry)
    return jnp.transpose(y, (0, n + 1, *range(1, n + 1)))


def _with_tap_products_for_w(conv: Any, geometry: Geometry) -> Any:
    """``conv`` (channels-last X (N, ..., C) by W (..., C, M), one group) whose gradient
    with respect to W is one matrix product a tap: dW[tap] = X_tap^T dY, X_tap the
    strided slice of the padded X the tap reads, both viewed as (positions, channels).

    JAX's own rule writes dW as a convolution over the batch, which XLA:CPU ran through
    transposes of X and dY with the batch innermost (magika's training step at batch 64:
    110 of its 750 ms in two such copies). So the tangent of y in W is written as the
    products sum_tap X_tap dW[tap], whose transpose JAX takes for the gradient; the
    tangent in X stays JAX's conv. A JVP rule: forward mode (jax.jvp, hessian) works too.
    """

    def taps_times(x: Any, dw: Any) -> Any:
        """sum over the taps of X_tap (positions, C) times dW[tap] (C, M): conv(x, dw)."""
        kernel = dw.shape[:-2]
        windows, out = padded_windows(x, kernel, geometry, channels_last=True)
        rows = x.shape[0] * math.prod(out)
        y = None
        for tap, window in zip(
            itertools.product(*(range(k) for k in kernel)), windows, strict=True
        ):
            term = window.reshape((rows, window.shape[-1])) @ dw[tap]
            y = term if y is None else y + term
        assert y is not None  # a kernel has at least one tap
        return y.reshape((x.shape[0], *out, dw.shape[-1]))

    @jax.custom_jvp
    def tapped(x: Any, w: Any) -> Any:
        return conv(x, w)

    @tapped.defjvp
    def tangent(primals: Any, tangents: Any) -> tuple[Any, Any]:
        (x, w), (dx, dw) = primals, tangents
        return conv(x, w), conv(dx, w) + taps_times(x, dw).astype(x.dtype)

    return tapped


def _without_flat_axes(
    conv: Callable[[Any, Any, Geometry], Any], x: Any, w: Any, geometry: Geometry, first: int
) -> Any:
    """``conv`` of X (its spatial axes from ``first`` on) and W with the axes
    ``_flat_axes`` names dropped, put back in Y; None where there are none."""
    spatial = x.shape[first : first + w.ndim - 2]
    flat = _flat_axes(jax.ShapeDtypeStruct((1, 1, *spatial), x.dtype), w, geometry.padding)
    if not flat:
        return None
    kept = [d for d in range(len(spatial)) if d not in flat]
    y = conv(
        jnp.squeeze(x, [first + d for d in flat]),
        jnp.squeeze(w, [2 + d for d in flat]),
        geometry.on_axes(kept),
    )
    return jnp.expand_dims(y, [first + d for d in flat])


def _flat_axes(x: Any, w: Any, padding: Sequence[tuple[int, int]]) -> list[int]:
    """The spatial axes (0-based) that X and W both hold one element of, unpadded: a conv
    computes the same without them, its output holding one element there too.

    XLA:CPU runs a conv with such an axis 3-4x slower, and its gradient likewise, than
    the same conv without it: magika's 1-D conv, written on [N, 256, 512, 1] with a
    [512, 256, 5, 1] kernel, took 288 ms at batch 8 against 80 ms on [N, 256, 512]
    (forward and gradient: 848 against 234 ms). At least one spatial axis is kept.
    """
    flat = [
        d
        for d, (size, k, pad) in enumerate(zip(x.shape[2:], w.shape[2:], padding, strict=True))
        if size == 1 and k == 1 and tuple(pad) == (0, 0)
    ]
    return flat if len(flat) < x.ndim - 2 else flat[1:]


def output_sizes(spatial: Sequence[int], kernel: Sequence[int], geometry: Geometry) -> list[int]:
    """The output's spatial sizes: windows of the kernel's span in X dilated and padded."""
    return [
        ((size - 1) * ld + 1 + lo + hi - span) // s + 1
        for size, ld, (lo, hi), span, s in zip(
            spatial,
            geometry.lhs_dilation,
            geometry.padding,
            window_spans(kernel, geometry.dilations),
            geometry.strides,
            strict=True,
        )
    ]


def padded_windows(
    x: Any, kernel: Sequence[int], geometry: Geometry, channels_last: bool = False
) -> tuple[list[Any], list[int]]:
    """The strided slice of X (N, C, ...; ``channels_last``: N, ..., C) each tap of the
    kernel reads, and the output's spatial size.

    X is dilated by ``lhs_dilation`` and padded (a negative pad crops) first; the taps
    come in W's row-major order (``itertools.product`` over the kernel's axes).
    """
    strides, padding, lhs_dilation, dilations, _ = geometry
    first = 1 if channels_last else 2  # the first spatial axis
    spatial = slice(first, first + len(kernel))
    out = output_sizes(x.shape[spatial], kernel, geometry)
    config = [(0, 0, 0)] * x.ndim
    config[spatial] = [(lo, hi, d - 1) for (lo, hi), d in zip(padding, lhs_dilation, strict=True)]
    x = lax.pad(x, np.zeros((), x.dtype), config)
    windows = []
    for tap in itertools.product(*(range(k) for k in kernel)):
        starts, ends, steps = [0] * x.ndim, list(x.shape), [1] * x.ndim
        starts[spatial] = [t * d for t, d in zip(tap, dilations, strict=True)]
        ends[spatial] = [
            b + (o - 1) * s + 1 for b, o, s in zip(starts[spatial], out, strides, strict=True)
        ]
        steps[spatial] = strides
        windows.append(lax.slice(x, starts, ends, steps))
    return windows, out


def in_float32(rewrite: Any) -> Any:
    """A rewritten conv whose inputs narrower than float32 are computed in float32 (as
    XLA's native conv sums them), the result cast back."""

    @functools.wraps(rewrite)
    def wide(x: Any, w: Any, geometry: Geometry, **options: Any) -> Any:
        if jnp.finfo(x.dtype).bits >= 32:
            return rewrite(x, w, geometry, **options)
        wide_x, wide_w = x.astype(jnp.float32), w.astype(jnp.float32)
        return rewrite(wide_x, wide_w, geometry, **options).astype(x.dtype)

    return wide


@in_float32
def shifted_conv(
    x: Any,
    w: Any,
    geometry: Geometry,
) -> Any:
    """``native_conv`` as a sum over the window's taps of strided slices times weights.

    For each tap and each input channel of a group, the slice of X the tap reads at
    every output position (``padded_windows``) is multiplied by that tap's weights of
    the group's M/group output channels. XLA fuses the sum into one loop; the gradient
    is JAX's transpose of it.
    """
    n, (m, per_group), kernel = x.shape[0], w.shape[:2], w.shape[2:]
    group = geometry.group
    windows, out = padded_windows(x, kernel, geometry)
    w = w.reshape((group, m // group, per_group, *kernel))
    ones = (1,) * len(kernel)
    y = None
    for tap, window in zip(itertools.product(*(range(k) for k in kernel)), windows, strict=True):
        taps = w[(slice(None), slice(None), slice(None), *tap)]  # (group, M/group, C/group)
        # each input channel of a group apart (split: its gradient is one concatenation)
        channels = lax.split(window.reshape((n, group, per_group, *out)), [1] * per_group, 2)
        for c, xc in enumerate(channels):
            term = xc * taps[:, :, c].reshape((1, group, m // group, *ones))
            y = term if y is None else y + term
    assert y is not None  # a kernel has at least one tap
    return y.reshape((n, m, *out))


@in_float32
def patches_conv(
    x: Any,
    w: Any,
    geometry: Geometry,
    channels_last: bool = False,
) -> Any:
    """``native_conv`` as one matrix product (im2col): y = W' . P.

    P (group, C/group x taps, N x positions) stacks the slices each tap reads
    (``padded_windows``) of X with its batch axis moved after its channels; W' is W
    (M, C/group, ...) as (group, M/group, C/group x taps); the product is batched over
    the groups. (Stacked with the batch first, XLA:CPU copied the whole stack once more
    at batch > 1 to put it in that order: MTCNN rnet's forward at batch 8 took 0.70x the
    time without that copy, onet's 0.78x, light_squeezenet's at batch 4 0.86x.) A 1x1
    kernel needs no stacking: the product is W (M, C) by X (C, positions) of each
    sample, X as it lies. XLA:CPU runs such a product through its matrix
    kernels, 1.5-8x faster than its own convolution for 1x1 kernels and for kernels
    over few output positions (ResNet-50's 1x1 convs at 7x7 and 14x14).

    ``channels_last`` (one group; for an X that is a transpose of a channels-last
    tensor, see ``reads_channels_last``): the taps' slices of X (N, ..., C) stacked
    innermost, P (N x positions, C x taps) by W (M, C x taps) as it is, the product
    (N, ..., M) moved back to (N, M, ...). The stacking then reads X's rows as they lie;
    channels-first, XLA:CPU fused the transpose and whatever computed X into it, read
    through the transpose for every tap (magika's 5 taps: 0.85 of its 3.2 ms at batch 1).
    """
    n, (m, per_group), kernel = x.shape[0], w.shape[:2], w.shape[2:]
    group = geometry.group
    if channels_last:
        assert group == 1
        return jnp.moveaxis(nhwc_patches(jnp.moveaxis(x, 1, -1), w, geometry), -1, 1)
    taps = math.prod(kernel)
    w = w.reshape((group, m // group, per_group * taps))
    if taps == 1:  # X as it lies, (N, group, C/group, positions)
        windows, out = padded_windows(x, kernel, geometry)
        patches = windows[0].reshape((n, group, per_group, math.prod(out)))
        y = lax.dot_general(w, patches, (((2,), (2,)), ((0,), (1,))))  # (group, M/group, N, P)
        return jnp.moveaxis(y, 2, 0).reshape((n, m, *out))
    # stacked (C, taps, N, ...), the order the product reads it (see above)
    windows, out = padded_windows(jnp.moveaxis(x, 0, 1), kernel, geometry)
    patches = _stacked(windows, kernel, 1).reshape((group, per_group * taps, -1))
    y = lax.dot_general(w, patches, (((2,), (1,)), ((0,), (0,))))  # (group, M/group, N x P)
    return jnp.moveaxis(y.reshape((m, n, *out)), 1, 0)


# XLA:CPU fuses a concatenation of at most 8 operands with what computes them; the 9
# taps of a 3x3 kernel were 9 slices copied one by one and then concatenated, 10 kernels
# where one does (MTCNN rnet's two 3x3 convs: 18 of its 25 kernels). Stacks of at most
# STACKED_IN_ONE elements are therefore stacked in two steps of at most 8 (each kernel
# row's taps, then the rows), which XLA fuses into one kernel. Alone, by 3x3: 0.72x the
# time on [1, 28, 11, 11], the same on [1, 16, 55, 55], 1.36x on [1, 64, 56, 56]. In
# whole models at batch 1: MTCNN rnet 0.60x, onet 0.94x, the others within 2%; with
# stacks of up to 256K elements onet was 1.14x.
STACKED_IN_ONE = 1 << 15
FUSED_OPERANDS = 8


def _stacked(windows: list[Any], kernel: Sequence[int], axis: int) -> Any:
    """The taps' windows stacked on a new ``axis`` (1: after X's channels, in windows
    of X laid out (C, N, ...); -1, or -2: before the channels of windows (N, ..., C)),
    in their order."""
    if len(windows) == 1:
        return windows[0]
    inner = kernel[-1]
    if (
        len(windows) <= FUSED_OPERANDS
        or len(windows) * math.prod(windows[0].shape) > STACKED_IN_ONE
        or not 1 < inner <= FUSED_OPERANDS
        or len(windows) // inner > FUSED_OPERANDS
    ):
        return jnp.stack(windows, axis=axis)
    rows = [jnp.stack(windows[i : i + inner], axis=axis) for i in range(0, len(windows), inner)]
    if axis == -1:  # (..., C, taps): each row's taps innermost, then the rows before them
        stacked = jnp.stack(rows, axis=-2)
        return stacked.reshape((*stacked.shape[:-2], len(windows)))
    if axis == -2:  # (..., taps, C): the rows before each row's taps
        stacked = jnp.stack(rows, axis=-3)
        return stacked.reshape((*stacked.shape[:-3], len(windows), stacked.shape[-1]))
    stacked = jnp.stack(rows, axis=axis)  # (C, rows, inner, N, ...)
    return stacked.reshape((*stacked.shape[:axis], len(windows), *stacked.shape[axis + 2 :]))


# On CPU a conv of one group is a matrix product (``patches_conv``) when its kernel is
# 1x1 or its stacked taps hold at most PATCHES_ELEMENTS elements (N x C x taps x output
# positions); beyond, XLA's own conv, channels-last, which keeps no stacked copy of X
# (the product's gradient keeps one in a training step). Measured in whole models: at
# batch 1 the product was as fast or faster everywhere (light_squeezenet 5.0 to 4.0 ms,
# MTCNN onet 0.55 to 0.48 ms); in training steps at batch 8 with 5M elements stacked
# (magika's 1-D convs) it was 10% slower.
PATCHES_ELEMENTS = 1 << 21


def grouped_conv(
    x: Any,
    w: Any,
    geometry: Geometry,
    x_channels_last: bool = False,
) -> Any:
    """A (possibly grouped) conv: on CPU shifted multiply-adds for small groups (see
    SHIFTED_CHANNELS), a matrix product for large groups, 1x1 kernels and few stacked
    taps (see PATCHES_ELEMENTS; stacked channels-last where ``x_channels_last`` says X
    is a transpose of a channels-last tensor), else XLA's own, channels-last; XLA's own
    elsewhere."""
    per_group, taps = w.shape[1], math.prod(w.shape[2:])
    if not _float(x) or x.ndim < 3 or 0 in x.shape or 0 in w.shape:
        return native_conv(x, w, geometry)
    if geometry.group == 1:
        positions = math.prod(output_sizes(x.shape[2:], w.shape[2:], geometry))
        stacked = x.shape[0] * x.shape[1] * taps * positions
        undilated = all(d == 1 for d in geometry.lhs_dilation)
        if taps == 1 or (stacked <= PATCHES_ELEMENTS and undilated):
            cpu = functools.partial(patches_conv, channels_last=x_channels_last)
        elif x.ndim - 2 <= 3:
            return by_platform(
                x,
                w,
                cpu=lambda x, w: native_conv(x, w, geometry, channels_last=True),
                default=lambda x, w: native_conv(x, w, geometry),
            )
        else:
            return native_conv(x, w, geometry)
    elif per_group <= SHIFTED_CHANNELS and per_group * taps <= SHIFTED_TERMS:
        cpu = shifted_conv
    elif taps <= SHIFTED_TERMS:
        cpu = patches_conv
    else:
        return native_conv(x, w, geometry)
    return by_platform(
        x,
        w,
        cpu=lambda x, w: cpu(x, w, geometry),
        default=lambda x, w: native_conv(x, w, geometry),
    )


def _float(x: Any) -> bool:
    """Whether x holds floats (XLA's convolutions, not the shifted sums, take the rest)."""
    return bool(jnp.issubdtype(x.dtype, jnp.floating))


# The fewest channels for which a conv reads a channels-last X so: MTCNN's first conv
# (3 channels, each position's 3 values apart from the next tap's) ran 6% slower so.
CHANNELS_LAST_CHANNELS = 16


def reads_channels_last(node: Node, x: Any) -> bool:
    """Whether X (N, C, ...) is the output of a Transpose whose input holds it
    channels-last (N, ..., C, axes of size 1 anywhere): an exporter's idiom (tf2onnx
    writes one before every Conv). X read channels-last is then that input as it is."""
    perm = node.input_perms[0] if node.input_perms else None
    rank = np.ndim(x)
    if perm is None or rank < 3 or x.shape[1] < CHANNELS_LAST_CHANNELS:
        return False
    perm = perm or tuple(range(rank))[::-1]
    if sorted(perm) != list(range(rank)):
        return False  # the Transpose itself refuses it
    source = [1] * rank  # the Transpose's input's shape
    for axis, size in zip(perm, np.shape(x), strict=True):
        source[axis] = size
    order = [perm[0], *perm[2:], perm[1]]  # its axes as X channels-last reads them
    kept = [axis for axis in order if source[axis] != 1]
    return kept == sorted(kept)


def conv_geometry(node: Node, x: Any, w: Any, b: Any = None) -> Geometry:
    """A Conv node's geometry, checked against X (N, C, ...; anything with a shape and a
    dtype), W and B as onnxruntime checks them; the output's size within the limit."""
    pads_or_auto_pad(node)
    same_dtype(node, x, w, b)
    if len(x.shape) < 3 or np.ndim(w) != len(x.shape):
        raise ValueError(
            f"{node.where}: Conv needs X (N, C, ...) and W of the same rank, got shapes "
            f"{list(x.shape)} and {list(np.shape(w))}"
        )
    kernel = kernel_of(node, w)
    strides, dilations, padding = conv_window(node, x, kernel)
    group = group_of(node)
    m = w.shape[0]
    if x.shape[1] != w.shape[1] * group or m % group:
        raise ValueError(
            f"{node.where}: X of shape {list(x.shape)} and W of shape {list(w.shape)} do not "
            f"fit group {group} (X's channels must be W.shape[1] x group, W.shape[0] a multiple "
            "of group)"
        )
    bias_check(node, b, m)
    out = [x.shape[0], m]
    spans = window_spans(kernel, dilations)
    for size, s, span, (lo, hi) in zip(x.shape[2:], strides, spans, padding, strict=True):
        if size + lo + hi < span:  # onnxruntime: "Invalid input shape"
            raise ValueError(
                f"{node.where}: the kernel {kernel} (dilations {dilations}) spans more than X of "
                f"shape {list(x.shape)} padded by {padding}"
            )
        out.append((size + lo + hi - span) // s + 1)
    check_size(node, out, x.dtype)
    return Geometry(strides, padding, [1] * len(kernel), dilations, group)


def convolve(node: Node, x: Any, w: Any, b: Any = None) -> Any:
    geometry = conv_geometry(node, x, w, b)
    y = grouped_conv(x, w, geometry, reads_channels_last(node, x))
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * (y.ndim - 2))
    return y


def nhwc_native_conv(x: Any, w: Any, geometry: Geometry, tap_products: bool = True) -> Any:
    """XLA's conv of X (N, ..., C) by W (M, C/group, ...), Y (N, ..., M): dimension numbers
    NHWC, HWIO, NHWC (and their 1-D and 3-D analogues). One group and ``tap_products``
    (for XLA:CPU): its gradient in W one product a tap (``_with_tap_products_for_w``).
    The barrier on W's transpose: see ``channels_last_conv``, as the barrier on the
    result. The axes ``_flat_axes`` names are dropped first, as ``native_conv`` drops
    them (magika's training step at batch 8 took 179 against 129 ms with them)."""
    squeezed = _without_flat_axes(
        lambda x, w, g: nhwc_native_conv(x, w, g, tap_products), x, w, geometry, first=1
    )
    if squeezed is not None:
        return squeezed
    n = x.ndim - 2
    spatial = "DHW"[3 - n :]
    numbers = ("N" + spatial + "C", spatial + "IO", "N" + spatial + "C")
    w = lax.optimization_barrier(jnp.transpose(w, (*range(2, 2 + n), 1, 0)))

    def conv(x: Any, w: Any) -> Any:
        return lax.conv_general_dilated(
            x,
            w,
            window_strides=geometry.strides,
            padding=geometry.padding,
            lhs_dilation=geometry.lhs_dilation,
            rhs_dilation=geometry.dilations,
            feature_group_count=geometry.group,
            dimension_numbers=numbers,
        )

    if tap_products and geometry.group == 1 and all(d == 1 for d in geometry.lhs_dilation):
        return lax.optimization_barrier(_with_tap_products_for_w(conv, geometry)(x, w))
    return lax.optimization_barrier(conv(x, w))


@in_float32
def nhwc_patches(x: Any, w: Any, geometry: Geometry) -> Any:
    """A conv of one group on X (N, ..., C) as one product (im2col): the taps' slices
    stacked before the channels, P (N x positions, taps x C), by W moved to
    (M, taps x C). Each tap's slice is then copied a row of C at a time: stacked
    innermost (C x taps, W as it lies) a 3x3 conv [1, 16, 55, 55] took 0.91 against
    0.49 ms."""
    (m, per_group), kernel = w.shape[:2], w.shape[2:]
    windows, out = padded_windows(x, kernel, geometry, channels_last=True)
    rows = _stacked(windows, kernel, -2).reshape((-1, len(windows) * per_group))
    w = jnp.transpose(w, (0, *range(2, w.ndim), 1)).reshape((m, -1))
    y = lax.dot_general(rows, w, (((1,), (1,)), ((), ())))
    return y.reshape((x.shape[0], *out, m))
