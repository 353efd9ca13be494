"""Every check of a user's input, in one place, so that bad input fails early and clearly.

Each check raises ``TypeError`` or ``ValueError`` naming the argument and the
entry point (``where``) at trace time, before anything is compiled or donated.
Values only known at run time (tracers, e.g. under ``optax.inject_hyperparams``
inside ``jax.jit``) can only be checked for their shape.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

INT32_MAX = int(np.iinfo(np.int32).max)


# --------------------------------------------------------------------------
# Scalars
# --------------------------------------------------------------------------


def is_traced(value: Any) -> bool:
    """Whether ``value`` is a JAX tracer (its value is unknown at trace time)."""
    return isinstance(value, jax.core.Tracer)


def scalar(value: Any, kind: Literal["real", "integer"] = "real") -> float | int | None:
    """The value of a scalar known at trace time; ``None`` when it is traced.

    ``kind="real"`` accepts integers and floats (returns a float),
    ``kind="integer"`` only integers (returns an int). Booleans, strings,
    arrays of other shapes and other dtypes raise ``TypeError`` saying why.
    """
    if isinstance(value, bool | np.bool_):
        raise TypeError("a boolean is not a number here")
    if is_traced(value) or isinstance(value, jax.Array | np.ndarray | np.generic):
        if np.ndim(value) != 0:
            raise TypeError(f"expected a scalar, got an array of shape {np.shape(value)}")
        dtype = np.dtype(value.dtype)
        integer = np.issubdtype(dtype, np.integer) and dtype != np.bool_
        if not integer and (kind == "integer" or not np.issubdtype(dtype, np.floating)):
            expected = "an integer" if kind == "integer" else "a real"
            raise TypeError(f"expected {expected} scalar, got dtype {dtype}")
        if is_traced(value):
            return None
        number = np.asarray(value).item()
    elif isinstance(value, numbers.Integral) or (
        kind == "real" and isinstance(value, numbers.Real)
    ):
        number = value
    else:
        expected = "an integer" if kind == "integer" else "a real number"
        raise TypeError(f"expected {expected}, got {type(value).__name__}")
    return int(number) if kind == "integer" else float(number)


def stored_number(where: str, name: str, value: Any, *, positive: bool = False) -> float:
    """A finite real number (``> 0`` with ``positive``) that a model stores as a constant.

    Errors name ``where`` and ``name``; a traced value is refused, since a
    file can only hold a number.
    """
    try:
        number = scalar(value)
    except TypeError as error:
        raise TypeError(f"{where}: {name} must be a real number: {error}") from None
    if number is None:
        raise TypeError(f"{where}: {name} is traced; a value stored in ONNX needs a number")
    if not math.isfinite(number) or (positive and number <= 0):
        kind = "a finite number > 0" if positive else "finite"
        raise ValueError(f"{where}: {name} must be {kind}, got {number}")
    return number


def is_static_zero(value: Any) -> bool:
    """True when ``value`` is known at trace time to be exactly zero."""
    return not is_traced(value) and scalar(value) == 0.0


def check_hyperparameter(
    where: str,
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> None:
    """A real, finite scalar in ``[minimum, maximum]`` (traced: only its shape is checked)."""
    if isinstance(value, jax.Array | np.ndarray) and value.ndim != 0:
        raise ValueError(f"{where}: {name} must be a scalar, got shape {value.shape}")
    if is_traced(value):
        return
    try:
        number = scalar(value)
    except TypeError as error:
        raise TypeError(f"{where}: {name} must be a real number: {error}") from None
    assert number is not None
    if not math.isfinite(number):
        raise ValueError(f"{where}: {name} must be finite, got {number}")
    if minimum is not None and number < minimum:
        raise ValueError(f"{where}: {name} must be >= {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{where}: {name} must be <= {maximum}, got {number}")


def check_choice(where: str, name: str, value: Any, choices: Sequence[str]) -> None:
    """A string attribute (Momentum's ``mode``) must be one of ``choices``."""
    wanted = " or ".join(repr(choice) for choice in choices)
    if not isinstance(value, str):
        raise TypeError(
            f"{where}: {name} must be the string {wanted}, got {type(value).__name__} {value!r}"
        )
    if value not in choices:
        raise ValueError(f"{where}: {name} must be {wanted}, got {value!r}")


def check_attributes(
    where: str,
    attributes: Any,
    ranges: Mapping[str, tuple[float | None, float | None]],
    choices: Mapping[str, Sequence[str]],
    *,
    constant: bool,
) -> None:
    """Checks an operator's attributes (a NamedTuple) against its ranges and choices.

    ``constant=True`` (the ops) refuses traced values: ONNX attributes are
    constants, not tensors.
    """
    label = "attribute " if constant else ""
    for name, value in attributes._asdict().items():
        if name in choices:
            check_choice(where, name, value, choices[name])
            continue
        if constant and is_traced(value):
            raise TypeError(
                f"{where}: attribute {name} must be a constant (ONNX attributes are not "
                "tensors); for traced hyperparameters use the optax transformation with "
                "optax.inject_hyperparams"
            )
        minimum, maximum = ranges.get(name, (None, None))
        check_hyperparameter(where, label + name, value, minimum=minimum, maximum=maximum)


# --------------------------------------------------------------------------
# The factories' other arguments
# --------------------------------------------------------------------------


def check_learning_rate(where: str, learning_rate: Any) -> None:
    """A learning rate is a real scalar or a schedule ``count -> scalar``."""
    if not callable(learning_rate):
        check_hyperparameter(where, "learning_rate", learning_rate)


def check_initial_count(where: str, initial_count: Any) -> None:
    """The first T must be an integer in [0, 2**31 - 1] (the count is int32)."""
    try:
        value = scalar(initial_count, "integer")
    except TypeError:
        raise TypeError(
            f"{where}: initial_count must be an integer (the T of the first update), "
            f"got {initial_count!r}"
        ) from None
    if value is not None and not 0 <= value <= INT32_MAX:
        raise ValueError(f"{where}: initial_count must be in [0, {INT32_MAX}], got {value}")


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


def check_pack_leaves_below(where: str, pack_leaves_below: Any) -> int | None:
    """A non-negative integer (``None`` if traced: only ``init`` reads it)."""
    try:
        value = scalar(pack_leaves_below, "integer")
    except TypeError:
        raise TypeError(
            f"{where}: pack_leaves_below must be an integer (a leaf size), "
            f"got {pack_leaves_below!r}"
        ) from None
    if value is not None and value < 0:
        raise ValueError(f"{where}: pack_leaves_below must be >= 0, got {value}")
    return None if value is None else int(value)


# --------------------------------------------------------------------------
# Pytrees of a transformation's update
# --------------------------------------------------------------------------


def check_leaves(
    where: str, argument: str, tree: Any, *, floating: bool, abstract: bool = False
) -> None:
    """Every leaf must be an array (and, with ``floating``, a floating-point one).

    With ``abstract`` (``init``), a ``jax.ShapeDtypeStruct`` stands for an
    array, as optax's own ``init`` accepts for shape planning and sharding. A
    float64 leaf without 64-bit JAX is refused, as the ops refuse it: JAX would
    compute it in float32 (one rule for every entry point).
    """
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        location = f"{argument}{jax.tree_util.keystr(path)}"
        if isinstance(leaf, np.ndarray | np.generic):
            refuse_truncation(f"{where}: {location}", leaf)
        kinds: tuple[type, ...] = (jax.Array, np.ndarray, np.generic)
        if abstract:
            kinds = (*kinds, jax.ShapeDtypeStruct)
            if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.shape:
                refuse_truncation(f"{where}: {location}", np.empty(0, leaf.dtype))
        dtype = getattr(leaf, "dtype", None)
        if not isinstance(leaf, kinds) or dtype is None:
            if floating:
                raise TypeError(f"{where}: {location} is a {type(leaf).__name__}, not an array")
            raise TypeError(
                f"{where}: {location} must be a floating-point array, got {type(leaf).__name__}"
            )
        if floating and not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(
                f"{where}: {location} has dtype {dtype}; only floating-point tensors can be "
                "optimized (mask integer leaves out with optax.masked)"
            )


def check_update_arguments(
    where: str, state_class: type, state: Any, updates: Any, params: Any, reads_params: bool
) -> None:
    """What ``update`` checks before compiling: the state's type and array leaves."""
    if not isinstance(state, state_class):
        article = "an" if state_class.__name__[0] in "AEIOU" else "a"
        raise TypeError(
            f"{where}: state must be {article} {state_class.__name__}, got {type(state).__name__}"
        )
    count: Any = getattr(state, "count", None)
    if np.ndim(count) != 0 or np.dtype(getattr(count, "dtype", np.float64)) != np.int32:
        raise TypeError(
            f"{where}: state.count must be an int32 scalar (the T of the next update, as init() "
            f"makes it), got {getattr(count, 'dtype', type(count).__name__)}"
            f"{list(np.shape(count)) if np.ndim(count) else ''}"
        )
    if not is_traced(count) and int(np.asarray(count)) < 0:
        raise ValueError(
            f"{where}: state.count is {int(np.asarray(count))}; an update count is >= 0"
        )
    check_leaves(where, "updates", updates, floating=False)
    if reads_params:
        check_leaves(where, "params", params, floating=False)


def check_trees(
    where: str,
    updates: Any,
    states: Sequence[tuple[str, Any, Any]],
    params: Any,
    *,
    reads_params: bool,
    why_params: str,
) -> tuple[list[Any], Any, list[Any]]:
    """Checks, at trace time, that gradients, state and params line up.

    ``states`` holds ``(field, tree structure, leaf shapes)`` of each state
    tree. Returns the gradient leaves, their tree structure and the parameter
    leaves (``None`` each when the formula does not read X).
    """
    leaves_with_path, treedef_ = jax.tree_util.tree_flatten_with_path(updates)
    treedef: Any = treedef_
    params_def = None if params is None else jax.tree.structure(params)
    for name, state_def, _ in states:
        if state_def != treedef:
            if params_def is not None and params_def == state_def:
                culprit = "the gradients differ from the params and the state"
            elif params_def is not None and params_def == treedef:
                culprit = "the state differs from the gradients and the params"
            else:
                culprit = "the state must come from init() on parameters shaped like the gradients"
            raise ValueError(
                f"{where}: the updates (gradients) and state.{name} have different tree "
                f"structures; {culprit}.\n  updates: {treedef}\n  state.{name}: {state_def}"
            )
    param_leaves: list[Any] = [None] * len(leaves_with_path)
    if reads_params and leaves_with_path:
        if params is None:
            raise ValueError(
                f"{where}: {why_params}, so update() needs the parameters: call "
                "tx.update(grads, state, params)"
            )
        if params_def != treedef:
            raise ValueError(
                f"{where}: the updates (gradients) and params have different tree "
                f"structures.\n  updates: {treedef}\n  params: {params_def}"
            )
        param_leaves = treedef.flatten_up_to(params)
    for i, (path, g) in enumerate(leaves_with_path):
        location = jax.tree_util.keystr(path)
        if not jnp.issubdtype(g.dtype, jnp.floating):
            raise TypeError(
                f"{where}: updates{location} must be a floating-point array, got {g.dtype}"
            )
        for name, _, shapes in states:
            if shapes[i] != g.shape:
                raise ValueError(
                    f"{where}: updates{location} has shape {g.shape} but "
                    f"state.{name}{location} has shape {shapes[i]}"
                )
        x = param_leaves[i]
        if x is not None:
            if x.shape != g.shape:
                raise ValueError(
                    f"{where}: updates{location} has shape {g.shape} but "
                    f"params{location} has shape {x.shape}"
                )
            if not jnp.issubdtype(x.dtype, jnp.floating):
                raise TypeError(f"{where}: params{location} has non-float dtype {x.dtype}")
    return [g for _, g in leaves_with_path], treedef, param_leaves


# --------------------------------------------------------------------------
# The ops' inputs: R, T, X.., G.., (V..), (H..)
# --------------------------------------------------------------------------


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


def as_tensor(where: str, name: str, value: Any) -> jax.Array:
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


def _tensor_name(group: str, index: int, count: int) -> str:
    return group if count == 1 else f"{group}_{index + 1}"


def split_variadic(
    where: str, inputs: Sequence[Any], groups: Sequence[str]
) -> list[list[jax.Array]]:
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
    split = [
        [as_tensor(where, _tensor_name(group, i, n), inputs[j * n + i]) for i in range(n)]
        for j, group in enumerate(groups)
    ]
    dtype = split[0][0].dtype
    for j, group in enumerate(groups):
        for i, tensor in enumerate(split[j]):
            name = _tensor_name(group, i, n)
            if not jnp.issubdtype(tensor.dtype, jnp.floating):
                raise TypeError(
                    f"{where}: input {name} has dtype {tensor.dtype}; the optimized tensors "
                    "and their gradients and accumulators must be floating point "
                    "(ONNX T3: float or double)"
                )
            if tensor.dtype != dtype:
                raise TypeError(
                    f"{where}: input {name} has dtype {tensor.dtype} but "
                    f"{_tensor_name(groups[0], 0, n)} has {dtype}; all tensors of the op "
                    "share one type (ONNX T3)"
                )
            if tensor.shape != split[0][i].shape:
                raise ValueError(
                    f"{where}: input {name} has shape {tensor.shape} but "
                    f"{_tensor_name(groups[0], i, n)} has shape {split[0][i].shape}; each "
                    f"tensor's {', '.join(groups)} must have the same shape"
                )
    return split


def check_learning_rate_input(where: str, R: Any) -> jax.Array:
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


def check_count_input(where: str, T: Any) -> jax.Array:
    """T: an integer scalar (ONNX T2: int64), the update count."""
    if isinstance(T, bool | np.bool_):
        raise TypeError(f"{where}: input T must be an integer scalar, got bool")
    if not isinstance(T, numbers.Integral | jax.Array | np.ndarray | np.generic):
        T = np.asarray(T)
    if np.ndim(T) != 0:
        raise ValueError(f"{where}: input T must be a scalar (shape ()), got shape {np.shape(T)}")
    try:
        value = scalar(T, "integer")
    except TypeError:
        raise TypeError(
            f"{where}: input T must be an integer scalar (ONNX T2: int64), got dtype {T.dtype}"
        ) from None
    if value is None:
        return T
    if value < 0:
        raise ValueError(f"{where}: input T is an update count and must be >= 0, got {value}")
    if value > int(np.iinfo(np.int64).max):
        raise ValueError(f"{where}: input T={value} does not fit int64, the ONNX type of T")
    limit = int(np.iinfo(np.int64 if jax.config.read("jax_enable_x64") else np.int32).max)
    if value > limit:
        raise ValueError(
            f"{where}: input T={value} does not fit the {'int64' if limit > INT32_MAX else 'int32'}"
            " counter; enable 64-bit JAX (jax.config.update('jax_enable_x64', True)) for "
            "counts of 2**31 and more"
        )
    return jnp.asarray(value)
