"""Convolutions of ai.onnx: Conv and ConvTranspose.

Each op checks its geometry (kernel, strides, dilations, pads, groups) in Python ints
and computes its output shape before lax is called (``windows``); how a convolution
is computed lives in ``convolution``. A new convolution goes here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from onnx_optax._src.ops import convolution
from onnx_optax._src.ops.arrays import check_size, same_dtype
from onnx_optax._src.ops.convolution import (
    Geometry,
    convolve,
)
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.windows import (
    attr_ints,
    bias_check,
    conv_window,
    group_of,
    kernel_of,
    pads_or_auto_pad,
    window_spans,
)

register("Conv")(convolve)


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
    pads_or_auto_pad(node)
    strides, dilations, padding = conv_window(node, x, kernel)
    output_padding = attr_ints(node, "output_padding", n, 0, 0)
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
        zip(x.shape[2:], strides, window_spans(kernel, dilations), output_padding, strict=True)
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
    kernel = kernel_of(node, w)
    group = group_of(node)
    c_in, m_per_group = w.shape[0], w.shape[1]
    if x.shape[1] != c_in or c_in % group:
        raise ValueError(
            f"{node.where}: X of shape {list(x.shape)} and W of shape {list(w.shape)} do not "
            f"fit group {group} (W.shape[0] must be X's channels, a multiple of group)"
        )
    bias_check(node, b, m_per_group * group)
    strides, dilations, pads, _, sizes = _transpose_geometry(node, x, kernel, m_per_group * group)
    check_size(node, [x.shape[0], m_per_group * group, *sizes], x.dtype)
    # W (C, M/g, k...) -> (M, C/g, k...), spatially flipped: a dilated forward conv
    kernel_w = w.reshape((group, c_in // group, m_per_group, *w.shape[2:]))
    kernel_w = jnp.swapaxes(kernel_w, 1, 2).reshape(
        (group * m_per_group, c_in // group, *w.shape[2:])
    )
    kernel_w = jnp.flip(kernel_w, axis=tuple(range(2, 2 + n)))
    spans = window_spans(kernel, dilations)
    padding = []
    for size, s, span, (lo, _), out in zip(x.shape[2:], strides, spans, pads, sizes, strict=True):
        before = span - 1 - lo
        # the dilated input (s * (size - 1) + 1) padded to give `out` windows of `span`
        padding.append((before, out + span - 1 - before - (s * (size - 1) + 1)))
    y = convolution.grouped_conv(x, kernel_w, Geometry([1] * n, padding, strides, dilations, group))
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * n)
    return y
