"""Quantization ops of ai.onnx: QuantizeLinear, DequantizeLinear and the integer kernels.

QuantizeLinear and DequantizeLinear at every opset (10 to 25): a scale per tensor, per
``axis`` or per block of ``block_size`` along it, zero points of every integer type JAX
holds (u/int8, u/int16, u/int4, u/int2) and the float8/float4 types (``saturate``,
``output_dtype``, ``precision``). DynamicQuantizeLinear, MatMulInteger, QLinearMatMul,
ConvInteger and QLinearConv accumulate exactly in int32, as onnxruntime does: the
convolutions run the same ``lax`` convolution as ``Conv`` on int32 values, and a
quantized output is requantized from the int32 sum (times ``a_scale * b_scale / y_scale``
in float32, rounded half to even, plus the zero point, saturated).

Rounding is half to even everywhere (``2.5 -> 2``, ``3.5 -> 4``), as the ONNX documents say.
QuantizeLinear's rounding has a straight-through gradient: see :func:`_quantize_linear`.
"""

from __future__ import annotations

import weakref
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from onnx_optax._src.onnx_tensors import tensor_dtype
from onnx_optax._src.ops.arrays import (
    cast_to,
    check_at_run,
    check_size,
    matmul_shape,
    norm_axis,
    xp_of,
)
from onnx_optax._src.ops.convolution import convolve
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import is_static

# The integer types a quantized tensor may have, with their ranges.
_INT_RANGES = {
    "uint8": (0, 255),
    "int8": (-128, 127),
    "uint16": (0, 65535),
    "int16": (-32768, 32767),
    "uint4": (0, 15),
    "int4": (-8, 7),
    "uint2": (0, 3),
    "int2": (-2, 1),
}
_FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
_FLOAT4 = ("float4_e2m1fn",)


def _is_float(dtype: Any) -> bool:
    return bool(np.issubdtype(np.dtype(dtype), np.floating)) or np.dtype(dtype).name in (
        "bfloat16",
        *_FLOAT8,
        *_FLOAT4,
    )


def _per_element(
    node: Node, value: Any, name: str, shape: tuple[int, ...], axis: int, block: int
) -> Any:
    """A scale or zero point shaped to broadcast against X of ``shape``.

    A scalar (or a one-element 1-D tensor) is per tensor; without ``block_size``
    a 1-D tensor of ``shape[axis]`` is per axis; with it, a tensor of X's rank
    whose ``axis`` holds ``ceil(shape[axis] / block_size)`` blocks (each repeated
    ``block_size`` times, the last one cut short), X's shape elsewhere.
    """
    dims = tuple(int(d) for d in np.shape(value))
    if block < 0:  # onnxruntime: "'block_size' must be non-negative"
        raise ValueError(f"{node.where}: block_size {block} must be positive")
    if len(dims) == 0 or (len(dims) == 1 and dims[0] == 1):
        if block:  # onnxruntime: "block_size must be 0 for per-tensor quantization"
            raise ValueError(
                f"{node.where}: block_size {block} needs a blocked {name}; {name} of shape "
                f"{list(dims)} is per tensor"
            )
        return value.reshape(())
    if node.opset < 13:
        raise ValueError(f"{node.where}: {name} of shape {list(dims)} must be a scalar at opset 10")
    rank = len(shape)
    if not block:
        axis = norm_axis(axis, rank, node.where)
        if dims != (shape[axis],):
            raise ValueError(
                f"{node.where}: {name} of shape {list(dims)} is neither a scalar nor 1-D of "
                f"the {shape[axis]} entries of X's axis {axis} (X of shape {list(shape)})"
            )
        return value.reshape(tuple(shape[axis] if i == axis else 1 for i in range(rank)))
    axis = norm_axis(axis, rank, node.where)
    blocks = -(-shape[axis] // block)
    expected = tuple(blocks if i == axis else d for i, d in enumerate(shape))
    if dims != expected:
        raise ValueError(
            f"{node.where}: {name} of shape {list(dims)} does not fit X of shape {list(shape)} "
            f"in blocks of {block} along axis {axis} (expected {list(expected)})"
        )
    check_size(node, shape, value.dtype, f"{name} repeated over its blocks")
    xp = xp_of(value)
    # a block longer than the axis is one block: repeat no more than the axis holds
    repeats = min(block, shape[axis])
    return xp.take(xp.repeat(value, repeats, axis=axis), np.arange(shape[axis]), axis=axis)


def _quantized_type(node: Node, zero_point: Any) -> np.dtype:
    """The output type: the zero point's, else ``output_dtype``, else uint8."""
    code = int(node.get("output_dtype", 0))
    given = tensor_dtype(code, node.where) if code else None
    if zero_point is not None:
        if given is not None and np.dtype(zero_point.dtype) != given:
            raise TypeError(
                f"{node.where}: output_dtype {given} differs from the zero point's type "
                f"{np.dtype(zero_point.dtype)}"
            )
        return np.dtype(zero_point.dtype)
    return np.dtype(np.uint8) if given is None else given


def _division_type(node: Node, scale: Any) -> np.dtype:
    """Where x / y_scale is computed: ``precision`` (opset 23), else y_scale's own float type."""
    code = int(node.get("precision", 0))
    if code:
        return tensor_dtype(code, node.where)
    dtype = np.dtype(scale.dtype)
    return dtype if _is_float(dtype) and dtype.itemsize >= 2 else np.dtype(np.float32)


def _divide(a: Any, b: Any) -> Any:
    """a / b correctly rounded, as numpy and onnxruntime divide.

    XLA rewrites a division by a broadcast value (a per-tensor or per-axis
    scale) or by a constant into a multiplication by its reciprocal, which is
    off by one ulp for most quotients: enough to move a value across a
    rounding tie. Behind an optimization barrier the divisor is an array of the
    quotient's shape, which XLA divides by.
    """
    if xp_of(a, b) is np:
        return np.divide(a, b)
    shape = np.broadcast_shapes(np.shape(a), np.shape(b))
    return a / lax.optimization_barrier(jnp.broadcast_to(b, shape))


@jax.custom_jvp
def _round_ste(v: Any) -> Any:
    """Rounds half to even; its derivative is taken as 1 (straight through)."""
    return jnp.round(v)


@_round_ste.defjvp
def _round_ste_jvp(primals: Any, tangents: Any) -> Any:
    (v,), (dv,) = primals, tangents
    return _round_ste(v), dv


# Quantized tensors computed from traced values, by id: (the integer tensor, weakly (under
# jax.grad outside jit it is a concrete array, integers carrying no derivative); its
# values as float32, holding the straight-through derivative). JAX carries no derivative
# through an integer tensor, so DequantizeLinear reads these values instead of the integers
# it is given when that tensor is one of them (identical values, a derivative besides).
_SHADOWS: dict[int, tuple[weakref.ref[Any], Any]] = {}


def _shadow(q: Any, values: Any) -> None:
    """Records ``values`` (float32) as the differentiable twin of the traced integer ``q``."""
    for key, (ref, _) in list(_SHADOWS.items()):  # a copy: another thread may trace too
        if ref() is None:
            _SHADOWS.pop(key, None)
    _SHADOWS[id(q)] = (weakref.ref(q), values)


def _shadow_of(q: Any) -> Any:
    """The float32 twin of ``q`` recorded by QuantizeLinear, or None."""
    if is_static(q):
        return None
    entry = _SHADOWS.get(id(q))
    return entry[1] if entry is not None and entry[0]() is q else None


@register("QuantizeLinear")
def _quantize_linear(node: Node, x: Any, scale: Any, zero_point: Any = None) -> Any:
    """y = saturate(round(x / y_scale) + y_zero_point), rounding half to even.

    Integer outputs saturate into their type's range; float8 ones into their
    finite range when ``saturate`` (else overflow becomes inf or NaN, as a cast
    does), float4 always. The division runs in ``precision`` (opset 23), else in
    y_scale's type.

    Gradient (fine-tuning a quantize-dequantize model): rounding has a
    straight-through derivative, 1, and saturation is clipping, 1 inside the
    representable range and 0 where a value was clipped, so d y / d x is
    ``1 / y_scale`` within range and 0 outside, and through a DequantizeLinear
    of y, d(dequantized) / d x is 1 within range (the straight-through
    estimator of quantization-aware training). JAX carries no derivative
    through an integer tensor: the float32 values of y, with that derivative,
    are recorded beside it (``_SHADOWS``) and a DequantizeLinear given y reads
    them (the same values). Float8 outputs are float tensors: their cast has
    derivative 1, saturation 0.

    .. warning:: The graph must call both ops as they are: a node the graph
       replays from an earlier node's recorded trace (``graph/replay.py``'s ``Replay``)
       hands DequantizeLinear a new tracer, whose shadow is not found, and the
       derivative is 0. Listing both op types in ``graph/replay.py``'s ``UNREPLAYED`` keeps them
       called; until then a ``training.attach`` step through Q/DQ trains nothing
       upstream of the QuantizeLinear.
    """
    target = _quantized_type(node, zero_point)
    shape = tuple(int(d) for d in np.shape(x))
    axis, block = int(node.get("axis", 1)), int(node.get("block_size", 0))
    check_size(node, shape, np.float32, "x / y_scale")
    scale = _per_element(node, scale, "y_scale", shape, axis, block)
    if zero_point is not None:
        zero_point = _per_element(node, zero_point, "y_zero_point", shape, axis, block)
    xp = xp_of(x, scale, zero_point)
    precision = _division_type(node, scale)
    v = _divide(cast_to(x, precision), cast_to(scale, precision))
    name = target.name
    if name in _INT_RANGES:
        low, high = _INT_RANGES[name]
        v = xp.round(v) if xp is np else _round_ste(v)
        wide = np.dtype(np.float32) if precision.itemsize <= 4 else precision
        v = cast_to(v, wide)
        if zero_point is not None:
            v = v + cast_to(cast_to(zero_point, np.int32), wide)
        # saturated: derivative 1 inside [low, high] (its ends included), 0 where clipped;
        # NaN (never >= low) becomes low, as onnxruntime and onnx's reference quantize it
        v = xp.where(
            ~(v >= low), np.asarray(low, wide), xp.where(v > high, np.asarray(high, wide), v)
        )
        q = cast_to(cast_to(v, np.int32), target)
        if isinstance(v, jax.core.Tracer):  # q's values as float32 (NaN as q has it)
            _shadow(q, jnp.where(v == v, cast_to(v, np.float32), cast_to(q, np.float32)))
        return q
    if name in _FLOAT8 or name in _FLOAT4:
        if name in _FLOAT4 and zero_point is not None:
            v = v + cast_to(zero_point, precision)  # as onnx's reference
        if name in _FLOAT4 or node.get("saturate", 1):
            top = float(ml_dtypes.finfo(target).max)
            v = xp.clip(v, np.asarray(-top, v.dtype), np.asarray(top, v.dtype))
        return cast_to(v, target)
    raise TypeError(f"{node.where}: {target} is not a quantized type")


@register("DequantizeLinear")
def _dequantize_linear(node: Node, x: Any, scale: Any, zero_point: Any = None) -> Any:
    """y = (x - x_zero_point) * x_scale, in float32, given in ``output_dtype`` or x_scale's type.

    Integers are subtracted in int32; float8 and float4 x take no zero point
    (a float8 one must be zero, as onnx's reference says).
    """
    shape = tuple(int(d) for d in np.shape(x))
    axis, block = int(node.get("axis", 1)), int(node.get("block_size", 0))
    code = int(node.get("output_dtype", 0))
    out = tensor_dtype(code, node.where) if code else np.dtype(scale.dtype)
    check_size(node, shape, np.float32, "(x - x_zero_point) as float32")
    scale = _per_element(node, scale, "x_scale", shape, axis, block)
    if zero_point is not None:
        zero_point = _per_element(node, zero_point, "x_zero_point", shape, axis, block)
    if _is_float(x.dtype):
        if zero_point is not None and np.dtype(x.dtype).name in _FLOAT8:
            z = cast_to(zero_point, np.float32)
            check_at_run(
                f"{node.where}: a float8 x_zero_point must be zero, it holds {{}}",
                z != 0,
                z,
            )
        d = cast_to(x, np.float32)
    elif (shadow := _shadow_of(x)) is not None:  # x's values, differentiable
        d = shadow if zero_point is None else shadow - cast_to(zero_point, np.float32)
    else:
        d = cast_to(x, np.int32)
        if zero_point is not None:
            d = d - cast_to(zero_point, np.int32)
        d = cast_to(d, np.float32)
    return cast_to(d * cast_to(scale, np.float32), out)


@register("DynamicQuantizeLinear")
def _dynamic_quantize_linear(node: Node, x: Any) -> Any:
    """uint8 quantization over [min(x, 0), max(x, 0)]: y, y_scale and y_zero_point.

    y_scale = (max - min) / 255 (1/255 when both are 0), y_zero_point =
    round(clip(-min / y_scale, 0, 255)), y = saturate(round(x / y_scale) + y_zero_point).
    """
    check_size(node, np.shape(x), np.float32)
    xp = xp_of(x)
    f32 = np.float32
    top = xp.maximum(xp.max(x), f32(0)) if np.size(x) else f32(0)
    bottom = xp.minimum(xp.min(x), f32(0)) if np.size(x) else f32(0)
    scale = _divide(xp.where(top == bottom, f32(1), top - bottom), f32(255))
    zero = xp.round(xp.clip(f32(0) - _divide(bottom, scale), f32(0), f32(255)))
    y = xp.clip(xp.round(_divide(x, scale)) + zero, f32(0), f32(255))
    return cast_to(y, np.uint8), cast_to(scale, f32), cast_to(zero, np.uint8)


def _minus(node: Node, x: Any, zero_point: Any, name: str, axis_shape: Any = None) -> Any:
    """x - zero_point in int32; ``axis_shape`` reshapes a 1-D per-row/column/channel one."""
    v = cast_to(x, np.int32)
    if zero_point is None:
        return v
    z = cast_to(zero_point, np.int32)
    if np.ndim(z) == 1 and np.size(z) != 1 and axis_shape is not None:
        z = z.reshape(axis_shape)
    try:  # the zero point broadcasts to its input, never the input to a larger shape
        fits = np.broadcast_shapes(np.shape(v), np.shape(z)) == tuple(np.shape(v))
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"{node.where}: {name} of shape {list(np.shape(zero_point))} does not fit its "
            f"input of shape {list(np.shape(x))}"
        )
    return v - (z.reshape(()) if np.size(z) == 1 else z)


def _int_matmul(node: Node, a: Any, b: Any, a_zp: Any, b_zp: Any) -> Any:
    """(a - a_zero_point) @ (b - b_zero_point), summed exactly in int32.

    A 1-D a_zero_point of a's rows is per row, a 1-D b_zero_point of b's
    columns per column; N-D ones broadcast (``[D1, D2, M, 1]``, ``[D1, D2, 1, N]``).
    """
    out = matmul_shape(node, a, b)
    check_size(node, out, np.int32)
    rows = (-1, 1) if np.ndim(a) >= 2 else None
    a32 = _minus(node, a, a_zp, "a_zero_point", rows)
    b32 = _minus(node, b, b_zp, "b_zero_point")
    xp = xp_of(a32, b32)
    if xp is np:
        return np.matmul(a32, b32)
    return jnp.matmul(a32, b32, preferred_element_type=jnp.int32)


@register("MatMulInteger")
def _matmul_integer(node: Node, a: Any, b: Any, a_zp: Any = None, b_zp: Any = None) -> Any:
    return _int_matmul(node, a, b, a_zp, b_zp)


def _requantize(node: Node, acc: Any, multiplier: Any, zero_point: Any, target: Any) -> Any:
    """saturate(round(acc * multiplier) + zero_point) in ``target`` (u/int8), in float32."""
    low, high = _INT_RANGES[np.dtype(target).name]
    xp = xp_of(acc, multiplier, zero_point)
    v = cast_to(acc, np.float32) * cast_to(multiplier, np.float32)
    v = xp.round(v)
    if zero_point is not None:
        v = v + cast_to(cast_to(zero_point, np.int32), np.float32)
    v = xp.clip(v, np.float32(low), np.float32(high))
    return cast_to(cast_to(v, np.int32), target)


def _scalar_or(node: Node, value: Any, name: str, n: int, shape: tuple[int, ...]) -> Any:
    """A scalar, or a 1-D tensor of ``n`` reshaped to ``shape`` (per row/column/channel)."""
    if np.size(value) == 1:
        return value.reshape(())
    if np.ndim(value) == 1 and np.size(value) == n:
        return value.reshape(shape)
    raise ValueError(
        f"{node.where}: {name} of shape {list(np.shape(value))} must be a scalar or 1-D of {n}"
    )


@register("QLinearMatMul")
def _qlinear_matmul(
    node: Node,
    a: Any,
    a_scale: Any,
    a_zp: Any,
    b: Any,
    b_scale: Any,
    b_zp: Any,
    y_scale: Any,
    y_zp: Any,
) -> Any:
    """Quantized MatMul: the int32 sum requantized by a_scale * b_scale / y_scale.

    a's scale and zero point are per tensor or per row, b's per tensor or per
    column (1-D of b's columns), y's per tensor; the multiplier is computed in
    the scales' type, the rest as :func:`_requantize`.
    """
    if _is_float(a.dtype) or _is_float(b.dtype) or _is_float(y_zp.dtype):
        raise TypeError(
            f"{node.where}: QLinearMatMul of float8 tensors is not supported "
            f"(a {np.dtype(a.dtype)}, b {np.dtype(b.dtype)}, y {np.dtype(y_zp.dtype)})"
        )
    rows = int(np.shape(a)[-2]) if np.ndim(a) >= 2 else 1
    cols = int(np.shape(b)[-1]) if np.ndim(b) >= 2 else 1
    acc = _int_matmul(node, a, b, a_zp, b_zp)
    a_scale = _scalar_or(node, a_scale, "a_scale", rows, (rows, 1))
    b_scale = _scalar_or(node, b_scale, "b_scale", cols, (cols,))
    y_scale = _scalar_or(node, y_scale, "y_scale", 1, ())
    multiplier = _divide(a_scale * b_scale, y_scale)
    return _requantize(node, acc, multiplier, y_zp.reshape(()), y_zp.dtype)


def _int_conv(node: Node, x: Any, w: Any, x_zp: Any, w_zp: Any) -> Any:
    """Conv of (x - x_zero_point) and (w - w_zero_point) in int32: padding is x's zero
    point, as onnxruntime pads. x's zero point is per tensor, w's per tensor or per
    output channel (1-D of W.shape[0])."""
    if x_zp is not None and np.size(x_zp) != 1:
        raise ValueError(
            f"{node.where}: x_zero_point of shape {list(np.shape(x_zp))} must be a scalar"
        )
    if np.ndim(w) < 1:
        raise ValueError(f"{node.where}: W of shape {list(np.shape(w))} has no output channels")
    channels = (-1,) + (1,) * (np.ndim(w) - 1)
    if w_zp is not None and np.size(w_zp) not in (1, np.shape(w)[0]):
        raise ValueError(
            f"{node.where}: w_zero_point of shape {list(np.shape(w_zp))} must be a scalar or "
            f"1-D of W's {np.shape(w)[0]} output channels"
        )
    x32 = jnp.asarray(_minus(node, x, x_zp, "x_zero_point"))
    w32 = jnp.asarray(_minus(node, w, w_zp, "w_zero_point", channels))
    return convolve(node, x32, w32)


@register("ConvInteger")
def _conv_integer(node: Node, x: Any, w: Any, x_zp: Any = None, w_zp: Any = None) -> Any:
    return _int_conv(node, x, w, x_zp, w_zp)


@register("QLinearConv")
def _qlinear_conv(
    node: Node,
    x: Any,
    x_scale: Any,
    x_zp: Any,
    w: Any,
    w_scale: Any,
    w_zp: Any,
    y_scale: Any,
    y_zp: Any,
    bias: Any = None,
) -> Any:
    """Quantized Conv: the int32 sum (plus the int32 bias) requantized by
    x_scale * w_scale / y_scale; w's scale per tensor or per output channel."""
    acc = _int_conv(node, x, w, x_zp, w_zp)
    m = int(np.shape(w)[0])
    if bias is not None:
        if tuple(np.shape(bias)) != (m,):
            raise ValueError(
                f"{node.where}: B of shape {list(np.shape(bias))} must be 1-D of the {m} "
                "output channels"
            )
        acc = acc + jnp.asarray(bias).reshape((-1,) + (1,) * (acc.ndim - 2))
    spatial = (1,) * (np.ndim(w) - 2)
    w_scale = _scalar_or(node, w_scale, "w_scale", m, (m, *spatial))
    x_scale = _scalar_or(node, x_scale, "x_scale", 1, ())
    y_scale = _scalar_or(node, y_scale, "y_scale", 1, ())
    multiplier = _divide(x_scale * w_scale, y_scale)
    return _requantize(node, acc, multiplier, y_zp.reshape(()), y_zp.dtype)
