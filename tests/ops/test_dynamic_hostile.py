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
from tests.support.audit_inputs import I64  # noqa: E402
from tests.support.node_models import assert_as_onnxruntime, node_model, theirs  # noqa: E402


def _nms(iou: float | None = None, **attrs: int) -> onnx.ModelProto:
    consts = {
        "boxes": np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 5, 1, 6]]], np.float32),
        "scores": np.array([[[0.9, 0.8, 0.7]]], np.float32),
        "max": np.array([3], np.int64),
    }
    if iou is not None:
        consts["iou"] = np.array([iou], np.float32)
    return node_model("NonMaxSuppression", {}, attrs, consts=consts, outputs=(I64,), rank=2)


@pytest.mark.parametrize("iou", [1.5, -0.5, float("nan")])
def test_non_max_suppression_refuses_an_iou_threshold_outside_0_1(iou: float) -> None:
    assert theirs(_nms(iou), {}) is None
    assert_as_onnxruntime(_nms(iou), {})


def test_non_max_suppression_refuses_an_unknown_box_format() -> None:
    assert theirs(_nms(center_point_box=7), {}) is None
    assert_as_onnxruntime(_nms(center_point_box=7), {})


def test_non_max_suppression_within_its_range_still_matches_onnxruntime() -> None:
    for iou in (0.0, 0.5, 1.0):
        assert_as_onnxruntime(_nms(iou), {})
    assert_as_onnxruntime(_nms(0.5, center_point_box=1), {})
