"""training.Session: evaluate, the inference model, save with external data, several devices."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import onnx_optax

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import training  # noqa: E402
from onnx_optax._src.onnx_nodes import DOMAIN  # noqa: E402
from onnx_optax.training import _export  # noqa: E402
from tests.support.builders import assert_same  # noqa: E402
from tests.support.training_models import session_data as data  # noqa: E402
from tests.support.training_models import session_mlp as mlp  # noqa: E402
from tests.support.training_models import trainable, trained  # noqa: E402

F32 = TensorProto.FLOAT
PARAMS = ("W1", "b1", "W2", "b2")


# ----------------------------------------------------------------------------- evaluate


def test_evaluate_is_the_loss_of_the_current_weights_and_changes_nothing() -> None:
    session = trained(3)
    before = session.initializers
    batch = data(7)
    out = session.evaluate(batch)
    assert_same(before, session.initializers)
    assert sorted(out) == ["loss"]
    p = {n: jnp.asarray(before[n]) for n in PARAMS}
    logits = jax.nn.relu(batch["x"] @ p["W1"] + p["b1"][None, :]) @ p["W2"] + p["b2"][None, :]
    logp = jax.nn.log_softmax(logits, axis=1)
    by_hand = -jnp.mean(jnp.take_along_axis(logp, batch["target"][:, None].astype(np.int32), 1))
    np.testing.assert_allclose(out["loss"], by_hand, rtol=1e-6)
    # A step reports the loss before its update: the same number.
    np.testing.assert_allclose(session.step(batch)["loss"], out["loss"], rtol=1e-6)
    assert not np.array_equal(session.initializers["W1"], before["W1"])


def test_evaluate_checks_its_feeds_like_step() -> None:
    session = trained(1)
    before = session.initializers
    with pytest.raises(ValueError, match=r"training_info\[0\]: missing feed 'target'"):
        session.evaluate({"x": data(0)["x"]})
    with pytest.raises(ValueError, match=r"feed 'x' has shape \[16, 5\]; the graph declares"):
        session.evaluate({**data(0), "x": np.zeros((16, 5), np.float32)})
    assert_same(before, session.initializers)


# ----------------------------------------------------------------------------- inference model


def test_inference_model_matches_the_session_in_onnxruntime(
    capfd: pytest.CaptureFixture[str],
) -> None:
    ort = pytest.importorskip("onnxruntime")
    session = trained(4)
    model = session.to_inference_model()
    onnx.checker.check_model(model, full_check=True)
    assert len(model.training_info) == 0
    assert [o.domain for o in model.opset_import] == [""]
    assert [i.name for i in model.graph.initializer] == list(PARAMS)
    assert model.graph.node == mlp().graph.node
    assert_same(
        {n: session.initializers[n] for n in PARAMS},
        {i.name: numpy_helper.to_array(i) for i in model.graph.initializer},
    )

    def run(proto: onnx.ModelProto) -> tuple[np.ndarray, str]:
        options = ort.SessionOptions()
        options.log_severity_level = 2  # warnings and errors
        capfd.readouterr()
        inference = ort.InferenceSession(
            proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        out = inference.run(None, {"x": data(9)["x"]})[0]
        return out, capfd.readouterr().err

    out, log = run(model)
    assert log == ""
    np.testing.assert_allclose(out, session.run(data(9))["logits"], rtol=1e-5, atol=1e-6)
    # The log is really captured: the training model's state makes onnxruntime warn.
    _, log = run(session.to_model())
    assert "Removing initializer 'W1." in log


def test_inference_model_keeps_what_the_inference_graph_reads() -> None:
    """A frozen initializer and an imported domain the inference graph uses stay."""
    base = mlp()
    base.graph.initializer.append(numpy_helper.from_array(np.float32(2.0), "scale"))
    base.graph.node.append(helper.make_node("Mul", ["logits", "scale"], ["scaled"]))
    base.graph.output.append(helper.make_tensor_value_info("scaled", F32, ["N", 3]))
    model = training.attach(
        base, output="logits", optimizer=onnx_optax.adagrad(0.1), trainable=list(PARAMS)
    )
    session = training.Session(model)
    session.step(data(0))
    inference = session.to_inference_model()
    assert [i.name for i in inference.graph.initializer] == [*PARAMS, "scale"]
    assert not any(o.domain == DOMAIN for o in inference.opset_import)
    assert any(o.domain == DOMAIN for o in model.opset_import)  # the session's model untouched
    onnx.checker.check_model(inference, full_check=True)


def test_strip_training_drops_functions_and_domains_only_training_used() -> None:
    def function(name: str, domain: str) -> onnx.FunctionProto:
        return helper.make_function(
            domain,
            name,
            ["a"],
            ["b"],
            [helper.make_node("Neg", ["a"], ["b"])],
            [helper.make_opsetid("", 18)],
        )

    model = training.attach(mlp(), optimizer=onnx_optax.adam(0.01))
    model.graph.node.append(helper.make_node("Twice", ["logits"], ["twice"], domain="mine"))
    model.functions.extend([function("Twice", "mine"), function("Half", "theirs")])
    model.training_info[0].algorithm.node.append(
        helper.make_node("Half", ["loss"], ["half"], domain="theirs")
    )
    model.opset_import.extend([helper.make_opsetid("mine", 1), helper.make_opsetid("theirs", 1)])
    _export.strip_training(model)
    assert [f.name for f in model.functions] == ["Twice"]
    assert [o.domain for o in model.opset_import] == ["", "mine"]
    assert [i.name for i in model.graph.initializer] == list(PARAMS)
    assert len(model.training_info) == 0


# ----------------------------------------------------------------------------- save and load


def test_save_with_external_data_resumes_bit_identically(tmp_path: Path) -> None:
    straight, first = trained(3), trained(3)
    path = tmp_path / "model.onnx"
    first.save(path, external_data=True)
    data_file = tmp_path / "model.onnx.data"
    assert data_file.is_file()
    written = onnx.ModelProto.FromString(path.read_bytes())
    outside = {i.name for i in written.graph.initializer if i.data_location == TensorProto.EXTERNAL}
    assert {"W1", "W1.v", "W1.h"} <= outside  # W1 (2 KiB) and its Adam state V and H
    assert "b2" not in outside  # 12 bytes stay in the .onnx file
    # onnx's own reader sees the same weights.
    by_onnx = onnx.load(str(path))
    onnx.checker.check_model(str(path), full_check=True)
    assert_same(
        first.initializers, {i.name: numpy_helper.to_array(i) for i in by_onnx.graph.initializer}
    )
    resumed = training.Session(path)
    assert_same(first.initializers, resumed.initializers)
    for i in range(3, 6):
        a, b = straight.step(data(i)), resumed.step(data(i))
        np.testing.assert_array_equal(a["loss"], b["loss"])
    assert_same(straight.initializers, resumed.initializers)


def test_save_without_external_data_is_one_file(tmp_path: Path) -> None:
    session = trained(2)
    session.save(tmp_path / "m.onnx")
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]
    assert_same(session.initializers, training.Session(tmp_path / "m.onnx").initializers)


def test_the_size_decides_external_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The size comes from declared dims: a 2 GiB tensor kept outside is counted, never read.
    def declaring(count: int) -> onnx.ModelProto:
        model = mlp()
        big = model.graph.initializer.add(name="big", data_type=F32, dims=[count])
        big.data_location = TensorProto.EXTERNAL
        big.external_data.add(key="location", value="big.bin")
        return model

    small = mlp().ByteSize()
    assert 2**31 < _export.serialized_bytes(declaring(2**29)) < 2**31 + small + 100
    assert _export.serialized_bytes(declaring(2**29 - 2**20)) < _export.PROTOBUF_LIMIT
    # save's automatic choice: the size, within a few bytes of protobuf's own count.
    session = trained(1)
    size = len(session.to_model().SerializeToString())
    monkeypatch.setattr(_export, "PROTOBUF_LIMIT", size - 32)
    session.save(tmp_path / "big.onnx")
    assert (tmp_path / "big.onnx.data").is_file()
    assert_same(session.initializers, training.Session(tmp_path / "big.onnx").initializers)
    with pytest.raises(ValueError, match=r"more than protobuf's limit of .*external_data=True"):
        session.save(tmp_path / "refused.onnx", external_data=False)
    assert not (tmp_path / "refused.onnx").exists()
    monkeypatch.setattr(_export, "PROTOBUF_LIMIT", size + 32)
    session.save(tmp_path / "fits.onnx")
    assert not (tmp_path / "fits.onnx.data").exists()


def test_bad_external_data_fails_before_any_step(tmp_path: Path) -> None:
    session = trained(1)
    before = session.initializers
    folder = tmp_path / "m"
    folder.mkdir()
    session.save(folder / "m.onnx", external_data=True)
    data_file = folder / "m.onnx.data"
    # Truncated: the last tensor's bytes run past the end of the file.
    full = data_file.read_bytes()
    data_file.write_bytes(full[:-4])
    with pytest.raises(ValueError, match=r"tensor '.*' \(external data 'm.onnx.data'\).*truncated"):
        training.Session(folder / "m.onnx")
    # A location outside the model's folder.
    (tmp_path / "m.onnx.data").write_bytes(full)
    model = onnx.ModelProto.FromString((folder / "m.onnx").read_bytes())
    for init in model.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = "../m.onnx.data"
    (folder / "m.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(ValueError, match=r"tensor 'W1' .* leaves the model's folder"):
        training.Session(folder / "m.onnx")
    with pytest.raises(ValueError, match=r"write the model .*: the folder .* does not exist"):
        session.save(tmp_path / "nowhere" / "m.onnx")
    assert_same(before, session.initializers)


# ----------------------------------------------------------------------------- devices


def test_devices_must_be_a_list_of_jax_devices() -> None:
    model = trainable()
    for bad in ["cpu", [0], jax.devices()[0], [jax.devices()[0], "gpu"]]:
        with pytest.raises(TypeError, match=r"devices must be a list of JAX devices"):
            training.Session(model, devices=bad)
    for bad in [[], [jax.devices()[0]] * 2]:
        with pytest.raises(ValueError, match=r"devices must list at least one device, each once"):
            training.Session(model, devices=bad)


# Runs in a process of its own: XLA's device count is fixed when JAX starts.
EIGHT_DEVICES = """
import jax, numpy as np, onnx_optax
from onnx_optax import training
from tests.support.training_models import session_data as data, trainable

assert len(jax.devices()) == 8
with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
    model = trainable()
    one, many = training.Session(model), training.Session(model, devices=jax.devices())
    losses = [(one.step(data(i))["loss"], many.step(data(i))["loss"]) for i in range(20)]
    a, b = np.array(losses).T
    np.testing.assert_allclose(b, a, rtol=1e-6)
    for name, value in one.initializers.items():
        other = many.initializers[name]
        if value.dtype.kind == "f":
            error = np.linalg.norm(other - value) / np.linalg.norm(value)
            assert error <= 1e-6, (name, error)
        else:
            np.testing.assert_array_equal(other, value)
    # Internals, looked at once: the state replicated on all eight, a batch split over them.
    assert many._state["W1"].sharding.is_fully_replicated
    assert len(many._state["W1"].sharding.device_set) == 8
    x = many._feeds(many._entries[0], data(0), {})["x"]
    assert x.sharding.shard_shape(x.shape) == (2, 16), x.sharding
    np.testing.assert_allclose(
        many.evaluate(data(30))["loss"], one.evaluate(data(30))["loss"], rtol=1e-6
    )
    before = many.initializers
    try:
        many.step(data(0, n=12))
    except ValueError as error:
        assert "feed 'x' has 12 rows, which the 8 devices do not divide" in str(error), error
    else:
        raise AssertionError("a batch of 12 on 8 devices was accepted")
    for name, value in many.initializers.items():
        np.testing.assert_array_equal(value, before[name])
    many.step(data(0))  # still usable
print("ok")
"""


def test_eight_devices_match_one_device() -> None:
    root = Path(onnx_optax.__file__).parents[1]
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(EIGHT_DEVICES)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
