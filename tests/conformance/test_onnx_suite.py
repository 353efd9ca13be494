"""ONNX's own backend cases on onnx_optax.backend: see tests/support/onnx_suite.py for the selection."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")

from tests.support.onnx_suite import (
    NOT_REGISTERED,
    TRAINING_CASES,
    suite_classes,
    unregistered_node_ops,
)

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


def test_every_op_left_out_is_named_with_its_reason() -> None:
    """The node cases of ops the registry lacks: each op is in NOT_REGISTERED, and no more."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        missing = unregistered_node_ops()
    assert sorted(missing) == sorted(NOT_REGISTERED)
