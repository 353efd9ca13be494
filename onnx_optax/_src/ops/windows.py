"""Window geometry shared by the convolutions and pools (Conv, ConvTranspose, the pools,
LpPool, DeformConv, ConvInteger, QLinearConv): kernel, strides, dilations, pads, groups.

Each geometry is checked and its output shape computed in Python ints before lax is
called (see the comment below).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from onnx_optax._src.ops.registry import Node

# ----------------------------------------------------------------------------- conv and pools
#
# Every geometry is checked and the output shape computed in Python ints before lax is
# called: a zero or negative stride, dilation, kernel or group, a negative pad, a window
# larger than the padded input and an output over the tensor limit are refused with the
# node, the attribute and the shapes (onnxruntime refuses each of them too), instead of a
# ZeroDivisionError, an XLA abort on an overflowing shape or an empty or shifted result.


def attr_ints(node: Node, name: str, n: int, default: int, minimum: int) -> list[int]:
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


def window_spans(kernel: Sequence[int], dilations: Sequence[int]) -> list[int]:
    """Each window's extent over the (padded) input: (k - 1) * d + 1."""
    return [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]


def conv_window(node: Node, x: Any, kernel: Sequence[int]) -> tuple[Any, Any, Any]:
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
    strides = attr_ints(node, "strides", n, 1, 1)
    dilations = attr_ints(node, "dilations", n, 1, 1)
    pads = attr_ints(node, "pads", 2 * n, 0, 0)
    auto_pad = node.get("auto_pad", "NOTSET")
    padding = [(pads[i], pads[i + n]) for i in range(n)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        padding = []
        for size, s, span in zip(spatial, strides, window_spans(kernel, dilations), strict=True):
            total = max((-(-size // s) - 1) * s + span - size, 0)
            small, big = total // 2, total - total // 2
            padding.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
    elif auto_pad == "VALID":
        padding = [(0, 0)] * n
    elif auto_pad != "NOTSET":
        raise ValueError(f"{node.where}: unknown auto_pad {auto_pad!r}")
    return strides, dilations, padding


def group_of(node: Node) -> int:
    group = int(node["group"])
    if group < 1:
        raise ValueError(f"{node.where}: group {group} must be positive")
    return group


def kernel_of(node: Node, w: Any) -> list[int]:
    """The kernel: W's spatial dims, which a kernel_shape attribute must repeat."""
    kernel = [int(d) for d in w.shape[2:]]
    given = node.get("kernel_shape")
    if given is not None and [int(k) for k in given] != kernel:
        raise ValueError(
            f"{node.where}: kernel_shape {list(given)} does not match W of shape {list(w.shape)}"
        )
    return kernel


def bias_check(node: Node, b: Any, m: int) -> None:
    if b is not None and tuple(np.shape(b)) != (m,):
        raise ValueError(
            f"{node.where}: B of shape {list(np.shape(b))} must be 1-D of the {m} output channels"
        )


def empty_output(shape: Sequence[int], dtype: Any) -> Any:
    """An output with a zero dimension (onnxruntime's result for a window with no position)."""
    return jnp.zeros(tuple(shape), dtype)


def pads_or_auto_pad(node: Node) -> None:
    """Conv's (ConvTranspose's, ConvInteger's, QLinearConv's) pads and auto_pad exclude each
    other, as the spec says and onnxruntime checks."""
    auto_pad, pads = node.get("auto_pad", "NOTSET"), node.get("pads")
    if auto_pad != "NOTSET" and pads is not None:
        raise ValueError(
            f"{node.where}: auto_pad {auto_pad!r} and pads {list(pads)} cannot be given together"
        )


def check_pooled_input(node: Node, x: Any) -> None:
    """onnxruntime's rule for every pool: X is (N, C, D1, ...) and only N may be zero."""
    if np.ndim(x) < 3:
        raise ValueError(f"{node.where}: X of shape {list(np.shape(x))} needs (N, C, D1, ...)")
    if x.shape[0] and 0 in x.shape[1:]:
        raise ValueError(
            f"{node.where}: X of shape {list(x.shape)} is empty; only its batch axis may be 0"
        )


def pool_geometry(
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
    check_pooled_input(node, x)
    kernel = [int(k) for k in node["kernel_shape"]]
    strides, dilations, padding = conv_window(node, x, kernel)
    given = [int(p) for p in node.get("pads") or []]
    if any(p >= kernel[i % len(kernel)] for i, p in enumerate(given)):
        raise ValueError(  # as onnxruntime: a window could lie wholly in the padding
            f"{node.where}: pads {given} must be smaller than kernel_shape {kernel}"
        )
    auto_pad = node.get("auto_pad", "NOTSET")
    ceil = bool(node.get("ceil_mode", 0))
    extra, sizes = [], []
    for axis, (size, s, span, (lo, hi)) in enumerate(
        zip(x.shape[2:], strides, window_spans(kernel, dilations), padding, strict=True)
    ):
        # The spec's SAME pad, clamped at 0 by conv_window. Below 0 the windows skip X's end;
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
