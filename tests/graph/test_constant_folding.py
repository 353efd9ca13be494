"""Values computed from initializers and constants alone: once per device, not on each run.

``backend.prepare(model).run`` computes the nodes that read initializers and constants
alone (a weight written as a ConstantOfShape, as in ONNX's light zoo models; an
initializer scaled or dequantized) in a compiled function of their own, once, and the
graph then reads them as arguments. Expected values come from onnxruntime, which folds
the same constants when it creates a session.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

from onnx_optax import backend
from onnx_optax._src.graph import GraphFunction
from tests.support.builders import compilations

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(0)


def _model(nodes: list, inputs: list, outputs: list, initializers: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "constants", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _vi(name: str, shape: list[int], kind: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, kind, shape)


def _conv_of_a_filled_weight() -> onnx.ModelProto:
    """Y = conv(X, W * s) + W[0, 0, 0, 0], W a ConstantOfShape fill of 1.5 MiB."""
    shape = numpy_helper.from_array(np.array([256, 256, 3, 2], np.int64), "shape")
    scale = numpy_helper.from_array(RNG.normal(size=(256, 1, 1, 1)).astype(np.float32), "s")
    fill = helper.make_tensor("fill", TensorProto.FLOAT, [1], [0.01])
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["W"], value=fill),
        helper.make_node("Mul", ["W", "s"], ["Ws"]),
        helper.make_node("Conv", ["X", "Ws"], ["C"], pads=[1, 0, 1, 1]),
        helper.make_node("ReduceMean", ["W"], ["m"], keepdims=0),
        helper.make_node("Add", ["C", "m"], ["Y"]),
    ]
    return _model(
        nodes,
        [_vi("X", [1, 256, 9, 9])],
        [_vi("Y", [1, 256, 9, 10]), _vi("m", [])],
        [shape, scale],
    )


def test_a_filled_weight_is_computed_once_and_the_graph_equals_onnxruntime() -> None:
    model = _conv_of_a_filled_weight()
    rep = backend.prepare(model)
    graph = rep.graph
    folded = {step.node.op_type for step in graph._constant_steps}
    assert folded == {"ConstantOfShape", "Mul", "ReduceMean"}
    assert [step.node.op_type for step in graph._run_schedule] == ["Conv", "Add"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in range(2):
        x = np.random.default_rng(seed).normal(size=(1, 256, 9, 9)).astype(np.float32)
        with compilations() as compiled:
            y, m = rep.run({"X": x})
        assert seed == 0 or compiled == []
        want_y, want_m = session.run(None, {"X": x})
        np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(m, np.float32(0.01), rtol=1e-6)  # the fill's mean
        np.testing.assert_allclose(m, want_m, rtol=1e-3)  # onnxruntime sums in float32
    assert graph._constants_jit._cache_size() == 1  # compiled once, for the one device
    # what the compiled graph runs: the weight an argument, no fill of its size
    ((device, constants),) = graph._device_constants.items()
    assert sorted(constants) == ["Ws", "m"]  # W itself only feeds other constants
    ((jitted, _),) = graph._compilations.values()
    text = jitted.lower(*_arguments(graph, device, x, constants)).as_text()
    assert "tensor<256x256x3x2xf32>" in text
    assert not [line for line in text.splitlines() if "broadcast" in line and "256x256x3x2" in line]


def _arguments(graph: GraphFunction, device: Any, x: np.ndarray, constants: dict) -> tuple:
    from onnx_optax._src.graph.packing import pack

    _, buffers, own = pack({"X": x}, graph._packable)
    p_buffers, p_own = graph._device_params[device]
    return buffers, own, p_buffers, {**p_own, **constants}


def test_small_constants_stay_in_the_graph() -> None:
    """Below HOISTED_BYTES a second compilation would cost more than it saves."""
    w = numpy_helper.from_array(RNG.normal(size=(4, 4)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Relu", ["w"], ["r"]),
        helper.make_node("MatMul", ["X", "r"], ["Y"]),
    ]
    model = _model(nodes, [_vi("X", [2, 4])], [_vi("Y", [2, 4])], [w])
    rep = backend.prepare(model)
    x = RNG.normal(size=(2, 4)).astype(np.float32)
    (y,) = rep.run({"X": x})
    assert rep.graph._constant_steps == [] and rep.graph._constants_jit is None
    np.testing.assert_allclose(y, x @ np.maximum(numpy_helper.to_array(w), 0), rtol=1e-6)


def test_a_constant_graph_output_and_a_dropout_of_constants() -> None:
    """An output computed from constants alone comes from the constants' function;
    Dropout (random in training mode) is never computed ahead."""
    shape = numpy_helper.from_array(np.array([512, 1024], np.int64), "shape")
    fill = helper.make_tensor("fill", TensorProto.FLOAT, [1], [2.0])
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["F"], value=fill),
        helper.make_node("Sqrt", ["F"], ["S"]),
        helper.make_node("Dropout", ["S"], ["D"]),
        helper.make_node("Add", ["X", "D"], ["Y"]),
    ]
    model = _model(
        nodes, [_vi("X", [512, 1024])], [_vi("S", [512, 1024]), _vi("Y", [512, 1024])], [shape]
    )
    rep = backend.prepare(model)
    assert [step.node.op_type for step in rep.graph._run_schedule] == ["Dropout", "Add"]
    x = RNG.normal(size=(512, 1024)).astype(np.float32)
    s, y = rep.run({"X": x})
    np.testing.assert_allclose(s, np.full((512, 1024), np.sqrt(np.float32(2))), rtol=1e-7)
    np.testing.assert_allclose(y, x + np.sqrt(np.float32(2)), rtol=1e-6)


def test_a_failing_run_time_check_of_a_constant_names_its_node() -> None:
    """Gather's indices, out of range, are checked when the constants are computed."""
    shape = numpy_helper.from_array(np.array([1024, 512], np.int64), "shape")
    indices = numpy_helper.from_array(np.arange(5000, dtype=np.int64) % 1025, "i")
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["F"]),
        helper.make_node("Gather", ["F", "i"], ["G"]),
        helper.make_node("ReduceSum", ["G"], ["r"], keepdims=0),
        helper.make_node("Add", ["X", "r"], ["Y"]),
    ]
    model = _model(nodes, [_vi("X", [])], [_vi("Y", [])], [shape, indices])
    rep = backend.prepare(model)
    with pytest.raises(ValueError, match=r"\(ai.onnx.Gather\): indices hold 1024"):
        rep.run({"X": np.float32(1)})


def test_a_run_on_another_device_computes_its_own_constants() -> None:
    model = _conv_of_a_filled_weight()
    rep = backend.prepare(model)
    x = RNG.normal(size=(1, 256, 9, 9)).astype(np.float32)
    device = jax.devices()[0]
    first = rep.graph({"X": x}, device=device)
    second = rep.graph({"X": x})
    assert set(rep.graph._device_constants) == {device, None}
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
