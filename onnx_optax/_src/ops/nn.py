"""The standard ONNX ops (domain ``ai.onnx``) as small jax.numpy/lax functions.

One registry, keyed by domain and then by op type (not by opset version):
``REGISTRY[""]["Relu"]``, also ``OPS["Relu"]`` (``OPS`` is the ``ai.onnx``
table), is an :class:`Op` whose ``fn(node, *inputs)`` follows the newest opset's
semantics and branches only where a newer opset changed them (``axes`` moving
from an attribute to an input, Softmax's axis, Pad's and Slice's old attribute
forms). Other domains' ops register into the same registry from their own
module (``register("Scaler", domain="ai.onnx.ml")`` in ``onnx_ml_ops``, imported
at the end of this module so that importing the registry registers them all).
``node`` is a :class:`Node`: the attributes by name with the schema's defaults
for the model's opset of the node's domain, the opset itself and how errors
name the node. Absent optional inputs arrive as ``None``.

Shape-valued inputs (``Op.static``: Reshape's shape, Slice's starts, Reduce
axes, ...) are numpy arrays known at trace time; ops whose inputs are all numpy
compute with numpy and return numpy (``_xp``), so shape arithmetic such as
``Shape -> Gather -> Concat -> Reshape`` folds while tracing and a whole graph
compiles into one XLA computation.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src.onnx_tensors import (
    STRINGS_ADVICE,
    read_tensor,
    refuse_narrowing,
    tensor_dtype,
    utf8,
)

STANDARD_DOMAINS = ("", "ai.onnx")
# The default Limits.tensor_bytes (onnx_optax._src.load): the most bytes one tensor a
# node computes may take, checked before numpy allocates it or XLA is handed its shape.
MAX_TENSOR_BYTES = 16 * 2**30


@dataclasses.dataclass(frozen=True)
class Node:
    """What an op function knows of its node: attributes (defaults filled), opset, name."""

    attrs: Mapping[str, Any]
    opset: int
    where: str  # how errors name the node
    n_outputs: int
    max_bytes: int = MAX_TENSOR_BYTES  # the largest tensor the node may compute

    def __getitem__(self, name: str) -> Any:
        return self.attrs[name]

    def get(self, name: str, default: Any = None) -> Any:
        value = self.attrs.get(name)
        return default if value is None else value


@dataclasses.dataclass(frozen=True)
class Op:
    """One op type: its function, the input positions read at trace time, its checks."""

    fn: Callable[..., Any]
    static: tuple[int, ...] = ()  # inputs that must be known while tracing (shapes, axes)
    # Checks the attributes alone when the graph is prepared (before any input is seen).
    check: Callable[[Node], None] | None = None


# The one registry: domain ('' for ai.onnx) -> op type -> Op.
REGISTRY: dict[str, dict[str, Op]] = {"": {}}
OPS: dict[str, Op] = REGISTRY[""]  # the ai.onnx ops


def domain_of(node: Any) -> str:
    """A node's domain as the registry keys it ('' for ai.onnx, however written)."""
    return "" if node.domain in STANDARD_DOMAINS else node.domain


def find_op(node: Any) -> Op | None:
    """The registered op running ``node`` (by its domain and op type), if any."""
    return REGISTRY.get(domain_of(node), {}).get(node.op_type)


def register(
    *names: str,
    static: tuple[int, ...] = (),
    domain: str = "",
    check: Callable[[Node], None] | None = None,
) -> Callable[..., Any]:
    """Registers ``fn(node, *inputs)`` as the op(s) ``names`` of ``domain``."""
    table = REGISTRY.setdefault("" if domain in STANDARD_DOMAINS else domain, {})

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            table[name] = Op(fn, static, check)
        return fn

    return wrap


# ----------------------------------------------------------------------------- helpers


def is_static(value: Any) -> bool:
    """Whether a value is known while tracing (a numpy array, not a JAX array)."""
    return isinstance(value, np.ndarray | np.generic)


def _xp(*values: Any) -> Any:
    """numpy when every given value is static (shape arithmetic), else jax.numpy."""
    return np if all(v is None or is_static(v) for v in values) else jnp


def _canonical(dtype: Any) -> np.dtype:
    """The dtype JAX holds for ``dtype`` (int64 -> int32 without 64-bit JAX)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(np.dtype(dtype)))


def _cast(x: Any, dtype: Any) -> Any:
    if is_static(x):
        return np.asarray(x).astype(dtype)
    return x.astype(_canonical(dtype))


def _ints(value: Any) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _axis(axis: int, rank: int, where: str) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"{where}: axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def _axes(axes: Sequence[int], rank: int, where: str) -> tuple[int, ...]:
    out = tuple(_axis(int(a), rank, where) for a in axes)
    if len(set(out)) != len(out):
        raise ValueError(f"{where}: repeated axes {list(axes)}")
    return out


def _legacy_broadcast(node: Node, a: Any, b: Any) -> Any:
    """Opset < 7 binary ops: ``broadcast=1`` aligns ``b`` with ``a`` from ``axis``."""
    if node.opset >= 7 or not node.get("broadcast", 0) or np.ndim(b) == 0:
        return b
    axis = node.get("axis")
    if axis is None:
        return b
    axis = _axis(int(axis), np.ndim(a), node.where)
    trailing = np.ndim(a) - axis - np.ndim(b)
    return b.reshape(tuple(np.shape(b)) + (1,) * max(trailing, 0))


def _same_dtype(node: Node, *values: Any) -> None:
    dtypes = {_canonical(v.dtype) for v in values if v is not None}
    if len(dtypes) > 1:
        raise TypeError(
            f"{node.where}: inputs have dtypes {sorted(map(str, dtypes))}; they must be of one type"
        )


def _broadcast_check(node: Node, *values: Any) -> None:
    given = [v for v in values if v is not None]
    try:
        shape = np.broadcast_shapes(*(np.shape(v) for v in given))
    except ValueError:
        shapes = [list(np.shape(v)) for v in given]
        raise ValueError(f"{node.where}: input shapes {shapes} do not broadcast") from None
    if given:
        widest = max((np.dtype(v.dtype) for v in given), key=lambda d: d.itemsize)
        check_size(node, shape, widest)


def check_size(node: Node, shape: Sequence[Any], dtype: Any, what: str = "output") -> None:
    """Refuses a tensor of ``shape`` larger than the node's limit, counted in Python ints.

    Called before numpy allocates a computed shape or XLA is handed one (an
    element count beyond int64 aborts XLA), with the limit keyword to raise it.
    """
    dims = [int(d) for d in shape]
    size = math.prod(dims) * np.dtype(dtype).itemsize
    if size > node.max_bytes:
        raise ValueError(
            f"{node.where}: its {what} of shape {dims} ({np.dtype(dtype)}) would take {size} "
            f"bytes, over the limit of {node.max_bytes} bytes per tensor; raise it with "
            "limits=Limits(tensor_bytes=...) if the model is yours"
        )


def _is_int(x: Any) -> bool:
    return bool(np.issubdtype(np.dtype(x.dtype), np.integer))


# ----------------------------------------------------------------------------- elementwise


def _binary(fn_name: str) -> Callable[..., Any]:
    def run(node: Node, a: Any, b: Any) -> Any:
        b = _legacy_broadcast(node, a, b)
        _same_dtype(node, a, b)
        _broadcast_check(node, a, b)
        return getattr(_xp(a, b), fn_name)(a, b)

    return run


register("Add")(_binary("add"))
register("Sub")(_binary("subtract"))
register("Mul")(_binary("multiply"))


@register("Div")
def _div(node: Node, a: Any, b: Any) -> Any:
    b = _legacy_broadcast(node, a, b)
    _same_dtype(node, a, b)
    _broadcast_check(node, a, b)
    if _is_int(a):
        if _xp(a, b) is np:
            return np.trunc(a / b).astype(a.dtype)
        shape = jnp.broadcast_shapes(a.shape, b.shape)
        return lax.div(jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape))
    return _xp(a, b).divide(a, b)


@register("Mod")
def _mod(node: Node, a: Any, b: Any) -> Any:
    _same_dtype(node, a, b)
    xp = _xp(a, b)
    if node.get("fmod", 0):
        return xp.fmod(a, b)
    return xp.mod(a, b)


@register("Pow")
def _pow(node: Node, a: Any, b: Any) -> Any:
    b = _legacy_broadcast(node, a, b)
    _broadcast_check(node, a, b)
    xp = _xp(a, b)
    if _is_int(a) and not _is_int(b):
        return _cast(xp.power(_cast(a, b.dtype), b), a.dtype)
    return xp.power(a, _cast(b, a.dtype))


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
    ("Sigmoid", jax.nn.sigmoid, None),
    ("Relu", jax.nn.relu, None),
    ("Softplus", jax.nn.softplus, None),
    ("Softsign", jax.nn.soft_sign, None),
    ("Not", jnp.logical_not, np.logical_not),
    ("IsNaN", jnp.isnan, np.isnan),
]:
    register(_name)(_unary(_fn, _np_fn))


@register("IsInf")
def _isinf(node: Node, x: Any) -> Any:
    xp = _xp(x)
    pos = xp.isposinf(x) if node.get("detect_positive", 1) else xp.zeros(x.shape, bool)
    neg = xp.isneginf(x) if node.get("detect_negative", 1) else xp.zeros(x.shape, bool)
    return xp.logical_or(pos, neg)


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
        _same_dtype(node, *xs)
        _broadcast_check(node, *xs)
        xp = _xp(*xs)
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
    _same_dtype(node, x, y)
    _broadcast_check(node, condition, x, y)
    return _xp(condition, x, y).where(condition, x, y)


@register("Clip")
def _clip(node: Node, x: Any, low: Any = None, high: Any = None) -> Any:
    if node.opset < 11:  # min and max were attributes
        low, high = node.get("min"), node.get("max")
        low = None if low is None else np.asarray(low, x.dtype)
        high = None if high is None else np.asarray(high, x.dtype)
    xp = _xp(x, low, high)
    if low is not None:
        x = xp.maximum(x, _cast(low, x.dtype))
    if high is not None:
        x = xp.minimum(x, _cast(high, x.dtype))
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

    xp = _xp(x)
    source = np.dtype(x.dtype)
    if target.name == "float8_e8m0fnu":
        raise ValueError(f"{node.where}: casts to FLOAT8E8M0 are not supported")
    if target.name in _SMALL_INTS:  # truncate, then wrap around, as numpy (ml_dtypes) does
        bits = 4 if target.name.endswith("4") else 2
        if not np.issubdtype(source, np.integer):
            x = xp.trunc(x)
        v = _cast(x, np.int32)
        low = -(1 << (bits - 1)) if target.name.startswith("int") else 0
        span = np.asarray(1 << bits, np.int32)
        return _cast(xp.mod(v - np.int32(low), span) + np.int32(low), target)
    if target.name in _SMALL_FLOATS and node.get("saturate", 1):
        top = float(ml_dtypes.finfo(target).max)
        x = xp.clip(x, np.asarray(-top, source), np.asarray(top, source))
    return _cast(x, target)


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
    dims = _ints(shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"{node.where}: negative dimension in shape {dims}")
    check_size(node, dims, fill.dtype)
    if math.prod(dims) > 1 << 16:  # big fills are computed on the device, not embedded
        refuse_narrowing(f"{node.where}: attribute 'value'", fill)
        return jnp.full(dims, fill[0], _canonical(fill.dtype))
    return np.full(dims, fill[0], fill.dtype)


@register("Range", static=(0, 1, 2))
def _range(node: Node, start: Any, limit: Any, delta: Any) -> Any:
    _same_dtype(node, start, limit, delta)
    start, limit, delta = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    if delta == 0:
        raise ValueError(f"{node.where}: delta is 0")
    steps = float((limit - start) / delta)
    if not math.isfinite(steps):
        raise ValueError(
            f"{node.where}: start {start}, limit {limit} and delta {delta} give no finite "
            "number of elements"
        )
    count = max(math.ceil(steps), 0)
    check_size(node, [count], np.int64, "index array")  # numpy builds it first
    return (start + np.arange(count) * delta).astype(start.dtype)


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


@register("MatMul")
def _matmul(node: Node, a: Any, b: Any) -> Any:
    _same_dtype(node, a, b)
    try:
        return _xp(a, b).matmul(a, b)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{node.where}: MatMul of shapes {list(a.shape)} and {list(b.shape)}: {error}"
        ) from None


@register("Gemm")
def _gemm(node: Node, a: Any, b: Any, c: Any = None) -> Any:
    _same_dtype(node, a, b, c)
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
    mask = np.ones(x.shape, bool) if node.opset >= 10 else np.ones(x.shape, x.dtype)
    return (x, mask)[: node.n_outputs]


# ----------------------------------------------------------------------------- shapes


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


@register("Reshape", static=(1,))
def _reshape(node: Node, x: Any, shape: Any = None) -> Any:
    dims = _ints(node.get("shape") if shape is None else shape)
    if not node.get("allowzero", 0):
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    try:
        return _xp(x).reshape(x, dims)
    except (TypeError, ValueError):
        raise ValueError(
            f"{node.where}: cannot reshape shape {list(x.shape)} to {_ints(shape)}"
        ) from None


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
    return _xp(x).transpose(x, perm)


def _axes_of(node: Node, axes: Any) -> list[int] | None:
    """Axes from the input (newer opsets) or the attribute (older), None if neither."""
    if axes is not None:
        return _ints(axes)
    value = node.get("axes")
    return None if value is None else [int(a) for a in value]


@register("Squeeze", static=(1,))
def _squeeze(node: Node, x: Any, axes: Any = None) -> Any:
    picked = _axes_of(node, axes)
    if picked is None:
        picked = [i for i, d in enumerate(x.shape) if d == 1]
    picked_ = _axes(picked, np.ndim(x), node.where)
    if any(x.shape[a] != 1 for a in picked_):
        raise ValueError(f"{node.where}: cannot squeeze axes {picked} of shape {list(x.shape)}")
    return _xp(x).squeeze(x, axis=picked_) if picked_ else x


@register("Unsqueeze", static=(1,))
def _unsqueeze(node: Node, x: Any, axes: Any = None) -> Any:
    picked = _axes_of(node, axes)
    if picked is None:
        raise ValueError(f"{node.where}: Unsqueeze needs axes")
    rank = np.ndim(x) + len(picked)
    shape = list(np.shape(x))
    for a in sorted(_axes(picked, rank, node.where)):
        shape.insert(a, 1)
    return _xp(x).reshape(x, shape)


@register("Concat")
def _concat(node: Node, *xs: Any) -> Any:
    xs = tuple(x for x in xs if x is not None)
    _same_dtype(node, *xs)
    axis = _axis(int(node["axis"]), np.ndim(xs[0]), node.where)
    try:
        return _xp(*xs).concatenate(xs, axis=axis)
    except (TypeError, ValueError):
        shapes = [list(np.shape(x)) for x in xs]
        raise ValueError(
            f"{node.where}: cannot concatenate shapes {shapes} on axis {axis}"
        ) from None


@register("Split", static=(1,))
def _split(node: Node, x: Any, split: Any = None) -> Any:
    axis = _axis(int(node["axis"]), np.ndim(x), node.where)
    size = x.shape[axis]
    sizes = _ints(split) if split is not None else node.get("split")
    n = node.n_outputs
    if sizes is None:
        parts = int(node.get("num_outputs", n))
        chunk = -(-size // parts)
        sizes = [min(chunk, size - i * chunk) for i in range(parts)]
    sizes = [int(s) for s in sizes]
    if sum(sizes) != size or len(sizes) != n:
        raise ValueError(
            f"{node.where}: split {sizes} does not cut axis {axis} of size {size} into {n}"
        )
    offsets = np.cumsum([0, *sizes])
    xp = _xp(x)
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
    rank = np.ndim(x)
    starts_, ends_ = _ints(starts), _ints(ends)
    axes_ = list(range(len(starts_))) if axes is None else _ints(axes)
    steps_ = [1] * len(starts_) if steps is None else _ints(steps)
    if not len(starts_) == len(ends_) == len(axes_) == len(steps_):
        raise ValueError(f"{node.where}: starts, ends, axes and steps differ in length")
    index: list[Any] = [slice(None)] * rank
    for start, end, axis, step in zip(
        starts_, ends_, _axes(axes_, rank, node.where), steps_, strict=True
    ):
        dim = x.shape[axis]
        if step == 0:
            raise ValueError(f"{node.where}: a step is 0")
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        index[axis] = slice(start, None if end < 0 else end, step)
    return x[tuple(index)]


@register("Gather")
def _gather(node: Node, x: Any, indices: Any) -> Any:
    axis = _axis(int(node["axis"]), np.ndim(x), node.where)
    if not _is_int(indices):
        raise TypeError(f"{node.where}: indices must be integers, got {indices.dtype}")
    dim = x.shape[axis]
    xp = _xp(x, indices)
    indices = xp.where(indices < 0, indices + dim, indices)
    if xp is np:
        return np.take(x, indices, axis=axis)
    return jnp.take(x, indices, axis=axis, mode="clip")


@register("GatherElements")
def _gather_elements(node: Node, x: Any, indices: Any) -> Any:
    axis = _axis(int(node["axis"]), np.ndim(x), node.where)
    indices = jnp.where(indices < 0, indices + x.shape[axis], indices)
    return jnp.take_along_axis(x, indices, axis=axis, mode="clip")


@register("Expand", static=(1,))
def _expand(node: Node, x: Any, shape: Any) -> Any:
    try:
        target = np.broadcast_shapes(np.shape(x), tuple(_ints(shape)))
    except ValueError:
        raise ValueError(
            f"{node.where}: shape {list(np.shape(x))} does not expand to {_ints(shape)}"
        ) from None
    check_size(node, target, x.dtype)
    return _xp(x).broadcast_to(x, target)


@register("Tile", static=(1,))
def _tile(node: Node, x: Any, repeats: Any) -> Any:
    reps = _ints(repeats)
    if len(reps) != np.ndim(x):
        raise ValueError(f"{node.where}: repeats {reps} do not match rank {np.ndim(x)}")
    if any(r < 0 for r in reps):
        raise ValueError(f"{node.where}: negative repeats {reps}")
    check_size(node, [d * r for d, r in zip(np.shape(x), reps, strict=True)], x.dtype)
    return _xp(x).tile(x, reps)


@register("Pad", static=(1, 3))
def _pad(node: Node, x: Any, pads: Any = None, value: Any = None, axes: Any = None) -> Any:
    rank = np.ndim(x)
    if node.opset < 11:
        amounts = [int(p) for p in node.get("pads") or node.get("paddings")]
        fill = np.asarray(node.get("value", 0.0), x.dtype)
    else:
        amounts = _ints(pads)
        fill = np.zeros((), x.dtype) if value is None else value
    picked = list(range(rank)) if axes is None else list(_axes(_ints(axes), rank, node.where))
    if len(amounts) != 2 * len(picked):
        raise ValueError(f"{node.where}: pads {amounts} do not fit {len(picked)} axes")
    widths = [[0, 0] for _ in range(rank)]
    for i, axis in enumerate(picked):
        widths[axis] = [amounts[i], amounts[i + len(picked)]]
    # negative pads crop
    crop = tuple(slice(max(-lo, 0), x.shape[a] - max(-hi, 0)) for a, (lo, hi) in enumerate(widths))
    x = x[crop]
    widths_ = [(max(lo, 0), max(hi, 0)) for lo, hi in widths]
    check_size(node, [d + lo + hi for d, (lo, hi) in zip(x.shape, widths_, strict=True)], x.dtype)
    mode = node.get("mode", "constant")
    xp = _xp(x, value)
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


@register("DepthToSpace")
def _depth_to_space(node: Node, x: Any) -> Any:
    b = int(node["blocksize"])
    n, c, h, w = x.shape
    if node.get("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@register("SpaceToDepth")
def _space_to_depth(node: Node, x: Any) -> Any:
    b = int(node["blocksize"])
    n, c, h, w = x.shape
    if node.get("mode", "DCR") == "CRD":
        y = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 1, 3, 5, 2, 4)
        return y.reshape(n, c * b * b, h // b, w // b)
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


# ----------------------------------------------------------------------------- reductions


def _reduction(
    fn: Callable[..., Any], empty: Callable[[Any], Any] | None = None
) -> Callable[..., Any]:
    def run(node: Node, x: Any, axes: Any = None) -> Any:
        picked = _axes_of(node, axes)
        keepdims = bool(node.get("keepdims", 1))
        if not picked:
            if node.get("noop_with_empty_axes", 0):
                return x
            picked = list(range(np.ndim(x)))
        picked_ = _axes(picked, np.ndim(x), node.where)
        xp = _xp(x)
        if any(x.shape[a] == 0 for a in picked_) and empty is not None:
            shape = [1 if a in picked_ else d for a, d in enumerate(x.shape)]
            out = xp.full(shape, empty(x.dtype), x.dtype)
            return (
                out
                if keepdims
                else out.reshape([d for a, d in enumerate(x.shape) if a not in picked_])
            )
        return fn(xp, x, picked_, keepdims)

    return run


def _low(dtype: Any) -> Any:
    if np.dtype(dtype) == np.bool_:
        return False
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def _high(dtype: Any) -> Any:
    if np.dtype(dtype) == np.bool_:
        return True
    return np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).max


def _logsumexp(xp: Any, x: Any, axes: Any, keepdims: bool) -> Any:
    if xp is np:
        top = np.max(x, axis=axes, keepdims=True)
        out = np.log(np.sum(np.exp(x - top), axis=axes, keepdims=True)) + top
        return out if keepdims else np.squeeze(out, axis=axes)
    return jax.nn.logsumexp(x, axis=axes, keepdims=keepdims)


for _name, _reduce, _empty in [
    ("ReduceSum", lambda xp, x, a, k: xp.sum(x, axis=a, keepdims=k), None),
    ("ReduceMean", lambda xp, x, a, k: xp.mean(x, axis=a, keepdims=k), None),
    ("ReduceMax", lambda xp, x, a, k: xp.max(x, axis=a, keepdims=k), _low),
    ("ReduceMin", lambda xp, x, a, k: xp.min(x, axis=a, keepdims=k), _high),
    ("ReduceProd", lambda xp, x, a, k: xp.prod(x, axis=a, keepdims=k), None),
    ("ReduceL1", lambda xp, x, a, k: xp.sum(xp.abs(x), axis=a, keepdims=k), None),
    (
        "ReduceL2",
        lambda xp, x, a, k: xp.sqrt(xp.sum(xp.square(x), axis=a, keepdims=k)).astype(x.dtype),
        None,
    ),
    ("ReduceSumSquare", lambda xp, x, a, k: xp.sum(xp.square(x), axis=a, keepdims=k), None),
    ("ReduceLogSum", lambda xp, x, a, k: xp.log(xp.sum(x, axis=a, keepdims=k)), lambda d: -np.inf),
    ("ReduceLogSumExp", _logsumexp, lambda d: -np.inf),
]:
    register(_name, static=(1,))(_reduction(_reduce, _empty))


def _arg(fn_name: str) -> Callable[..., Any]:
    def run(node: Node, x: Any) -> Any:
        axis = _axis(int(node["axis"]), np.ndim(x), node.where)
        keepdims = bool(node["keepdims"])
        xp = _xp(x)
        if node.get("select_last_index", 0):
            flipped = xp.flip(x, axis=axis)
            index = x.shape[axis] - 1 - getattr(xp, fn_name)(flipped, axis=axis, keepdims=keepdims)
        else:
            index = getattr(xp, fn_name)(x, axis=axis, keepdims=keepdims)
        return _cast(index, np.int64)

    return run


register("ArgMax")(_arg("argmax"))
register("ArgMin")(_arg("argmin"))


# ----------------------------------------------------------------------------- losses


def _nll(node: Node, log_prob: Any, labels: Any, weights: Any) -> Any:
    """Negative log-likelihood of ``labels`` under ``log_prob`` (N, C, d...), with reduction."""
    if not _is_int(labels):
        raise TypeError(f"{node.where}: labels must be integers, got {labels.dtype}")
    reduction = node.get("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"{node.where}: reduction must be none, sum or mean, got {reduction!r}")
    ignore = node.get("ignore_index")
    labels = jnp.asarray(labels)
    valid = jnp.ones(labels.shape, bool) if ignore is None else labels != ignore
    safe = jnp.where(valid, labels, 0)
    picked = jnp.take_along_axis(log_prob, safe[:, None], axis=1, mode="clip")[:, 0]
    w = (
        jnp.ones(labels.shape, log_prob.dtype)
        if weights is None
        else jnp.take(weights, safe, mode="clip")
    )
    w = jnp.where(valid, w, jnp.zeros_like(w))
    loss = -picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return jnp.sum(loss)
    return jnp.sum(loss) / jnp.sum(w)


@register("NegativeLogLikelihoodLoss")
def _nll_loss(node: Node, log_prob: Any, labels: Any, weights: Any = None) -> Any:
    return _nll(node, log_prob, labels, weights)


@register("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(node: Node, scores: Any, labels: Any, weights: Any = None) -> Any:
    log_prob = jax.nn.log_softmax(scores, axis=1)
    loss = _nll(node, log_prob, labels, weights)
    return (loss, log_prob)[: node.n_outputs]


# ----------------------------------------------------------------------------- attributes


def node_schema(node: Any, opset: int, where: str) -> Any:
    """The node's ``OpSchema`` at ``opset`` (else its newest); "ai.onnx" is the default domain."""
    import onnx

    domain = domain_of(node)
    try:
        return onnx.defs.get_schema(node.op_type, opset, domain)
    except onnx.defs.SchemaError:
        pass
    try:
        return onnx.defs.get_schema(node.op_type, domain)
    except onnx.defs.SchemaError:
        raise NotImplementedError(
            f"{where}: ONNX defines no op {node.op_type} in domain '{domain or 'ai.onnx'}'"
        ) from None


def check_omitted_inputs(node: Any, opset: int, where: str) -> None:
    """Refuses an omitted input (an empty name) where the schema does not mark it optional."""
    import onnx

    formal = list(node_schema(node, opset, where).inputs)
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    for position, name in enumerate(node.input):
        if name:
            continue
        if not formal or formal[min(position, len(formal) - 1)].option != optional:
            raise ValueError(
                f"{where}: input {position} is omitted (an empty name), but {node.op_type} "
                "requires it; only inputs the ONNX schema marks optional may be left out"
            )


def read_attributes(node: Any, opset: int, where: str) -> dict[str, Any]:
    """The node's attributes by name, with the schema's defaults for ``opset`` filled in.

    Each attribute's type is checked against the schema; tensors are read with
    :func:`read_tensor`. An attribute the schema lacks is an error.
    """
    import onnx
    from onnx import helper

    schema = node_schema(node, opset, where)
    values: dict[str, Any] = {}
    for name, spec in schema.attributes.items():
        default = spec.default_value
        values[name] = _attribute_value(default, where) if default.type else None
    names = collections.Counter(attribute.name for attribute in node.attribute)
    repeated = sorted(name for name, count in names.items() if count > 1)
    if repeated:
        raise ValueError(f"{where}: attribute(s) {', '.join(repeated)} given more than once")
    for attribute in node.attribute:
        declared = schema.attributes.get(attribute.name)
        if declared is None:
            raise ValueError(
                f"{where}: unknown attribute '{attribute.name}' ({node.op_type} at opset {opset} "
                f"has {', '.join(schema.attributes) or 'none'})"
            )
        if attribute.ref_attr_name:
            raise ValueError(
                f"{where}: attribute '{attribute.name}' refers to a function attribute"
            )
        if attribute.type != declared.type:
            expected = onnx.AttributeProto.AttributeType.Name(declared.type)
            got = onnx.AttributeProto.AttributeType.Name(attribute.type)
            raise TypeError(f"{where}: attribute '{attribute.name}' must be {expected}, got {got}")
        values[attribute.name] = _attribute_value(attribute, where)
    missing = [
        name
        for name, spec in schema.attributes.items()
        if spec.required and values.get(name) is None
    ]
    if missing:
        raise ValueError(f"{where}: missing required attribute(s) {', '.join(missing)}")
    del helper
    return values


def _attribute_value(attribute: Any, where: str) -> Any:
    import onnx
    from onnx import helper

    kind = attribute.type
    if kind == onnx.AttributeProto.TENSOR:
        return read_tensor(attribute.t, f"{where} attribute '{attribute.name}'")
    if kind in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        raise ValueError(f"{where}: attribute '{attribute.name}' holds a subgraph (not supported)")
    if kind in (onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.TENSORS):
        return attribute  # refused by the op that would read it
    value = helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return utf8(value, f"{where}: attribute '{attribute.name}'")
    if kind == onnx.AttributeProto.STRINGS:
        return [utf8(v, f"{where}: attribute '{attribute.name}'") for v in value]
    if kind in (onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS):
        return list(value)
    return value


# The other domains' ops register into REGISTRY when their module is imported: here, so
# that whoever reads the registry sees them all.
from onnx_optax._src.ops import ml  # noqa: E402, F401
