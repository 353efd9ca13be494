"""Learning-rate schedules that a training model stores as ONNX ops.

Each function takes optax's arguments and returns a :class:`Schedule`: a valid
optax schedule (a callable of the update count, equal to optax's schedule of
the same name to float32 rounding) that also writes itself as standard ONNX
ops computing R from T. So ``attach(..., optimizer=onnx_optax.adam(schedule))``
stores the whole recipe in the algorithm graph, and the model trains the same
in any runtime. Both faces run one formula: written once against a small set
of operations, evaluated either on jax arrays or as ONNX nodes.

Values are computed in float32 (as optax does without 64-bit JAX) and cast to
the parameters' dtype. The count is the optimizer's own (T): onnx_optax's Adam
counts from 1, so its first step reads ``schedule(1)``.

Example:
  >>> from onnx_optax.training import schedules
  >>> schedule = schedules.cosine_decay_schedule(1e-3, decay_steps=1000)
  >>> [round(float(schedule(t)), 6) for t in (0, 500, 1000, 2000)]
  [0.001, 0.0005, 0.0, 0.0]
  >>> schedule
  cosine_decay_schedule(init_value=0.001, decay_steps=1000, alpha=0.0, exponent=1.0)

  The same formula as ONNX nodes, from the int64 tensor T to the float tensor R
  (``names`` makes fresh tensor names; attach passes the model's):

  >>> fresh = iter(range(100))
  >>> nodes = schedules.linear_schedule(1.0, 0.0, transition_steps=10).onnx_nodes(
  ...     "T", "R", names=lambda base: f"{base}_{next(fresh)}")
  >>> [node.op_type for node in nodes if node.op_type != "Constant"]
  ['Cast', 'Sub', 'Max', 'Min', 'Div', 'Sub', 'Mul', 'Add', 'Cast']
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_optax._src import checks
from onnx_optax._src.checks import INT32_MAX

__all__ = [
    "SCHEDULES",
    "Schedule",
    "constant_schedule",
    "cosine_decay_schedule",
    "exponential_decay",
    "linear_schedule",
    "warmup_cosine_decay_schedule",
]

SCHEDULES = (
    "constant_schedule",
    "linear_schedule",
    "exponential_decay",
    "cosine_decay_schedule",
    "warmup_cosine_decay_schedule",
)


# ----------------------------------------------------------------------------- the two faces


class _Jax:
    """The formulas' operations on float32 jax arrays."""

    const = staticmethod(jnp.float32)
    add, sub, mul, div = jnp.add, jnp.subtract, jnp.multiply, jnp.divide
    minimum, maximum, pow = jnp.minimum, jnp.maximum, jnp.power
    cos, floor, greater, less, where = jnp.cos, jnp.floor, jnp.greater, jnp.less, jnp.where


def _op(op_type: str) -> Callable[..., str]:
    def write(self: _Onnx, *inputs: str) -> str:
        return self.node(op_type, *inputs)

    return write


class _Onnx:
    """The formulas' operations as ONNX nodes: each returns the name of its output."""

    def __init__(self, names: Callable[[str], str], prefix: str) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.names, self.prefix = names, prefix

    def node(self, op_type: str, *inputs: str, **attributes: Any) -> str:
        output = self.names(f"{self.prefix}/{op_type}")
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], **attributes))
        return output

    def const(self, value: float) -> str:
        return self.node("Constant", value=numpy_helper.from_array(np.asarray(value, np.float32)))

    add, sub, mul, div = _op("Add"), _op("Sub"), _op("Mul"), _op("Div")
    minimum, maximum, pow, cos = _op("Min"), _op("Max"), _op("Pow"), _op("Cos")
    floor, greater, less, where = _op("Floor"), _op("Greater"), _op("Less"), _op("Where")


# The formulas keep optax's order of operations and its float64 folding of
# constants (``init - end``, ``1 - alpha``), so that they round as optax's do.


def _linear(o: Any, t: Any, init: float, end: float, steps: int, begin: int) -> Any:
    done = o.minimum(o.maximum(o.sub(t, o.const(begin)), o.const(0)), o.const(steps))
    fraction = o.sub(o.const(1), o.div(done, o.const(steps)))
    return o.add(o.mul(o.const(init - end), fraction), o.const(end))


def _cosine(o: Any, t: Any, init: float, steps: int, alpha: float, exponent: float) -> Any:
    angle = o.div(o.mul(o.const(math.pi), o.minimum(t, o.const(steps))), o.const(steps))
    cosine = o.mul(o.const(0.5), o.add(o.const(1), o.cos(angle)))
    decayed = o.add(o.mul(o.const(1 - alpha), o.pow(cosine, o.const(exponent))), o.const(alpha))
    return o.mul(o.const(init), decayed)


# ----------------------------------------------------------------------------- checks


def _steps(where: str, name: str, value: Any, low: int, why: str = "") -> int:
    try:
        number = checks.scalar(value, "integer")
    except TypeError as error:
        raise TypeError(f"{where}: {name} must be an integer (a count of steps): {error}") from None
    if number is None:
        raise TypeError(f"{where}: {name} is traced; a schedule stored in ONNX needs a number")
    if not low <= number <= INT32_MAX:
        raise ValueError(f"{where}: {name} must be in [{low}, {INT32_MAX}], got {number}{why}")
    return int(number)


_CONSTANT_HINT = "; for a value that does not change use constant_schedule"


# ----------------------------------------------------------------------------- the schedules


@dataclasses.dataclass(frozen=True)
class Schedule:
    """An optax schedule ``count -> value`` that writes itself as ONNX ops.

    Built by the functions of this module, which check their arguments; it is
    immutable and hashable, so jitted code can take it as a static argument.
    """

    def __call__(self, count: Any) -> jax.Array:
        """The value at ``count`` (an integer scalar or array), in float32."""
        return self._formula(_Jax, jnp.asarray(count).astype(jnp.float32))

    def onnx_nodes(
        self, count: str, value: str, names: Callable[[str], str], dtype: Any = np.float32
    ) -> list[onnx.NodeProto]:
        """ONNX nodes computing tensor ``value`` (of ``dtype``) from the int64 tensor ``count``.

        ``names(base)`` returns a fresh tensor name. The ops (Cast, Constant,
        Add, Sub, Mul, Div, Min, Max, Pow, Cos, Floor, Greater, Less, Where) are
        elementwise, so ``count`` may hold many counts at once.
        """
        writer = _Onnx(names, value)
        t = writer.node("Cast", count, to=onnx.TensorProto.FLOAT)
        result = self._formula(writer, t)
        if not any(t in node.input for node in writer.nodes):
            del writer.nodes[0]
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        writer.nodes.append(helper.make_node("Cast", [result], [value], to=elem))
        return writer.nodes

    def _formula(self, o: Any, t: Any) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"{self._name}({fields})"

    _name = "Schedule"


@dataclasses.dataclass(frozen=True, repr=False)
class _Constant(Schedule):
    value: float
    _name = "constant_schedule"

    def _formula(self, o: Any, t: Any) -> Any:
        return o.const(self.value)


@dataclasses.dataclass(frozen=True, repr=False)
class _Linear(Schedule):
    init_value: float
    end_value: float
    transition_steps: int
    transition_begin: int
    _name = "linear_schedule"

    def _formula(self, o: Any, t: Any) -> Any:
        return _linear(o, t, *dataclasses.astuple(self))


@dataclasses.dataclass(frozen=True, repr=False)
class _Exponential(Schedule):
    init_value: float
    transition_steps: int
    decay_rate: float
    transition_begin: int
    staircase: bool
    end_value: float | None
    _name = "exponential_decay"

    def _formula(self, o: Any, t: Any) -> Any:
        elapsed = o.sub(t, o.const(self.transition_begin))
        power = o.div(elapsed, o.const(self.transition_steps))
        if self.staircase:
            power = o.floor(power)
        decayed = o.mul(o.const(self.init_value), o.pow(o.const(self.decay_rate), power))
        value = o.where(o.greater(elapsed, o.const(0)), decayed, o.const(self.init_value))
        if self.end_value is None:
            return value
        bound = o.maximum if self.decay_rate < 1 else o.minimum
        return bound(value, o.const(self.end_value))


@dataclasses.dataclass(frozen=True, repr=False)
class _Cosine(Schedule):
    init_value: float
    decay_steps: int
    alpha: float
    exponent: float
    _name = "cosine_decay_schedule"

    def _formula(self, o: Any, t: Any) -> Any:
        return _cosine(o, t, *dataclasses.astuple(self))


@dataclasses.dataclass(frozen=True, repr=False)
class _WarmupCosine(Schedule):
    init_value: float
    peak_value: float
    warmup_steps: int
    decay_steps: int
    end_value: float
    exponent: float
    _name = "warmup_cosine_decay_schedule"

    def _formula(self, o: Any, t: Any) -> Any:
        warm = self.warmup_steps
        alpha = 0.0 if self.peak_value == 0 else self.end_value / self.peak_value
        warmup = (
            _linear(o, t, self.init_value, self.peak_value, warm, 0)
            if warm
            else o.const(self.init_value)
        )
        decay_steps = self.decay_steps - warm
        decay = _cosine(
            o, o.sub(t, o.const(warm)), self.peak_value, decay_steps, alpha, self.exponent
        )
        return o.where(o.less(t, o.const(warm)), warmup, decay)


# ----------------------------------------------------------------------------- the functions


def constant_schedule(value: float) -> Schedule:
    """The same value at every count: ``R = value`` (optax.constant_schedule).

    Args:
      value: a finite number.

    Returns:
      The :class:`Schedule`.
    """
    return _Constant(checks.stored_number("constant_schedule", "value", value))


def linear_schedule(
    init_value: float, end_value: float, transition_steps: int, transition_begin: int = 0
) -> Schedule:
    """From ``init_value`` to ``end_value`` in a straight line (optax.linear_schedule).

    ``R = (I - E) * (1 - clip(t - B, 0, S) / S) + E`` at count ``t``: ``I``
    until ``t = B``, ``E`` from ``t = B + S`` on.

    Args:
      init_value: I, a finite number.
      end_value: E, a finite number.
      transition_steps: S, the length of the transition, an integer >= 1.
      transition_begin: B, the count at which it starts, an integer >= 0.

    Returns:
      The :class:`Schedule`.
    """
    where = "linear_schedule"
    return _Linear(
        checks.stored_number(where, "init_value", init_value),
        checks.stored_number(where, "end_value", end_value),
        _steps(where, "transition_steps", transition_steps, 1, _CONSTANT_HINT),
        _steps(where, "transition_begin", transition_begin, 0),
    )


def exponential_decay(
    init_value: float,
    transition_steps: int,
    decay_rate: float,
    transition_begin: int = 0,
    staircase: bool = False,
    end_value: float | None = None,
) -> Schedule:
    """``init_value`` times ``decay_rate`` per ``transition_steps`` (optax.exponential_decay).

    ``R = I * rate ** p`` with ``p = (t - B) / S`` (``floor`` of it when
    ``staircase``) once ``t > B``, and ``R = I`` before; with ``end_value``,
    R stops there (a lower bound when ``rate < 1``, an upper one otherwise).

    Args:
      init_value: I, a finite number.
      transition_steps: S, an integer >= 1.
      decay_rate: the factor per S steps, a finite number > 0.
      transition_begin: B, the count at which the decay starts, an integer >= 0.
      staircase: decay in whole steps of S counts.
      end_value: None or a finite number: where the decay stops.

    Returns:
      The :class:`Schedule`.
    """
    where = "exponential_decay"
    if not isinstance(staircase, bool | np.bool_):
        raise TypeError(f"{where}: staircase must be True or False, got {staircase!r}")
    return _Exponential(
        checks.stored_number(where, "init_value", init_value),
        _steps(where, "transition_steps", transition_steps, 1, _CONSTANT_HINT),
        checks.stored_number(where, "decay_rate", decay_rate, positive=True),
        _steps(where, "transition_begin", transition_begin, 0),
        bool(staircase),
        None if end_value is None else checks.stored_number(where, "end_value", end_value),
    )


def cosine_decay_schedule(
    init_value: float, decay_steps: int, alpha: float = 0.0, exponent: float = 1.0
) -> Schedule:
    """Half a cosine from ``init_value`` to ``alpha * init_value`` (optax.cosine_decay_schedule).

    ``R = I * ((1 - alpha) * c ** exponent + alpha)`` with
    ``c = (1 + cos(pi * min(t, D) / D)) / 2``, ``D = decay_steps``.

    Args:
      init_value: I, a finite number.
      decay_steps: D, an integer >= 1.
      alpha: the final multiplier of I, a finite number.
      exponent: the power of c, a finite number > 0.

    Returns:
      The :class:`Schedule`.
    """
    where = "cosine_decay_schedule"
    return _Cosine(
        checks.stored_number(where, "init_value", init_value),
        _steps(where, "decay_steps", decay_steps, 1),
        checks.stored_number(where, "alpha", alpha),
        checks.stored_number(where, "exponent", exponent, positive=True),
    )


def warmup_cosine_decay_schedule(
    init_value: float,
    peak_value: float,
    warmup_steps: int,
    decay_steps: int,
    end_value: float = 0.0,
    exponent: float = 1.0,
) -> Schedule:
    """A linear warmup, then a cosine decay (optax.warmup_cosine_decay_schedule).

    For ``t < W``: ``linear_schedule(init_value, peak_value, W)(t)``; from
    then on ``cosine_decay_schedule(peak_value, D - W, alpha, exponent)(t - W)``
    with ``alpha = end_value / peak_value`` (0 when ``peak_value`` is 0),
    ``W = warmup_steps`` and ``D = decay_steps``, which counts the warmup.

    Args:
      init_value: the value at count 0, a finite number.
      peak_value: the value at the end of the warmup, a finite number.
      warmup_steps: W, an integer >= 0.
      decay_steps: D, the length of the whole schedule, an integer > W.
      end_value: the value from count D on, a finite number.
      exponent: the power of the cosine term, a finite number > 0.

    Returns:
      The :class:`Schedule`.
    """
    where = "warmup_cosine_decay_schedule"
    warmup = _steps(where, "warmup_steps", warmup_steps, 0)
    why = " (greater than warmup_steps, since it counts the warmup)"
    return _WarmupCosine(
        checks.stored_number(where, "init_value", init_value),
        checks.stored_number(where, "peak_value", peak_value),
        warmup,
        _steps(where, "decay_steps", decay_steps, warmup + 1, why),
        checks.stored_number(where, "end_value", end_value),
        checks.stored_number(where, "exponent", exponent, positive=True),
    )


def learning_rate_nodes(
    learning_rate: Any, count: str, value: str, names: Callable[[str], str], dtype: Any
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """R of an algorithm graph: a schedule's nodes reading T, or a number's initializer."""
    if isinstance(learning_rate, Schedule):
        return learning_rate.onnx_nodes(count, value, names, dtype), []
    if callable(learning_rate):
        raise TypeError(
            f"the optimizer's learning rate is a Python function ({learning_rate!r}), which an "
            "ONNX model cannot store; use a schedule of onnx_optax.training.schedules "
            f"({', '.join(SCHEDULES)}): each writes itself as ONNX ops"
        )
    number = checks.scalar(learning_rate)
    if number is None:
        raise TypeError("the optimizer's learning rate is traced; ONNX stores R as a number")
    return [], [numpy_helper.from_array(np.asarray(number, dtype), value)]
