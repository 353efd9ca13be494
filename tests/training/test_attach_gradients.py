"""Training through control flow, recurrence, Resize and Attention: attach's gradients
against central finite differences in float64.

Each model is a small float64 inference graph built around one op family (If, Loop,
Scan, LSTM, GRU, Resize, Attention) whose weights are initializers read where the op
reads them (inside a branch or a body, as W/R/B, before a Resize, as Q/K/V
projections). ``training.attach`` makes it trainable with the mean squared error and
ONNX Momentum with R = 1, alpha = 0, beta = 1 and no decay: at T = 0 that step is
``W_new = W - dL/dW``, so one ``Session.step`` reveals the gradient attach's graph
computed (its ``Gradient`` node, through the op). The expected gradient is the central
difference of the loss, ``mean((y - t)**2)``, computed in numpy from the inference
model's forward (its weights fed as inputs) with each weight element moved by +-h.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import onnx_optax  # noqa: E402
from onnx_optax import backend, training  # noqa: E402
from tests.support.finite_differences import central_difference  # noqa: E402

F64, I64, BOOL = TensorProto.DOUBLE, TensorProto.INT64, TensorProto.BOOL
vi = helper.make_tensor_value_info
RNG = np.random.default_rng(2026)


def _model(
    nodes: list[Any],
    x_shape: list[int],
    y_shape: list[int],
    weights: dict[str, np.ndarray],
    constants: dict[str, np.ndarray] | None = None,
    opset: int = 17,
) -> Any:
    initializers = {**weights, **(constants or {})}
    graph = helper.make_graph(
        nodes,
        "g",
        [vi("x", F64, x_shape)],
        [vi("y", F64, y_shape)],
        initializer=[numpy_helper.from_array(v, k) for k, v in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _weights(**shapes: tuple[int, ...]) -> dict[str, np.ndarray]:
    return {name: RNG.normal(scale=0.5, size=shape) for name, shape in shapes.items()}


def if_model() -> tuple[Any, list[str], tuple[int, ...]]:
    """y = If(sum(x) > 0) then tanh(x @ W) else sin(x @ W) * v: W and v read by the branches."""
    then = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["a"]),
            helper.make_node("Tanh", ["a"], ["then_y"]),
        ],
        "then",
        [],
        [vi("then_y", F64, [4, 3])],
    )
    other = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["b"]),
            helper.make_node("Sin", ["b"], ["s"]),
            helper.make_node("Mul", ["s", "v"], ["else_y"]),
        ],
        "else",
        [],
        [vi("else_y", F64, [4, 3])],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
    ]
    weights = _weights(W=(3, 3), v=(3,))
    model = _model(nodes, [4, 3], [4, 3], weights, {"zero": np.array(0.0)})
    return model, ["W", "v"], (4, 3)


def loop_model() -> tuple[Any, list[str], tuple[int, ...]]:
    """Three steps of h = tanh(h @ W + b) in a Loop body reading W and b from outside."""
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
            helper.make_node("Add", ["hw", "b"], ["hb"]),
            helper.make_node("Tanh", ["hb"], ["h_out"]),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [vi("i", I64, []), vi("c_in", BOOL, []), vi("h_in", F64, [4, 3])],
        [vi("c_out", BOOL, []), vi("h_out", F64, [4, 3])],
    )
    nodes = [helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)]
    model = _model(nodes, [4, 3], [4, 3], _weights(W=(3, 3), b=(3,)), {"M": np.array(3)})
    return model, ["W", "b"], (4, 3)


def scan_model() -> tuple[Any, list[str], tuple[int, ...]]:
    """A running state s = tanh(s @ W + x_t) over x's 5 rows (Scan), its final state out."""
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["s_in", "W"], ["sw"]),
            helper.make_node("Add", ["sw", "x_t"], ["sx"]),
            helper.make_node("Tanh", ["sx"], ["s_out"]),
        ],
        "body",
        [vi("s_in", F64, [3]), vi("x_t", F64, [3])],
        [vi("s_out", F64, [3])],
    )
    nodes = [helper.make_node("Scan", ["s0", "x"], ["y"], body=body, num_scan_inputs=1)]
    model = _model(nodes, [5, 3], [3], _weights(W=(3, 3), s0=(3,)))
    return model, ["W", "s0"], (3,)


def _recurrent_model(op: str, gates: int) -> tuple[Any, list[str], tuple[int, ...]]:
    hidden, inputs, seq, batch = 3, 2, 4, 2
    nodes = [helper.make_node(op, ["x", "W", "R", "B"], ["", "y"], hidden_size=hidden)]
    weights = _weights(
        W=(1, gates * hidden, inputs), R=(1, gates * hidden, hidden), B=(1, 2 * gates * hidden)
    )
    model = _model(nodes, [seq, batch, inputs], [1, batch, hidden], weights, opset=14)
    return model, ["W", "R", "B"], (1, batch, hidden)


def lstm_model() -> tuple[Any, list[str], tuple[int, ...]]:
    """LSTM's final hidden state; W, R and B trained."""
    return _recurrent_model("LSTM", 4)


def gru_model() -> tuple[Any, list[str], tuple[int, ...]]:
    """GRU's final hidden state; W, R and B trained."""
    return _recurrent_model("GRU", 3)


def resize_model() -> tuple[Any, list[str], tuple[int, ...]]:
    """y = Resize(x * W) to twice the size, linear, half_pixel; W trained through Resize."""
    nodes = [
        helper.make_node("Mul", ["x", "W"], ["xw"]),
        helper.make_node("Resize", ["xw", "", "scales"], ["y"], mode="linear"),
    ]
    scales = np.array([1.0, 1.0, 2.0, 2.0], np.float32)
    model = _model(
        nodes, [1, 2, 3, 3], [1, 2, 6, 6], _weights(W=(1, 2, 3, 3)), {"scales": scales}, opset=19
    )
    return model, ["W"], (1, 2, 6, 6)


def attention_model() -> tuple[Any, list[str], tuple[int, ...]]:
    """Attention (opset 23, 4-D, causal) of x's projections by Wq, Wk and Wv."""
    nodes = [
        helper.make_node("MatMul", ["x", "Wq"], ["q"]),
        helper.make_node("MatMul", ["x", "Wk"], ["k"]),
        helper.make_node("MatMul", ["x", "Wv"], ["v"]),
        helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1),
    ]
    weights = _weights(Wq=(4, 4), Wk=(4, 4), Wv=(4, 4))
    model = _model(nodes, [1, 2, 3, 4], [1, 2, 3, 4], weights, opset=23)
    return model, ["Wq", "Wk", "Wv"], (1, 2, 3, 4)


MODELS: dict[str, Callable[[], tuple[Any, list[str], tuple[int, ...]]]] = {
    "If, then": if_model,
    "If, else": if_model,
    "Loop": loop_model,
    "Scan": scan_model,
    "LSTM": lstm_model,
    "GRU": gru_model,
    "Resize": resize_model,
    "Attention": attention_model,
}


def _input_shape(model: Any) -> tuple[int, ...]:
    return tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)


def _fed(model: Any, names: list[str]) -> Any:
    """The model with the initializers ``names`` turned into graph inputs (fed values)."""
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    kept = [i for i in changed.graph.initializer if i.name not in names]
    for tensor in changed.graph.initializer:
        if tensor.name in names:
            changed.graph.input.append(vi(tensor.name, tensor.data_type, list(tensor.dims)))
    del changed.graph.initializer[:]
    changed.graph.initializer.extend(kept)
    return changed


@pytest.mark.parametrize("family", list(MODELS))
def test_attach_gradient_equals_central_differences(family: str) -> None:
    model, trained_names, y_shape = MODELS[family]()
    x = RNG.normal(size=_input_shape(model))
    if family.startswith("If"):  # the branch taken decided by the data: both are tested
        x = np.abs(x) * (1 if family == "If, then" else -1)
    t = RNG.normal(size=y_shape)
    sgd = onnx_optax.momentum(1.0, alpha=0.0, beta=1.0, norm_coefficient=0.0)
    with jax.enable_x64(True):
        initial = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        trained = training.attach(
            model, loss="mse", target="t", optimizer=sgd, trainable=trained_names
        )
        session = training.Session(trained)
        session.step({"x": x, "t": t})
        after = session.initializers
        forward = backend.prepare(_fed(model, trained_names))  # compiled once
        weights = {name: initial[name] for name in trained_names}
        largest = 0.0
        for name in trained_names:

            def loss(w: np.ndarray, name: str = name) -> float:
                (y,) = forward.run({"x": x, **weights, name: w})
                return float(np.mean((np.asarray(y) - t) ** 2))

            got = initial[name] - after[name]  # W - (W - dL/dW)
            expected = central_difference(loss, initial[name])
            largest = max(largest, float(np.abs(expected).max()))
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-8, err_msg=name)
    assert largest > 1e-3  # not a vacuous comparison (the branch not taken has none: v)
