"""Helpers shared by the tests split out of tests/test_hostile_graph.py (issue 34)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from tests.support.builders import run_capped  # noqa: E402

DOMAIN = "ai.onnx.preview.training"

F32, I64 = TensorProto.FLOAT, TensorProto.INT64

BIG = 2**32 + 7  # an int64 that int32 cannot hold: 32-bit JAX would make it 7


def model_with_training(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
    training: Sequence[onnx.TrainingInfoProto] = (),
) -> onnx.ModelProto:
    """A model of opset 21 and the training domain, with ``training`` as its training_info."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)],
    )
    model.training_info.extend(training)
    return model


# ----------------------------------------------------------------------------- 6. fuzzer findings

OPSET21 = [helper.make_opsetid("", 21)]

LIMIT_HINT = r"limits=Limits\(tensor_bytes=\.\.\.\)"


def opset21_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
) -> onnx.ModelProto:
    """A plain opset-21 model of ``nodes``, no training domain."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers)
    return helper.make_model(graph, opset_imports=OPSET21)


def run_capped_60s(script: str) -> str:
    """``builders.run_capped`` with the 60-second timeout these tests have always had."""
    return run_capped(script, timeout=60)
