"""Shared plumbing for the three ONNX training operators.

Each operator module (``adagrad.py``, ``adam.py``, ``momentum.py``) holds its
formula once. This module holds what they share: checking hyperparameters and
inputs so that bad input fails with a clear Python error at trace time, the
dtype policy, the update counter and what a transformation records for export
to ONNX. Applying a formula to a pytree is in ``tree.py``.

Dtype policy (the same for the ops and the transforms):

* Every formula runs in its *compute dtype*: the widest of float32 and the dtypes
  of the tensors it reads. For the ONNX types (float32, float64) that is the
  tensor dtype itself, so ONNX semantics are kept exactly; bfloat16 and float16
  tensors are computed in float32 and rounded once when stored (optax rounds
  every intermediate, and ``0.999`` is ``1.0`` in bfloat16).
* Attributes are cast to the compute dtype before use, so ``1 - alpha`` is
  evaluated in tensor precision, as an ONNX runtime does with its float32
  attributes.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

Array = jax.Array
PyTree = Any

INT32_MAX = int(np.iinfo(np.int32).max)


# --------------------------------------------------------------------------
# Scalars and hyperparameters
# --------------------------------------------------------------------------


def is_traced(value: Any) -> bool:
    """Whether ``value`` is a JAX tracer (its value is unknown at trace time)."""
    return isinstance(value, jax.core.Tracer)


def static_number(value: Any) -> float | None:
    """The value of a real scalar known at trace time, or ``None`` if traced.

    Raises ``TypeError`` for anything that is not a real scalar.
    """
    if is_traced(value):
        return None
    if isinstance(value, bool | np.bool_):
        raise TypeError("a boolean is not a number here")
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, jax.Array | np.ndarray | np.generic):
        if np.ndim(value) != 0:
            raise TypeError(f"expected a scalar, got an array of shape {np.shape(value)}")
        dtype = np.dtype(value.dtype)
        if dtype == np.bool_ or not (
            np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)
        ):
            raise TypeError(f"expected a real scalar, got dtype {dtype}")
        return float(np.asarray(value))
    raise TypeError(f"expected a real number, got {type(value).__name__}")


def check_hyperparameter(
    where: str,
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> None:
    """Checks a real, finite scalar hyperparameter and its range.

    Traced values (e.g. under ``optax.inject_hyperparams`` inside ``jax.jit``)
    can only be checked for shape; their value is data.
    """
    if isinstance(value, jax.Array | np.ndarray) and value.ndim != 0:
        raise ValueError(f"{where}: {name} must be a scalar, got shape {value.shape}")
    if is_traced(value):
        return
    try:
        number = static_number(value)
    except TypeError as error:
        raise TypeError(f"{where}: {name} must be a real number: {error}") from None
    assert number is not None
    if not math.isfinite(number):
        raise ValueError(f"{where}: {name} must be finite, got {number}")
    if minimum is not None and number < minimum:
        raise ValueError(f"{where}: {name} must be >= {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{where}: {name} must be <= {maximum}, got {number}")


def is_static_zero(value: Any) -> bool:
    """True when ``value`` is known at trace time to be exactly zero."""
    return not is_traced(value) and static_number(value) == 0.0


def check_learning_rate(where: str, learning_rate: Any) -> None:
    """A learning rate is a real scalar or a schedule ``count -> scalar``."""
    if callable(learning_rate):
        return
    check_hyperparameter(where, "learning_rate", learning_rate)


Schedule = Callable[[Array], Any]


def split_learning_rate(learning_rate: optax.ScalarOrSchedule) -> tuple[Schedule | None, Any]:
    """``(schedule, None)`` for a schedule, ``(None, value)`` for a number.

    The schedule becomes a static argument of the compiled update (it is code);
    a number is traced, so changing it recompiles nothing.
    """
    if callable(learning_rate):
        return learning_rate, None
    return None, learning_rate


def learning_rate_at(schedule: Schedule | None, rate: Any, count: Array) -> Any:
    """The learning rate R used at update count ``count``."""
    if schedule is None:
        return rate
    value = schedule(count)
    if np.ndim(value) != 0:
        raise ValueError(
            f"the learning-rate schedule returned shape {np.shape(value)}; it must return a scalar"
        )
    return value


def check_initial_count(where: str, initial_count: Any) -> None:
    """The first T must be an integer in [0, 2**31 - 1] (the count is int32)."""
    if is_traced(initial_count):
        return
    dtype = getattr(initial_count, "dtype", None)
    is_integer = (
        isinstance(initial_count, numbers.Integral) and not isinstance(initial_count, bool)
    ) or (
        dtype is not None
        and np.ndim(initial_count) == 0
        and np.issubdtype(np.dtype(dtype), np.integer)
    )
    if not is_integer:
        raise TypeError(
            f"{where}: initial_count must be an integer (the T of the first update), "
            f"got {initial_count!r}"
        )
    value = int(np.asarray(initial_count))
    if not 0 <= value <= INT32_MAX:
        raise ValueError(f"{where}: initial_count must be in [0, {INT32_MAX}], got {value}")


def initial_count_array(initial_count: Any) -> Array:
    """The int32 update counter holding the T of the next update."""
    return jnp.asarray(initial_count).astype(jnp.int32)


def check_accumulator_dtype(where: str, accumulator_dtype: Any) -> jnp.dtype | None:
    """``None`` (the parameters' dtype) or a floating dtype for the state."""
    if accumulator_dtype is None:
        return None
    try:
        dtype = jnp.dtype(accumulator_dtype)
    except TypeError:
        raise TypeError(
            f"{where}: accumulator_dtype must be a floating dtype or None, "
            f"got {accumulator_dtype!r}"
        ) from None
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{where}: accumulator_dtype must be a floating dtype, got {dtype}")
    return dtype


def compute_dtype(*dtypes: Any) -> jnp.dtype:
    """The widest of float32 and ``dtypes``: the dtype a formula runs in.

    float64 if any of ``dtypes`` is float64, else float32 (bfloat16, float16
    and narrower floats are computed in float32).
    """
    if any(jnp.dtype(dtype) == jnp.float64 for dtype in dtypes):
        return jnp.dtype(jnp.float64)
    return jnp.dtype(jnp.float32)


def as_dtype(value: Any, dtype: Any) -> Array:
    """``value`` (a Python number or an array) as an array of ``dtype``."""
    return jnp.asarray(value).astype(dtype)


# --------------------------------------------------------------------------
# What a transformation implements, for export to ONNX
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OnnxSpec:
    """The ONNX operator an onnx_optax transformation implements, and how it was built."""

    op_type: str  # "Adagrad", "Adam" or "Momentum"
    attributes: Mapping[str, Any]  # the ONNX attributes (mode included for Momentum)
    learning_rate: Any  # R: a number, an array or a schedule
    initial_count: Any  # the T of the first update
    options: Mapping[str, Any]  # factory arguments that are not ONNX attributes


class OnnxTransformation(optax.GradientTransformationExtraArgs):
    """An ``optax.GradientTransformationExtraArgs`` that knows its ONNX operator.

    It is the ``(init, update)`` pair optax expects, plus ``onnx_spec``
    (:class:`OnnxSpec`), which :mod:`onnx_optax.interop` reads to export it.
    """

    onnx_spec: OnnxSpec


def onnx_transformation(
    init_fn: Callable[..., Any], update_fn: Callable[..., Any], spec: OnnxSpec
) -> OnnxTransformation:
    """Builds the transformation and attaches its :class:`OnnxSpec`."""
    transformation = OnnxTransformation(init_fn, update_fn)
    transformation.onnx_spec = spec
    return transformation


# --------------------------------------------------------------------------
# The functional ops: ONNX inputs R, T, X.., G.., (V..), (H..)
# --------------------------------------------------------------------------


def check_attributes(where: str, **attributes: float) -> dict[str, float]:
    """ONNX attributes are constants: they must be known real finite numbers."""
    values: dict[str, float] = {}
    for name, value in attributes.items():
        if is_traced(value):
            raise TypeError(
                f"{where}: attribute {name} must be a constant (ONNX attributes are not "
                "tensors); for traced hyperparameters use the optax transformation with "
                "optax.inject_hyperparams"
            )
        check_hyperparameter(where, f"attribute {name}", value)
        number = static_number(value)
        assert number is not None
        values[name] = number
    return values


def _tensor_name(group: str, index: int, count: int) -> str:
    return group if count == 1 else f"{group}_{index + 1}"


def refuse_truncation(what: str, array: Any) -> None:
    """Refuses a host array that 32-bit JAX would silently narrow.

    Without ``jax_enable_x64``, JAX turns float64 arrays into float32 and int64
    into int32. A float64 scalar (a double learning rate R beside float tensors)
    is cast to the tensors' type by the ops anyway; a float64 tensor, or an
    int64 value beyond int32, would lose information: refuse those.
    """
    if jax.config.read("jax_enable_x64"):
        return
    dtype = np.dtype(array.dtype)
    if dtype == np.float64 and np.ndim(array):
        raise TypeError(
            f"{what} is float64, which needs 64-bit JAX: call "
            "jax.config.update('jax_enable_x64', True) first (it would otherwise be "
            "computed in float32)"
        )
    if dtype == np.int64:
        values = np.asarray(array)
        info = np.iinfo(np.int32)
        if values.size and (values.min() < info.min or values.max() > info.max):
            raise ValueError(
                f"{what} holds int64 values beyond int32; enable 64-bit JAX "
                "(jax.config.update('jax_enable_x64', True))"
            )


def as_tensor(where: str, name: str, value: Any) -> Array:
    """An input tensor as a JAX array, with a clear error if it is not one."""
    if isinstance(value, jax.Array):
        return value
    if isinstance(value, str | bytes) or value is None:
        raise TypeError(f"{where}: input {name} must be a tensor, got {type(value).__name__}")
    if isinstance(value, np.ndarray | np.generic):
        refuse_truncation(f"{where}: input {name}", value)
    try:
        return jnp.asarray(value)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"{where}: input {name} must be a tensor, got {type(value).__name__} ({error})"
        ) from None


def split_variadic(where: str, inputs: Sequence[Any], groups: Sequence[str]) -> list[list[Array]]:
    """Splits ONNX variadic inputs ``[X_1..X_n, G_1..G_n, ...]`` and checks them.

    Returns one list per group: floating tensors of one dtype, each tensor's
    X, G, V, H of one shape.
    """
    k = len(groups)
    if len(inputs) == 0 or len(inputs) % k:
        raise TypeError(
            f"{where}: after R and T the op takes {k}*n tensors "
            f"({', '.join(g + '_1..' + g + '_n' for g in groups)}) for n >= 1 optimized "
            f"tensors; got {len(inputs)} tensor(s)"
        )
    n = len(inputs) // k
    split: list[list[Array]] = []
    for j, group in enumerate(groups):
        split.append(
            [as_tensor(where, _tensor_name(group, i, n), inputs[j * n + i]) for i in range(n)]
        )
    dtype = None
    for j, group in enumerate(groups):
        for i, tensor in enumerate(split[j]):
            name = _tensor_name(group, i, n)
            if not jnp.issubdtype(tensor.dtype, jnp.floating):
                raise TypeError(
                    f"{where}: input {name} has dtype {tensor.dtype}; the optimized tensors "
                    "and their gradients and accumulators must be floating point "
                    "(ONNX T3: float or double)"
                )
            if dtype is None:
                dtype = tensor.dtype
            elif tensor.dtype != dtype:
                raise TypeError(
                    f"{where}: input {name} has dtype {tensor.dtype} but "
                    f"{_tensor_name(groups[0], 0, n)} has {dtype}; all tensors of the op "
                    "share one type (ONNX T3)"
                )
    for i in range(n):
        shape = split[0][i].shape
        for j in range(1, k):
            if split[j][i].shape != shape:
                raise ValueError(
                    f"{where}: input {_tensor_name(groups[j], i, n)} has shape "
                    f"{split[j][i].shape} but {_tensor_name(groups[0], i, n)} has shape "
                    f"{shape}; each tensor's {', '.join(groups)} must have the same shape"
                )
    return split


def check_learning_rate_input(where: str, R: Any) -> Array:
    """R: a floating-point scalar (ONNX T1: float or double)."""
    if isinstance(R, bool | np.bool_):
        raise TypeError(f"{where}: input R must be a floating-point scalar, got bool")
    if isinstance(R, numbers.Real) and not isinstance(R, np.generic):
        return jnp.asarray(float(R))
    r = as_tensor(where, "R", R)
    if r.ndim != 0:
        raise ValueError(f"{where}: input R must be a scalar (shape ()), got shape {r.shape}")
    if not jnp.issubdtype(r.dtype, jnp.floating):
        raise TypeError(
            f"{where}: input R must be a floating-point scalar (ONNX T1: float or double), "
            f"got dtype {r.dtype}"
        )
    return r


def check_count_input(where: str, T: Any) -> Array:
    """T: an integer scalar (ONNX T2: int64), the update count."""
    if isinstance(T, bool | np.bool_):
        raise TypeError(f"{where}: input T must be an integer scalar, got bool")
    if isinstance(T, numbers.Integral) and not isinstance(T, np.generic):
        value = int(T)
    else:
        array = T if isinstance(T, jax.Array) else np.asarray(T)
        if np.ndim(array) != 0:
            raise ValueError(
                f"{where}: input T must be a scalar (shape ()), got shape {np.shape(array)}"
            )
        if not np.issubdtype(np.dtype(array.dtype), np.integer) or array.dtype == np.bool_:
            raise TypeError(
                f"{where}: input T must be an integer scalar (ONNX T2: int64), "
                f"got dtype {array.dtype}"
            )
        if is_traced(T):
            return T
        value = int(np.asarray(array))
    if value < 0:
        raise ValueError(f"{where}: input T is an update count and must be >= 0, got {value}")
    limit = int(np.iinfo(np.int64 if jax.config.read("jax_enable_x64") else np.int32).max)
    if value > limit:
        raise ValueError(
            f"{where}: input T={value} does not fit the {'int64' if limit > INT32_MAX else 'int32'}"
            " counter; enable 64-bit JAX (jax.config.update('jax_enable_x64', True)) for "
            "counts of 2**31 and more"
        )
    return jnp.asarray(value)
