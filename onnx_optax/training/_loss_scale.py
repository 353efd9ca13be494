"""Dynamic loss scaling as ONNX ops: for float16 gradients that would underflow.

The step differentiates ``Cast(loss, float32) * S`` instead of the loss, so
each gradient leaves the backward pass ``S`` times larger (above float16's
smallest value), and unscales it as ``Cast(g, float32) / S`` before the
optimizer. When any unscaled gradient is not finite (the scaled backward pass
overflowed), the step is skipped: every bound initializer (the parameters,
their optimizer state, T) keeps its value, ``S`` halves (not below 1) and the
count of good steps restarts; after ``period`` good steps in a row ``S``
doubles (not above ``MAX_SCALE``). ``S`` (float32) and the count (int64) are
initializers the step binds, so a saved model resumes with them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_optax._src import checks

MAX_SCALE = 2.0**24
"""The largest loss scale reached by doubling."""


class LossScale(NamedTuple):
    """The nodes, initializers and bindings of dynamic loss scaling."""

    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto]
    binding: dict[str, str]  # S and the good-step count to their next values
    outputs: list[onnx.ValueInfoProto]  # the algorithm outputs those are


class _Writer:
    """Nodes written into one list, each output a fresh name under ``loss_scale/``."""

    def __init__(self, names: Callable[[str], str]) -> None:
        self.names = names
        self.nodes: list[onnx.NodeProto] = []

    def __call__(self, op_type: str, inputs: Sequence[str], base: str, **attributes: Any) -> str:
        output = self.names(f"loss_scale/{base}")
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], **attributes))
        return output

    def constant(self, value: np.ndarray, base: str) -> str:
        return self("Constant", [], base, value=numpy_helper.from_array(value))


def check_options(initial: Any, period: Any) -> tuple[float, int]:
    """``loss_scale`` (a number >= 1) and ``loss_scale_period`` (an integer >= 1), checked."""
    scale = checks.stored_number("attach", "loss_scale", initial, positive=True)
    if not 1 <= scale <= MAX_SCALE:
        raise ValueError(f"attach: loss_scale must be in [1, 2**24]; got {scale}")
    if not isinstance(period, int | np.integer) or isinstance(period, bool) or period < 1:
        raise ValueError(f"attach: loss_scale_period must be an integer >= 1; got {period!r}")
    return scale, int(period)


def scaled_loss(loss: str, names: Callable[[str], str]) -> tuple[list[onnx.NodeProto], str, str]:
    """Nodes computing ``Cast(loss, float32) * S``; with its name and S's."""
    write = _Writer(names)
    scale = names("loss_scale")
    wide = write("Cast", [loss], "loss", to=TensorProto.FLOAT)
    return write.nodes, write("Mul", [wide, scale], "scaled"), scale


def unscaled(
    grads: Sequence[str], scale: str, dtype: np.dtype, names: Callable[[str], str]
) -> tuple[list[onnx.NodeProto], list[str], str]:
    """Nodes computing each ``g / S`` (in float32, or float64 for float64 gradients) in
    ``dtype``, and ``ok``: whether every one is finite (``sum(g * 0)`` is not NaN)."""
    write = _Writer(names)
    wide = np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)
    wide_elem = int(helper.np_dtype_to_tensor_dtype(wide))
    elem = int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    s = scale if wide == np.float32 else write("Cast", [scale], "S.wide", to=wide_elem)
    zero = write.constant(np.zeros((), wide), "zero")
    result, probes = [], []
    for g in grads:
        value = g if np.dtype(dtype) == wide else write("Cast", [g], f"{g}.wide", to=wide_elem)
        value = write("Div", [value, s], f"{g}.unscaled")
        probes.append(
            write("ReduceSum", [write("Mul", [value, zero], f"{g}.zero")], f"{g}.probe", keepdims=0)
        )
        result.append(value if np.dtype(dtype) == wide else write("Cast", [value], g, to=elem))
    total = write("Sum", probes, "probe") if len(probes) > 1 else probes[0]
    ok = write("Not", [write("IsNaN", [total], "nan")], "ok")
    return write.nodes, result, ok


def kept(
    ok: str, binding: dict[str, str], names: Callable[[str], str]
) -> tuple[list[onnx.NodeProto], dict[str, str]]:
    """Each binding ``key -> new`` as ``key -> Where(ok, new, key)``: skipped unless ``ok``."""
    write = _Writer(names)
    return write.nodes, {k: write("Where", [ok, v, k], f"{k}.kept") for k, v in binding.items()}


def updated(
    ok: str, scale: str, initial: float, period: int, names: Callable[[str], str]
) -> LossScale:
    """S and the good-step count after this step, as stored initializers and bindings.

    ``ok``: ``S2 = min(2 S, MAX_SCALE)`` and ``count = 0`` once ``count + 1`` reaches
    ``period``, else ``S`` and ``count + 1``; not ``ok``: ``max(S / 2, 1)`` and 0.
    """
    write = _Writer(names)
    count = names("loss_scale.good_steps")
    f32, i64 = np.float32, np.int64
    more = write("Add", [count, write.constant(np.ones((), i64), "one")], "count.more")
    grow = write(
        "GreaterOrEqual", [more, write.constant(np.asarray(period, i64), "period")], "grow"
    )
    doubled = write("Mul", [scale, write.constant(np.asarray(2, f32), "two")], "doubled")
    doubled = write("Min", [doubled, write.constant(np.asarray(MAX_SCALE, f32), "max")], "capped")
    halved = write("Mul", [scale, write.constant(np.asarray(0.5, f32), "half")], "halved")
    halved = write("Max", [halved, write.constant(np.ones((), f32), "min")], "floored")
    zero = write.constant(np.zeros((), i64), "zero_count")
    next_scale = write(
        "Where", [ok, write("Where", [grow, doubled, scale], "good"), halved], "next"
    )
    next_count = write(
        "Where", [ok, write("Where", [grow, zero, more], "counted"), zero], "count.next"
    )
    return LossScale(
        write.nodes,
        [
            numpy_helper.from_array(np.asarray(initial, f32), scale),
            numpy_helper.from_array(np.zeros((), i64), count),
        ],
        {scale: next_scale, count: next_count},
        [
            helper.make_tensor_value_info(next_scale, TensorProto.FLOAT, []),
            helper.make_tensor_value_info(next_count, TensorProto.INT64, []),
        ],
    )
