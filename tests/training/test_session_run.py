"""training.Session: ``run`` compiled once per output set; class labels checked before a step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import onnx_optax

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import training  # noqa: E402
from tests.support.builders import assert_same, compilations  # noqa: E402

F32 = TensorProto.FLOAT


def linear(w: np.ndarray | None = None) -> onnx.ModelProto:
    """y = x @ w and r = Relu(y), 4 features and 3 classes: two outputs, so two output sets."""
    w = np.zeros((4, 3), np.float32) if w is None else w
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["r"])],
        "linear",
        [helper.make_tensor_value_info("x", F32, ["N", 4])],
        [
            helper.make_tensor_value_info("y", F32, ["N", 3]),
            helper.make_tensor_value_info("r", F32, ["N", 3]),
        ],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def trainable(loss: str = "softmax_cross_entropy", w: np.ndarray | None = None) -> Any:
    return training.attach(
        linear(w), loss=loss, target="t", output="y", optimizer=onnx_optax.adam(0.1)
    )


def batch(seed: int, n: int = 6) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.normal(size=(n, 4)).astype(np.float32),
        "t": rng.integers(0, 3, size=n).astype(np.int64),
    }


def onnxruntime_outputs(model: onnx.ModelProto, x: np.ndarray) -> dict[str, np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    inference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in inference.get_outputs()]
    return dict(zip(names, inference.run(None, {"x": x}), strict=True))


# ----------------------------------------------------------------------------- run


def test_run_compiles_once_per_output_set_and_reads_the_current_weights() -> None:
    session = training.Session(trainable())
    x = batch(0)["x"]
    with compilations() as first:
        before = session.run({"x": x})
    assert len(first) == 1
    np.testing.assert_array_equal(before["y"], np.zeros((6, 3), np.float32))  # w is zero
    session.step(batch(1))
    with compilations() as again:
        after = session.run({"x": x})
        repeated = session.run({"x": batch(2)["x"]})  # the same signature
    assert again == []
    expected = onnxruntime_outputs(session.to_inference_model(), x)
    assert not np.allclose(expected["y"], 0)  # the step moved w
    for name in ("y", "r"):
        np.testing.assert_allclose(after[name], expected[name], rtol=1e-6, atol=1e-7)
    w = session.initializers["w"]
    np.testing.assert_allclose(repeated["y"], batch(2)["x"] @ w, rtol=1e-5, atol=1e-6)
    with compilations() as other:
        only_r = session.run({"x": x}, ["r"])
        session.run({"x": x}, ["r"])
    assert len(other) == 1  # a new output set: one compilation, then none
    assert list(only_r) == ["r"]
    np.testing.assert_allclose(only_r["r"], np.maximum(x @ w, 0), rtol=1e-5, atol=1e-6)
    with compilations() as smaller:
        session.run({"x": x[:2]})
    assert len(smaller) == 1  # a new feed signature


def test_run_after_steps_matches_onnxruntime_each_time() -> None:
    session = training.Session(trainable(w=np.eye(4, 3, dtype=np.float32)))
    x = batch(5)["x"]
    for seed in range(3):
        session.step(batch(seed))
        ours = session.run({"x": x}, ["y"])
        expected = onnxruntime_outputs(session.to_inference_model(), x)
        np.testing.assert_allclose(ours["y"], expected["y"], rtol=1e-6, atol=1e-7)


def test_run_checks_its_feeds_as_the_graph_declares_them() -> None:
    session = training.Session(trainable())
    x = batch(0)["x"]
    with pytest.raises(ValueError, match=r"Session.run: missing feed 'x'"):
        session.run({"t": batch(0)["t"]})
    with pytest.raises(TypeError, match=r"feed 'x' has dtype float64; the graph declares float32"):
        session.run({"x": x.astype(np.float64)})
    with pytest.raises(ValueError, match=r"feed 'x' has shape \[6, 3\]; the graph declares"):
        session.run({"x": np.zeros((6, 3), np.float32)})
    with pytest.raises(TypeError, match=r"outputs must be a list of output names"):
        session.run({"x": x}, "y")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"graph output 'nope' is produced by no node"):
        session.run({"x": x}, ["nope"])
    # Feeds the outputs do not need are ignored, as before.
    np.testing.assert_array_equal(session.run({**batch(0), "extra": 1})["y"], np.zeros((6, 3)))


# ----------------------------------------------------------------------------- class labels


@pytest.mark.parametrize("loss", ["softmax_cross_entropy", "nll", "log_loss"])
@pytest.mark.parametrize("label", [7, 3, -1])
def test_a_label_outside_the_classes_is_refused_before_anything_runs(loss: str, label: int) -> None:
    session = training.Session(trainable(loss))
    session.step(batch(0))
    before = session.initializers
    bad = batch(1)
    bad["t"][4] = label
    for call in (session.step, session.evaluate):
        with pytest.raises(ValueError) as error:
            call(bad)
        message = str(error.value)
        assert "feed 't'" in message, message
        assert f"label {label}," in message, message
        assert "outside [0, 3)" in message and "3 classes" in message, message
    assert_same(before, session.initializers)
    session.step(batch(1))  # a valid batch still steps
    assert session.initializers["T"] == before["T"] + 1


def with_ignore_index(model: onnx.ModelProto, ignore_index: int) -> onnx.ModelProto:
    """The model with ``ignore_index`` written on its SoftmaxCrossEntropyLoss node."""
    (node,) = [
        n for n in model.training_info[0].algorithm.node if n.op_type == "SoftmaxCrossEntropyLoss"
    ]
    node.attribute.append(helper.make_attribute("ignore_index", ignore_index))
    return model


def cross_entropy(x: np.ndarray, w: np.ndarray, t: np.ndarray, ignore: int) -> float:
    """The mean softmax cross-entropy over the rows whose label is not ``ignore``, in numpy."""
    logits = x.astype(np.float64) @ w.astype(np.float64)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    kept = t != ignore
    return float(-logp[kept, t[kept]].mean())


@pytest.mark.parametrize("ignore", [-1, 5])
def test_the_ignore_index_written_on_the_node_is_accepted(ignore: int) -> None:
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    session = training.Session(with_ignore_index(trainable(w=w), ignore))
    data = batch(3)
    data["t"][[1, 4]] = ignore
    loss = session.evaluate(data)["loss"]
    np.testing.assert_allclose(loss, cross_entropy(data["x"], w, data["t"], ignore), rtol=1e-6)
    session.step(data)
    assert not np.array_equal(session.initializers["w"], w)
    data["t"][0] = -2 if ignore == -1 else -1  # another label outside the classes still is not
    with pytest.raises(
        ValueError, match=rf"feed 't' holds the label {data['t'][0]}, .*ignore_index"
    ):
        session.step(data)


def with_cast(model: onnx.ModelProto) -> onnx.ModelProto:
    """Labels fed as int32 and cast to int64 (through an Identity) before the loss node."""
    algorithm = model.training_info[0].algorithm
    (node,) = [n for n in algorithm.node if n.op_type == "SoftmaxCrossEntropyLoss"]
    node.input[1] = "t64"
    algorithm.node.insert(0, helper.make_node("Cast", ["t"], ["t.cast"], to=TensorProto.INT64))
    algorithm.node.insert(1, helper.make_node("Identity", ["t.cast"], ["t64"]))
    (t,) = [i for i in algorithm.input if i.name == "t"]
    t.type.tensor_type.elem_type = TensorProto.INT32
    return model


def test_labels_reaching_the_loss_through_identity_and_cast_are_checked() -> None:
    model = with_cast(trainable())
    assert training.check(model) == []
    session = training.Session(model)
    data = {**batch(0), "t": batch(0)["t"].astype(np.int32)}
    session.step(data)
    before = session.initializers
    data["t"][2] = 3
    with pytest.raises(ValueError, match=r"feed 't' holds the label 3, outside \[0, 3\)"):
        session.step(data)
    assert_same(before, session.initializers)
