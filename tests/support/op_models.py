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

F32, F64, I32, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32, TensorProto.INT64


def _vi(name: str, elem: int, shape: Sequence[int | str] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _constant(name: str, value: Any) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


def _model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    opset: int = 21,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def _refused_by_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    with pytest.raises(Exception, match=r"ONNXRuntimeError"):
        _onnxruntime(model, feeds)


def _ours(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return list(backend.prepare(model).run(feeds))


X3 = np.array([10.0, 20.0, 30.0], np.float32)


def _one_node(
    op: str, inputs: list[Any], attributes: dict[str, Any], opset: int, fed: bool
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``op`` named "n" on ``inputs`` (None: an absent input), fed or Constants."""
    names = ["" if v is None else f"i{k}" for k, v in enumerate(inputs)]
    given = {name: v for name, v in zip(names, inputs, strict=True) if name}
    nodes = [] if fed else [_constant(name, v) for name, v in given.items()]
    node = helper.make_node(
        op, names, ["y"], name="n", **{k: v for k, v in attributes.items() if v != []}
    )
    for k in (k for k, v in attributes.items() if v == []):  # an empty ints attribute
        node.attribute.append(helper.make_attribute(k, [], attr_type=onnx.AttributeProto.INTS))
    feeds = given if fed else {}
    vis = [_vi(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()]
    model = _model([*nodes, node], vis, [], opset)
    first = next(iter(given.values()))
    elem, rank = helper.np_dtype_to_tensor_dtype(first.dtype), first.ndim
    try:  # y's type as onnx infers it, else the first input's
        found = onnx.shape_inference.infer_shapes(model).graph.value_info
        typed = next(v.type.tensor_type for v in found if v.name == "y")
        elem, rank = typed.elem_type, len(typed.shape.dim) if typed.HasField("shape") else rank
    except (StopIteration, onnx.shape_inference.InferenceError):
        pass
    model.graph.output.append(_vi("y", elem, ["d"] * rank))
    return model, feeds
