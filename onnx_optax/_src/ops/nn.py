"""Neural-network ops of ai.onnx: activations, Softmax, MatMul, Conv, pools, normalizations.

Activations, the Softmax family, MatMul/Gemm/Einsum, Conv and ConvTranspose,
pooling, BatchNormalization/InstanceNormalization/LayerNormalization and Dropout
(inference only).

Each is a small ``@register``-ed function over jax.numpy/lax; an op's lowering
choices live beside it. To add a layer or an activation, register it here under
the section it belongs to.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src.onnx_tensors import tensor_dtype
from onnx_optax._src.ops.arrays import (
    _axis,
    _broadcast_check,
    _canonical,
    _cast,
    _same_dtype,
    _xp,
    check_size,
    is_static,
)
from onnx_optax._src.ops.registry import Node, register

# TODO(ops): shared with reductions.py; belongs in arrays.py beside _xp (the other session's).
HOST_FOLD_ELEMENTS = 1 << 16  # as ConstantOfShape: larger results are computed on the device


def _xp_sized(node: Node, shape: Sequence[int], dtype: Any, *values: Any) -> Any:
    """numpy for a small result of static values (shape arithmetic folds while tracing),
    else jax.numpy, after checking the result's size against the node's limit.

    A large result of constants is staged into the computation like any other, so
    the host never allocates it while tracing (16 GiB of MatMul from two constant
    vectors was a MemoryError) nor does it become a literal in the compiled program.
    """
    check_size(node, shape, dtype)
    small = math.prod(int(d) for d in shape) <= HOST_FOLD_ELEMENTS
    return _xp(*values) if small else jnp


# ----------------------------------------------------------------------------- activations


@register("LeakyRelu")
def _leaky_relu(node: Node, x: Any) -> Any:
    return jnp.where(x < 0, x * np.asarray(node["alpha"], x.dtype), x)


@register("PRelu")
def _prelu(node: Node, x: Any, slope: Any) -> Any:
    if node.opset < 7 and np.ndim(slope) == 1 and np.ndim(x) > 2 and slope.shape[0] == x.shape[1]:
        slope = slope.reshape((-1,) + (1,) * (np.ndim(x) - 2))  # per channel
    _same_dtype(node, x, slope)
    _broadcast_check(node, x, slope)
    return jnp.where(x < 0, x * slope, x)


@register("Elu")
def _elu(node: Node, x: Any) -> Any:
    alpha = np.asarray(node["alpha"], x.dtype)
    return jnp.where(x < 0, alpha * jnp.expm1(jnp.minimum(x, 0)), x)


@register("Celu")
def _celu(node: Node, x: Any) -> Any:
    alpha = np.asarray(node["alpha"], x.dtype)
    return jnp.maximum(x, 0) + jnp.minimum(0, alpha * jnp.expm1(jnp.minimum(x, 0) / alpha))


@register("Selu")
def _selu(node: Node, x: Any) -> Any:
    alpha = np.asarray(node["alpha"], x.dtype)
    gamma = np.asarray(node["gamma"], x.dtype)
    return gamma * jnp.where(x <= 0, alpha * jnp.expm1(jnp.minimum(x, 0)), x)


@register("ThresholdedRelu")
def _thresholded_relu(node: Node, x: Any) -> Any:
    return jnp.where(x > np.asarray(node["alpha"], x.dtype), x, jnp.zeros_like(x))


@register("HardSigmoid")
def _hard_sigmoid(node: Node, x: Any) -> Any:
    alpha = np.asarray(node["alpha"], x.dtype)
    beta = np.asarray(node["beta"], x.dtype)
    return jnp.clip(alpha * x + beta, 0, 1)


@register("HardSwish")
def _hard_swish(node: Node, x: Any) -> Any:
    del node
    return x * jnp.clip(x / np.asarray(6, x.dtype) + np.asarray(0.5, x.dtype), 0, 1)


@register("Mish")
def _mish(node: Node, x: Any) -> Any:
    del node
    return x * jnp.tanh(jax.nn.softplus(x))


@register("Gelu")
def _gelu(node: Node, x: Any) -> Any:
    approximate = node.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ValueError(f"{node.where}: approximate must be 'none' or 'tanh', got {approximate!r}")
    return jax.nn.gelu(x, approximate=approximate == "tanh")


def _softmax_like(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(node: Node, x: Any) -> Any:
        rank = np.ndim(x)
        if node.opset >= 13:
            return fn(x, axis=_axis(int(node.get("axis", -1)), rank, node.where))
        # opset < 13: coerce to 2-D at `axis` (default 1) and normalise each row
        axis = _axis(int(node.get("axis", 1)), rank, node.where)
        rows = math.prod(x.shape[:axis])
        flat = x.reshape(rows, math.prod(x.shape[axis:]))
        return fn(flat, axis=1).reshape(x.shape)

    return run


register("Softmax")(_softmax_like(jax.nn.softmax))
register("LogSoftmax")(_softmax_like(jax.nn.log_softmax))


def _hardmax(x: Any, axis: int) -> Any:
    index = jnp.argmax(x, axis=axis, keepdims=True)
    positions = lax.broadcasted_iota(index.dtype, x.shape, axis)
    return (positions == index).astype(x.dtype)


register("Hardmax")(_softmax_like(_hardmax))


# ----------------------------------------------------------------------------- linear algebra


def _broadcasts_to(node: Node, name: str, value: Any, shape: Sequence[int]) -> None:
    """Refuses ``value`` unless it broadcasts to ``shape`` one way (the result keeps ``shape``)."""
    target = tuple(int(d) for d in shape)
    try:
        fits = np.broadcast_shapes(target, tuple(np.shape(value))) == target
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"{node.where}: {name} of shape {list(np.shape(value))} does not broadcast to "
            f"{list(target)}"
        )


def _matmul_shape(node: Node, a: Any, b: Any) -> list[int]:
    """numpy.matmul's output shape, computed before anything is multiplied."""
    sa, sb = list(np.shape(a)), list(np.shape(b))
    if not sa or not sb or (sa[-1] != (sb[-2] if len(sb) > 1 else sb[0])):
        raise ValueError(f"{node.where}: MatMul of shapes {sa} and {sb} do not match")
    try:
        batch = np.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2]))
    except ValueError:
        raise ValueError(
            f"{node.where}: MatMul of shapes {sa} and {sb}: their batch dimensions do not broadcast"
        ) from None
    return [*batch, *sa[-2:-1], *(sb[-1:] if len(sb) > 1 else [])]


@register("MatMul")
def _matmul(node: Node, a: Any, b: Any) -> Any:
    _same_dtype(node, a, b)
    return _xp_sized(node, _matmul_shape(node, a, b), a.dtype, a, b).matmul(a, b)


@register("Gemm")
def _gemm(node: Node, a: Any, b: Any, c: Any = None) -> Any:
    _same_dtype(node, a, b, c)
    for name in ("transA", "transB"):
        if node[name] not in (0, 1):
            raise ValueError(f"{node.where}: {name} {node[name]} must be 0 or 1")
    if np.ndim(a) != 2 or np.ndim(b) != 2:
        raise ValueError(
            f"{node.where}: Gemm needs 2-D A and B, got shapes {list(np.shape(a))} and "
            f"{list(np.shape(b))}"
        )
    if node["transA"]:
        a = a.T
    if node["transB"]:
        b = b.T
    if a.shape[-1] != b.shape[0]:
        raise ValueError(
            f"{node.where}: Gemm of shapes {list(a.shape)} and {list(b.shape)} (after transA, "
            "transB) do not match"
        )
    out = jnp.matmul(a, b)
    alpha, beta = node["alpha"], node["beta"]
    if alpha != 1.0:
        out = out * np.asarray(alpha, out.dtype)
    if c is not None:
        _broadcast_check(node, out, c)
        out = out + (c if beta == 1.0 else c * np.asarray(beta, c.dtype))
    return out


@register("Einsum")
def _einsum(node: Node, *xs: Any) -> Any:
    _same_dtype(node, *xs)
    return jnp.einsum(node["equation"].replace(" ", ""), *xs)


# ----------------------------------------------------------------------------- conv and pools


def _window(node: Node, x: Any, kernel: Sequence[int]) -> tuple[Any, Any, Any]:
    """Strides, dilations and (begin, end) pads of a conv or pool over x's spatial axes."""
    n = len(kernel)
    spatial = x.shape[2:]
    strides = list(node.get("strides") or [1] * n)
    dilations = list(node.get("dilations") or [1] * n)
    pads = list(node.get("pads") or [0] * (2 * n))
    if len(strides) != n or len(dilations) != n or len(pads) != 2 * n:
        raise ValueError(
            f"{node.where}: strides {strides}, dilations {dilations} and pads {pads} do not fit "
            f"{n} spatial axes"
        )
    auto_pad = node.get("auto_pad", "NOTSET")
    padding = [(pads[i], pads[i + n]) for i in range(n)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        padding = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
            out = -(-size // s)
            total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            padding.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
    elif auto_pad == "VALID":
        padding = [(0, 0)] * n
    elif auto_pad != "NOTSET":
        raise ValueError(f"{node.where}: unknown auto_pad {auto_pad!r}")
    return strides, dilations, padding


@register("Conv")
def _conv(node: Node, x: Any, w: Any, b: Any = None) -> Any:
    _same_dtype(node, x, w, b)
    if np.ndim(x) < 3 or np.ndim(w) != np.ndim(x):
        raise ValueError(
            f"{node.where}: Conv needs X (N, C, ...) and W of the same rank, got shapes "
            f"{list(np.shape(x))} and {list(np.shape(w))}"
        )
    kernel = list(node.get("kernel_shape") or w.shape[2:])
    strides, dilations, padding = _window(node, x, kernel)
    group = int(node["group"])
    if x.shape[1] != w.shape[1] * group:
        raise ValueError(
            f"{node.where}: X has {x.shape[1]} channels, W expects {w.shape[1]} x group {group}"
        )
    out = lax.conv_general_dilated(
        x,
        w,
        window_strides=strides,
        padding=padding,
        rhs_dilation=dilations,
        feature_group_count=group,
    )
    if b is not None:
        out = out + b.reshape((-1,) + (1,) * (out.ndim - 2))
    return out


@register("ConvTranspose")
def _conv_transpose(node: Node, x: Any, w: Any, b: Any = None) -> Any:
    _same_dtype(node, x, w, b)
    n = np.ndim(x) - 2
    kernel = list(node.get("kernel_shape") or w.shape[2:])
    strides = list(node.get("strides") or [1] * n)
    dilations = list(node.get("dilations") or [1] * n)
    output_padding = list(node.get("output_padding") or [0] * n)
    pads = list(node.get("pads") or [0] * (2 * n))
    group = int(node["group"])
    spatial = x.shape[2:]
    auto_pad = node.get("auto_pad", "NOTSET")
    output_shape = node.get("output_shape")
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if output_shape is None:
            output_shape = [size * s for size, s in zip(spatial, strides, strict=True)]
        output_shape = list(output_shape)[-n:]
        pads = [0] * (2 * n)
        for i in range(n):
            total = (
                strides[i] * (spatial[i] - 1)
                + output_padding[i]
                + (kernel[i] - 1) * dilations[i]
                + 1
                - output_shape[i]
            )
            if auto_pad == "SAME_UPPER":
                pads[i], pads[i + n] = total // 2, total - total // 2
            else:
                pads[i], pads[i + n] = total - total // 2, total // 2
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    c_in = w.shape[0]
    m_per_group = w.shape[1]
    # W (C, M/g, k...) -> (M, C/g, k...), spatially flipped: a dilated forward conv
    kernel_w = w.reshape((group, c_in // group, m_per_group, *w.shape[2:]))
    kernel_w = jnp.swapaxes(kernel_w, 1, 2).reshape(
        (group * m_per_group, c_in // group, *w.shape[2:])
    )
    kernel_w = jnp.flip(kernel_w, axis=tuple(range(2, 2 + n)))
    padding = [
        (
            dilations[i] * (kernel[i] - 1) - pads[i],
            dilations[i] * (kernel[i] - 1) - pads[i + n] + output_padding[i],
        )
        for i in range(n)
    ]
    out = lax.conv_general_dilated(
        x,
        kernel_w,
        window_strides=[1] * n,
        padding=padding,
        lhs_dilation=strides,
        rhs_dilation=dilations,
        feature_group_count=group,
    )
    if b is not None:
        out = out + b.reshape((-1,) + (1,) * n)
    return out


def _pool_geometry(
    node: Node, x: Any
) -> tuple[list[int], list[int], list[int], list[Any], list[Any]]:
    """Kernel, strides, dilations, explicit pads and the extra end pads of ceil_mode."""
    kernel = list(node["kernel_shape"])
    strides, dilations, padding = _window(node, x, kernel)
    extra = [(0, 0)] * len(kernel)
    if node.get("ceil_mode", 0):
        extra = []
        for size, k, s, d, (lo, hi) in zip(
            x.shape[2:], kernel, strides, dilations, padding, strict=True
        ):
            span = (k - 1) * d + 1
            out = -(-(size + lo + hi - span) // s) + 1
            if (out - 1) * s >= size + lo:  # the last window would start in the end padding
                out -= 1
            extra.append((0, max((out - 1) * s + span - (size + lo + hi), 0)))
    return kernel, strides, dilations, padding, extra


@register("MaxPool")
def _max_pool(node: Node, x: Any) -> Any:
    kernel, strides, dilations, padding, extra = _pool_geometry(node, x)
    low = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    pads = [(0, 0), (0, 0)] + [(p[0], p[1] + e[1]) for p, e in zip(padding, extra, strict=True)]
    window = dict(
        window_dimensions=(1, 1, *kernel),
        window_strides=(1, 1, *strides),
        padding=pads,
        window_dilation=(1, 1, *dilations),
    )
    values = lax.reduce_window(x, np.asarray(low, x.dtype), lax.max, **window)
    if node.n_outputs == 1:
        return values
    # Indices: each maximum's position in the flattened input (first one on ties)
    spatial = x.shape[2:]
    flat = np.arange(math.prod(x.shape), dtype=np.int32).reshape(x.shape)
    if node.get("storage_order", 0):  # column-major over the spatial axes
        per_image = np.arange(math.prod(spatial), dtype=np.int32).reshape(spatial[::-1]).T
        images = np.arange(x.shape[0] * x.shape[1], dtype=np.int32) * math.prod(spatial)
        flat = images.reshape(x.shape[:2] + (1,) * len(spatial)) + per_image

    def pick(a: Any, b: Any) -> Any:
        (va, ia), (vb, ib) = a, b
        take_b = (vb > va) | ((vb == va) & (ib < ia))
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    _, indices = lax.reduce_window(
        (x, jnp.asarray(flat)),
        (np.asarray(low, x.dtype), np.asarray(np.iinfo(np.int32).max, np.int32)),
        pick,
        **window,
    )
    return values, _cast(indices, np.int64)


@register("AveragePool")
def _average_pool(node: Node, x: Any) -> Any:
    kernel, strides, dilations, padding, extra = _pool_geometry(node, x)
    pads = [(0, 0), (0, 0)] + [(p[0], p[1] + e[1]) for p, e in zip(padding, extra, strict=True)]
    window = dict(
        window_dimensions=(1, 1, *kernel),
        window_strides=(1, 1, *strides),
        padding=pads,
        window_dilation=(1, 1, *dilations),
    )
    total = lax.reduce_window(x, np.asarray(0, x.dtype), lax.add, **window)
    # How many elements each window averages: a box, so a product of 1-D counts (numpy)
    include = bool(node.get("count_include_pad", 0))
    count = np.ones((1, 1), np.float64)
    for axis, (size, k, s, d, (lo, hi), (_, more)) in enumerate(
        zip(x.shape[2:], kernel, strides, dilations, padding, extra, strict=True)
    ):
        inside = np.pad(np.ones(size), (lo, hi), constant_values=1.0 if include else 0.0)
        inside = np.pad(inside, (0, more))
        n_out = total.shape[2 + axis]
        per_dim = np.array(
            [inside[i * s : i * s + (k - 1) * d + 1 : d].sum() for i in range(n_out)]
        )
        count = count[..., None] * per_dim
    return total / np.asarray(count, x.dtype)


@register("GlobalAveragePool")
def _global_average_pool(node: Node, x: Any) -> Any:
    del node
    return jnp.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@register("GlobalMaxPool")
def _global_max_pool(node: Node, x: Any) -> Any:
    del node
    return jnp.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)


# ----------------------------------------------------------------------------- normalization


def _channel(value: Any, rank: int) -> Any:
    """A per-channel (C, ...) statistic shaped to broadcast against (N, C, ...)."""
    return value.reshape(tuple(value.shape) + (1,) * (rank - 1 - np.ndim(value)))


@register("BatchNormalization")
def _batch_norm(node: Node, x: Any, scale: Any, bias: Any, mean: Any, var: Any) -> Any:
    _same_dtype(node, scale, bias)
    _same_dtype(node, mean, var)
    rank = np.ndim(x)
    eps = node["epsilon"]
    if node.opset >= 14:
        training = bool(node.get("training_mode", 0))
    else:  # before opset 14, asking for the statistics outputs meant training
        training = node.n_outputs > 1 and not node.get("is_test", 0)
    outputs: tuple[Any, ...] = ()
    if training:
        axes = (0, *range(2, rank))
        batch_mean = jnp.mean(x, axis=axes)
        batch_var = jnp.mean(jnp.square(x - _channel(batch_mean, rank)), axis=axes)
        momentum = np.asarray(node.get("momentum", 0.9), mean.dtype)
        outputs = (
            mean * momentum + batch_mean.astype(mean.dtype) * (1 - momentum),
            var * momentum + batch_var.astype(var.dtype) * (1 - momentum),
            batch_mean,
            batch_var,
        )
        mean, var = batch_mean, batch_var
    inv = lax.rsqrt(_channel(var, rank) + np.asarray(eps, var.dtype))
    out = (x - _channel(mean, rank).astype(x.dtype)) * (inv * _channel(scale, rank)).astype(x.dtype)
    y = out + _channel(bias, rank).astype(x.dtype)
    return ((y, *outputs) + (None,) * node.n_outputs)[: node.n_outputs]


@register("InstanceNormalization")
def _instance_norm(node: Node, x: Any, scale: Any, bias: Any) -> Any:
    axes = tuple(range(2, x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    eps = np.asarray(node["epsilon"], x.dtype)
    return (x - mean) * lax.rsqrt(var + eps) * _channel(scale, x.ndim) + _channel(bias, x.ndim)


@register("LayerNormalization")
def _layer_norm(node: Node, x: Any, scale: Any, bias: Any = None) -> Any:
    rank = x.ndim
    axis = _axis(int(node["axis"]), rank, node.where)
    stash = tensor_dtype(node["stash_type"], node.where)
    axes = tuple(range(axis, rank))
    xs = x.astype(_canonical(stash))
    mean = jnp.mean(xs, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xs - mean), axis=axes, keepdims=True)
    inv_std = lax.rsqrt(var + np.asarray(node["epsilon"], xs.dtype))
    y = ((xs - mean) * inv_std).astype(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return (y, mean, inv_std)[: node.n_outputs]


@register("Dropout")
def _dropout(node: Node, x: Any, ratio: Any = None, training_mode: Any = None) -> Any:
    del ratio
    training = training_mode is not None and (not is_static(training_mode) or bool(training_mode))
    if training or (node.opset < 7 and not node.get("is_test", 0) and node.n_outputs > 1):
        raise ValueError(
            f"{node.where}: Dropout in training mode is not supported (inference only)"
        )
    xp = _xp(x)  # a mask of a traced X is built in-graph, not as a host constant
    mask = xp.ones(x.shape, bool) if node.opset >= 10 else xp.ones(x.shape, x.dtype)
    return (x, mask)[: node.n_outputs]
