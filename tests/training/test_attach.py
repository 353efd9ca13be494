"""training.attach: the l1 and bce_with_logits losses, and what is trained (trainable, frozen).

Expected values are the same networks and losses written by hand in jax.numpy,
trained by ``jax.value_and_grad`` and the same onnx_optax transformation
applied by hand.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import onnx_optax

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import training  # noqa: E402

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
Params = dict[str, jax.Array]


def _model(
    nodes: list[onnx.NodeProto],
    inits: dict[str, np.ndarray],
    x_shape: list[str | int],
    out: str,
    out_shape: list[str | int],
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "net",
        [helper.make_tensor_value_info("x", F32, x_shape)],
        [helper.make_tensor_value_info(out, F32, out_shape)],
        initializer=[numpy_helper.from_array(v, n) for n, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _trained_by_hand(
    loss_fn: Callable[[Params, jax.Array, jax.Array], jax.Array],
    params: dict[str, np.ndarray],
    tx: optax.GradientTransformation,
    batches: list[tuple[np.ndarray, np.ndarray]],
) -> tuple[list[float], Params]:
    """The losses of each step and the final parameters: value_and_grad, then tx by hand."""
    p = {k: jnp.asarray(v) for k, v in params.items()}
    state = tx.init(p)
    losses = []
    for x, t in batches:
        value, grads = jax.value_and_grad(loss_fn)(p, jnp.asarray(x), jnp.asarray(t))
        updates, state = tx.update(grads, state, p)
        p = optax.apply_updates(p, updates)
        losses.append(float(value))
    return losses, p


# ----------------------------------------------------------------------------- losses

LINEAR = {
    "W": (np.random.default_rng(0).normal(size=(4, 3)) / 2).astype(np.float32),
    "b": np.full(3, 0.1, np.float32),
}


def _linear() -> onnx.ModelProto:
    return _model(
        [helper.make_node("Gemm", ["x", "W", "b"], ["out"])], LINEAR, ["N", 4], "out", ["N", 3]
    )


def _l1(out: jax.Array, t: jax.Array) -> jax.Array:
    return jnp.mean(jnp.abs(out - t))


def _bce(out: jax.Array, t: jax.Array) -> jax.Array:
    return jnp.mean(jnp.maximum(out, 0) - out * t + jnp.log1p(jnp.exp(-jnp.abs(out))))


HAND_LOSSES = {"l1": _l1, "bce_with_logits": _bce}


def _targets(loss: str, rng: np.random.Generator) -> np.ndarray:
    if loss == "l1":
        return rng.normal(size=(16, 3)).astype(np.float32)
    return rng.uniform(size=(16, 3)).astype(np.float32)  # probabilities, 0 to 1


@pytest.mark.parametrize("loss", ["l1", "bce_with_logits"])
def test_elementwise_loss_and_its_steps_match_jax(loss: str) -> None:
    assert loss in training.LOSSES
    model = training.attach(_linear(), loss=loss, target="t", optimizer=onnx_optax.adam(0.05))
    onnx.checker.check_model(model, full_check=True)
    assert training.check(model) == []
    rng = np.random.default_rng(1)
    batches = [(rng.normal(size=(16, 4)).astype(np.float32), _targets(loss, rng)) for _ in range(3)]
    session = training.Session(model)
    losses = [float(session.step({"x": x, "t": t})["loss"]) for x, t in batches]

    def loss_fn(p: Params, x: jax.Array, t: jax.Array) -> jax.Array:
        return HAND_LOSSES[loss](x @ p["W"] + p["b"][None, :], t)

    expected, params = _trained_by_hand(loss_fn, LINEAR, onnx_optax.adam(0.05), batches)
    np.testing.assert_allclose(losses, expected, rtol=2e-6)
    for name in LINEAR:
        np.testing.assert_allclose(session.initializers[name], params[name], rtol=1e-5, atol=1e-6)
        assert not np.array_equal(session.initializers[name], LINEAR[name])


def test_bce_with_logits_is_finite_and_exact_for_large_logits() -> None:
    # out = x @ W: logits of +-100 and +-30, right and wrong with confidence.
    weights = {"W": np.diag([100.0, -100.0, 30.0]).astype(np.float32)}
    base = _model([helper.make_node("MatMul", ["x", "W"], ["out"])], weights, [4, 3], "out", [4, 3])
    tx = lambda: onnx_optax.momentum(1e-3, alpha=0.9, beta=1.0, norm_coefficient=0.0)  # noqa: E731
    model = training.attach(base, loss="bce_with_logits", target="t", optimizer=tx())
    x = np.array([[1, 1, 1], [-1, -1, -1], [1, -1, 1], [-1, 1, -1]], np.float32)
    t = np.array([[1, 0, 1], [1, 0, 0], [0, 1, 0], [0, 0, 1]], np.float32)
    sigmoid = jax.nn.sigmoid(jnp.asarray(x @ weights["W"]))
    naive = -(t * jnp.log(sigmoid) + (1 - t) * jnp.log(1 - sigmoid))
    assert not jnp.isfinite(naive).all()  # the formula a stable loss must avoid

    session = training.Session(model)
    loss = session.step({"x": x, "t": t})["loss"]

    def loss_fn(p: Params, x: jax.Array, t: jax.Array) -> jax.Array:
        return _bce(x @ p["W"], t)

    expected, params = _trained_by_hand(loss_fn, weights, tx(), [(x, t)])
    assert np.isfinite(loss) and np.isfinite(session.initializers["W"]).all()
    np.testing.assert_allclose(loss, expected[0], rtol=1e-6)
    np.testing.assert_allclose(session.initializers["W"], params["W"], rtol=1e-6)


# ----------------------------------------------------------------------------- what is trained


def _mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    inits = {
        "W1": rng.normal(size=(4, 5)).astype(np.float32),
        "b1": np.zeros(5, np.float32),
        "W2": rng.normal(size=(5, 3)).astype(np.float32),
        "b2": np.zeros(3, np.float32),
    }
    nodes = [
        helper.make_node("Gemm", ["x", "W1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("Gemm", ["a", "W2", "b2"], ["out"]),
    ]
    return _model(nodes, inits, ["N", 4], "out", ["N", 3])


def _xs(model: onnx.ModelProto) -> list[str]:
    node = next(n for n in model.training_info[0].algorithm.node if n.op_type == "Gradient")
    xs = next(a for a in node.attribute if a.name == "xs")
    return [s.decode() for s in xs.strings]


def _batch(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.normal(size=(8, 4)).astype(np.float32),
        "target": rng.integers(0, 3, size=8).astype(np.int64),
    }


def test_frozen_is_the_complement_of_trainable() -> None:
    frozen = training.attach(_mlp(), frozen=["W1", "b1"], optimizer=onnx_optax.adam(0.1))
    chosen = training.attach(_mlp(), trainable=["W2", "b2"], optimizer=onnx_optax.adam(0.1))
    assert _xs(frozen) == _xs(chosen) == ["W2", "b2"]
    assert training.check(frozen) == []
    sessions = [training.Session(m) for m in (frozen, chosen)]
    for session in sessions:
        session.step(_batch())
    start = numpy_helper.to_array
    before = {i.name: start(i) for i in _mlp().graph.initializer}
    for session in sessions:
        for name in ("W1", "b1"):
            np.testing.assert_array_equal(session.initializers[name], before[name])
        assert not np.array_equal(session.initializers["W2"], before["W2"])
    np.testing.assert_array_equal(sessions[0].initializers["W2"], sessions[1].initializers["W2"])


@pytest.mark.parametrize(
    ("arguments", "error", "pattern"),
    [
        (
            {"trainable": ["W1"], "frozen": ["W2"]},
            ValueError,
            r"pass trainable= \(exactly these\) or frozen= \(every weight but these\), not both",
        ),
        (
            {"frozen": ["W1", "W7"]},
            ValueError,
            r"frozen \['W7'\] are not initializers or Constant nodes of the model's graph",
        ),
        ({"trainable": ["h"]}, ValueError, r"trainable \['h'\] are not initializers"),
        ({"frozen": ["W1", "W1"]}, ValueError, r"frozen= names \['W1'\] more than once"),
        ({"frozen": "W1"}, TypeError, r"frozen= takes a list of tensor names.*\['W1'\]"),
        (
            {"frozen": ["W1", "b1", "W2", "b2"]},
            ValueError,
            r"nothing to train: frozen= freezes every weight of the model \(\['W1', 'b1', 'W2'",
        ),
        ({"trainable": []}, ValueError, r"nothing to train: trainable= is empty"),
    ],
)
def test_bad_trainable_or_frozen(arguments: dict[str, object], error: type, pattern: str) -> None:
    # The selection is checked before the loss: an unknown loss is not what is reported.
    with pytest.raises(error, match=pattern):
        training.attach(_mlp(), loss="hinge", optimizer=onnx_optax.adam(0.1), **arguments)  # type: ignore[arg-type]


def _shapes_model(float_shape: bool = True) -> onnx.ModelProto:
    """Weights W and b; the Reshape's shape and ReduceSum's 'axes' are no weights.

    The shape is 'shape_f', float, reaching the Reshape through Identity and
    Cast, or (``float_shape=False``) 'shape', int64: only integer initializers
    are known while tracing, so only that form runs on onnx_optax's runtime.
    """
    rng = np.random.default_rng(3)
    shape = np.array([-1, 2, 3], np.float32 if float_shape else np.int64)
    inits = {
        "W": rng.normal(size=(4, 6)).astype(np.float32),
        "shape_f" if float_shape else "shape": shape,
        "axes": np.array([1], np.int64),
        "b": np.zeros((1, 3), np.float32),
    }
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"])]
    if float_shape:
        nodes += [
            helper.make_node("Identity", ["shape_f"], ["shape_copy"]),
            helper.make_node("Cast", ["shape_copy"], ["shape"], to=I64),
        ]
    nodes += [
        helper.make_node("Reshape", ["h", "shape"], ["r"], name="reshape"),
        helper.make_node("ReduceSum", ["r", "axes"], ["s"], keepdims=0),
        helper.make_node("Add", ["s", "b"], ["out"]),
    ]
    return _model(nodes, inits, ["N", 4], "out", ["N", 3])


def test_the_default_trains_no_shape_or_integer_initializer() -> None:
    model = training.attach(_shapes_model(float_shape=False), optimizer=onnx_optax.adam(0.1))
    assert _xs(model) == ["W", "b"]
    assert training.check(model) == []
    session = training.Session(model)
    session.step(_batch())
    np.testing.assert_array_equal(session.initializers["shape"], [-1, 2, 3])
    assert not np.array_equal(session.initializers["b"], np.zeros((1, 3), np.float32))


def test_a_float_initializer_read_only_as_a_shape_is_no_weight() -> None:
    model = training.attach(_shapes_model(), optimizer=onnx_optax.adam(0.1))
    assert _xs(model) == ["W", "b"]
    with pytest.raises(
        ValueError,
        match=r"trainable names tensors that are not weights: 'shape_f' is read as a shape "
        r"\(input 1 of node 'reshape' \(ai.onnx.Reshape\)\); 'axes' is of dtype int64",
    ):
        training.attach(
            _shapes_model(), trainable=["W", "shape_f", "axes"], optimizer=onnx_optax.adam(0.1)
        )


def test_a_weight_the_loss_output_does_not_reach_is_not_trained() -> None:
    # 'shape_f' is also read as data, but only by a second output the loss does not read.
    model = _shapes_model()
    model.graph.node.append(helper.make_node("Identity", ["shape_f"], ["also"]))
    model.graph.output.append(helper.make_tensor_value_info("also", F32, [3]))
    attached = training.attach(model, output="out", optimizer=onnx_optax.adam(0.1))
    assert _xs(attached) == ["W", "b"]
    # A float shape is not known while tracing (see _shapes_model), so the first step
    # refuses the Reshape, and check, which traces the step on stand-in sizes, says so.
    (problem,) = training.check(attached)
    assert problem.blocking and "node 'reshape'" in problem
    assert "must be known when the graph is compiled" in problem
    kinds = {t.name: t.kind for t in training.plan(model, output="out").tensors}
    assert kinds["shape_f"] == "unreached"
    # Read by the loss's output, it is data with 3 elements: a weight.
    assert _xs(
        training.attach(model, output="also", loss="mse", optimizer=onnx_optax.adam(0.1))
    ) == ["shape_f"]


def test_nothing_to_train_names_what_is_not_a_weight() -> None:
    model = _shapes_model()
    for name in ("W", "b"):  # inputs instead of initializers
        index = [i.name for i in model.graph.initializer].index(name)
        value = model.graph.initializer[index]
        model.graph.input.append(helper.make_tensor_value_info(name, F32, list(value.dims)))
        del model.graph.initializer[index]
    with pytest.raises(
        ValueError,
        match=r"nothing to train: the model has no float initializer or Constant node that is a "
        r"weight the output reaches \('shape_f' is shape: read as a shape .*, 'axes' is "
        r"integer: of dtype int64",
    ):
        training.attach(model, optimizer=onnx_optax.adam(0.1))


# ----------------------------------------------------------------------------- a CNN with BN

CNN = {
    "Wc": (np.random.default_rng(4).normal(size=(4, 2, 3, 3)) / 3).astype(np.float32),
    "bc": np.full(4, 0.1, np.float32),
    "scale": np.array([1.0, 0.8, 1.2, 0.9], np.float32),
    "bias": np.array([0.0, 0.1, -0.1, 0.2], np.float32),
    "mean": np.array([0.3, -0.2, 0.5, 0.1], np.float32),
    "var": np.array([1.5, 0.7, 2.0, 1.1], np.float32),
    "Wg": (np.random.default_rng(5).normal(size=(4, 3)) / 2).astype(np.float32),
    "bg": np.zeros(3, np.float32),
}


def _cnn() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Conv", ["x", "Wc", "bc"], ["c"]),
        helper.make_node(
            "BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"], name="bn"
        ),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "Wg", "bg"], ["logits"]),
    ]
    return _model(nodes, CNN, ["N", 2, 6, 6], "logits", ["N", 3])


def _cnn_loss(batch_statistics: bool) -> Callable[[Params, jax.Array, jax.Array], jax.Array]:
    def loss_fn(p: Params, x: jax.Array, label: jax.Array) -> jax.Array:
        c = jax.lax.conv_general_dilated(x, p["Wc"], (1, 1), "VALID")
        c = c + p["bc"][None, :, None, None]
        mean, var = jnp.asarray(CNN["mean"]), jnp.asarray(CNN["var"])  # constants
        if batch_statistics:  # what a BN in training mode would use instead
            mean, var = jnp.mean(c, axis=(0, 2, 3)), jnp.var(c, axis=(0, 2, 3))

        def channel(v: jax.Array) -> jax.Array:
            return v[None, :, None, None]

        n = (c - channel(mean)) / jnp.sqrt(channel(var) + 1e-5) * channel(p["scale"])
        f = jnp.mean(jax.nn.relu(n + channel(p["bias"])), axis=(2, 3))
        logits = f @ p["Wg"] + p["bg"][None, :]
        logp = jax.nn.log_softmax(logits, axis=1)
        return -jnp.mean(jnp.take_along_axis(logp, label[:, None], axis=1))

    return loss_fn


def test_a_cnn_with_batch_normalization_trains_its_weights_not_its_statistics() -> None:
    model = training.attach(_cnn(), optimizer=onnx_optax.adam(0.02))
    assert _xs(model) == ["Wc", "bc", "scale", "bias", "Wg", "bg"]
    assert training.check(model) == []
    rng = np.random.default_rng(6)
    x = rng.normal(size=(16, 2, 6, 6)).astype(np.float32)
    label = rng.integers(0, 3, size=16).astype(np.int64)
    session = training.Session(model)
    losses = [float(session.step({"x": x, "target": label})["loss"]) for _ in range(20)]

    # Inference-mode BN, the stored statistics: the loss and weights of JAX by hand.
    batches = [(x, label.astype(np.int32))] * 20
    weights = {k: v for k, v in CNN.items() if k not in ("mean", "var")}
    expected, trained = _trained_by_hand(_cnn_loss(False), weights, onnx_optax.adam(0.02), batches)
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    with_batch_statistics = _cnn_loss(True)(
        {k: jnp.asarray(v) for k, v in weights.items()}, jnp.asarray(x), jnp.asarray(label)
    )
    assert abs(losses[0] - float(with_batch_statistics)) > 1e-3  # the test tells them apart
    assert losses[-1] < 0.8 * losses[0]
    final = session.initializers
    for name in ("Wc", "bc", "scale", "bias", "Wg", "bg"):
        assert not np.array_equal(final[name], CNN[name]), name
        np.testing.assert_allclose(final[name], trained[name], rtol=1e-5, atol=1e-6)
    for name in ("mean", "var"):
        assert final[name].tobytes() == CNN[name].tobytes()
        stored = next(i for i in session.to_model().graph.initializer if i.name == name)
        assert numpy_helper.to_array(stored).tobytes() == CNN[name].tobytes()


def test_bn_statistics_are_no_trainable_and_frozen_may_name_them() -> None:
    with pytest.raises(
        ValueError,
        match=r"'mean' is the running mean \(input 3\) of node 'bn' "
        r"\(ai.onnx.BatchNormalization\)",
    ):
        training.attach(_cnn(), trainable=["Wc", "mean"], optimizer=onnx_optax.adam(0.1))
    model = training.attach(_cnn(), frozen=["var", "Wc"], optimizer=onnx_optax.adam(0.1))
    assert _xs(model) == ["bc", "scale", "bias", "Wg", "bg"]


# ----------------------------------------------------------------------------- check


def _sgd(base: onnx.ModelProto, xs: list[str], output: str) -> onnx.ModelProto:
    """A training model written by hand: x.new = x - 0.1 * d mean(output) / dx for each x."""
    inits = {i.name: numpy_helper.to_array(i) for i in base.graph.initializer}
    nodes = [
        helper.make_node("ReduceMean", [output], ["loss"], keepdims=0),
        helper.make_node(
            "Gradient",
            xs,
            [f"{x}.grad" for x in xs],
            domain="ai.onnx.preview.training",
            xs=xs,
            y="loss",
        ),
    ]
    outputs = []
    for x in xs:
        nodes += [
            helper.make_node("Mul", [f"{x}.grad", "lr"], [f"{x}.step"]),
            helper.make_node("Sub", [x, f"{x}.step"], [f"{x}.new"]),
        ]
        elem = helper.np_dtype_to_tensor_dtype(inits[x].dtype)
        outputs.append(helper.make_tensor_value_info(f"{x}.new", elem, list(inits[x].shape)))
    algorithm = helper.make_graph(
        nodes,
        "sgd",
        [],
        outputs,
        initializer=[numpy_helper.from_array(np.asarray(0.1, np.float32), "lr")],
    )
    model = onnx.ModelProto()
    model.CopyFrom(base)
    model.opset_import.append(helper.make_opsetid("ai.onnx.preview.training", 1))
    model.training_info.append(
        helper.make_training_info(algorithm, [(x, f"{x}.new") for x in xs], None, None)
    )
    return model


@pytest.mark.parametrize(
    ("base", "xs", "output", "pattern"),
    [
        (
            _cnn,
            ["Wc", "mean"],
            "logits",
            r"xs 'mean' is the running mean \(input 3\) of node 'bn' "
            r"\(ai.onnx.BatchNormalization\), not a weight",
        ),
        (
            _shapes_model,
            ["W", "shape_f"],
            "out",
            r"xs 'shape_f' is read as a shape \(input 1 of node 'reshape' \(ai.onnx.Reshape\)\), "
            "not a weight",
        ),
        (_shapes_model, ["W", "axes"], "out", r"xs 'axes' is of dtype int64 \(not a float\)"),
    ],
)
def test_check_names_an_initializer_trained_that_is_not_a_weight(
    base: Callable[[], onnx.ModelProto], xs: list[str], output: str, pattern: str
) -> None:
    model = _sgd(base(), xs, output)
    problems = training.check(model)
    assert len(problems) == 1 and re.search(pattern, problems[0]), problems
    with pytest.raises(training.TrainingModelError, match=pattern):
        training.Session(model)
    # The same model training the weight alone has no such problem.
    assert not any(re.search(pattern, p) for p in training.check(_sgd(base(), xs[:1], output)))
