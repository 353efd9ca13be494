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
from tests.support.audit_inputs import F  # noqa: E402


@pytest.mark.parametrize("value", ["no", 0, 1, None])
def test_session_takes_shard_parameters_as_a_bool(value: object) -> None:
    """shard_parameters="no" sharded the parameters (any truthy value did), where remat
    already refused what is not a bool."""
    import jax
    from onnx import helper, numpy_helper

    import onnx_optax
    from onnx_optax import training

    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["logits"])],
        "g",
        [helper.make_tensor_value_info("x", F, ["N", 4])],
        [helper.make_tensor_value_info("logits", F, ["N", 3])],
        initializer=[w],
    )
    inference = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model = training.attach(inference, target="label", optimizer=onnx_optax.adam(0.1))
    with pytest.raises(TypeError, match="shard_parameters must be True or False"):
        training.Session(model, devices=jax.devices(), shard_parameters=value)  # type: ignore[arg-type]
