"""Elementwise ops of ai.onnx: arithmetic, unary math, comparisons, logic, Where, Clip, Cast, bits.

Binary and variadic ops broadcast numpy-style (opset < 7's ``broadcast``/``axis``
attributes are read too), insist on one input dtype and compute with numpy when
every input is static. To add an elementwise op: a one-line entry in the tables
below (``_unary``, ``_binary``, ``_variadic``) or a small ``@register``-ed function.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src.onnx_tensors import STRINGS_ADVICE, tensor_dtype
from onnx_optax._src.ops.arrays import (
    broadcast_check,
    cast_to,
    check_at_run,
    check_size,
    flag,
    is_int,
    norm_axis,
    same_dtype,
    xp_of,
)
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import canonical, is_static


def _legacy_broadcast(node: Node, a: Any, b: Any) -> Any:
    """Opset < 7 binary ops: ``broadcast=1`` aligns ``b`` with ``a`` from ``axis``."""
    if node.opset >= 7 or not node.get("broadcast", 0) or np.ndim(b) == 0:
        return b
    axis = node.get("axis")
    if axis is None:
        return b
    axis = norm_axis(int(axis), np.ndim(a), node.where)
    trailing = np.ndim(a) - axis - np.ndim(b)
    return b.reshape(tuple(np.shape(b)) + (1,) * max(trailing, 0))


def _binary(fn_name: str) -> Callable[..., Any]:
    def run(node: Node, a: Any, b: Any) -> Any:
        b = _legacy_broadcast(node, a, b)
        same_dtype(node, a, b)
        broadcast_check(node, a, b)
        return getattr(xp_of(a, b), fn_name)(a, b)

    return run


register("Add")(_binary("add"))
register("Sub")(_binary("subtract"))
register("Mul")(_binary("multiply"))


def _nonzero_divisor(node: Node, b: Any) -> None:
    """Integer division by zero is an error (onnxruntime's too), never XLA's -1 or numpy's 0."""
    check_at_run(f"{node.where}: divides integers by {{}}", b == 0, b)


def _int_quotient(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a / b`` truncated toward zero (as ONNX and C divide integers), exact in int64."""
    with np.errstate(over="ignore"):  # INT_MIN / -1 wraps around, as XLA's
        floor = np.floor_divide(a, b)
        inexact = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
        return (floor + inexact.astype(floor.dtype)).astype(a.dtype)


@register("Div")
def _div(node: Node, a: Any, b: Any) -> Any:
    b = _legacy_broadcast(node, a, b)
    same_dtype(node, a, b)
    shape = broadcast_check(node, a, b)
    if is_int(a):
        _nonzero_divisor(node, b)
        if xp_of(a, b) is np:
            return _int_quotient(a, b)
        return lax.div(jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape))
    return xp_of(a, b).divide(a, b)


@register("Mod")
def _mod(node: Node, a: Any, b: Any) -> Any:
    same_dtype(node, a, b)
    broadcast_check(node, a, b)
    fmod = flag(node, "fmod")
    if is_int(a):
        _nonzero_divisor(node, b)
    elif not fmod and node.opset < 28:
        raise ValueError(
            f"{node.where}: Mod of floating-point tensors needs fmod=1 before opset 28 "
            f"(this model's opset is {node.opset})"
        )
    xp = xp_of(a, b)
    return xp.fmod(a, b) if fmod else xp.mod(a, b)


@register("Pow")
def _pow(node: Node, a: Any, b: Any) -> Any:
    b = _legacy_broadcast(node, a, b)
    broadcast_check(node, a, b)
    xp = xp_of(a, b)
    if is_int(a) and not is_int(b):
        return cast_to(xp.power(cast_to(a, b.dtype), b), a.dtype)
    return xp.power(a, cast_to(b, a.dtype))


def _unary(fn: Callable[[Any], Any], np_fn: Callable[[Any], Any] | None = None) -> Any:
    def run(node: Node, x: Any) -> Any:
        del node
        if np_fn is not None and is_static(x):
            return np_fn(x)
        return fn(x)

    return run


for _name, _fn, _np_fn in [
    ("Neg", jnp.negative, np.negative),
    ("Abs", jnp.abs, np.abs),
    ("Exp", jnp.exp, None),
    ("Log", jnp.log, None),
    ("Sqrt", jnp.sqrt, None),
    ("Reciprocal", jnp.reciprocal, None),
    ("Erf", lax.erf, None),
    ("Floor", jnp.floor, np.floor),
    ("Ceil", jnp.ceil, np.ceil),
    ("Round", jnp.round, None),
    ("Sign", jnp.sign, np.sign),
    ("Sin", jnp.sin, None),
    ("Cos", jnp.cos, None),
    ("Tan", jnp.tan, None),
    ("Tanh", jnp.tanh, None),
    ("Asin", jnp.arcsin, None),
    ("Acos", jnp.arccos, None),
    ("Atan", jnp.arctan, None),
    ("Sinh", jnp.sinh, None),
    ("Cosh", jnp.cosh, None),
    ("Asinh", jnp.arcsinh, None),
    ("Acosh", jnp.arccosh, None),
    ("Atanh", jnp.arctanh, None),
    ("Sigmoid", jax.nn.sigmoid, None),
    ("Relu", jax.nn.relu, lambda x: np.maximum(x, np.zeros((), x.dtype))),  # exact: host too
    ("Softplus", jax.nn.softplus, None),
    ("Softsign", jax.nn.soft_sign, None),
    ("Not", jnp.logical_not, np.logical_not),
    ("IsNaN", jnp.isnan, np.isnan),
]:
    register(_name)(_unary(_fn, _np_fn))


@register("IsInf")
def _isinf(node: Node, x: Any) -> Any:
    xp = xp_of(x)
    pos = xp.isposinf(x) if node.get("detect_positive", 1) else xp.zeros(x.shape, bool)
    neg = xp.isneginf(x) if node.get("detect_negative", 1) else xp.zeros(x.shape, bool)
    return xp.logical_or(pos, neg)


def _int_compare(xp: Any, x: Any, bound: float, below: bool) -> Any:
    """``x < bound`` (``below``) or ``x > bound`` for integer x, exactly, in x's dtype."""
    info = np.iinfo(x.dtype)
    edge = math.ceil(bound) if below else math.floor(bound)
    if edge > info.max or edge < info.min:  # every x is on one side of the bound
        return xp.full(np.shape(x), (edge > info.max) == below)
    edge_x = np.asarray(edge, x.dtype)
    return x < edge_x if below else x > edge_x


@register("Shrink")
def _shrink(node: Node, x: Any) -> Any:
    """``x + bias`` where ``x < -lambd``, ``x - bias`` where ``x > lambd``, else 0.

    The comparisons are exact for integer x; ``bias`` is read in x's dtype
    (truncated for integers), so the output keeps x's dtype.
    """
    xp = xp_of(x)
    bias, lambd = float(node["bias"]), float(node["lambd"])
    if is_int(x):
        low, high = _int_compare(xp, x, -lambd, True), _int_compare(xp, x, lambd, False)
    else:
        low, high = x < np.asarray(-lambd, x.dtype), x > np.asarray(lambd, x.dtype)
    shift = np.asarray(bias, np.float64).astype(x.dtype)
    return xp.where(low, x + shift, xp.where(high, x - shift, xp.zeros_like(x)))


for _name, _fn_name in [
    ("Equal", "equal"),
    ("Less", "less"),
    ("Greater", "greater"),
    ("LessOrEqual", "less_equal"),
    ("GreaterOrEqual", "greater_equal"),
    ("And", "logical_and"),
    ("Or", "logical_or"),
    ("Xor", "logical_xor"),
]:
    register(_name)(_binary(_fn_name))


def _variadic(fn_name: str) -> Callable[..., Any]:
    def run(node: Node, *xs: Any) -> Any:
        same_dtype(node, *xs)
        broadcast_check(node, *xs)
        xp = xp_of(*xs)
        out = xs[0]
        for x in xs[1:]:
            out = getattr(xp, fn_name)(out, x)
        return out

    return run


register("Sum")(_variadic("add"))
register("Max")(_variadic("maximum"))
register("Min")(_variadic("minimum"))


@register("Mean")
def _mean(node: Node, *xs: Any) -> Any:
    total = _variadic("add")(node, *xs)
    return total / np.asarray(len(xs), total.dtype)


@register("Where")
def _where(node: Node, condition: Any, x: Any, y: Any) -> Any:
    same_dtype(node, x, y)
    broadcast_check(node, condition, x, y)
    return xp_of(condition, x, y).where(condition, x, y)


@register("Clip")
def _clip(node: Node, x: Any, low: Any = None, high: Any = None) -> Any:
    if node.opset < 11:  # min and max were attributes
        low, high = node.get("min"), node.get("max")
        low = None if low is None else np.asarray(low, x.dtype)
        high = None if high is None else np.asarray(high, x.dtype)
    for name, bound in (("min", low), ("max", high)):
        if bound is not None and (np.size(bound) != 1 or np.ndim(bound) > 1):
            raise ValueError(
                f"{node.where}: {name} must be a scalar, got shape {list(np.shape(bound))}"
            )
    xp = xp_of(x, low, high)
    if low is not None:
        x = xp.maximum(x, cast_to(low, x.dtype).reshape(()))
    if high is not None:
        x = xp.minimum(x, cast_to(high, x.dtype).reshape(()))
    return x


_SMALL_INTS = ("int4", "uint4", "int2", "uint2")
_SMALL_FLOATS = (
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float4_e2m1fn",
)


def _convert(node: Node, x: Any, target: np.dtype) -> Any:
    """Cast and CastLike; ``saturate`` clips into the range of the narrow float types."""
    import ml_dtypes

    xp = xp_of(x)
    source = np.dtype(x.dtype)
    # the widest array computed: the target, or int32 on the way to 2- and 4-bit types
    widest = np.dtype(np.int32) if target.name in _SMALL_INTS else target
    check_size(node, np.shape(x), max(widest, source, key=lambda d: d.itemsize))
    if target.name == "float8_e8m0fnu":
        raise ValueError(f"{node.where}: casts to FLOAT8E8M0 are not supported")
    if node.get("saturate", 1) == 0 and target.name not in _SMALL_FLOATS:  # as onnxruntime
        raise ValueError(
            f"{node.where}: saturate 0 applies to casts to float8 only, not to {target.name}"
        )
    if target.name in _SMALL_INTS:  # truncate, then wrap around, as numpy (ml_dtypes) does
        bits = 4 if target.name.endswith("4") else 2
        if not np.issubdtype(source, np.integer):
            x = xp.trunc(x)
        v = cast_to(x, np.int32)
        low = -(1 << (bits - 1)) if target.name.startswith("int") else 0
        span = np.asarray(1 << bits, np.int32)
        return cast_to(xp.mod(v - np.int32(low), span) + np.int32(low), target)
    if target.name in _SMALL_FLOATS and node.get("saturate", 1):
        top = float(ml_dtypes.finfo(target).max)
        x = xp.clip(x, np.asarray(-top, source), np.asarray(top, source))
    return cast_to(x, target)


def _cast_check(node: Node) -> None:
    if node["to"] == 8:  # TensorProto.STRING
        raise TypeError(f"{node.where}: casts to STRING; {STRINGS_ADVICE}")


@register("Cast", check=_cast_check)
def _cast_op(node: Node, x: Any) -> Any:
    _cast_check(node)
    return _convert(node, x, tensor_dtype(node["to"], node.where))


@register("CastLike")
def _cast_like(node: Node, x: Any, like: Any) -> Any:
    return _convert(node, x, np.dtype(like.dtype))


# ----------------------------------------------------------------------------- bits


for _name, _fn_name in [
    ("BitwiseAnd", "bitwise_and"),
    ("BitwiseOr", "bitwise_or"),
    ("BitwiseXor", "bitwise_xor"),
]:
    register(_name)(_binary(_fn_name))
register("BitwiseNot")(_unary(jnp.invert, np.invert))


@register("BitShift")
def _bit_shift(node: Node, x: Any, shift: Any) -> Any:
    """Shifts by ``shift`` bits (arithmetic right shifts of signed ints, opset 28); a shift
    that is negative or at least the width gives what the sign extension alone gives: -1
    for a right shift of a negative x, 0 otherwise (never XLA's or C's unspecified result)."""
    direction = node["direction"]
    if direction not in ("LEFT", "RIGHT"):
        raise ValueError(f"{node.where}: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    same_dtype(node, x, shift)
    shape = broadcast_check(node, x, shift)
    x, shift = jnp.broadcast_to(x, shape), jnp.broadcast_to(shift, shape)
    bits = np.iinfo(x.dtype).bits
    outside = (shift < 0) | (shift >= bits)
    amount = jnp.where(outside, jnp.zeros_like(shift), shift)
    zero = jnp.zeros_like(x)
    if direction == "LEFT":
        return jnp.where(outside, zero, jnp.left_shift(x, amount))
    fill = jnp.where(x < 0, jnp.full_like(x, -1), zero) if np.iinfo(x.dtype).min else zero
    return jnp.where(outside, fill, jnp.right_shift(x, amount))


_NO_BITCAST = ("bool", "complex64", "complex128", "str", *_SMALL_INTS, "float4_e2m1fn")


@register("BitCast")
def _bit_cast(node: Node, x: Any) -> Any:
    """The same bits read as ``to`` (of the same width), little endian as XLA and numpy.

    A bool is the byte 0 or 1; a cast to bool is refused (other bytes are no bool).
    """
    target = tensor_dtype(node["to"], node.where)
    if x.dtype == bool:
        x = cast_to(x, np.uint8)
    source = np.dtype(x.dtype)
    for dtype in (source, target):
        if dtype.name in _NO_BITCAST:
            raise ValueError(f"{node.where}: bit casts to or from {dtype.name} are not supported")
    if not is_static(x) and canonical(target) != target:  # x is then narrowed too
        raise ValueError(f"{node.where}: BitCast to {target} needs 64-bit JAX (jax_enable_x64)")
    if source.itemsize != target.itemsize:
        raise ValueError(
            f"{node.where}: BitCast from {source} ({8 * source.itemsize} bits) to {target} "
            f"({8 * target.itemsize} bits) changes the width"
        )
    if is_static(x):
        return np.ascontiguousarray(x).view(target)
    return lax.bitcast_convert_type(x, target)
