"""attach(master_dtype="float32"): float32 master weights and state for a float16 model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import optax
import pytest
from onnx import numpy_helper

import onnx_optax
from onnx_optax import training
from tests.support.training_models import half_mlp as mlp

F16 = np.float16


def batches(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [
        {
            "x": rng.normal(size=(32, 8)).astype(F16),
            "target": rng.normal(size=(32, 3)).astype(F16),
        }
        for _ in range(count)
    ]


def by_hand(
    model: onnx.ModelProto, steps: list[dict[str, np.ndarray]], rate: float
) -> tuple[dict[str, np.ndarray], list[float]]:
    """The same training in JAX: float32 masters, a float16 forward pass, Adam in float32."""
    params = {
        i.name: jnp.asarray(numpy_helper.to_array(i).astype(np.float32))
        for i in model.graph.initializer
    }

    def loss(masters: dict[str, jax.Array], x: jax.Array, t: jax.Array) -> jax.Array:
        w = {n: v.astype(jnp.float16) for n, v in masters.items()}
        y = jnp.tanh(x @ w["W1"] + w["b1"][None, :]) @ w["W2"]
        return jnp.mean(jnp.square(y - t))

    tx = onnx_optax.adam(rate)
    state = tx.init(params)
    losses = []
    for feeds in steps:
        value, grads = jax.value_and_grad(loss)(params, feeds["x"], feeds["target"])
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        losses.append(float(value))
    return {n: np.asarray(v) for n, v in params.items()}, losses


def test_float16_weights_train_on_float32_masters_as_written_by_hand() -> None:
    # A learning rate below float16's resolution at the weights (2**-12 near 0.3): a float16
    # weight stepped in float16 would not move; its float32 master does.
    rate, steps = 1e-4, batches(6)
    model = mlp()
    attached = training.attach(
        model,
        loss="mse",
        optimizer=onnx_optax.adam(rate, accumulator_dtype=jnp.float32),
        master_dtype="float32",
    )
    onnx.checker.check_model(attached, full_check=True)
    assert training.check(attached) == []
    session = training.Session(attached)
    losses = [float(session.step(feeds)["loss"]) for feeds in steps]
    want, want_losses = by_hand(model, steps, rate)
    got = session.initializers
    assert {n: got[n].dtype for n in got if n.endswith((".master", ".v", ".h"))} == {
        f"{n}.master{s}": np.float32 for n in ("W1", "b1", "W2") for s in ("", ".v", ".h")
    }
    for name, value in want.items():
        np.testing.assert_allclose(got[f"{name}.master"], value, rtol=0, atol=2e-6)
        assert not np.array_equal(got[f"{name}.master"].astype(F16), model_value(model, name))
    np.testing.assert_allclose(losses, want_losses, rtol=2e-3)


def model_value(model: onnx.ModelProto, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == name)


def test_the_inference_model_gets_float16_weights_and_runs_in_onnxruntime() -> None:
    onnxruntime = pytest.importorskip("onnxruntime")
    attached = training.attach(
        mlp(), loss="mse", optimizer=onnx_optax.adam(0.01), master_dtype="float32"
    )
    session = training.Session(attached)
    for feeds in batches(3):
        session.step(feeds)
    inference = session.to_inference_model()
    onnx.checker.check_model(inference, full_check=True)
    stored = {i.name: numpy_helper.to_array(i) for i in inference.graph.initializer}
    masters = session.initializers
    assert sorted(stored) == ["W1", "W2", "b1"]
    assert [n.op_type for n in inference.graph.node] == ["MatMul", "Add", "Tanh", "MatMul"]
    for name, value in stored.items():
        assert value.dtype == F16
        np.testing.assert_array_equal(value, masters[f"{name}.master"].astype(F16))
    x = batches(1)[0]["x"]
    ours = np.asarray(session.run({"x": x})["y"])
    ort = onnxruntime.InferenceSession(
        inference.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (theirs,) = ort.run(None, {"x": x})
    assert theirs.dtype == ours.dtype == F16
    np.testing.assert_allclose(theirs.astype(np.float32), ours.astype(np.float32), atol=4e-3)


def test_master_weights_resume_bit_identically(tmp_path: object) -> None:
    attached = training.attach(
        mlp(), loss="mse", optimizer=onnx_optax.adam(0.01), master_dtype="float32"
    )
    session = training.Session(attached)
    steps = batches(4)
    for feeds in steps[:2]:
        session.step(feeds)
    resumed = training.Session(session.to_model())
    for feeds in steps[2:]:
        np.testing.assert_array_equal(session.step(feeds)["loss"], resumed.step(feeds)["loss"])
    for name, value in session.initializers.items():
        np.testing.assert_array_equal(resumed.initializers[name], value)


@pytest.mark.parametrize("dtype", ["float16", "int32", "bfloat16"])
def test_master_dtype_must_be_float32_or_float64(dtype: str) -> None:
    with pytest.raises(ValueError, match="float32 or float64"):
        training.attach(mlp(), loss="mse", optimizer=onnx_optax.adam(0.01), master_dtype=dtype)


def test_master_weights_of_float32_weights_are_refused() -> None:
    model = mlp()
    for init in model.graph.initializer:
        init.CopyFrom(
            numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float32), init.name)
        )
    with pytest.raises(ValueError, match="wider copy of 16-bit weights"):
        training.attach(model, loss="mse", optimizer=onnx_optax.adam(0.01), master_dtype="float32")


def test_without_master_dtype_a_float32_accumulator_is_refused_and_says_what_to_do() -> None:
    with pytest.raises(ValueError, match="master_dtype='float32'"):
        training.attach(
            mlp(), loss="mse", optimizer=onnx_optax.adam(0.01, accumulator_dtype=jnp.float32)
        )


def test_the_callers_model_is_unchanged() -> None:
    model = mlp()
    before = model.SerializeToString()
    training.attach(model, loss="mse", optimizer=onnx_optax.adam(0.01), master_dtype="float32")
    assert model.SerializeToString() == before
