"""Helpers shared by the tests split out of tests/test_hostile_graph.py (issue 34)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

DOMAIN = "ai.onnx.preview.training"

F32, I64 = TensorProto.FLOAT, TensorProto.INT64

BIG = 2**32 + 7  # an int64 that int32 cannot hold: 32-bit JAX would make it 7


def _model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
    training: Sequence[onnx.TrainingInfoProto] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)],
    )
    model.training_info.extend(training)
    return model


def _vi(name: str, elem: int, shape: list[int] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


# ----------------------------------------------------------------------------- 6. fuzzer findings

OPSET21 = [helper.make_opsetid("", 21)]

LIMIT_HINT = r"limits=Limits\(tensor_bytes=\.\.\.\)"


def _graph_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers)
    return helper.make_model(graph, opset_imports=OPSET21)


def _outcome(script: str) -> str:
    """Runs ``script`` in a fresh interpreter under a 4 GB data limit.

    A hang, an abort or a huge allocation (before the fixes) must not take pytest down.
    """
    root = Path(__file__).parents[2]
    limit = "import resource; resource.setrlimit(resource.RLIMIT_DATA, (4 << 30, 4 << 30))\n"
    done = subprocess.run(
        [sys.executable, "-c", limit + textwrap.dedent(script)],
        cwd=root,
        env={"PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
