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

from tests.support.audit_inputs import seeded_floats as _x
from tests.support.node_models import assert_as_onnxruntime, node_model

EMPTY_FED_INDICES = {
    "Gather": ({"x": _x(3, 2), "i": np.zeros(0, np.int64)}, 2),
    "GatherElements": ({"x": _x(3, 2), "i": np.zeros((0, 2), np.int64)}, 2),
    "GatherND": ({"x": _x(3, 2), "i": np.zeros((0, 2), np.int64)}, 1),
    "ScatterElements": (
        {"x": _x(3, 2), "i": np.zeros((0, 2), np.int64), "u": np.zeros((0, 2), np.float32)},
        2,
    ),
}


@pytest.mark.parametrize("op", sorted(EMPTY_FED_INDICES))
def test_indices_fed_empty_are_checked_without_error(op: str) -> None:
    """The run-time index check took the argmax of no flags, a ValueError naming the node
    with numpy's "argmax of an empty sequence" for a legitimate empty index."""
    feeds, rank = EMPTY_FED_INDICES[op]
    assert_as_onnxruntime(node_model(op, feeds, rank=rank), feeds)
