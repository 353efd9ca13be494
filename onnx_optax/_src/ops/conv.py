"""Convolutions and pools of ai.onnx: Conv, ConvTranspose, the pools and MaxUnpool.

Each op checks its geometry (kernel, strides, dilations, pads, groups) in Python ints
and computes its output shape before lax is called. The lowering choices live beside
the op (``_grouped_conv``), on the CPU: small groups as shifted multiply-adds
(``_shifted_conv``), large groups, 1x1 kernels and small convolutions as one matrix
product of the stacked taps (``_patches_conv``), the rest channels-last
(``_channels_last_conv``); XLA's own elsewhere (``_native_conv``). A new convolution
or pool goes here.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src.ops.arrays import cast_to, check_at_run, check_size, check_vector, same_dtype
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import canonical, is_static

# ----------------------------------------------------------------------------- conv and pools
#
# Every geometry is checked and the output shape computed in Python ints before lax is
# called: a zero or negative stride, dilation, kernel or group, a negative pad, a window
# larger than the padded input and an output over the tensor limit are refused with the
# node, the attribute and the shapes (onnxruntime refuses each of them too), instead of a
# ZeroDivisionError, an XLA abort on an overflowing shape or an empty or shifted result.


def _attr_ints(node: Node, name: str, n: int, default: int, minimum: int) -> list[int]:
    """An ints attribute of ``n`` entries (``default`` each when absent), each >= ``minimum``;
    an empty one is given, of the wrong size (as onnx's shape inference, run by onnxruntime)."""
    given = node.get(name)
    values = [int(v) for v in given] if given is not None else [default] * n
    if len(values) != n:
        raise ValueError(
            f"{node.where}: {name} {values} has {len(values)} entries; {n} expected "
            f"({n // 2 if name == 'pads' else n} spatial axes)"
        )
    if any(v < minimum for v in values):
        bound = "positive" if minimum == 1 else "non-negative"
        raise ValueError(f"{node.where}: {name} {values} must all be {bound}")
    return values


def _spans(kernel: Sequence[int], dilations: Sequence[int]) -> list[int]:
    """Each window's extent over the (padded) input: (k - 1) * d + 1."""
    return [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]


def _window(node: Node, x: Any, kernel: Sequence[int]) -> tuple[Any, Any, Any]:
    """Strides, dilations and (begin, end) pads of a conv or pool over x's spatial axes."""
    n = len(kernel)
    if np.ndim(x) != n + 2:
        raise ValueError(
            f"{node.where}: X of shape {list(np.shape(x))} has {np.ndim(x) - 2} spatial axes, "
            f"the kernel {list(kernel)} has {n}"
        )
    if any(k < 1 for k in kernel):
        raise ValueError(f"{node.where}: kernel_shape {list(kernel)} must all be positive")
    spatial = x.shape[2:]
    strides = _attr_ints(node, "strides", n, 1, 1)
    dilations = _attr_ints(node, "dilations", n, 1, 1)
    pads = _attr_ints(node, "pads", 2 * n, 0, 0)
    auto_pad = node.get("auto_pad", "NOTSET")
    padding = [(pads[i], pads[i + n]) for i in range(n)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        padding = []
        for size, s, span in zip(spatial, strides, _spans(kernel, dilations), strict=True):
            total = max((-(-size // s) - 1) * s + span - size, 0)
            small, big = total // 2, total - total // 2
            padding.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
    elif auto_pad == "VALID":
        padding = [(0, 0)] * n
    elif auto_pad != "NOTSET":
        raise ValueError(f"{node.where}: unknown auto_pad {auto_pad!r}")
    return strides, dilations, padding


def _group(node: Node) -> int:
    group = int(node["group"])
    if group < 1:
        raise ValueError(f"{node.where}: group {group} must be positive")
    return group


def _kernel_of(node: Node, w: Any) -> list[int]:
    """The kernel: W's spatial dims, which a kernel_shape attribute must repeat."""
    kernel = [int(d) for d in w.shape[2:]]
    given = node.get("kernel_shape")
    if given is not None and [int(k) for k in given] != kernel:
        raise ValueError(
            f"{node.where}: kernel_shape {list(given)} does not match W of shape {list(w.shape)}"
        )
    return kernel


def _bias_check(node: Node, b: Any, m: int) -> None:
    if b is not None and tuple(np.shape(b)) != (m,):
        raise ValueError(
            f"{node.where}: B of shape {list(np.shape(b))} must be 1-D of the {m} output channels"
        )


def _empty(shape: Sequence[int], dtype: Any) -> Any:
    """An output with a zero dimension (onnxruntime's result for a window with no position)."""
    return jnp.zeros(tuple(shape), dtype)


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
# product batched over the groups (``_patches_conv``), if its window has at most
# SHIFTED_TERMS taps: as one product a tap it was 2-3x faster than native for 1x1
# kernels, 0.8x native's forward for 3x3, but a gradient 50x faster. (At 8 channels a
# group the products' forward was 2-3x slower than the sum's.) Elsewhere (GPU) the
# native conv.
SHIFTED_CHANNELS = 8
SHIFTED_TERMS = 128


def _native_conv(
    x: Any,
    w: Any,
    geometry: Geometry,
    channels_last: bool = False,
) -> Any:
    """XLA's conv of X (N, C, ...) by W (M, C/group, ...), the axes ``_flat_axes`` names
    dropped; ``channels_last``: through ``_channels_last_conv``."""
    # The barrier keeps XLA from seeing a weight that is a broadcast constant (an
    # exporter's ConstantOfShape): XLA:CPU then lowered the conv followed by a reduction
    # to code that read garbage (NaN, 0 or -3.9e34 instead of the mean; light_squeezenet's
    # last GlobalAveragePool came out 0 or inf). For a weight that is an argument it
    # changes nothing.
    flat = _flat_axes(x, w, geometry.padding)
    if flat:
        kept = [d for d in range(len(geometry.strides)) if d not in flat]
        squeezed = _native_conv(
            jnp.squeeze(x, [2 + d for d in flat]),
            jnp.squeeze(w, [2 + d for d in flat]),
            geometry.on_axes(kept),
            channels_last,
        )
        return jnp.expand_dims(squeezed, [2 + d for d in flat])
    if channels_last:
        return _channels_last_conv(x, w, geometry)
    return lax.conv_general_dilated(
        x,
        lax.optimization_barrier(w),
        window_strides=geometry.strides,
        padding=geometry.padding,
        lhs_dilation=geometry.lhs_dilation,
        rhs_dilation=geometry.dilations,
        feature_group_count=geometry.group,
    )


def _channels_last_conv(
    x: Any,
    w: Any,
    geometry: Geometry,
) -> Any:
    """``_native_conv`` computed channels-last: y = T_back(conv(T_x(x), T_w(w))).

    X (N, C, ...) is transposed to (N, ..., C), W (M, C/group, ...) to (..., C/group, M),
    XLA convolves those (dimension numbers NHWC, HWIO, NHWC and their 1-D and 3-D
    analogues) and the result goes back to (N, M, ...). XLA:CPU runs a convolution of
    a kernel larger than 1x1 1.5x faster so (light_resnet50: 80 against 53 ms).

    The barrier is on W's transpose (then XLA folds the transpose of a constant weight
    at compile time) and on the result: without the latter XLA:CPU fused a conv whose
    weight is a broadcast constant with the reduction that follows into one YNNPACK
    fusion, dropping the barrier on the weight, and read garbage (light_squeezenet's
    mean came out -8e28, its softmax NaN; tests/test_xla_cpu.py).
    """
    n = x.ndim - 2
    spatial = "DHW"[3 - n :]
    numbers = ("N" + spatial + "C", spatial + "IO", "N" + spatial + "C")
    w = lax.optimization_barrier(jnp.transpose(w, (*range(2, 2 + n), 1, 0)))
    x = jnp.transpose(x, (0, *range(2, 2 + n), 1))

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

    if geometry.group == 1 and all(d == 1 for d in geometry.lhs_dilation):
        y = _with_tap_products_for_w(conv, geometry)(x, w)
    else:
        y = conv(x, w)
    return lax.optimization_barrier(jnp.transpose(y, (0, n + 1, *range(1, n + 1))))


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
        windows, out = _padded_windows(x, kernel, geometry, channels_last=True)
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


def _output_sizes(spatial: Sequence[int], kernel: Sequence[int], geometry: Geometry) -> list[int]:
    """The output's spatial sizes: windows of the kernel's span in X dilated and padded."""
    return [
        ((size - 1) * ld + 1 + lo + hi - span) // s + 1
        for size, ld, (lo, hi), span, s in zip(
            spatial,
            geometry.lhs_dilation,
            geometry.padding,
            _spans(kernel, geometry.dilations),
            geometry.strides,
            strict=True,
        )
    ]


def _padded_windows(
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
    out = _output_sizes(x.shape[spatial], kernel, geometry)
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


def _in_float32(rewrite: Any) -> Any:
    """A rewritten conv whose inputs narrower than float32 are computed in float32 (as
    XLA's native conv sums them), the result cast back."""

    @functools.wraps(rewrite)
    def wide(x: Any, w: Any, geometry: Geometry, **options: Any) -> Any:
        if jnp.finfo(x.dtype).bits >= 32:
            return rewrite(x, w, geometry, **options)
        wide_x, wide_w = x.astype(jnp.float32), w.astype(jnp.float32)
        return rewrite(wide_x, wide_w, geometry, **options).astype(x.dtype)

    return wide


@_in_float32
def _shifted_conv(
    x: Any,
    w: Any,
    geometry: Geometry,
) -> Any:
    """``_native_conv`` as a sum over the window's taps of strided slices times weights.

    For each tap and each input channel of a group, the slice of X the tap reads at
    every output position (``_padded_windows``) is multiplied by that tap's weights of
    the group's M/group output channels. XLA fuses the sum into one loop; the gradient
    is JAX's transpose of it.
    """
    n, (m, per_group), kernel = x.shape[0], w.shape[:2], w.shape[2:]
    group = geometry.group
    windows, out = _padded_windows(x, kernel, geometry)
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


@_in_float32
def _patches_conv(
    x: Any,
    w: Any,
    geometry: Geometry,
    channels_last: bool = False,
) -> Any:
    """``_native_conv`` as one matrix product (im2col): y = W' . P.

    P (group, C/group x taps, N x positions) stacks the slices each tap reads
    (``_padded_windows``) of X with its batch axis moved after its channels; W' is W
    (M, C/group, ...) as (group, M/group, C/group x taps); the product is batched over
    the groups. (Stacked with the batch first, XLA:CPU copied the whole stack once more
    at batch > 1 to put it in that order: MTCNN rnet's forward at batch 8 took 0.70x the
    time without that copy, onet's 0.78x, light_squeezenet's at batch 4 0.86x.) A 1x1
    kernel needs no stacking: the product is W (M, C) by X (C, positions) of each
    sample, X as it lies. XLA:CPU runs such a product through its matrix
    kernels, 1.5-8x faster than its own convolution for 1x1 kernels and for kernels
    over few output positions (ResNet-50's 1x1 convs at 7x7 and 14x14).

    ``channels_last`` (one group; for an X that is a transpose of a channels-last
    tensor, see ``_reads_channels_last``): the taps' slices of X (N, ..., C) stacked
    innermost, P (N x positions, C x taps) by W (M, C x taps) as it is, the product
    (N, ..., M) moved back to (N, M, ...). The stacking then reads X's rows as they lie;
    channels-first, XLA:CPU fused the transpose and whatever computed X into it, read
    through the transpose for every tap (magika's 5 taps: 0.85 of its 3.2 ms at batch 1).
    """
    n, (m, per_group), kernel = x.shape[0], w.shape[:2], w.shape[2:]
    group = geometry.group
    if channels_last:
        assert group == 1
        windows, out = _padded_windows(jnp.moveaxis(x, 1, -1), kernel, geometry, channels_last=True)
        patches = _stacked(windows, kernel, -1)
        rows = patches.reshape((-1, per_group * len(windows)))  # (N x positions, C x taps)
        y = lax.dot_general(rows, w.reshape((m, -1)), (((1,), (1,)), ((), ())))
        return jnp.moveaxis(y.reshape((n, *out, m)), -1, 1)
    taps = math.prod(kernel)
    w = w.reshape((group, m // group, per_group * taps))
    if taps == 1:  # X as it lies, (N, group, C/group, positions)
        windows, out = _padded_windows(x, kernel, geometry)
        patches = windows[0].reshape((n, group, per_group, math.prod(out)))
        y = lax.dot_general(w, patches, (((2,), (2,)), ((0,), (1,))))  # (group, M/group, N, P)
        return jnp.moveaxis(y, 2, 0).reshape((n, m, *out))
    # stacked (C, taps, N, ...), the order the product reads it (see above)
    windows, out = _padded_windows(jnp.moveaxis(x, 0, 1), kernel, geometry)
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
    of X laid out (C, N, ...); or -1), in their order."""
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
    stacked = jnp.stack(rows, axis=axis)  # (C, rows, inner, N, ...)
    return stacked.reshape((*stacked.shape[:axis], len(windows), *stacked.shape[axis + 2 :]))


# On CPU a conv of one group is a matrix product (``_patches_conv``) when its kernel is
# 1x1 or its stacked taps hold at most PATCHES_ELEMENTS elements (N x C x taps x output
# positions); beyond, XLA's own conv, channels-last, which keeps no stacked copy of X
# (the product's gradient keeps one in a training step). Measured in whole models: at
# batch 1 the product was as fast or faster everywhere (light_squeezenet 5.0 to 4.0 ms,
# MTCNN onet 0.55 to 0.48 ms); in training steps at batch 8 with 5M elements stacked
# (magika's 1-D convs) it was 10% slower.
PATCHES_ELEMENTS = 1 << 21


def _grouped_conv(
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
        return _native_conv(x, w, geometry)
    if geometry.group == 1:
        positions = math.prod(_output_sizes(x.shape[2:], w.shape[2:], geometry))
        stacked = x.shape[0] * x.shape[1] * taps * positions
        undilated = all(d == 1 for d in geometry.lhs_dilation)
        if taps == 1 or (stacked <= PATCHES_ELEMENTS and undilated):
            cpu = functools.partial(_patches_conv, channels_last=x_channels_last)
        elif x.ndim - 2 <= 3:
            return lax.platform_dependent(
                x,
                w,
                cpu=lambda x, w: _native_conv(x, w, geometry, channels_last=True),
                default=lambda x, w: _native_conv(x, w, geometry),
            )
        else:
            return _native_conv(x, w, geometry)
    elif per_group <= SHIFTED_CHANNELS and per_group * taps <= SHIFTED_TERMS:
        cpu = _shifted_conv
    elif taps <= SHIFTED_TERMS:
        cpu = _patches_conv
    else:
        return _native_conv(x, w, geometry)
    return lax.platform_dependent(
        x,
        w,
        cpu=lambda x, w: cpu(x, w, geometry),
        default=lambda x, w: _native_conv(x, w, geometry),
    )


def _float(x: Any) -> bool:
    """Whether x holds floats (XLA's convolutions, not the shifted sums, take the rest)."""
    return bool(jnp.issubdtype(x.dtype, jnp.floating))


# The fewest channels for which a conv reads a channels-last X so: MTCNN's first conv
# (3 channels, each position's 3 values apart from the next tap's) ran 6% slower so.
CHANNELS_LAST_CHANNELS = 16


def _reads_channels_last(node: Node, x: Any) -> bool:
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


def _pads_or_auto_pad(node: Node) -> None:
    """Conv's (ConvTranspose's, ConvInteger's, QLinearConv's) pads and auto_pad exclude each
    other, as the spec says and onnxruntime checks."""
    auto_pad, pads = node.get("auto_pad", "NOTSET"), node.get("pads")
    if auto_pad != "NOTSET" and pads is not None:
        raise ValueError(
            f"{node.where}: auto_pad {auto_pad!r} and pads {list(pads)} cannot be given together"
        )


@register("Conv")
def _conv(node: Node, x: Any, w: Any, b: Any = None) -> Any:
    _pads_or_auto_pad(node)
    same_dtype(node, x, w, b)
    if np.ndim(x) < 3 or np.ndim(w) != np.ndim(x):
        raise ValueError(
            f"{node.where}: Conv needs X (N, C, ...) and W of the same rank, got shapes "
            f"{list(np.shape(x))} and {list(np.shape(w))}"
        )
    kernel = _kernel_of(node, w)
    strides, dilations, padding = _window(node, x, kernel)
    group = _group(node)
    m = w.shape[0]
    if x.shape[1] != w.shape[1] * group or m % group:
        raise ValueError(
            f"{node.where}: X of shape {list(x.shape)} and W of shape {list(w.shape)} do not "
            f"fit group {group} (X's channels must be W.shape[1] x group, W.shape[0] a multiple "
            "of group)"
        )
    _bias_check(node, b, m)
    out = [x.shape[0], m]
    spans = _spans(kernel, dilations)
    for size, s, span, (lo, hi) in zip(x.shape[2:], strides, spans, padding, strict=True):
        if size + lo + hi < span:  # onnxruntime: "Invalid input shape"
            raise ValueError(
                f"{node.where}: the kernel {kernel} (dilations {dilations}) spans more than X of "
                f"shape {list(x.shape)} padded by {padding}"
            )
        out.append((size + lo + hi - span) // s + 1)
    check_size(node, out, x.dtype)
    geometry = Geometry(strides, padding, [1] * len(kernel), dilations, group)
    y = _grouped_conv(x, w, geometry, _reads_channels_last(node, x))
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * (y.ndim - 2))
    return y


def _transpose_geometry(
    node: Node, x: Any, kernel: Sequence[int], w_out: int
) -> tuple[list[int], list[int], list[tuple[int, int]], list[int], list[int]]:
    """Strides, dilations, pads, output_padding and output size of a ConvTranspose.

    As onnxruntime: an ``output_shape`` larger than the natural size is reached by
    zeros at the end (pads stay 0); ``output_padding`` plus that excess must stay
    below the stride (else no forward Conv of the output gives back X's size), and
    every output dimension must be positive.
    """
    n = np.ndim(x) - 2
    _pads_or_auto_pad(node)
    strides, dilations, padding = _window(node, x, kernel)
    output_padding = _attr_ints(node, "output_padding", n, 0, 0)
    auto_pad = node.get("auto_pad", "NOTSET")
    output_shape = node.get("output_shape")
    if output_shape is not None:
        output_shape = [int(v) for v in output_shape]
        if len(output_shape) != n or any(v < 0 for v in output_shape):
            raise ValueError(
                f"{node.where}: output_shape {output_shape} must give the {n} spatial "
                "dimensions, none negative"
            )
    pads: list[tuple[int, int]] = []
    sizes: list[int] = []
    naturals: list[int] = []
    for i, (size, s, span, adj) in enumerate(
        zip(x.shape[2:], strides, _spans(kernel, dilations), output_padding, strict=True)
    ):
        natural = s * (size - 1) + adj + span
        excess = 0
        if output_shape is not None:
            total = natural - output_shape[i]
            excess = max(-total, 0)
            total = max(total, 0)
            first = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pads.append((first, total - first))
            sizes.append(output_shape[i])
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            total = natural - size * s  # below 0 (a kernel shorter than the stride): as the spec
            first = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pads.append((first, total - first))
            sizes.append(size * s)
        else:
            lo, hi = (0, 0) if auto_pad == "VALID" else padding[i]
            pads.append((lo, hi))
            sizes.append(natural - lo - hi)
        if adj + excess >= s:  # no forward Conv of the output would give back X's size
            beyond = "" if output_shape is None else f" plus output_shape {output_shape}'s excess"
            raise ValueError(
                f"{node.where}: output_padding {output_padding}{beyond} must stay below the "
                f"strides {strides} for X of shape {list(x.shape)}"
            )
        naturals.append(natural)
        if sizes[-1] <= 0:
            raise ValueError(
                f"{node.where}: X of shape {list(x.shape)} with kernel {list(kernel)}, strides "
                f"{strides}, dilations {dilations} and pads {pads[-1]} gives an output dimension "
                f"of {sizes[-1]}"
            )
    # XLA shapes the whole dilated input before the pads crop it: an overflowing length aborts
    check_size(node, [x.shape[0], w_out, *naturals], x.dtype, "uncropped output")
    return strides, dilations, pads, output_padding, sizes


@register("ConvTranspose")
def _conv_transpose(node: Node, x: Any, w: Any, b: Any = None) -> Any:
    same_dtype(node, x, w, b)
    if np.ndim(x) < 3 or np.ndim(w) != np.ndim(x):
        raise ValueError(
            f"{node.where}: ConvTranspose needs X (N, C, ...) and W of the same rank, got "
            f"shapes {list(np.shape(x))} and {list(np.shape(w))}"
        )
    n = np.ndim(x) - 2
    kernel = _kernel_of(node, w)
    group = _group(node)
    c_in, m_per_group = w.shape[0], w.shape[1]
    if x.shape[1] != c_in or c_in % group:
        raise ValueError(
            f"{node.where}: X of shape {list(x.shape)} and W of shape {list(w.shape)} do not "
            f"fit group {group} (W.shape[0] must be X's channels, a multiple of group)"
        )
    _bias_check(node, b, m_per_group * group)
    strides, dilations, pads, _, sizes = _transpose_geometry(node, x, kernel, m_per_group * group)
    check_size(node, [x.shape[0], m_per_group * group, *sizes], x.dtype)
    # W (C, M/g, k...) -> (M, C/g, k...), spatially flipped: a dilated forward conv
    kernel_w = w.reshape((group, c_in // group, m_per_group, *w.shape[2:]))
    kernel_w = jnp.swapaxes(kernel_w, 1, 2).reshape(
        (group * m_per_group, c_in // group, *w.shape[2:])
    )
    kernel_w = jnp.flip(kernel_w, axis=tuple(range(2, 2 + n)))
    spans = _spans(kernel, dilations)
    padding = []
    for size, s, span, (lo, _), out in zip(x.shape[2:], strides, spans, pads, sizes, strict=True):
        before = span - 1 - lo
        # the dilated input (s * (size - 1) + 1) padded to give `out` windows of `span`
        padding.append((before, out + span - 1 - before - (s * (size - 1) + 1)))
    y = _grouped_conv(x, kernel_w, Geometry([1] * n, padding, strides, dilations, group))
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * n)
    return y


def _pooled_input(node: Node, x: Any) -> None:
    """onnxruntime's rule for every pool: X is (N, C, D1, ...) and only N may be zero."""
    if np.ndim(x) < 3:
        raise ValueError(f"{node.where}: X of shape {list(np.shape(x))} needs (N, C, D1, ...)")
    if x.shape[0] and 0 in x.shape[1:]:
        raise ValueError(
            f"{node.where}: X of shape {list(x.shape)} is empty; only its batch axis may be 0"
        )


def _pool_geometry(
    node: Node, x: Any
) -> tuple[list[int], list[int], list[int], list[Any], list[Any], list[int]]:
    """Kernel, strides, dilations, pads, the extra end pads past them, the output's spatial size.

    Output sizes as onnxruntime computes them: ``(L - span) / s`` rounded toward
    zero (up with ceil_mode), plus 1, where L is the padded length. A window larger
    than the padded input thus still gives one window while ``L - span > -s`` (it
    reads past the pads, as a ceil_mode window does: the extra end pads, never
    counted), none at exactly ``-s``, and is refused below. With ceil_mode a last
    window starting in the end padding is dropped.
    """
    _pooled_input(node, x)
    kernel = [int(k) for k in node["kernel_shape"]]
    strides, dilations, padding = _window(node, x, kernel)
    given = [int(p) for p in node.get("pads") or []]
    if any(p >= kernel[i % len(kernel)] for i, p in enumerate(given)):
        raise ValueError(  # as onnxruntime: a window could lie wholly in the padding
            f"{node.where}: pads {given} must be smaller than kernel_shape {kernel}"
        )
    auto_pad = node.get("auto_pad", "NOTSET")
    ceil = bool(node.get("ceil_mode", 0))
    extra, sizes = [], []
    for axis, (size, s, span, (lo, hi)) in enumerate(
        zip(x.shape[2:], strides, _spans(kernel, dilations), padding, strict=True)
    ):
        # The spec's SAME pad, clamped at 0 by _window. Below 0 the windows skip X's end;
        # onnxruntime pads need / 2 (SAME_UPPER) or (need + 1) / 2 in front, rounded toward
        # zero: when that is negative it starts AveragePool's windows late and refuses MaxPool.
        need = (-(-size // s) - 1) * s + span - size
        front = need if auto_pad == "SAME_UPPER" else need + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER") and front <= -2:
            raise ValueError(
                f"{node.where}: auto_pad {auto_pad} needs a negative pad ({need}) on spatial "
                f"axis {axis} of X of shape {list(x.shape)} (kernel_shape {kernel}, strides "
                f"{strides}, dilations {dilations}); give explicit pads instead"
            )
        length = size + lo + hi
        room = length - span  # onnxruntime: room / s (toward zero, or up) + 1 windows
        out = (-(-room // s) if ceil or room < 0 else room // s) + 1
        if out < 0:
            raise ValueError(
                f"{node.where}: the window (kernel_shape {kernel}, dilations {dilations}) is "
                f"larger than X of shape {list(x.shape)} padded by {padding}"
            )
        if ceil and out > 0 and (out - 1) * s >= size + lo:  # starts in the end padding
            out -= 1
        sizes.append(out)
        extra.append((0, max((out - 1) * s + span - length, 0)))
    return kernel, strides, dilations, padding, extra, sizes


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


@register("MaxPool")
def _max_pool(node: Node, x: Any) -> Any:
    order = int(node.get("storage_order", 0))
    if order not in (0, 1):  # onnxruntime refuses any other
        raise ValueError(
            f"{node.where}: storage_order {order} must be 0 (row major) or 1 (column major)"
        )
    kernel, strides, dilations, padding, extra, sizes = _pool_geometry(node, x)
    out_shape = [*x.shape[:2], *sizes]
    check_size(node, out_shape, x.dtype)
    if node.n_outputs > 1:
        check_size(node, out_shape, np.int64, "Indices output")
    if 0 in out_shape:
        return (_empty(out_shape, x.dtype), cast_to(np.zeros(out_shape, np.int64), np.int64))[
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
def _average_pool(node: Node, x: Any) -> Any:
    """The windows' sums (``lax.reduce_window`` in x's dtype) over their element counts.

    The count of a window is a product of 1-D counts, one per spatial axis, each
    a small in-graph ``reduce_window`` over ones: the input's positions, or with
    ``count_include_pad`` the padded ones (never ceil_mode's extra end). A count
    that is the same for every window is one number.
    """
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{node.where}: AveragePool needs a floating-point X, got {x.dtype}")
    include = bool(node.get("count_include_pad", 0))
    kernel, strides, dilations, padding, extra, sizes = _pool_geometry(node, x)
    out_shape = [*x.shape[:2], *sizes]
    check_size(node, out_shape, x.dtype)
    if 0 in out_shape:
        return _empty(out_shape, x.dtype)
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
    _pooled_input(node, x)
    return jnp.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@register("GlobalMaxPool")
def _global_max_pool(node: Node, x: Any) -> Any:
    _pooled_input(node, x)
    if x.shape[0] == 0:
        return _empty([*x.shape[:2]] + [1] * (x.ndim - 2), x.dtype)
    return jnp.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@register("MaxUnpool", static=(2,))
def _max_unpool(node: Node, x: Any, indices: Any, output_shape: Any = None) -> Any:
    """MaxPool's inverse: zeros of ``(N, C, (D - 1) * stride - pad_begin - pad_end +
    kernel, ...)`` holding ``x`` at ``indices`` (flat into that whole tensor, as MaxPool's
    second output), the rest zero; an ``output_shape`` as large or larger pads it with
    zeros at the end of each axis (as onnx's node cases and reference; onnxruntime
    instead reads the indices into ``output_shape``)."""
    _pooled_input(node, x)
    n = x.ndim - 2
    kernel = _attr_ints(node, "kernel_shape", n, 1, 1)
    strides = _attr_ints(node, "strides", n, 1, 1)
    pads = _attr_ints(node, "pads", 2 * n, 0, 0)
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
