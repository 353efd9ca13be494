"""Dropout in training mode: seeded masks, their statistics, and Session(seed=) resuming."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_optax
from onnx_optax import backend, training
from onnx_optax._src import random_keys
from onnx_optax._src.graph import GraphFunction


def dropout_model(ratio: float | None, seed: int | None = 3, n: int = 40000) -> onnx.ModelProto:
    """x[n] -> Dropout(x, ratio, training_mode=True) -> (y, mask)."""
    attrs = {} if seed is None else {"seed": seed}
    inits = [numpy_helper.from_array(np.asarray(True), "t")]
    constant = helper.make_node(
        "Constant", [], ["r"], value=numpy_helper.from_array(np.asarray(ratio or 0, np.float32))
    )
    node = helper.make_node(
        "Dropout", ["x", "r" if ratio is not None else "", "t"], ["y", "m"], name="drop", **attrs
    )
    graph = helper.make_graph(
        [constant, node],
        "dropout",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [n]),
            helper.make_tensor_value_info("m", TensorProto.BOOL, [n]),
        ],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def within_binomial(kept: int, n: int, p: float) -> bool:
    """Whether ``kept`` of ``n`` draws is within 5 standard deviations of n * p."""
    return abs(kept - n * p) <= 5 * np.sqrt(n * p * (1 - p))


X = np.random.default_rng(0).normal(size=40000).astype(np.float32)


@pytest.mark.parametrize("ratio", [0.3, None, 0.9])
def test_mask_keeps_a_binomial_fraction_and_scales_by_one_over_one_minus_ratio(
    ratio: float | None,
) -> None:
    y, mask = backend.prepare(dropout_model(ratio)).run([X])
    p = 1 - (0.5 if ratio is None else ratio)
    assert mask.dtype == np.bool_
    assert within_binomial(int(mask.sum()), X.size, p)
    np.testing.assert_allclose(y[mask], X[mask] / np.float32(p), rtol=1e-6)
    assert np.all(y[~mask] == 0)


def test_the_seed_attribute_decides_the_mask() -> None:
    first = backend.prepare(dropout_model(0.5, seed=3)).run([X])[1]
    again = backend.prepare(dropout_model(0.5, seed=3)).run([X])[1]
    other = backend.prepare(dropout_model(0.5, seed=4)).run([X])[1]
    np.testing.assert_array_equal(first, again)
    assert within_binomial(int((first != other).sum()), X.size, 0.5)  # independent masks


def test_ratio_zero_is_the_identity() -> None:
    y, mask = backend.prepare(dropout_model(0.0, seed=None)).run([X])
    np.testing.assert_array_equal(y, X)
    assert mask.all()


def fed_ratio_model() -> onnx.ModelProto:
    """x[8], r (fed) -> Dropout(x, r, training_mode=True, seed=0) -> y."""
    graph = helper.make_graph(
        [helper.make_node("Dropout", ["x", "r", "t"], ["y"], seed=0)],
        "fed",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [8]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
        initializer=[numpy_helper.from_array(np.asarray(True), "t")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_a_fed_ratio_of_zero_keeps_all_and_of_one_drops_all_with_finite_gradients() -> None:
    function = GraphFunction(fed_ratio_model().graph)

    @jax.jit  # r traced: known only when the graph runs
    def total(x: jax.Array, r: jax.Array) -> tuple[jax.Array, jax.Array]:
        return function.apply({"x": x, "r": r})[0].sum(), function.apply({"x": x, "r": r})[0]

    x = X[:8]
    for ratio, expected in ((0.0, x), (1.0, np.zeros_like(x))):
        r = np.float32(ratio)
        np.testing.assert_array_equal(np.asarray(total(x, r)[1]), expected)
        grad = jax.grad(lambda v, r=r: total(v, r)[0])(x)
        np.testing.assert_array_equal(np.asarray(grad), np.full(8, 1 - ratio, np.float32))


def test_training_mode_without_a_seed_is_refused_naming_the_node() -> None:
    with pytest.raises(ValueError, match=r"node 'drop'.*no seed attribute"):
        backend.prepare(dropout_model(0.5, seed=None)).run([X])


def test_a_ratio_of_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"node 'drop'.*ratio must be in \[0, 1\)"):
        backend.prepare(dropout_model(1.0)).run([X])


def test_the_gradient_is_zero_where_dropped_and_the_scale_where_kept() -> None:
    function = GraphFunction(dropout_model(0.25, n=1000).graph)
    x = X[:1000]

    def total(value: jax.Array) -> jax.Array:
        return function.apply({"x": value})[0].sum()

    grad = np.asarray(jax.grad(total)(x))
    mask = np.asarray(function.apply({"x": x})[1])
    expected = np.where(mask, np.float32(1 / np.float32(0.75)), np.float32(0))
    np.testing.assert_allclose(grad, expected, rtol=1e-6)
    assert 0 < mask.sum() < mask.size


# -- in a training Session


def net(dropout_ratio: float = 0.5) -> onnx.ModelProto:
    """y = Dropout(w) (w[64], trained) broadcast to the batch: y[N, 64] = x * Dropout(w)."""
    w = np.random.default_rng(1).normal(size=64).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Dropout", ["w", "ratio"], ["d"], name="drop"),
            helper.make_node("Mul", ["x", "d"], ["y"]),
        ],
        "net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])],
        initializer=[
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.asarray(dropout_ratio, np.float32), "ratio"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def attached(rate: float = 0.01) -> onnx.ModelProto:
    return training.attach(
        net(), loss="mse", target="t", optimizer=onnx_optax.adam(rate), dropout=True
    )


FEEDS = {"x": np.ones((4, 64), np.float32), "t": np.full((4, 64), 0.5, np.float32)}


def test_a_step_trains_only_what_the_mask_kept_and_reports_that_loss() -> None:
    session = training.Session(attached(), seed=7)
    w = session.initializers["w"]
    loss = float(session.step(FEEDS)["loss"])
    kept = session.initializers["w"] != w  # Adam moves exactly the nonzero gradients
    assert within_binomial(int(kept.sum()), 64, 0.5)
    y = np.where(kept, w * np.float32(2), np.float32(0))  # x is 1
    np.testing.assert_allclose(loss, np.mean((y - 0.5) ** 2), rtol=1e-6)


def test_masks_change_with_T_and_evaluate_draws_the_next_steps() -> None:
    session = training.Session(attached(rate=0.0), seed=7)  # the weights stay
    losses = []
    for _ in range(3):
        expected = float(session.evaluate(FEEDS)["loss"])
        losses.append(float(session.step(FEEDS)["loss"]))
        assert losses[-1] == expected
    assert len(set(losses)) == 3


def test_a_resumed_session_draws_the_masks_of_an_uninterrupted_one(tmp_path: Path) -> None:
    straight = training.Session(attached(), seed=11)
    losses = [float(straight.step(FEEDS)["loss"]) for _ in range(6)]
    first = training.Session(attached(), seed=11)
    for _ in range(3):
        first.step(FEEDS)
    first.save(tmp_path / "m.onnx")
    resumed = training.Session(tmp_path / "m.onnx", seed=11)
    assert [float(resumed.step(FEEDS)["loss"]) for _ in range(3)] == losses[3:]
    for name, value in straight.initializers.items():
        np.testing.assert_array_equal(resumed.initializers[name], value)


def test_another_seed_draws_other_masks() -> None:
    a = training.Session(attached(), seed=1)
    b = training.Session(attached(), seed=2)
    a.step(FEEDS)
    b.step(FEEDS)
    assert not np.array_equal(a.initializers["w"], b.initializers["w"])


def test_without_a_seed_the_step_is_refused_naming_the_node() -> None:
    with pytest.raises(ValueError, match=r"node 'drop'.*Session\(model, seed=0\)"):
        training.Session(attached()).step(FEEDS)


def test_a_bad_seed_is_refused() -> None:
    with pytest.raises(TypeError, match="seed must be an integer"):
        training.Session(attached(), seed=1.5)  # type: ignore[arg-type]


def test_inference_keeps_every_element(tmp_path: Path) -> None:
    session = training.Session(attached(), seed=3)
    session.step(FEEDS)
    w = session.initializers["w"]
    x = np.random.default_rng(2).normal(size=(4, 64)).astype(np.float32)
    np.testing.assert_array_equal(session.run({"x": x})["y"], x * w)
    model = session.to_inference_model()
    ours = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(ours.run(None, {"x": x})[0], x * w, rtol=1e-6)


def test_without_dropout_attach_leaves_dropout_in_inference_mode() -> None:
    model = training.attach(net(), loss="mse", target="t", optimizer=onnx_optax.adam(0.01))
    session = training.Session(model)  # no seed needed: nothing is drawn
    w = session.initializers["w"]
    session.step(FEEDS)
    assert np.all(session.initializers["w"] != w)


def test_dropout_needs_opset_12() -> None:
    model = net()
    model.opset_import[0].version = 11
    del model.graph.node[0].input[1:]
    with pytest.raises(ValueError, match=r"opset 11.*training_mode"):
        training.attach(model, loss="mse", target="t", optimizer=onnx_optax.adam(0.1), dropout=True)


def test_two_unnamed_dropout_nodes_of_one_input_draw_independent_masks() -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Dropout", ["x", "", "t"], ["a", "ma"]),
            helper.make_node("Dropout", ["x", "", "t"], ["b", "mb"]),
        ],
        "twins",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4000])],
        [helper.make_tensor_value_info(n, TensorProto.BOOL, [4000]) for n in ("ma", "mb")],
        initializer=[numpy_helper.from_array(np.asarray(True), "t")],
    )
    with random_keys.step_key(jax.random.key(0), "the test"):  # (its shapes are traced too)
        function = GraphFunction(graph)
        first, second = (np.asarray(m) for m in function.apply({"x": X[:4000]}))
    assert within_binomial(int((first != second).sum()), 4000, 0.5)


def exported_in_training_mode() -> onnx.ModelProto:
    """``net`` as an exporter writes it in training mode: training_mode a stored True."""
    model = net()
    model.graph.node[0].input.append("training")
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(True), "training"))
    return model


def test_an_exporters_training_mode_trains_with_masks_and_infers_without() -> None:
    model = training.attach(
        exported_in_training_mode(), loss="mse", target="t", optimizer=onnx_optax.adam(0.01)
    )
    session = training.Session(model, seed=7)
    w = session.initializers["w"]
    session.step(FEEDS)
    assert within_binomial(int((session.initializers["w"] != w).sum()), 64, 0.5)
    x = np.ones((2, 64), np.float32)
    np.testing.assert_array_equal(session.run({"x": x})["y"], x * session.initializers["w"])
    inference = session.to_inference_model()
    assert not numpy_helper.to_array(
        next(i for i in inference.graph.initializer if i.name == "training")
    )


def test_dropout_true_refuses_a_fed_training_mode() -> None:
    model = net()
    model.graph.node[0].input.append("mode")
    model.graph.input.append(helper.make_tensor_value_info("mode", TensorProto.BOOL, []))
    with pytest.raises(ValueError, match=r"node 'drop'.*reads training_mode from 'mode'"):
        training.attach(model, loss="mse", target="t", optimizer=onnx_optax.adam(0.1), dropout=True)
