"""onnx_optax.training: attach a loss and an optimizer, check, train, write back."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import onnx_optax

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import interop, training  # noqa: E402
from tests.support.training_models import data, mlp  # noqa: E402
from tests.support.training_models import mlp_forward as _forward  # noqa: E402
from tests.support.training_models import mlp_params as _params  # noqa: E402

F32 = TensorProto.FLOAT
OPTIMIZERS = {
    "adagrad": lambda: onnx_optax.adagrad(0.1),
    "adam": lambda: onnx_optax.adam(0.01),
    "momentum": lambda: onnx_optax.momentum(0.05, alpha=0.9, beta=1.0, norm_coefficient=0.0),
    "nesterov": lambda: onnx_optax.nesterov(0.05, alpha=0.9, beta=1.0, norm_coefficient=0.0),
}


def _by_hand(loss: str, tx: optax.GradientTransformation, steps: int) -> list[float]:
    """The same network and optimizer written in JAX: the losses of the first steps."""

    def loss_fn(p: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
        logits = _forward(p, x)
        if loss == "mse":
            return jnp.mean((logits - y) ** 2)
        logp = jax.nn.log_softmax(logits, axis=1)
        if loss == "log_loss":
            logp = jnp.log(jnp.maximum(jax.nn.softmax(logits, axis=1), 1e-7))
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    params = {k: jnp.asarray(v) for k, v in _params().items()}
    state = tx.init(params)
    losses = []
    for i in range(steps):
        batch = data(seed=i)
        y = batch["target"].astype(np.int32) if loss != "mse" else _mse_target(batch)
        value, grads = jax.value_and_grad(loss_fn)(params, jnp.asarray(batch["x"]), jnp.asarray(y))
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        losses.append(float(value))
    return losses


def _mse_target(batch: dict[str, np.ndarray]) -> np.ndarray:
    return np.eye(3, dtype=np.float32)[batch["target"]]


def test_attach_is_a_valid_model_that_onnxruntime_still_runs() -> None:
    ort = pytest.importorskip("onnxruntime")
    model = training.attach(mlp(), optimizer=onnx_optax.adam(1e-3))
    onnx.checker.check_model(model, full_check=True)
    assert training.check(model) == []
    assert model.graph.node == mlp().graph.node
    info = model.training_info[0]
    assert info.algorithm.output[0].name == "loss"
    x = data()["x"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(mlp().SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_first_losses_match_the_network_trained_by_hand(name: str) -> None:
    model = training.attach(mlp(), optimizer=OPTIMIZERS[name]())
    session = training.Session(model)
    losses = [float(session.step(data(seed=i))["loss"]) for i in range(4)]
    np.testing.assert_allclose(losses, _by_hand("sce", OPTIMIZERS[name](), 4), rtol=2e-6)


@pytest.mark.parametrize("loss", ["log_loss", "nll", "mse"])
def test_each_loss_matches_jax(loss: str) -> None:
    base = mlp(softmax=loss == "log_loss")
    if loss == "nll":  # log-probabilities: LogSoftmax on the logits
        base.graph.node.append(helper.make_node("LogSoftmax", ["logits"], ["logp"], axis=1))
        base.graph.output[0].name = "logp"
    model = training.attach(base, loss=loss, optimizer=onnx_optax.adam(0.01))
    assert training.check(model) == []
    session = training.Session(model)
    losses = []
    for i in range(3):
        batch = data(seed=i)
        if loss == "mse":
            batch["target"] = _mse_target(batch)
        losses.append(float(session.step(batch)["loss"]))
    expected = _by_hand("sce" if loss == "nll" else loss, onnx_optax.adam(0.01), 3)
    np.testing.assert_allclose(losses, expected, rtol=2e-6)


def test_a_loss_graph_of_your_own() -> None:
    loss = helper.make_graph(
        [
            helper.make_node("Sub", ["p", "t"], ["d"]),
            helper.make_node("Abs", ["d"], ["a"]),
            helper.make_node("ReduceMean", ["a"], ["l"], keepdims=0),
        ],
        "l1",
        [
            helper.make_tensor_value_info("p", F32, ["N", 3]),
            helper.make_tensor_value_info("t", F32, ["N", 3]),
        ],
        [helper.make_tensor_value_info("l", F32, [])],
    )
    model = training.attach(mlp(), loss=loss, target="y", optimizer=onnx_optax.adam(0.01))
    assert training.check(model) == []
    batch = data()
    out = training.Session(model).step({"x": batch["x"], "y": _mse_target(batch)})
    logits = _forward({k: jnp.asarray(v) for k, v in _params().items()}, jnp.asarray(batch["x"]))
    np.testing.assert_allclose(
        out["loss"], jnp.mean(jnp.abs(logits - _mse_target(batch))), rtol=1e-6
    )


def test_to_model_and_a_new_session_continue_bit_identically() -> None:
    model = training.attach(mlp(), optimizer=onnx_optax.adam(0.01))
    straight = training.Session(model)
    first = training.Session(model)
    for i in range(3):
        straight.step(data(seed=i))
        first.step(data(seed=i))
    resumed = training.Session(onnx.ModelProto.FromString(first.to_model().SerializeToString()))
    for i in range(3, 6):
        a, b = straight.step(data(seed=i)), resumed.step(data(seed=i))
        np.testing.assert_array_equal(a["loss"], b["loss"])
    for name, value in straight.initializers.items():
        np.testing.assert_array_equal(resumed.initializers[name], value, err_msg=name)
        assert resumed.initializers[name].dtype == value.dtype
    T = next(k for k in straight.initializers if k.startswith("T"))
    assert straight.initializers[T] == 7 and straight.initializers[T].dtype == np.int64


def test_trained_model_in_onnxruntime_matches_the_session() -> None:
    ort = pytest.importorskip("onnxruntime")
    session = training.Session(training.attach(mlp(), optimizer=onnx_optax.adam(0.05)))
    for i in range(5):
        session.step(data(seed=i))
    trained = session.to_model()
    x = data(seed=9)["x"]
    run = ort.InferenceSession(trained.SerializeToString(), providers=["CPUExecutionProvider"])
    p = {k: jnp.asarray(v) for k, v in session.initializers.items() if k in _params()}
    np.testing.assert_allclose(
        run.run(None, {"x": x})[0], _forward(p, jnp.asarray(x)), rtol=1e-5, atol=1e-6
    )
    assert not np.array_equal(p["W1"], _params()["W1"])


def test_from_model_reads_a_complete_training_model() -> None:
    model = training.attach(mlp(), optimizer=onnx_optax.adam(0.01, beta=0.95))
    session = training.Session(model)
    session.step(data())
    imported = interop.from_model(session.to_model())
    assert imported.T == 2
    assert sorted(imported.params) == sorted(_params())
    np.testing.assert_array_equal(imported.params["W1"], session.initializers["W1"])
    assert imported.transformation.hyperparameters.beta == pytest.approx(0.95)


def test_a_model_made_by_interop_to_model_trains() -> None:
    tx = onnx_optax.adagrad(0.1)
    params = {"w": jnp.ones(3)}
    model = interop.to_model(tx, params, tx.init(params))
    session = training.Session(model)
    g = np.array([1.0, 2.0, 3.0], np.float32)
    session.step({"w.grad": g})
    updates, _ = tx.update({"w": jnp.asarray(g)}, tx.init(params), params)
    np.testing.assert_allclose(session.initializers["w"], 1.0 + updates["w"], rtol=1e-6)
    assert session.initializers["T"] == 1


def test_entries_run_in_sequence_and_initialization_runs() -> None:
    model = training.attach(mlp(), optimizer=onnx_optax.adam(0.01))
    # A second entry counting steps, initialized to 10 by its initialization graph.
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(0, np.int64), "steps"))
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(3, np.float32), "seen"))
    one = numpy_helper.from_array(np.asarray(1, np.int64), "one")
    algorithm = helper.make_graph(
        [
            helper.make_node("Add", ["steps", "one"], ["steps.new"]),
            helper.make_node("Identity", ["b2"], ["b2.copy"]),
        ],
        "count",
        [],
        [
            helper.make_tensor_value_info("steps.new", TensorProto.INT64, []),
            helper.make_tensor_value_info("b2.copy", F32, [3]),
        ],
        initializer=[one],
    )
    ten = numpy_helper.from_array(np.asarray(10, np.int64), "ten")
    init = helper.make_graph(
        [helper.make_node("Identity", ["ten"], ["start"])],
        "init",
        [],
        [helper.make_tensor_value_info("start", TensorProto.INT64, [])],
        initializer=[ten],
    )
    model.training_info.append(
        helper.make_training_info(
            algorithm, [("steps", "steps.new"), ("seen", "b2.copy")], init, [("steps", "start")]
        )
    )
    assert training.check(model) == []
    session = training.Session(model)
    session.initialize()
    assert session.initializers["steps"] == 10
    session.step(data())
    session.step(data(seed=2))
    assert session.initializers["steps"] == 12
    # The second entry sees the first entry's update of the same step.
    np.testing.assert_array_equal(session.initializers["seen"], session.initializers["b2"])


def test_load_refuses_external_data_outside_the_folder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = mlp()
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "../secret.bin"
    (tmp_path / "secret.bin").write_bytes(b"\0" * 128)
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save(model, str(folder / "m.onnx"))
    with pytest.raises(ValueError, match=r"leaves the model's folder"):
        training.load(folder / "m.onnx")


# ----------------------------------------------------------------------------- bad input


def _attached() -> onnx.ModelProto:
    return training.attach(mlp(), optimizer=onnx_optax.adam(0.01))


def _bind(
    model: onnx.ModelProto, key: str, value: str | None, *, new_key: str | None = None
) -> None:
    """Changes (value None: removes) update_binding[key] of the first entry."""
    binding = model.training_info[0].update_binding
    for i, entry in enumerate(binding):
        if entry.key == key:
            if value is None:
                del binding[i]
            else:
                entry.value = value
                entry.key = new_key or key
            return
    raise KeyError(key)


def _problems(model: onnx.ModelProto, pattern: str) -> None:
    problems = training.check(model)
    assert any(__import__("re").search(pattern, p) for p in problems), problems
    with pytest.raises(training.TrainingModelError, match=pattern):
        training.Session(model)


def test_bad_binding_key_not_an_initializer() -> None:
    model = _attached()
    _bind(model, "W1", "W1.new", new_key="W9")
    _problems(
        model, r"training_info\[0\]: update_binding\['W9'\] = 'W1.new': 'W9' is not an initializer"
    )


def test_bad_binding_value_not_an_output() -> None:
    model = _attached()
    _bind(model, "W1", "nothing")
    _problems(
        model, r"update_binding\['W1'\] = 'nothing': 'nothing' is not an output of the algorithm"
    )


def test_bad_binding_key_bound_twice() -> None:
    model = _attached()
    model.training_info[0].update_binding.add(key="b1", value="b1.new")
    _problems(model, r"update_binding\['b1'\] = 'b1.new': 'b1' is bound twice")


def test_bad_binding_shape_or_dtype() -> None:
    model = _attached()
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(5, np.float32), "other"))
    model.training_info[0].update_binding.add(key="other", value="b1.new")
    _problems(
        model,
        r"update_binding\['other'\] = 'b1.new': the value is float32\[8\] but the initializer is float32\[5\]",
    )
    model = _attached()
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(8, np.int32), "ints"))
    model.training_info[0].update_binding.add(key="ints", value="b1.new")
    _problems(
        model,
        r"update_binding\['ints'\] = 'b1.new': the value is float32\[8\] but the initializer is int32\[8\]",
    )


def test_bad_initialization_graph_with_inputs() -> None:
    model = _attached()
    init = model.training_info[0].initialization
    init.input.append(helper.make_tensor_value_info("seed", F32, []))
    _problems(model, r"training_info\[0\]: the initialization graph has inputs \['seed'\]")


def _gradient(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in model.training_info[0].algorithm.node if n.op_type == "Gradient")


def test_bad_gradient_xs() -> None:
    model = _attached()
    node = _gradient(model)
    xs = next(a for a in node.attribute if a.name == "xs")
    xs.strings[0] = b"h"  # a node output, not an initializer or input
    _problems(
        model,
        r"node 'gradient' \(ai.onnx.preview.training.Gradient\): xs \['h'\] are not initializers or inputs",
    )


def test_bad_gradient_y() -> None:
    model = _attached()
    y = next(a for a in _gradient(model).attribute if a.name == "y")
    y.s = b"nowhere"
    _problems(model, r"Gradient\): y 'nowhere' names no tensor")


def test_bad_optimizer_state_not_bound() -> None:
    model = _attached()
    _bind(model, "W1.v", None)
    _problems(
        model,
        r"update_binding\['W1.v'\] should be 'W1.v.new' \(the node 'adam' .*new V of 'W1'\), but it is missing",
    )


def test_bad_T_not_bound_to_T_plus_one() -> None:
    model = _attached()
    _bind(model, "T", "loss")
    _problems(model, r"update_binding\['T'\] = 'loss' is not T \+ 1")
    model = _attached()
    _bind(model, "T", None)
    _problems(
        model,
        r"T \('T'\) of node 'adam' .* is stored as an initializer but update_binding does not update it",
    )


def test_bad_loss_and_output() -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown loss 'hinge'; attach knows softmax_cross_entropy, log_loss, nll, mse",
    ):
        training.attach(mlp(), loss="hinge", optimizer=onnx_optax.adam(0.1))
    with pytest.raises(ValueError, match=r"output 'probs' is not a graph output"):
        training.attach(mlp(), output="probs", optimizer=onnx_optax.adam(0.1))
    with pytest.raises(ValueError, match=r"target 'x' is already a tensor name"):
        training.attach(mlp(), target="x", optimizer=onnx_optax.adam(0.1))
    with pytest.raises(TypeError, match=r"wrappers such as optax.chain"):
        training.attach(mlp(), optimizer=optax.chain(onnx_optax.adam(0.1)))


def _unchanged_after(
    session: training.Session, feeds: dict[str, np.ndarray], error: type, pattern: str
) -> None:
    before = session.initializers
    with pytest.raises(error, match=pattern):
        session.step(feeds)
    for name, value in session.initializers.items():
        np.testing.assert_array_equal(value, before[name])
    session.step(data())  # still usable


def test_bad_feeds_leave_the_initializers_unchanged() -> None:
    session = training.Session(_attached())
    session.step(data())
    batch = data()
    _unchanged_after(
        session, {"x": batch["x"]}, ValueError, r"training_info\[0\]: missing feed 'target'"
    )
    _unchanged_after(
        session,
        {**batch, "x": batch["x"].astype(np.int32)},
        TypeError,
        r"feed 'x' has dtype int32; the graph declares float32",
    )
    _unchanged_after(
        session,
        {**batch, "x": batch["x"][:, :3]},
        ValueError,
        r"feed 'x' has shape \[16, 3\]; the graph declares \['N', 4\]",
    )
    _unchanged_after(
        session,
        {**batch, "target": batch["target"][:5]},
        ValueError,
        r"feed 'target' has shape \[5\]; the graph declares \['N'\] with \{'N': 16\}",
    )
    _unchanged_after(
        session,
        {**batch, "target": batch["target"][:, None]},
        ValueError,
        r"feed 'target' has shape \[16, 1\]",
    )


def test_a_model_from_a_real_exporter_trains_and_runs_in_onnxruntime() -> None:
    """skl2onnx's MLPClassifier: attached, checked, trained, written back, run by onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    skl2onnx = pytest.importorskip("skl2onnx")
    import warnings

    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    X, y = load_digits(return_X_y=True)
    X = (X / 16).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MLPClassifier(hidden_layer_sizes=(16,), max_iter=3, random_state=0).fit(X, y)
    exported = skl2onnx.to_onnx(clf, X[:1], options={"zipmap": False}, target_opset=18)
    model = training.attach(
        exported,
        loss="log_loss",
        target="target",
        output="probabilities",
        optimizer=onnx_optax.adam(0.01),
    )
    onnx.checker.check_model(model, full_check=True)
    assert training.check(model) == []
    session = training.Session(model)
    losses = [
        float(
            session.step(
                {"X": X[i * 64 : (i + 1) * 64], "target": y[i * 64 : (i + 1) * 64].astype(np.int64)}
            )["loss"]
        )
        for i in range(10)
    ]
    assert losses[-1] < losses[0]
    trained = onnx.ModelProto.FromString(session.to_model().SerializeToString())
    run = ort.InferenceSession(trained.SerializeToString(), providers=["CPUExecutionProvider"])
    label, probabilities = run.run(["label", "probabilities"], {"X": X[:100]})
    ours = session.run({"X": X[:100]}, ["probabilities"])["probabilities"]
    np.testing.assert_allclose(probabilities, ours, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(label, np.argmax(ours, axis=1))
    original = ort.InferenceSession(
        exported.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    assert not np.allclose(original.run(["probabilities"], {"X": X[:100]})[0], probabilities)
