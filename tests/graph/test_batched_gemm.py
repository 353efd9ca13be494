"""Gemm nodes sharing B, none reading another's output, run as one stacked product.

An unrolled recurrence as PyTorch exports it: ``u_t = Gemm(x_t, W, b, transB=1)`` for
each step t (independent of one another), then ``h_t = tanh(Gemm(h_{t-1}, R) + u_t)``
(each reading the one before). Expected values come from onnxruntime (the forward) and
from the same network written by hand in JAX (the gradients).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from onnx_optax import backend
from onnx_optax._src.graph import run as graph_module
from onnx_optax._src.graph.passes.batched_products import BatchedGemmStep as _BatchedGemmStep

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

STEPS, BATCH, IN, HIDDEN = 5, 3, 4, 6
RNG = np.random.default_rng(0)
W = RNG.normal(size=(HIDDEN, IN)).astype(np.float32)
B = RNG.normal(size=HIDDEN).astype(np.float32)
R = RNG.normal(size=(HIDDEN, HIDDEN)).astype(np.float32) * 0.5


def _unrolled(gradient: bool = False, width: int | str = IN) -> onnx.ModelProto:
    nodes = []
    for t in range(STEPS):
        index = numpy_helper.from_array(np.array(t, np.int64))
        nodes += [
            helper.make_node("Constant", [], [f"i{t}"], value=index),
            helper.make_node("Gather", ["X", f"i{t}"], [f"x{t}"]),
            helper.make_node("Gemm", [f"x{t}", "W", "B"], [f"u{t}"], transB=1),
        ]
        if t == 0:
            nodes.append(helper.make_node("Tanh", ["u0"], ["h0"]))
        else:
            nodes += [
                helper.make_node("Gemm", [f"h{t - 1}", "R"], [f"r{t}"]),
                helper.make_node("Add", [f"r{t}", f"u{t}"], [f"a{t}"]),
                helper.make_node("Tanh", [f"a{t}"], [f"h{t}"]),
            ]
    nodes.append(helper.make_node("ReduceSum", [f"h{STEPS - 1}"], ["loss"], keepdims=0))
    outputs = [helper.make_tensor_value_info(f"h{STEPS - 1}", TensorProto.FLOAT, [BATCH, HIDDEN])]
    outputs.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    if gradient:
        nodes.append(
            helper.make_node(
                "Gradient",
                ["W", "R", "X"],
                ["dW", "dR"],
                domain="ai.onnx.preview.training",
                xs=["W", "R"],
                zs=["X"],
                y="loss",
            )
        )
        outputs += [
            helper.make_tensor_value_info("dW", TensorProto.FLOAT, [HIDDEN, IN]),
            helper.make_tensor_value_info("dR", TensorProto.FLOAT, [HIDDEN, HIDDEN]),
        ]
    inits = [numpy_helper.from_array(v, n) for n, v in (("W", W), ("B", B), ("R", R))]
    graph = helper.make_graph(
        nodes,
        "unrolled",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [STEPS, BATCH, width])],
        outputs,
        inits,
    )
    opsets = [helper.make_opsetid("", 17)]
    if gradient:
        opsets.append(helper.make_opsetid("ai.onnx.preview.training", 1))
    return helper.make_model(graph, opset_imports=opsets)


def _by_hand(w: Any, r: Any, x: Any) -> Any:
    h = jnp.tanh(x[0] @ w.T + B[None])
    for t in range(1, STEPS):
        h = jnp.tanh(h @ r + x[t] @ w.T + B[None])
    return jnp.sum(h)


def test_the_independent_gemms_are_one_step_and_the_recurrence_is_not() -> None:
    graph = backend.prepare(_unrolled()).graph
    batched = [step for step in graph.schedule if isinstance(step, _BatchedGemmStep)]
    assert len(batched) == 1
    assert [m.outputs[0] for m in batched[0].members] == [f"u{t}" for t in range(STEPS)]
    gemms = [s for s in graph.schedule if getattr(s, "node", None) and s.node.op_type == "Gemm"]
    assert sorted(s.outputs[0] for s in gemms if s not in batched) == [
        f"r{t}" for t in range(1, STEPS)
    ]


def test_the_stacked_product_equals_onnxruntime() -> None:
    model = _unrolled()
    x = RNG.normal(size=(STEPS, BATCH, IN)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"X": x})
    got = backend.prepare(model).run({"X": x})
    for ours, theirs in zip(got, want, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_gradients_through_the_stacked_product_equal_jax_by_hand() -> None:
    model = _unrolled(gradient=True)
    rep = backend.prepare(model)
    (gradient,) = [s for s in rep.graph._steps.values() if s.node.op_type == "Gradient"]
    assert any(isinstance(step, _BatchedGemmStep) for step in gradient.order)
    x = RNG.normal(size=(STEPS, BATCH, IN)).astype(np.float32)
    _, loss, dw, dr = rep.run({"X": x})
    want_loss, (want_dw, want_dr) = jax.value_and_grad(_by_hand, (0, 1))(W, R, x)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dr, want_dr, rtol=1e-4, atol=1e-5)


def test_a_member_that_cannot_be_stacked_names_its_own_node() -> None:
    """X's steps of other widths: each Gemm runs itself and the bad one says why."""
    rep = backend.prepare(_unrolled(width="k"))
    ragged = RNG.normal(size=(STEPS, BATCH, IN + 1)).astype(np.float32)
    with pytest.raises(ValueError, match=r"Gemm.*inner dimensions are 5 and 4"):
        rep.run({"X": ragged})


@pytest.fixture
def constants_computed_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every constant computed once per device ahead of the runs, however small."""
    monkeypatch.setattr(graph_module, "HOISTED_BYTES", 0)


@pytest.mark.usefixtures("constants_computed_ahead")
def test_a_stacked_product_reads_its_transposed_weight_computed_once() -> None:
    """W, read with transB=1, is transposed once per device with the constants (here
    however small it is) and the stacked product reads that; values as onnxruntime's."""
    model = _unrolled()
    x = RNG.normal(size=(STEPS, BATCH, IN)).astype(np.float32)
    rep = backend.prepare(model)
    got = rep.run({"X": x})
    (name,) = rep.graph._transposed.values()
    ((_, constants),) = rep.graph._device_constants.items()
    np.testing.assert_array_equal(np.asarray(constants[name]), W.T)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for ours, theirs in zip(got, session.run(None, {"X": x}), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("constants_computed_ahead")
def test_gradients_with_the_constants_computed_ahead_equal_jax_by_hand() -> None:
    """A transpose of W computed ahead would be a constant to the Gradient (dW 0): the
    Gradient's own stacked product reads W."""
    rep = backend.prepare(_unrolled(gradient=True))
    x = RNG.normal(size=(STEPS, BATCH, IN)).astype(np.float32)
    _, _, dw, _ = rep.run({"X": x})
    want_dw = jax.grad(_by_hand)(W, R, x)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-4, atol=1e-5)
