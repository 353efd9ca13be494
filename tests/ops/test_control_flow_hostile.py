"""Hostile attributes against the ops added since the last audit (issue 20, a third audit).

Each test is a finding of the audit of 027012a and fails there: inputs and attributes
onnxruntime refuses that were computed (a 2-D or scalar TopK K, a NonMaxSuppression
iou_threshold outside [0, 1] or center_point_box outside {0, 1}, an Attention scale of 0,
a MatMulInteger zero point that broadcast its input to a larger shape), and a
QuantizeLinear block longer than its axis, which onnxruntime computes as one block and
which ended in an OverflowError. Expected values are onnxruntime's (its refusal, or its
outputs for the same model), or numpy written here.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto  # noqa: E402

from onnx_optax import backend  # noqa: E402
from tests.support.audit_inputs import F  # noqa: E402
from tests.support.node_models import theirs  # noqa: E402


def test_loop_scan_output_that_changes_shape_is_refused_by_name() -> None:
    """An unrolled Loop (its body reads the iteration number as Range's limit) whose scan
    output grows each iteration ended in jnp.stack's 'All input arrays must have the
    same shape'; onnxruntime refuses it too ('Inconsistent shape in loop output')."""
    from onnx import helper, numpy_helper

    ints = TensorProto.INT64
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["c_in"], ["c_out"]),
            helper.make_node("Identity", ["x_in"], ["x_out"]),
            helper.make_node("Range", ["zero", "i", "one"], ["r"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", ints, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_in", F, [1]),
        ],
        [
            helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_out", F, [1]),
            helper.make_tensor_value_info("r", ints, None),
        ],
        initializer=[
            numpy_helper.from_array(np.array(0, np.int64), "zero"),
            numpy_helper.from_array(np.array(1, np.int64), "one"),
        ],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "x"], ["y", "rs"], name="n", body=body)],
        "g",
        [helper.make_tensor_value_info("x", F, [1])],
        [
            helper.make_tensor_value_info("y", F, ["a"]),
            helper.make_tensor_value_info("rs", ints, ["a", "b"]),
        ],
        initializer=[numpy_helper.from_array(np.array(3, np.int64), "M")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    feeds = {"x": np.array([2.0], np.float32)}
    assert theirs(model, feeds) is None
    with pytest.raises(ValueError, match=r"node 'n' \(ai\.onnx\.Loop\): scan output 'r' differs"):
        backend.prepare(model).run(feeds)
