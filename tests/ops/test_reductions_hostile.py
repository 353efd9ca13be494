"""Hostile shapes and attributes against the nn and reduction ops (issue 20, items 2, 6 and 7).

Each test is a finding of the audit, and fails on f9a32ac:

- memory bombs (2): outputs computed by numpy from trace-time constants, and host
  arrays the size of a declared input, before any size check (MatMul, the
  reductions of an empty constant, AveragePool's Python loop over output
  positions, MaxPool's index constant, Dropout's mask), and a ConvTranspose
  stride that overflowed XLA's shapes (an abort);
- silent wrong results (6): shapes and attributes onnxruntime refuses that we
  computed (negative pads, a ConvTranspose output beyond its natural size or an
  output_padding not below the stride, BatchNormalization on a rank-1 X, statistics,
  biases and scales of the wrong shape, a Conv window larger than its padded input,
  ...), and windows onnxruntime computes that we got wrong (a pool window past the
  padded input, dilated taps that miss X, ConvTranspose's output_shape);
- exceptions outside the promised set (7): a table of attribute values 0, negative
  and huge, each ending in onnxruntime's result or a ValueError/TypeError naming
  the node (ZeroDivisionError and lax's own errors before).

Expected values are onnxruntime's, running the same model (the ONNX reference
evaluator where onnxruntime departs from the spec, said at each such test), never
our own output.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto  # noqa: E402

from onnx_optax import backend  # noqa: E402
from tests.support.builders import run_capped as _outcome  # noqa: E402
from tests.support.node_models import FOLDED as _FOLDED  # noqa: E402
from tests.support.node_models import NAMED, F, assert_as_onnxruntime, node_model, theirs  # noqa: E402
from tests.support.node_models import random_floats as _random  # noqa: E402

HUGE = (2**31, 2**62)  # beyond int32; near int64's end


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceProd", "ReduceLogSumExp"])
@pytest.mark.parametrize("width", [2**30, 2**40])
def test_a_reduction_of_an_empty_constant_is_not_filled_on_the_host(op: str, width: int) -> None:
    # Reducing axis 0 of a [0, width] constant (zero bytes) gives width elements: numpy
    # filled them while tracing (4 GiB within the limit, 4 TiB beyond it: MemoryError).
    axes = "axes=np.array([0], np.int64)"
    found = _outcome(_FOLDED.format(args=f'"{op}", [[0, {width}]], {axes}', limit=2**34))
    if width > 2**32:
        assert f"RESULT ValueError node 'n' (ai.onnx.{op})" in found, found
        assert "tensor_bytes" in found, found
    else:
        assert "RESULT prepared" in found, found


# ----------------------------------------------------------------------------- 7. attributes


def _attribute_cases() -> dict[str, tuple[str, dict[str, list[int]], dict[str, Any], int]]:
    """name -> (op, input shapes, attributes, opset): every attribute at 0, -1, -3 and huge."""
    conv = {"x": [1, 2, 5, 5], "w": [2, 2, 3, 3]}
    pool = {"x": [1, 2, 5, 5]}
    cases: dict[str, tuple[str, dict[str, list[int]], dict[str, Any], int]] = {}
    for value in (0, -1, -3, *HUGE):
        for op, shapes, base in (
            ("Conv", conv, {}),
            ("ConvTranspose", conv, {}),
            ("MaxPool", pool, {"kernel_shape": [2, 2]}),
            ("AveragePool", pool, {"kernel_shape": [2, 2]}),
        ):
            names = ["strides", "dilations", "kernel_shape", "pads"]
            names += ["group"] if op.startswith("Conv") else ["ceil_mode"]
            names += ["output_padding", "output_shape"] if op == "ConvTranspose" else []
            for name in names:
                if name in ("group", "ceil_mode"):
                    attrs = {**base, name: value}
                elif name == "pads":
                    attrs = {**base, name: [value, 0, 0, value]}
                elif name == "kernel_shape":
                    attrs = {**base, name: [value, 2 if op.endswith("Pool") else 3]}
                else:
                    attrs = {**base, name: [value, 1 if name != "output_shape" else 5]}
                cases[f"{op} {name}={value}"] = (op, shapes, attrs, 21)
                if name == "strides":  # the SAME pads and ceil_mode divide by the stride
                    same = {**attrs, "auto_pad": "SAME_UPPER"}
                    cases[f"{op} {name}={value} SAME_UPPER"] = (op, shapes, same, 21)
                    if op.endswith("Pool"):
                        ceil = {**attrs, "ceil_mode": 1}
                        cases[f"{op} {name}={value} ceil_mode"] = (op, shapes, ceil, 21)
        gemm = {"a": [3, 2], "b": [3, 4]}
        cases[f"Gemm transA={value}"] = ("Gemm", gemm, {"transA": value}, 21)
        cases[f"Gemm transB={value}"] = ("Gemm", {"a": [2, 3], "b": [4, 3]}, {"transB": value}, 21)
        x = {"x": [2, 3, 4]}
        for op in ("Softmax", "LogSoftmax", "Hardmax"):
            cases[f"{op} axis={value}"] = (op, x, {"axis": value}, 21)
            cases[f"{op} axis={value} opset 11"] = (op, x, {"axis": value}, 11)
        cases[f"Flatten axis={value}"] = ("Flatten", x, {"axis": value}, 21)
        cases[f"ReduceMean axes=[{value}]"] = ("ReduceMean", x, {"axes": [value]}, 13)
        cases[f"ArgMax axis={value}"] = ("ArgMax", x, {"axis": value}, 13)
    return cases


ATTRIBUTE_CASES = _attribute_cases()

# where onnxruntime's own arithmetic overflows: the result must equal the one for 2**31
OVERFLOWS_IN_ONNXRUNTIME = {f"Conv strides={2**62} SAME_UPPER": f"Conv strides={2**31} SAME_UPPER"}


@pytest.mark.parametrize("case", ATTRIBUTE_CASES)
def test_attribute_values_end_in_onnxruntimes_result_or_a_named_error(case: str) -> None:
    """A ValueError or TypeError naming the node, or (where onnxruntime computes too) its
    result: never another exception, an abort or a hang."""
    op, shapes, attrs, opset = ATTRIBUTE_CASES[case]
    rng = np.random.default_rng(0)
    feeds = {k: _random(rng, s) for k, s in shapes.items()}
    types = (TensorProto.INT64,) if op == "ArgMax" else (F,)
    model = node_model(op, feeds, attrs, opset=opset, outputs=types)
    try:
        got = backend.prepare(model).run(feeds)
    except (ValueError, TypeError) as error:
        assert re.match(NAMED, str(error)), error
        return
    twin = OVERFLOWS_IN_ONNXRUNTIME.get(case, case)
    op, shapes, attrs, opset = ATTRIBUTE_CASES[twin]
    expected = theirs(node_model(op, feeds, attrs, opset=opset, outputs=types), feeds)
    assert expected is not None, f"computed {[np.shape(g) for g in got]}; onnxruntime refuses"
    assert_as_onnxruntime(model, feeds, expected)


# ----------------------------------------------------------------------------- 11. fuzzer findings
# Found by the op-level mutations of tests/support/fuzz_mutations.py (issue 20, item 11); each case
# marked so fails on c038037.

SCALAR_CASES: dict[str, tuple[str, dict[str, np.ndarray], dict[str, Any], int]] = {
    # IndexError on c038037: a scalar was given the axis 0 of rank 1
    "ArgMax": ("ArgMax", {}, {"axis": 0}, 21),
    "ReduceSum axes [0]": ("ReduceSum", {"axes": np.array([0], np.int64)}, {}, 21),
    "ReduceMax axes [0]": ("ReduceMax", {"axes": np.array([0], np.int64)}, {}, 21),
    "ReduceMean axes=[0]": ("ReduceMean", {}, {"axes": [0]}, 13),
    # computed on c038037 (1.0, and the scalar normalized) where onnxruntime refuses
    "Softmax opset 11": ("Softmax", {}, {"axis": 0}, 11),
    "LayerNormalization": ("LayerNormalization", {"s": np.ones((), np.float32)}, {"axis": 0}, 21),
    # refused on c038037 too (by lax, for the same reason), kept beside them
    "Softmax": ("Softmax", {}, {"axis": -1}, 21),
}


@pytest.mark.parametrize("case", SCALAR_CASES)
def test_an_axis_of_a_scalar_is_refused_as_onnxruntime_refuses_it(case: str) -> None:
    op, consts, attrs, opset = SCALAR_CASES[case]
    feeds = {"x": np.array(2.0, np.float32)}
    types = (TensorProto.INT64,) if op == "ArgMax" else (F,)
    model = node_model(op, feeds, attrs, consts=consts, opset=opset, outputs=types)
    assert theirs(model, feeds) is None  # onnxruntime refuses it
    with pytest.raises(ValueError, match=rf"{NAMED}: axis -?[01] is out of range for rank 0"):
        backend.prepare(model).run(feeds)
