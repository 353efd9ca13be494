"""Each graph pass fires on a small model, and switched off leaves the same outputs.

A pass is switched off with ``GraphFunction(..., passes=...)`` (the names it keeps);
the outputs with and without it are compared bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper

from onnx_optax._src.graph import PASS_NAMES, GraphFunction
from onnx_optax._src.graph import run as run_module
from onnx_optax._src.graph.passes.batched_products import BatchedGemmStep
from onnx_optax._src.graph.passes.gradient_fusion import FusedGradientStep
from onnx_optax._src.graph.passes.one_hot import OneHotProductStep

TRAINING = "ai.onnx.preview.training"
RNG = np.random.default_rng(7)


def _vi(name: str, shape: list[int], kind: int = TensorProto.FLOAT) -> Any:
    return helper.make_tensor_value_info(name, kind, shape)


def _graph(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: Any = ()) -> Any:
    return helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))


def _both(graph: Any, name: str, feeds: dict[str, np.ndarray]) -> tuple[Any, Any, list, list]:
    """The graph with every pass and without ``name``, and their outputs."""
    on = GraphFunction(graph, opsets={"": 17, TRAINING: 1})
    off = GraphFunction(graph, opsets={"": 17, TRAINING: 1}, passes=PASS_NAMES - {name})
    return on, off, on(feeds), off(feeds)


def _equal(ours: list, theirs: list) -> None:
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a, b)


def _close(ours: list, theirs: list) -> None:
    """A stacked product sums in another order than one product a node: equal to rounding."""
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def _unrolled(steps: int = 4) -> tuple[Any, dict[str, np.ndarray]]:
    """u_t = Gemm(x_t, W, transB=1) for each t, summed: independent Gemms of one B."""
    nodes, names = [], []
    for t in range(steps):
        nodes.append(helper.make_node("Gemm", [f"x{t}", "W"], [f"u{t}"], transB=1))
        names.append(f"u{t}")
    nodes.append(helper.make_node("Sum", names, ["y"]))
    w = numpy_helper.from_array(RNG.normal(size=(6, 5)).astype(np.float32), "W")
    inputs = [_vi(f"x{t}", [3, 5]) for t in range(steps)]
    feeds = {f"x{t}": RNG.normal(size=(3, 5)).astype(np.float32) for t in range(steps)}
    return _graph(nodes, inputs, [_vi("y", [3, 6])], [w]), feeds


def test_batched_products_stack_the_gemms_and_compute_the_same() -> None:
    graph, feeds = _unrolled()
    on, off, ours, theirs = _both(graph, "batched_products", feeds)
    assert any(isinstance(step, BatchedGemmStep) for step in on.schedule)
    assert not any(isinstance(step, BatchedGemmStep) for step in off.schedule)
    assert on.compilations == off.compilations == 1
    _close(ours, theirs)


def test_weight_transposes_give_the_stacked_gemm_its_weight_transposed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(run_module, "HOISTED_BYTES", 0)  # any transpose computed ahead
    graph, feeds = _unrolled()
    on, off, ours, theirs = _both(graph, "weight_transposes", feeds)
    assert list(on._transposed) == ["W"]
    assert not off._transposed
    _close(ours, theirs)


def test_constants_are_computed_once_and_the_graph_computes_the_same() -> None:
    fill = helper.make_tensor("fill", TensorProto.FLOAT, [1], [0.25])
    shape = numpy_helper.from_array(np.array([512, 512], np.int64), "shape")  # 1 MiB
    s = numpy_helper.from_array(RNG.normal(size=(512, 1)).astype(np.float32), "s")
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["W"], value=fill),
        helper.make_node("Mul", ["W", "s"], ["Ws"]),
        helper.make_node("MatMul", ["X", "Ws"], ["Y"]),
    ]
    graph = _graph(nodes, [_vi("X", [2, 512])], [_vi("Y", [2, 512])], [shape, s])
    feeds = {"X": RNG.normal(size=(2, 512)).astype(np.float32)}
    on, off, ours, theirs = _both(graph, "constants", feeds)
    assert [step.node.op_type for step in on._run_schedule] == ["MatMul"]
    assert on._constants_jit is not None and on._constants_jit._cache_size() == 1
    assert not off._constant_steps and off._constants_jit is None
    _equal(ours, theirs)


def test_one_hot_products_run_as_gathers_and_compute_the_same() -> None:
    span = numpy_helper.from_array(np.arange(6, dtype=np.int64).reshape(1, 1, 6), "span")
    nodes = [
        helper.make_node("Equal", ["ids", "span"], ["hot"]),
        helper.make_node("Cast", ["hot"], ["one_hot"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["one_hot", "w"], ["y"]),
    ]
    inputs = [_vi("ids", [2, 5, 1], TensorProto.INT64), _vi("w", [6, 4])]
    graph = _graph(nodes, inputs, [_vi("y", [2, 5, 4])], [span])
    feeds = {
        "ids": RNG.integers(0, 6, (2, 5, 1)).astype(np.int64),
        "w": RNG.normal(size=(6, 4)).astype(np.float32),
    }
    on, off, ours, theirs = _both(graph, "one_hot", feeds)
    assert any(isinstance(step, OneHotProductStep) for step in on.schedule)
    assert not any(isinstance(step, OneHotProductStep) for step in off.schedule)
    _equal(ours, theirs)


def test_gradient_fusion_shares_the_forward_and_computes_the_same_gradients() -> None:
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["H"]),
        helper.make_node("Tanh", ["H"], ["A"]),
        helper.make_node("MatMul", ["A", "W2"], ["P"]),
        helper.make_node("ReduceSum", ["P"], ["loss"], keepdims=0),
        helper.make_node(
            "Gradient",
            ["W1", "W2", "X"],
            ["dW1", "dW2"],
            domain=TRAINING,
            xs=["W1", "W2"],
            zs=["X"],
            y="loss",
        ),
    ]
    shapes = {"W1": [3, 5], "W2": [5, 2], "X": [4, 3]}
    outputs = [_vi("loss", []), _vi("dW1", [3, 5]), _vi("dW2", [5, 2])]
    graph = _graph(nodes, [_vi(n, s) for n, s in shapes.items()], outputs)
    feeds = {n: RNG.normal(size=s).astype(np.float32) for n, s in shapes.items()}
    on, off, ours, theirs = _both(graph, "gradient_fusion", feeds)
    assert any(isinstance(step, FusedGradientStep) for step in on.schedule)
    assert not any(isinstance(step, FusedGradientStep) for step in off.schedule)
    assert len(on.schedule) < len(off.schedule)  # the forward runs once, in the Gradient
    _equal(ours, theirs)


def test_an_unknown_pass_is_refused_by_name() -> None:
    graph, _ = _unrolled(1)
    with pytest.raises(ValueError, match="unknown graph pass"):
        GraphFunction(graph, passes={"no_such_pass"})
