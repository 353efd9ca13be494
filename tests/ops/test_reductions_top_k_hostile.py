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

from tests.support.audit_inputs import I64, F
from tests.support.audit_inputs import seeded_floats as _x
from tests.support.node_models import assert_as_onnxruntime, node_model, theirs


@pytest.mark.parametrize("k", [np.array([[1]], np.int64), np.array(1, np.int64)], ids=["2d", "0d"])
def test_top_k_takes_k_as_one_value_in_one_dimension(k: np.ndarray) -> None:
    """The schema's K is a 1-D tensor of one value; onnxruntime refuses other shapes."""
    model = node_model("TopK", {"x": _x(3, 4)}, consts={"k": k}, outputs=(F, I64))
    assert theirs(model, {"x": _x(3, 4)}) is None
    assert_as_onnxruntime(model, {"x": _x(3, 4)})
