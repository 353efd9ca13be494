"""Opset imports beyond what the installed onnx defines are refused when the model is loaded.

onnxruntime refuses them too ("Current official support for domain ai.onnx is
till opset 28"); older, valid opsets and custom domains still load.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax._src.graph.load import load_model  # noqa: E402

NEWEST = onnx.defs.onnx_opset_version()
NEWEST_ML = onnx.defs.onnx_ml_opset_version()
X = np.array([[-1.0, 2.0]], np.float32)


def relu_model(
    opsets: list[tuple[str, int]], functions: list[onnx.FunctionProto] = ()
) -> onnx.ModelProto:
    node = helper.make_node("Relu", ["X"], ["Y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2])],
    )
    imports = [helper.make_opsetid(domain, version) for domain, version in opsets]
    return helper.make_model(graph, opset_imports=imports, functions=list(functions))


def onnxruntime_refuses(model: onnx.ModelProto) -> str:
    with pytest.raises(Exception) as caught:  # onnxruntime raises its own error types
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return str(caught.value)


@pytest.mark.parametrize(
    ("domain", "version"),
    [
        ("", NEWEST + 2),
        ("", 99),
        ("", 10**9),
        ("ai.onnx.ml", NEWEST_ML + 1),
        ("ai.onnx.preview.training", 2),
        ("ai.onnx.preview", 2),
    ],
)
def test_an_opset_beyond_the_installed_onnx_is_refused(domain: str, version: int) -> None:
    opsets = [(domain, version)] if domain == "" else [("", 17), (domain, version)]
    model = relu_model(opsets)
    assert "support" in onnxruntime_refuses(model)
    label = domain or "ai.onnx"
    with pytest.raises(
        ValueError, match=f"'{label}' opset {version}; (only version 1 exists|.* defines)"
    ) as caught:
        backend.prepare(model)
    assert len(str(caught.value)) < 300
    with pytest.raises(ValueError, match=f"'{label}' opset {version}"):
        load_model(model)


def test_a_function_importing_an_opset_beyond_the_installed_onnx_is_refused() -> None:
    body = [helper.make_node("Relu", ["a"], ["b"])]
    function = helper.make_function("local", "F", ["a"], ["b"], body, [helper.make_opsetid("", 99)])
    node = helper.make_node("F", ["X"], ["Y"], domain="local")
    model = relu_model([("", 17), ("local", 1)], [function])
    model.graph.node[0].CopyFrom(node)
    assert "till opset" in onnxruntime_refuses(model)
    with pytest.raises(ValueError, match=r"function 'F'.*'ai\.onnx' opset 99"):
        load_model(model)


@pytest.mark.parametrize(
    "opsets",
    [
        [("", NEWEST)],
        [("", 7)],
        [("ai.onnx", 13)],
        [("", 17), ("ai.onnx.ml", NEWEST_ML)],
        [("", 17), ("ai.onnx.preview.training", 1)],
        [("", 17), ("com.example", 99)],
    ],
)
def test_opsets_the_installed_onnx_defines_still_run(opsets: list[tuple[str, int]]) -> None:
    (y,) = backend.prepare(relu_model(opsets)).run({"X": X})
    np.testing.assert_array_equal(y, np.maximum(X, 0))
