"""Mixed precision: dynamic loss scaling for float16, bfloat16 compute on float32 masters."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_optax
from onnx_optax import training
from tests.support.training_models import half_mlp as mlp

F16 = np.float16
C = 1e-3  # the output's factor: the float16 backward pass multiplies by it


def tiny_gradients(seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """y = (x @ W) * 1e-3 in float16, with mse feeds whose gradients underflow float16.

    With 1024 x 4 outputs, dL/dy = 2 (y - t) / 4096 is about 1e-6, times 1e-3 about
    1e-9: below float16's smallest subnormal (6e-8), so the backward pass gives 0.
    """
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Mul", ["h", "c"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["N", 4])],
        initializer=[
            numpy_helper.from_array(rng.normal(size=(8, 4)).astype(F16), "W"),
            numpy_helper.from_array(np.asarray(C, F16), "c"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = rng.normal(size=(1024, 8)).astype(F16)
    t = (x.astype(np.float32) @ rng.normal(size=(8, 4)).astype(np.float32) * C).astype(F16)
    return model, {"x": x, "t": t}


def float32_loss(w: np.ndarray, feeds: dict[str, np.ndarray]) -> float:
    """The mse of the model with weights ``w``, by hand in float32."""
    x, t = (feeds[n].astype(np.float32) for n in ("x", "t"))
    return float(np.mean((x @ w * np.float32(C) - t) ** 2))


def scaled(model: onnx.ModelProto, **options: object) -> onnx.ModelProto:
    return training.attach(
        model,
        loss="mse",
        target="t",
        optimizer=onnx_optax.adam(0.05),
        master_dtype="float32",
        trainable=["W"],
        **options,  # type: ignore[arg-type]
    )


def test_without_loss_scaling_the_gradients_underflow_and_nothing_trains() -> None:
    model, feeds = tiny_gradients()
    session = training.Session(scaled(model))
    before = session.initializers["W.master"]
    for _ in range(5):
        session.step(feeds)
    np.testing.assert_array_equal(session.initializers["W.master"], before)


def test_with_loss_scaling_the_loss_falls() -> None:
    model, feeds = tiny_gradients()
    attached = scaled(model, loss_scale=2.0**15)
    assert training.check(attached) == []
    session = training.Session(attached)
    before = float32_loss(session.initializers["W.master"], feeds)
    for _ in range(20):
        session.step(feeds)
    after = float32_loss(session.initializers["W.master"], feeds)
    assert after < 0.95 * before
    assert session.initializers["loss_scale"] == 2.0**15  # no overflow, no doubling yet
    assert session.initializers["loss_scale.good_steps"] == 20


def test_a_step_that_overflows_changes_nothing_but_halves_the_scale() -> None:
    model, feeds = tiny_gradients()
    # dL/dloss = S = 2**20 is inf in float16: every gradient overflows.
    session = training.Session(scaled(model, loss_scale=2.0**20))
    before = session.initializers
    session.step(feeds)
    after = session.initializers
    for name, value in before.items():
        if not name.startswith("loss_scale"):
            np.testing.assert_array_equal(after[name], value, err_msg=name)
    assert after["loss_scale"] == 2.0**19 and after["loss_scale.good_steps"] == 0
    assert after["T"] == before["T"]
    for _ in range(4):  # 2**19 .. 2**16 overflow too; 2**15 trains
        session.step(feeds)
    assert session.initializers["loss_scale"] == 2.0**15
    np.testing.assert_array_equal(session.initializers["W.master"], before["W.master"])
    session.step(feeds)
    assert not np.array_equal(session.initializers["W.master"], before["W.master"])
    assert session.initializers["T"] == before["T"] + 1


def test_the_scale_doubles_after_the_period_of_good_steps() -> None:
    model, feeds = tiny_gradients()
    session = training.Session(scaled(model, loss_scale=2.0**10, loss_scale_period=3))
    seen = []
    for _ in range(7):
        session.step(feeds)
        seen.append(
            (
                float(session.initializers["loss_scale"]),
                int(session.initializers["loss_scale.good_steps"]),
            )
        )
    assert seen == [
        (2.0**10, 1),
        (2.0**10, 2),
        (2.0**11, 0),
        (2.0**11, 1),
        (2.0**11, 2),
        (2.0**12, 0),
        (2.0**12, 1),
    ]


def test_the_scale_and_its_count_save_and_resume(tmp_path: Path) -> None:
    model, feeds = tiny_gradients()
    attached = scaled(model, loss_scale=2.0**17, loss_scale_period=2)
    straight = training.Session(attached)
    losses = [float(straight.step(feeds)["loss"]) for _ in range(8)]
    first = training.Session(attached)
    for _ in range(4):
        first.step(feeds)
    first.save(tmp_path / "m.onnx")
    resumed = training.Session(tmp_path / "m.onnx")
    assert [float(resumed.step(feeds)["loss"]) for _ in range(4)] == losses[4:]
    for name, value in straight.initializers.items():
        np.testing.assert_array_equal(resumed.initializers[name], value, err_msg=name)
    assert "loss_scale" not in {i.name for i in resumed.to_inference_model().graph.initializer}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"loss_scale": 0.5}, r"loss_scale must be in \[1, 2\*\*24\]"),
        ({"loss_scale": 2.0**30}, r"loss_scale must be in \[1, 2\*\*24\]"),
        ({"loss_scale": 8.0, "loss_scale_period": 0}, "loss_scale_period must be an integer"),
    ],
)
def test_bad_loss_scale_options_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        scaled(tiny_gradients()[0], **options)


# -- bfloat16 compute on float32 masters


def float32_mlp(seed: int = 0) -> onnx.ModelProto:
    """test_master_weights' MLP (MatMul, Add, Tanh, MatMul) in float32."""
    return mlp(seed, np.float32)


MLP_FEEDS = {
    "x": np.random.default_rng(1).normal(size=(32, 8)).astype(np.float32),
    "t": np.random.default_rng(2).normal(size=(32, 3)).astype(np.float32),
}


def mlp_session(**options: object) -> training.Session:
    model = training.attach(
        float32_mlp(),
        loss="mse",
        target="t",
        optimizer=onnx_optax.adam(0.01),
        **options,  # type: ignore[arg-type]
    )
    assert training.check(model) == []
    return training.Session(model)


def forward(w: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The MLP by hand in float64."""
    return np.tanh(x @ w["W1"] + w["b1"]) @ w["W2"]


def test_bfloat16_compute_tracks_the_float32_run_within_bfloat16_precision() -> None:
    exact = mlp_session()
    half = mlp_session(compute_dtype="bfloat16")
    for _ in range(6):
        a = float(exact.step(MLP_FEEDS)["loss"])
        b = float(half.step(MLP_FEEDS)["loss"])
        assert abs(a - b) <= 2**-7 * a  # bfloat16 keeps 8 significant bits
    for name in ("W1", "b1", "W2"):  # float32 masters: below bfloat16's resolution
        master = half.initializers[f"{name}.master"]
        assert master.dtype == np.float32
        assert np.mean(master != master.astype(ml_dtypes.bfloat16).astype(np.float32)) > 0.9


def test_bfloat16_compute_is_bfloat16_not_float32() -> None:
    session = mlp_session(compute_dtype="bfloat16")
    weights = {
        n: session.initializers[f"{n}.master"].astype(np.float64) for n in ("W1", "b1", "W2")
    }
    x = MLP_FEEDS["x"]
    y = session.run({"x": x})["y"]
    assert y.dtype == np.float32
    reference = forward(weights, x.astype(np.float64))
    error = np.max(np.abs(y - reference)) / np.max(np.abs(reference))
    assert 1e-4 < error < 3e-2  # far above float32's rounding, within bfloat16's


def test_compute_dtype_refuses_what_it_cannot_rewrite() -> None:
    with pytest.raises(ValueError, match="compute_dtype must be 'bfloat16'"):
        mlp_session(compute_dtype="float16")
    with pytest.raises(ValueError, match="leave master_dtype out"):
        mlp_session(compute_dtype="bfloat16", master_dtype="float32")
    model, _ = tiny_gradients()
    with pytest.raises(ValueError, match="takes a float32 model"):
        training.attach(
            model, loss="mse", target="t", optimizer=onnx_optax.adam(0.1), compute_dtype="bfloat16"
        )


def test_loss_scaling_trains_float16_weights_without_masters() -> None:
    model, feeds = tiny_gradients()
    attached = training.attach(
        model,
        loss="mse",
        target="t",
        optimizer=onnx_optax.adam(0.05),
        trainable=["W"],
        loss_scale=2.0**15,
    )
    session = training.Session(attached)
    before = session.initializers["W"]
    assert before.dtype == F16
    for _ in range(20):
        session.step(feeds)
    after = session.initializers["W"]
    assert float32_loss(after.astype(np.float32), feeds) < 0.95 * float32_loss(
        before.astype(np.float32), feeds
    )


def test_bfloat16_compute_keeps_what_an_op_takes_as_float32_only() -> None:
    """Resize's scales are tensor(float) only: kept float32, the data computed in bfloat16."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "w"], ["h"]),
            helper.make_node("Resize", ["h", "", "s"], ["y"]),
        ],
        "resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])],
        initializer=[
            numpy_helper.from_array(np.full((1, 1, 2, 2), 0.5, np.float32), "w"),
            numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    attached = training.attach(
        model,
        loss="mse",
        target="t",
        optimizer=onnx_optax.adam(0.1),
        compute_dtype="bfloat16",
        trainable=["w"],  # (the plan calls it preprocessing: x * w)
    )
    stored = {i.name: i.data_type for i in attached.graph.initializer}
    assert stored["s"] == TensorProto.FLOAT and stored["w.master"] == TensorProto.FLOAT
    session = training.Session(attached)
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    loss = float(session.step({"x": x, "t": np.zeros((1, 1, 4, 4), np.float32)})["loss"])
    # nearest resize of x * 0.5 (exact in bfloat16): the mean of 4 copies of each squared value
    assert loss == np.mean((x * 0.5) ** 2)
