"""Helpers shared by the tests split out of tests/test_hostile_ops.py (issue 34)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import backend  # noqa: E402
from tests.support.builders import onnxruntime_outputs, value_info  # noqa: E402

F32, F64, I32, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32, TensorProto.INT64


def constant_node(name: str, value: Any) -> onnx.NodeProto:
    """A Constant node that outputs ``value`` as ``name``."""
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


def opset_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    opset: int = 21,
) -> onnx.ModelProto:
    """A model of graph ``g`` of ``nodes`` at the default domain's ``opset``."""
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def refused_by_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """Asserts that onnxruntime raises an ONNXRuntimeError on ``model``."""
    with pytest.raises(Exception, match=r"ONNXRuntimeError"):
        onnxruntime_outputs(model, feeds)


def ours(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """All outputs of ``model`` on ``feeds`` from onnx_optax's backend."""
    return list(backend.prepare(model).run(feeds))


X3 = np.array([10.0, 20.0, 30.0], np.float32)


def one_node(
    op: str, inputs: list[Any], attributes: dict[str, Any], opset: int, fed: bool
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``op`` named "n" on ``inputs`` (None: an absent input), fed or Constants."""
    names = ["" if v is None else f"i{k}" for k, v in enumerate(inputs)]
    given = {name: v for name, v in zip(names, inputs, strict=True) if name}
    nodes = [] if fed else [constant_node(name, v) for name, v in given.items()]
    node = helper.make_node(
        op, names, ["y"], name="n", **{k: v for k, v in attributes.items() if v != []}
    )
    for k in (k for k, v in attributes.items() if v == []):  # an empty ints attribute
        node.attribute.append(helper.make_attribute(k, [], attr_type=onnx.AttributeProto.INTS))
    feeds = given if fed else {}
    vis = [
        value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()
    ]
    model = opset_model([*nodes, node], vis, [], opset)
    first = next(iter(given.values()))
    elem, rank = helper.np_dtype_to_tensor_dtype(first.dtype), first.ndim
    try:  # y's type as onnx infers it, else the first input's
        found = onnx.shape_inference.infer_shapes(model).graph.value_info
        typed = next(v.type.tensor_type for v in found if v.name == "y")
        elem, rank = typed.elem_type, len(typed.shape.dim) if typed.HasField("shape") else rank
    except (StopIteration, onnx.shape_inference.InferenceError):
        pass
    model.graph.output.append(value_info("y", elem, ["d"] * rank))
    return model, feeds
