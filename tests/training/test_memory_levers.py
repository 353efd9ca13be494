"""Session's memory levers: gradients accumulated over micro-batches."""

from __future__ import annotations

import jax
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_optax
from onnx_optax import training
from tests.support.training_models import deep
from tests.support.training_models import deep_batch as batch


def temporaries(session: training.Session, inputs: dict[str, np.ndarray]) -> int:
    """The compiled step's temporary bytes, from XLA's memory analysis."""
    arguments = (session._state, session._checked_feeds(inputs), session._constants)
    analysis = session._step.lower(*arguments).compile().memory_analysis()
    return int(analysis.temp_size_in_bytes)


def assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], rtol: float) -> None:
    """Same names and dtypes; each float array within ``rtol`` of the reference in norm
    (Adam divides by sqrt(H): an element whose gradient is near 0 amplifies rounding)."""
    assert list(got) == list(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        if value.dtype.kind == "f":
            error = np.linalg.norm(got[name] - value) / max(np.linalg.norm(value), 1e-30)
            assert error <= rtol, (name, error)
        else:
            np.testing.assert_array_equal(got[name], value, err_msg=name)


# ----------------------------------------------------------------------------- micro-batches


def test_micro_batches_train_as_the_whole_batch(dtype: str) -> None:
    # The reference: the same batches in one piece. A mean loss's gradient is the mean of
    # the parts' gradients, so losses, weights and Adam's V and H agree to rounding.
    model = training.attach(deep(dtype), optimizer=onnx_optax.adam(0.05))
    whole = training.Session(model)
    parted = training.Session(model, micro_batches=4)
    rtol = 1e-5 if dtype == "float32" else 1e-12
    for step in range(4):
        inputs = batch(step, 16, dtype)
        assert_close(parted.step(inputs), whole.step(inputs), rtol)
        assert_close(parted.evaluate(inputs), whole.evaluate(inputs), rtol)
    assert_close(parted.initializers, whole.initializers, rtol)
    # Training moved the weights: the comparison is not of two unchanged models.
    assert not np.allclose(
        parted.initializers["W0"], numpy_helper.to_array(model.graph.initializer[0])
    )


def test_micro_batches_of_a_summed_loss_train_on_the_mean_of_the_parts() -> None:
    # A loss summed over the rows: each part's gradient is of its own sum, and the step
    # applies their mean, which is 1/k of the whole batch's sum. SGD shows it: with the
    # learning rate times k, the parts take the whole batch's step.
    dtype = "float64"
    with jax.enable_x64(True):
        prediction = helper.make_tensor_value_info("p", TensorProto.DOUBLE, None)
        target = helper.make_tensor_value_info("t", TensorProto.DOUBLE, None)
        loss = helper.make_graph(
            [
                helper.make_node("Sub", ["p", "t"], ["d"]),
                helper.make_node("Mul", ["d", "d"], ["s"]),
                helper.make_node("ReduceSum", ["s"], ["l"], keepdims=0),
            ],
            "sum",
            [prediction, target],
            [helper.make_tensor_value_info("l", TensorProto.DOUBLE, [])],
        )
        inputs = batch(0, 8, dtype)
        inputs["target"] = np.random.default_rng(1).normal(size=(8, 3))

        def trained(rate: float, parts: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
            model = training.attach(
                deep(dtype),
                loss=loss,
                optimizer=onnx_optax.momentum(rate, alpha=0.0, beta=1.0, norm_coefficient=0.0),
            )
            session = training.Session(model, micro_batches=parts)
            return session.step(inputs), session.initializers

        whole_loss, whole = trained(0.01, 1)
        parts_loss, parts = trained(0.04, 4)
        np.testing.assert_allclose(parts_loss["loss"] * 4, whole_loss["loss"], rtol=1e-12)
        # Momentum's V is the gradient applied (alpha 0, beta 1): a quarter of the sum's.
        velocities = [n for n in whole if n.endswith(".v")]
        assert velocities
        for name in velocities:
            parts[name] = parts[name] * 4
        assert_close(parts, whole, 1e-12)


def test_micro_batches_split_over_devices_too() -> None:
    # One CPU device here: the layout's code path (a mesh of one) with micro-batches.
    model = training.attach(deep(), optimizer=onnx_optax.adam(0.05))
    whole = training.Session(model)
    parted = training.Session(model, devices=jax.devices()[:1], micro_batches=4)
    for step in range(2):
        inputs = batch(step, 16)
        assert_close(parted.step(inputs), whole.step(inputs), 1e-5)
    assert_close(parted.initializers, whole.initializers, 1e-5)


def test_micro_batches_lower_the_temporaries() -> None:
    # What the option is for: the activations held for the backward pass are one
    # part's. XLA's own accounting of the compiled step, not a timing.
    model = training.attach(deep(width=256, depth=4, inputs=64), optimizer=onnx_optax.adam(0.01))
    inputs = batch(0, 1024, inputs=64)
    sizes = {k: temporaries(training.Session(model, micro_batches=k), inputs) for k in (1, 4, 16)}
    # The floor is what does not scale with the batch: the gradients' sums, Adam's work.
    assert sizes[4] < 0.6 * sizes[1], sizes
    assert sizes[16] < 0.8 * sizes[4], sizes


def test_micro_batches_refuse_a_batch_they_do_not_divide() -> None:
    session = training.Session(
        training.attach(deep(), optimizer=onnx_optax.adam(0.01)), micro_batches=3
    )
    before = session.initializers
    with pytest.raises(ValueError, match="micro-batches"):
        session.step(batch(0, 16))
    for name, value in before.items():
        np.testing.assert_array_equal(session.initializers[name], value)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_micro_batches_must_be_a_positive_integer(bad: object) -> None:
    with pytest.raises(ValueError, match="micro_batches"):
        training.Session(
            training.attach(deep(), optimizer=onnx_optax.adam(0.01)), micro_batches=bad
        )  # type: ignore[arg-type]


def test_micro_batches_check_labels_in_every_part() -> None:
    # A label outside the classes is refused before the step, whichever part it is in.
    session = training.Session(
        training.attach(deep(), optimizer=onnx_optax.adam(0.01)), micro_batches=4
    )
    inputs = batch(0, 16)
    inputs["target"][13] = 7
    with pytest.raises(ValueError, match="label 7"):
        session.step(inputs)


# ----------------------------------------------------------------------------- remat


def test_remat_trains_as_the_default() -> None:
    # The reference: the same model without remat. The same ops on the same values.
    model = training.attach(deep(depth=6), optimizer=onnx_optax.adam(0.05))
    default = training.Session(model)
    remat = training.Session(model, remat=True)
    for step in range(3):
        inputs = batch(step, 16)
        assert_close(remat.step(inputs), default.step(inputs), 1e-6)
    assert_close(remat.initializers, default.initializers, 1e-6)


def test_remat_recomputes_the_forward_pass_in_the_backward() -> None:
    # The step's program runs each Tanh more often (a trace without the segments would
    # pass the test above by doing nothing): 6 layers, each Tanh traced once by default
    # (the Gradient's forward gives the loss reported too), three times under remat (the
    # loss reported apart, the Gradient's forward, its segments' recomputation).
    def tanhs(remat: bool) -> int:
        model = training.attach(deep(depth=6), optimizer=onnx_optax.adam(0.05))
        session = training.Session(model, remat=remat)
        arguments = (session._state, session._checked_feeds(batch(0, 16)), session._constants)
        return str(jax.make_jaxpr(session._step_all)(*arguments)).count(" tanh ")

    assert (tanhs(False), tanhs(True)) == (6, 18)


def test_remat_lowers_the_temporaries() -> None:
    # A deep MLP: without remat the backward pass keeps every layer's activations.
    model = training.attach(deep(width=256, depth=16, inputs=64), optimizer=onnx_optax.adam(0.01))
    inputs = batch(0, 512, inputs=64)
    default = temporaries(training.Session(model), inputs)
    remat = temporaries(training.Session(model, remat=True), inputs)
    assert remat < 0.6 * default, (remat, default)


def test_remat_with_micro_batches_trains_as_the_whole_batch() -> None:
    model = training.attach(deep(depth=6), optimizer=onnx_optax.adam(0.05))
    whole = training.Session(model)
    both = training.Session(model, remat=True, micro_batches=4)
    for step in range(2):
        inputs = batch(step, 16)
        assert_close(both.step(inputs), whole.step(inputs), 1e-5)
    assert_close(both.initializers, whole.initializers, 1e-5)


def test_remat_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="remat"):
        training.Session(training.attach(deep(), optimizer=onnx_optax.adam(0.01)), remat=1)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- 16-bit models


def half(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array((rng.normal(size=(8, 3)) / 3).astype(np.float16), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["logits"])],
        "half",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["N", 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT16, ["N", 3])],
        initializer=[weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_float16_model_trains_with_float16_state_over_micro_batches() -> None:
    # The state stays in the parameters' dtype (the ONNX node's type constraint); the
    # micro-batches' gradient sums are float32 inside the step, not stored.
    session = training.Session(
        training.attach(half(), optimizer=onnx_optax.adam(0.05)), micro_batches=4
    )
    rng = np.random.default_rng(1)
    inputs = {
        "x": rng.normal(size=(16, 8)).astype(np.float16),
        "target": rng.integers(0, 3, size=16).astype(np.int64),
    }
    losses = [float(session.step(inputs)["loss"]) for _ in range(20)]
    assert losses[-1] < 0.8 * losses[0], losses
    dtypes = {n: v.dtype for n, v in session.initializers.items()}
    assert dtypes == {
        "W": np.float16,
        "T": np.int64,
        "R.scale": np.float16,
        "W.v": np.float16,
        "W.h": np.float16,
    }


def test_attach_refuses_a_state_dtype_other_than_the_parameters() -> None:
    # adam(accumulator_dtype=float32) on a float16 model: the state was cast to float16
    # without a word before; the ONNX Adam node cannot hold it in float32.
    with pytest.raises(ValueError, match="accumulator_dtype"):
        training.attach(
            half(), optimizer=onnx_optax.adam(0.05, accumulator_dtype=jax.numpy.float32)
        )
