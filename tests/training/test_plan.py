"""training.plan and attach on exporters' idioms: what trains by default, and why.

Each model below is a few nodes written the way an exporter writes them
(tf2onnx's constants as initializers, PaddlePaddle's and PyTorch's Constant
nodes, keras2onnx's PRelu and several heads); the expected kinds are the
documented rule of ``onnx_optax.training._plan``, and the numbers the
inference graph computes are checked against onnxruntime.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import onnx_optax

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import training  # noqa: E402

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(11)


def _f32(*shape: int, scale: float = 0.3) -> np.ndarray:
    return (RNG.normal(size=shape) * scale).astype(np.float32)


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], name=f"c_{name}", value=numpy_helper.from_array(value)
    )


def _model(
    nodes: list[onnx.NodeProto],
    inits: dict[str, np.ndarray],
    inputs: list[tuple[str, int, list[Any]]],
    outputs: list[tuple[str, list[Any]]],
    opset: int = 17,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, F32, s) for n, s in outputs],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def tf2onnx_style() -> onnx.ModelProto:
    """Dense, a decomposed LayerNorm and GELU: their constants stored as float initializers."""
    inits = {
        "dense/kernel": _f32(6, 8),
        "dense/bias": _f32(1, 8),
        "ln/gamma": np.ones((1, 8), np.float32),
        "ln/beta": np.zeros((1, 8), np.float32),
        "ln/epsilon": np.asarray(1e-6, np.float32),
        "ln/recip": np.asarray(1 / 8, np.float32),
        "gelu/half": np.asarray(0.5, np.float32),
        "gelu/coef": np.asarray(0.044715, np.float32),
        "gelu/sqrt2pi": np.asarray(0.7978846, np.float32),
        "gelu/one": np.asarray(1.0, np.float32),
        "gelu/three": np.asarray(3.0, np.float32),
        "relu/zero": np.asarray(0.0, np.float32),
        "head/kernel": _f32(8, 3),
        "head/bias": _f32(3),  # one element would still be a bias (see below)
        "axes": np.asarray([1], np.int64),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "dense/kernel"], ["h0"]),
        helper.make_node("Add", ["h0", "dense/bias"], ["h"]),
        helper.make_node("ReduceSum", ["h", "axes"], ["s"], keepdims=1),
        helper.make_node("Mul", ["s", "ln/recip"], ["mean"]),
        helper.make_node("Sub", ["h", "mean"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["d2"]),
        helper.make_node("ReduceSum", ["d2", "axes"], ["v0"], keepdims=1),
        helper.make_node("Mul", ["v0", "ln/recip"], ["var"]),
        helper.make_node("Add", ["var", "ln/epsilon"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["n0"]),
        helper.make_node("Mul", ["n0", "ln/gamma"], ["n1"]),
        helper.make_node("Add", ["n1", "ln/beta"], ["n"]),
        helper.make_node("Pow", ["n", "gelu/three"], ["n3"]),
        helper.make_node("Mul", ["gelu/coef", "n3"], ["c3"]),
        helper.make_node("Add", ["n", "c3"], ["in0"]),
        helper.make_node("Mul", ["gelu/sqrt2pi", "in0"], ["in1"]),
        helper.make_node("Tanh", ["in1"], ["t"]),
        helper.make_node("Add", ["gelu/one", "t"], ["t1"]),
        helper.make_node("Mul", ["gelu/half", "n"], ["hn"]),
        helper.make_node("Mul", ["hn", "t1"], ["g"]),
        helper.make_node("Max", ["relu/zero", "g"], ["r"]),
        helper.make_node("MatMul", ["r", "head/kernel"], ["l0"]),
        helper.make_node("Add", ["l0", "head/bias"], ["logits"]),
    ]
    return _model(nodes, inits, [("x", F32, ["unk__1", 6])], [("logits", ["unk__2", 3])])


TF2ONNX = {
    "dense/kernel": "weight",
    "dense/bias": "weight",
    "ln/gamma": "weight",
    "ln/beta": "weight",
    "head/kernel": "weight",
    "head/bias": "weight",
    "ln/epsilon": "exporter constant",
    "ln/recip": "exporter constant",
    "gelu/half": "exporter constant",
    "gelu/coef": "exporter constant",
    "gelu/sqrt2pi": "exporter constant",
    "gelu/one": "exporter constant",
    "gelu/three": "hyperparameter",
    "relu/zero": "hyperparameter",
    "axes": "integer",
}


def paddle_style(opset: int = 11) -> onnx.ModelProto:
    """Every weight in a Constant node, BN statistics too, Clip bounds, dims -1 and '?'."""
    nodes = [
        _const("conv.w", _f32(4, 3, 3, 3)),
        _const("bn.scale", np.linspace(0.8, 1.2, 4).astype(np.float32)),
        _const("bn.bias", _f32(4)),
        _const("bn.mean", _f32(4)),
        _const("bn.var", np.linspace(0.5, 1.5, 4).astype(np.float32)),
        _const("clip.min", np.asarray(0.0, np.float32)),
        _const("clip.max", np.asarray(6.0, np.float32)),
        _const("fc.w", _f32(4, 2)),
        _const("fc.b", _f32(2)),
        _const("shape", np.asarray([-1, 4], np.int64)),
        helper.make_node("Conv", ["x", "conv.w"], ["c"], pads=[1, 1, 1, 1], group=1),
        helper.make_node(
            "BatchNormalization", ["c", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["b"]
        ),
        helper.make_node("Clip", ["b", "clip.min", "clip.max"], ["r"]),
        helper.make_node("HardSigmoid", ["r"], ["h"], alpha=0.2, beta=0.5),
        helper.make_node("Mul", ["r", "h"], ["hs"]),
        helper.make_node("GlobalAveragePool", ["hs"], ["p"]),
        helper.make_node("Reshape", ["p", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "fc.w"], ["m"]),
        helper.make_node("Add", ["m", "fc.b"], ["z"]),
        helper.make_node("Softmax", ["z"], ["probs"], axis=1),
    ]
    model = _model(nodes, {}, [("x", F32, [-1, 3, "?", "?"])], [("probs", [-1, 2])], opset)
    return model


PADDLE = {
    "conv.w": "weight",
    "bn.scale": "weight",
    "bn.bias": "weight",
    "fc.w": "weight",
    "fc.b": "weight",
    "bn.mean": "statistic",
    "bn.var": "statistic",
    "clip.min": "hyperparameter",
    "clip.max": "hyperparameter",
}


def pytorch_style() -> onnx.ModelProto:
    """Input normalization, a conv with a folded BN (Mul/Add Constants), a head in Constants."""
    nodes = [
        _const("norm.scale", np.asarray([[[[0.017]], [[0.018]], [[0.019]]]], np.float32)),
        _const("norm.shift", np.asarray([[[[-2.1]], [[-2.0]], [[-1.8]]]], np.float32)),
        _const("bn.scale", np.linspace(0.9, 1.1, 4).reshape(1, 4, 1, 1).astype(np.float32)),
        _const("bn.shift", _f32(1, 4, 1, 1)),
        _const("head.w", _f32(4, 5)),
        _const("head.b", _f32(5)),
        _const("mask", np.asarray([0.0, 0.0, 0.0, 0.0, -np.inf], np.float32)),
        helper.make_node("Mul", ["image", "norm.scale"], ["i0"]),
        helper.make_node("Add", ["i0", "norm.shift"], ["i1"]),
        helper.make_node("Conv", ["i1", "conv.w", "conv.b"], ["c"]),
        helper.make_node("Mul", ["c", "bn.scale"], ["c1"]),
        helper.make_node("Add", ["c1", "bn.shift"], ["c2"]),
        helper.make_node("Relu", ["c2"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "head.w"], ["m"]),
        helper.make_node("Add", ["m", "head.b"], ["z"]),
        helper.make_node("Add", ["z", "mask"], ["logits"]),
    ]
    inits = {"conv.w": _f32(4, 3, 3, 3), "conv.b": _f32(4)}
    return _model(nodes, inits, [("image", F32, ["batch", 3, 6, 6])], [("logits", ["batch", 5])])


PYTORCH = {
    "conv.w": "weight",
    "conv.b": "weight",
    "bn.scale": "weight",
    "bn.shift": "weight",
    "head.w": "weight",
    "head.b": "weight",
    "norm.scale": "preprocessing",
    "norm.shift": "preprocessing",
    "mask": "non-finite",
}


def keras2onnx_style() -> onnx.ModelProto:
    """Channels-last input, PRelu with one shared slope, three heads."""
    inits = {
        "conv/kernel": _f32(4, 3, 3, 3),
        "prelu/alpha": np.asarray([0.25], np.float32),
        "cls/kernel": _f32(4, 2),
        "cls/bias": _f32(2),
        "box/kernel": _f32(4, 4),
        "box/bias": _f32(4),
    }
    nodes = [
        helper.make_node("Transpose", ["input_1"], ["t"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["t", "conv/kernel"], ["c"]),
        helper.make_node("PRelu", ["c", "prelu/alpha"], ["a"]),
        helper.make_node("GlobalAveragePool", ["a"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "cls/kernel"], ["k0"]),
        helper.make_node("Add", ["k0", "cls/bias"], ["k1"]),
        helper.make_node("Softmax", ["k1"], ["softmax"], axis=1),
        helper.make_node("MatMul", ["f", "box/kernel"], ["b0"]),
        helper.make_node("Add", ["b0", "box/bias"], ["boxes"]),
    ]
    return _model(
        nodes,
        inits,
        [("input_1", F32, ["N", "H", "W", 3])],
        [("boxes", ["N", 4]), ("softmax", ["N", 2])],
        opset=12,
    )


KERAS = {
    "conv/kernel": "weight",
    "prelu/alpha": "weight",
    "cls/kernel": "weight",
    "cls/bias": "weight",
    "box/kernel": "unreached",
    "box/bias": "unreached",
}

IDIOMS: dict[str, tuple[Callable[[], onnx.ModelProto], dict[str, str], dict[str, Any]]] = {
    "tf2onnx": (tf2onnx_style, TF2ONNX, {}),
    "paddle": (paddle_style, PADDLE, {"loss": "log_loss"}),
    "pytorch": (pytorch_style, PYTORCH, {}),
    "keras2onnx": (keras2onnx_style, KERAS, {"output": "softmax", "loss": "log_loss"}),
}


def _feeds(model: onnx.ModelProto, n: int = 4, spatial: int = 6) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(n)
    feeds = {}
    for value in model.graph.input:
        dims = [
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in value.type.tensor_type.shape.dim
        ]
        shape = [n if i == 0 else (spatial if d is None else d) for i, d in enumerate(dims)]
        feeds[value.name] = rng.normal(size=shape).astype(np.float32)
    return feeds


def _attach(model: onnx.ModelProto, **kwargs: Any) -> onnx.ModelProto:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "the model imports ai.onnx opset", UserWarning)
        return training.attach(model, optimizer=onnx_optax.adam(0.01), **kwargs)


def _xs(model: onnx.ModelProto) -> list[str]:
    node = next(n for n in model.training_info[0].algorithm.node if n.op_type == "Gradient")
    return [s.decode() for s in next(a for a in node.attribute if a.name == "xs").strings]


@pytest.mark.parametrize("idiom", IDIOMS)
def test_the_plan_of_each_exporter_idiom(idiom: str) -> None:
    make, expected, kwargs = IDIOMS[idiom]
    plan = training.plan(make(), output=kwargs.get("output"))
    kinds = {t.name: t.kind for t in plan.tensors}
    assert {n: kinds[n] for n in expected} == expected
    trains = {t.name for t in plan.tensors if t.trains}
    assert trains == {n for n, k in expected.items() if k == "weight"}
    for tensor in plan.tensors:  # every line says why
        assert tensor.reason and (tensor.kind == "weight") == tensor.trains
    text = str(plan)
    assert all(name in text for name in expected)
    assert text.splitlines()[0].startswith(f"loss output: {plan.output}; {len(trains)} of ")


@pytest.mark.parametrize("idiom", IDIOMS)
def test_attach_trains_the_plan_and_inference_is_unchanged(idiom: str) -> None:
    make, expected, kwargs = IDIOMS[idiom]
    model = make()
    attached = _attach(model, **kwargs)
    assert training.check(attached) == []
    weights = [n for n, k in expected.items() if k == "weight"]
    assert sorted(_xs(attached)) == sorted(weights)
    # Lifted Constants are initializers now; what stays a Constant is untouched.
    stored = {i.name for i in attached.graph.initializer}
    constants = {n.output[0] for n in attached.graph.node if n.op_type == "Constant"}
    assert set(weights) <= stored and not set(weights) & constants
    session = training.Session(attached)
    feeds = _feeds(model)
    inference = session.to_inference_model()
    onnx.checker.check_model(inference, full_check=True)
    names = [o.name for o in model.graph.output]
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    lifted = ort.InferenceSession(inference.SerializeToString(), providers=["CPUExecutionProvider"])
    before = reference.run(names, feeds)
    for ours, theirs in zip(before, lifted.run(names, feeds), strict=True):
        np.testing.assert_array_equal(ours, theirs)
    for name, value in zip(names, before, strict=True):
        np.testing.assert_allclose(session.run(feeds)[name], value, rtol=2e-5, atol=2e-6)


def test_lift_constants_false_keeps_every_constant_and_trains_none() -> None:
    model = pytorch_style()
    plan = training.plan(model, lift_constants=False)
    assert plan.trained == ["conv.w", "conv.b"]
    held = {t.name: t.reason for t in plan.tensors if t.source.startswith("Constant")}
    assert "lift_constants=False" in held["head.w"]
    attached = _attach(model, lift_constants=False)
    assert _xs(attached) == ["conv.w", "conv.b"]
    assert sum(n.op_type == "Constant" for n in attached.graph.node) == 7
    with pytest.raises(ValueError, match=r"nothing to train: the model has no float initializer"):
        _attach(paddle_style(), loss="log_loss", lift_constants=False)


def test_a_constant_named_in_trainable_is_lifted_and_check_warns() -> None:
    model = tf2onnx_style()
    attached = _attach(model, trainable=["dense/kernel", "ln/epsilon"])
    problems = training.check(attached)
    assert len(problems) == 1 and not problems[0].blocking
    assert re.search(r"xs 'ln/epsilon' trains, but it is a exporter constant", problems[0])
    training.Session(attached)  # a warning does not stop the session
    plan = training.plan(model, trainable=["dense/kernel", "ln/epsilon"])
    reason = next(t.reason for t in plan.tensors if t.name == "ln/epsilon")
    assert reason.startswith("named in trainable= (exporter constant")


def test_a_weight_the_loss_does_not_reach_is_named_by_check() -> None:
    attached = _attach(keras2onnx_style(), output="softmax", trainable=["cls/kernel", "box/kernel"])
    (problem,) = training.check(attached)
    assert not problem.blocking and "xs 'box/kernel' trains, but it is a unreached" in problem


def test_several_outputs_need_output_named_with_their_shapes() -> None:
    with pytest.raises(
        ValueError,
        match=re.escape(
            "the model has 2 outputs ('boxes' float32[N, 4], 'softmax' float32[N, 2]); pass "
            "output= to say which one the loss reads"
        ),
    ):
        _attach(keras2onnx_style())


def test_one_element_bias_after_matmul_and_prelu_slope_train() -> None:
    model = tf2onnx_style()
    model.graph.initializer[-2].CopyFrom(numpy_helper.from_array(_f32(1), "head/bias"))
    kinds = {t.name: t.kind for t in training.plan(model).tensors}
    assert kinds["head/bias"] == kinds["dense/bias"] == "weight"


# ----------------------------------------------------------------------------- the target


def test_the_default_target_name_never_collides() -> None:
    model = tf2onnx_style()
    assert _attach(model).training_info[0].algorithm.input[0].name == "target"
    model.graph.node.append(helper.make_node("Identity", ["logits"], ["target"]))
    model.graph.output.append(helper.make_tensor_value_info("target", F32, ["unk__2", 3]))
    attached = _attach(model, output="logits")
    assert attached.training_info[0].algorithm.input[0].name == "target_1"
    with pytest.raises(ValueError, match=r"target 'target' is already a tensor name"):
        _attach(model, output="logits", target="target")


# ----------------------------------------------------------------------------- class axes


def _sequence_model(layout: str) -> onnx.ModelProto:
    """Scores of 5 classes per position: [N, C, L] (ONNX's layout) or [T, N, C] (time-major)."""
    w = _f32(3, 5)
    if layout == "NCL":
        nodes = [
            helper.make_node("MatMul", ["x", "w"], ["s"]),  # x [N, L, 3] -> [N, L, 5]
            helper.make_node("Transpose", ["s"], ["scores"], perm=[0, 2, 1]),
        ]
        return _model(nodes, {"w": w}, [("x", F32, ["N", 7, 3])], [("scores", ["N", 5, 7])])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["scores"])]  # x [T, N, 3]
    return _model(nodes, {"w": w}, [("x", F32, [7, "batch", 3])], [("scores", [7, "batch", 5])])


@pytest.mark.parametrize(("layout", "class_axis"), [("NCL", None), ("TNC", 2), ("TNC", -1)])
def test_per_position_classes_match_jax_by_hand(layout: str, class_axis: int | None) -> None:
    model = _sequence_model(layout)
    w = numpy_helper.to_array(model.graph.initializer[0])
    # Momentum with alpha 0, beta 1 is plain gradient descent: x - 0.5 * g.
    sgd = onnx_optax.momentum(0.5, alpha=0.0, beta=1.0, norm_coefficient=0.0)
    attached = training.attach(model, class_axis=class_axis, optimizer=sgd)
    assert training.check(attached) == []
    target = attached.training_info[0].algorithm.input[0]
    dims = [d.dim_value or d.dim_param for d in target.type.tensor_type.shape.dim]
    assert dims == (["N", 7] if layout == "NCL" else [7, "batch"])
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4, 7, 3) if layout == "NCL" else (7, 4, 3)).astype(np.float32)
    t = rng.integers(0, 5, size=(4, 7) if layout == "NCL" else (7, 4)).astype(np.int64)

    def loss_fn(w: jax.Array) -> jax.Array:
        logp = jax.nn.log_softmax(x @ w, axis=-1)  # classes last in both layouts here
        return -jnp.mean(jnp.take_along_axis(logp, t[..., None].astype(np.int32), axis=-1))

    session = training.Session(attached)
    loss = float(session.step({"x": x, "target": t})["loss"])
    np.testing.assert_allclose(loss, float(loss_fn(jnp.asarray(w))), rtol=1e-6)
    grad = jax.grad(loss_fn)(jnp.asarray(w))
    np.testing.assert_allclose(session.initializers["w"], w - 0.5 * grad, rtol=1e-5, atol=1e-7)


def test_a_symbolic_class_axis_is_refused_at_attach_naming_the_output() -> None:
    with pytest.raises(
        ValueError,
        match=re.escape(
            "output 'scores' has shape [7, batch, 5]: its axis 1 (batch) has no fixed size, so "
            "it cannot hold the classes of a class loss; pass class_axis=2 if axis 2 holds the "
            "classes"
        ),
    ):
        _attach(_sequence_model("TNC"))
    fixed = _sequence_model("TNC")
    fixed.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 1  # a batch of one
    with pytest.raises(ValueError, match=r"its axis 1 holds 1 class\(es\), and a class loss"):
        _attach(fixed)
    with pytest.raises(ValueError, match=r"class_axis=3 is out of range for output 'scores'"):
        _attach(_sequence_model("TNC"), class_axis=3)
    with pytest.raises(ValueError, match=r"class_axis= is for class losses; 'mse'"):
        _attach(_sequence_model("TNC"), loss="mse", class_axis=2)


def test_log_loss_of_a_softmax_reads_its_logits() -> None:
    """-log(softmax(z)) as the cross-entropy of z: a confident mistake keeps its gradient."""
    model = keras2onnx_style()
    attached = _attach(model, output="softmax", loss="log_loss")
    algorithm = attached.training_info[0].algorithm
    (loss_node,) = [n for n in algorithm.node if n.op_type == "SoftmaxCrossEntropyLoss"]
    assert loss_node.input[0] == "k1"
    feeds = _feeds(model)
    session = training.Session(attached)
    probs = session.run(feeds)["softmax"]
    target = np.argmin(probs, axis=1).astype(np.int64)
    loss = float(session.evaluate({**feeds, "target": target})["loss"])
    np.testing.assert_allclose(loss, -np.mean(np.log(probs[np.arange(4), target])), rtol=1e-5)


# ----------------------------------------------------------------------------- old opsets


def test_an_opset_11_model_is_raised_or_converted_and_still_runs_in_onnxruntime() -> None:
    model = paddle_style(opset=11)
    with pytest.warns(UserWarning, match=r"imports ai.onnx opset 11 and the loss needs 12"):
        attached = training.attach(model, loss="log_loss", optimizer=onnx_optax.adam(0.05))
    assert training.check(attached) == []
    assert max(o.version for o in attached.opset_import if o.domain == "") >= 12
    session = training.Session(attached)
    feeds = _feeds(model, spatial=9)
    rows = np.arange(4) % 2
    first = float(session.step({**feeds, "target": rows})["loss"])
    for _ in range(29):
        last = float(session.step({**feeds, "target": rows})["loss"])
    assert last < 0.5 * first
    inference = ort.InferenceSession(
        session.to_inference_model().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    np.testing.assert_allclose(
        inference.run(None, feeds)[0], session.run(feeds)["probs"], rtol=1e-5, atol=1e-6
    )


def test_an_opset_11_model_whose_ops_are_the_same_at_12_only_raises_the_import() -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"])]
    model = _model(nodes, {"w": _f32(3, 2)}, [("x", F32, ["N", 3])], [("z", ["N", 2])], opset=11)
    with pytest.warns(UserWarning, match=r"none of its ops changed between the two"):
        attached = training.attach(model, optimizer=onnx_optax.adam(0.1))
    assert [n.op_type for n in attached.graph.node] == ["MatMul"]
    elementwise = training.attach(model, loss="mse", optimizer=onnx_optax.adam(0.1))
    assert [o.version for o in elementwise.opset_import if o.domain == ""] == [11]


def test_unknown_dims_and_question_marks_stay_unknown() -> None:
    attached = _attach(paddle_style(), loss="log_loss")
    assert training.check(attached) == []
    session = training.Session(attached)
    for h, w in ((5, 7), (9, 4)):  # '?' names no size shared by H and W
        feeds = {"x": np.ones((2, 3, h, w), np.float32), "target": np.array([0, 1])}
        assert np.isfinite(session.step(feeds)["loss"])


# ----------------------------------------------------------------------------- a property


@st.composite
def _exports(draw: st.DrawFn) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """An exporter's idiom, with its batch and spatial dims drawn fixed or symbolic."""
    idiom = draw(st.sampled_from(sorted(IDIOMS)))
    make, _, kwargs = IDIOMS[idiom]
    model = make()
    for value in [*model.graph.input, *model.graph.output]:
        for i, dim in enumerate(value.type.tensor_type.shape.dim):
            if not dim.HasField("dim_value") or dim.dim_value <= 0:
                choice = draw(st.sampled_from(["fixed", "named", "minus-one", "empty"]))
                size = 1 if i == 0 else 3
                if choice == "fixed" and value in model.graph.input:
                    dim.dim_value = size
                elif choice == "named":
                    dim.dim_param = f"d{i}"
                elif choice == "minus-one":
                    dim.dim_value = -1
                else:
                    dim.Clear()
    return model, kwargs


@settings(max_examples=12)
@given(_exports())
def test_attach_never_returns_a_model_that_fails_check(
    case: tuple[onnx.ModelProto, dict[str, Any]],
) -> None:
    model, kwargs = case
    try:
        attached = _attach(model, **kwargs)
    except ValueError as error:  # refused at attach time: then with a reason naming the output
        assert "output" in str(error)
        return
    assert training.check(attached) == []


# ----------------------------------------------------------------------------- scikit-learn


def test_weights_in_ml_attributes_are_named_with_what_to_do() -> None:
    skl2onnx = pytest.importorskip("skl2onnx")
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.linear_model import LogisticRegression

    x = np.random.default_rng(0).normal(size=(30, 4)).astype(np.float32)
    fitted = LogisticRegression().fit(x, (x[:, 0] > 0).astype(np.int64))
    model = skl2onnx.convert_sklearn(
        fitted,
        initial_types=[("x", FloatTensorType([None, 4]))],
        options={id(fitted): {"zipmap": False}},
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    with pytest.raises(ValueError, match=r"LinearClassifier\) keeps its weights in the attributes"):
        _attach(model, output="probabilities", loss="log_loss")


def test_an_skl2onnx_classifier_fine_tunes_and_runs_every_output() -> None:
    skl2onnx = pytest.importorskip("skl2onnx")
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.neural_network import MLPClassifier

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn's ConvergenceWarning
        fitted = MLPClassifier(hidden_layer_sizes=(8,), max_iter=20, random_state=0).fit(x, y)
    model = skl2onnx.convert_sklearn(
        fitted,
        initial_types=[("input", FloatTensorType([None, 4]))],
        options={id(fitted): {"zipmap": False}},
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    assert "label" in {o.name for o in model.graph.output}  # the old default target's name
    attached = _attach(model, output="probabilities", loss="log_loss")
    assert training.check(attached) == []
    session = training.Session(attached)
    target = attached.training_info[0].algorithm.input[0].name
    assert target == "target"
    losses = [float(session.step({"input": x, target: y})["loss"]) for _ in range(30)]
    assert losses[-1] < 0.8 * losses[0]
    every = session.run({"input": x})
    inference = ort.InferenceSession(
        session.to_inference_model().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    label, probabilities = inference.run(["label", "probabilities"], {"input": x})
    np.testing.assert_array_equal(every["label"], label)
    np.testing.assert_allclose(every["probabilities"], probabilities, rtol=1e-5, atol=1e-6)
