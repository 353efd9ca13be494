"""ONNX's own backend cases on onnx_optax.backend: see tests/onnx_suite.py for the selection."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")

from tests.onnx_suite import TRAINING_CASES, suite_classes

_classes = suite_classes()
OnnxTrainingCases = _classes["training"]
OnnxNodeCases = _classes["node"]
OnnxPyTorchModelCases = _classes["pytorch"]
OnnxSequenceModelCases = _classes["sequence"]


def test_selection_holds_all_training_cases() -> None:
    names = sorted(n[: -len("_cpu")] for n in dir(OnnxTrainingCases) if n.startswith("test_"))
    assert names == sorted(TRAINING_CASES)


def test_selection_is_large() -> None:
    """Guards against a runner change that would silently empty the sets."""
    assert sum(n.startswith("test_") for n in dir(OnnxNodeCases)) > 1000
    assert sum(n.startswith("test_") for n in dir(OnnxPyTorchModelCases)) == 117
    assert sum(n.startswith("test_") for n in dir(OnnxSequenceModelCases)) == 8
