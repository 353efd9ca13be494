"""Hostile and malformed models against the loading layer, the graph runtime and the backend.

Each test is one finding of the audit of issue 14: what a stranger's model did
to ``backend.prepare``/``run`` and ``backend.run_node``, and the clear refusal
(or the modest run) expected instead.
"""

from __future__ import annotations

import re
import textwrap

import pytest

onnx = pytest.importorskip("onnx")

from tests.support.graph_models import LIMIT_HINT  # noqa: E402
from tests.support.graph_models import run_capped_60s as _outcome  # noqa: E402


def _expand_sum_script(shape: list[int], symbolic_input: bool, constants: bool) -> str:
    """A script running Expand(ones(1), shape) -> ReduceSum, printing the outcome.

    With ``constants`` x and shape are Constant nodes (host values, folded while tracing).
    """
    return textwrap.dedent(
        f"""
        import numpy as np
        from onnx import TensorProto, helper, numpy_helper
        from onnx_optax import backend

        nodes = [
            helper.make_node("Expand", ["x", "shape"], ["e"], name="grow"),
            helper.make_node("ReduceSum", ["e"], ["s"], keepdims=0),
        ]
        inputs, outputs = [], [helper.make_tensor_value_info("s", TensorProto.FLOAT, [])]
        if {symbolic_input}:
            nodes.append(helper.make_node("Relu", ["n"], ["y"]))
            inputs = [helper.make_tensor_value_info("n", TensorProto.FLOAT, ["N"])]
            outputs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"]))
        inits = [
            numpy_helper.from_array(np.ones(1, np.float32), "x"),
            numpy_helper.from_array(np.array({shape}, np.int64), "shape"),
        ]
        if {constants}:
            nodes[:0] = [helper.make_node("Constant", [], [t.name], value=t) for t in inits]
            inits = []
        graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        try:
            rep = backend.prepare(model)
            rep.run([np.ones(2, np.float32)] if {symbolic_input} else [])
            print("RESULT ran")
        except ValueError as error:
            print("RESULT ValueError", error)
        """
    )


@pytest.mark.parametrize(
    ("shape", "symbolic_input", "constants"),
    [([2**20, 2**20], False, False), ([2**20, 2**20], False, True), ([2**62], True, False)],
    ids=["hang-folding-2**40", "hang-folding-constants", "xla-abort-2**62"],
)
def test_an_expanded_shape_over_the_limit_is_refused_quickly(
    shape: list[int], symbolic_input: bool, constants: bool
) -> None:
    # F9: folding ReduceSum over a broadcast view of 2**40 elements ran for hours;
    # F10: a shape of 2**62 elements reached XLA, which aborted the process.
    found = _outcome(_expand_sum_script(shape, symbolic_input, constants))
    assert re.search(
        rf"RESULT ValueError .*node 'grow' \(ai\.onnx\.Expand\).*over the limit.*{LIMIT_HINT}",
        found,
    )
