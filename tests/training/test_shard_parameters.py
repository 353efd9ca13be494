"""Session(shard_parameters=True): parameters and optimizer state split over 8 CPU devices."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import onnx_optax
from onnx_optax import training
from tests.support.training_models import trainable

# Runs in a process of its own: XLA's device count is fixed when JAX starts.
EIGHT_DEVICES = textwrap.dedent(
    """
    import sys, tempfile
    import jax, numpy as np, onnx
    from jax.sharding import PartitionSpec as P
    from onnx import numpy_helper
    import onnx_optax
    from onnx_optax import training
    from tests.support.training_models import session_data as data, session_mlp as mlp, trainable
    from tests.support.training_models import two_layer_mlp

    assert len(jax.devices()) == 8


    def wide(hidden):
        # x[N, 64] -> 64 x hidden -> relu -> hidden x 3: dominated by the first weight.
        rng = np.random.default_rng(1)
        values = {
            "W1": (rng.normal(size=(64, hidden)) / 8).astype(np.float32),
            "b1": np.zeros(hidden, np.float32),
            "W2": (rng.normal(size=(hidden, 3)) / hidden**0.5).astype(np.float32),
            "b2": np.zeros(3, np.float32),
        }
        model = two_layer_mlp(values, "wide")
        return training.attach(model, optimizer=onnx_optax.adam(0.01))


    def memory(session, inputs):
        all_feeds = session._checked_feeds(inputs)
        arguments = (session._state, all_feeds, session._constants)
        return session._step.lower(*arguments).compile().memory_analysis()


    def assert_close(got, want, rtol):
        assert list(got) == list(want)
        for name, value in want.items():
            assert got[name].dtype == value.dtype, name
            if value.dtype.kind == "f":
                error = np.linalg.norm(got[name] - value) / max(np.linalg.norm(value), 1e-30)
                assert error <= rtol, (name, error)
            else:
                np.testing.assert_array_equal(got[name], value, err_msg=name)


    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        devices = jax.devices()
        model = trainable()
        replicated = training.Session(model, devices=devices)
        sharded = training.Session(model, devices=devices, shard_parameters=True)
        # The layout: W1 (16 x 32, 2 KiB) and its V and H split along the longer axis,
        # what is under 1 KiB (W2 is 32 x 3, the biases, T) replicated.
        for name in ["W1", "W1.v", "W1.h"]:
            assert sharded._state[name].sharding.spec == P(None, "batch"), name
            assert sharded._state[name].sharding.shard_shape((16, 32)) == (16, 4), name
        for name in ["W2", "W2.v", "b1", "b1.h", "T"]:
            assert sharded._state[name].sharding.is_fully_replicated, name
        losses = [
            (replicated.step(data(i))["loss"], sharded.step(data(i))["loss"]) for i in range(20)
        ]
        a, b = np.array(losses).T
        np.testing.assert_allclose(b, a, rtol=1e-6)
        assert_close(sharded.initializers, replicated.initializers, 1e-6)
        assert sharded._state["W1.h"].sharding.spec == P(None, "batch")  # kept by the step
        assert sharded._step._cache_size() == 1  # the kept layout: compiled once
        np.testing.assert_allclose(
            sharded.evaluate(data(30))["loss"], replicated.evaluate(data(30))["loss"], rtol=1e-6
        )
        ran = sharded.run({"x": data(31)["x"]})["logits"]
        want = replicated.run({"x": data(31)["x"]})["logits"]
        assert np.linalg.norm(ran - want) <= 1e-6 * np.linalg.norm(want)

        # An initializer the steps only read (a frozen W1) is split as well.
        frozen = training.attach(mlp(), optimizer=onnx_optax.adam(0.01), frozen=["W1"])
        a = training.Session(frozen, devices=devices)
        b = training.Session(frozen, devices=devices, shard_parameters=True)
        assert "W1" not in b._state and b._constants[0]["W1"].sharding.spec == P(None, "batch")
        for i in range(5):
            np.testing.assert_allclose(b.step(data(i))["loss"], a.step(data(i))["loss"], rtol=1e-6)
        assert_close(b.initializers, a.initializers, 1e-6)

        # Saved as full arrays; resumed replicated and sharded, bit for bit.
        path = tempfile.mkdtemp() + "/sharded.onnx"
        sharded.save(path)
        saved = {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
        state = sharded.initializers
        for name, value in state.items():
            np.testing.assert_array_equal(saved[name], value, err_msg=name)
        for resumed in [
            training.Session(path),
            training.Session(path, devices=devices, shard_parameters=True),
        ]:
            assert_close(resumed.initializers, state, 0.0)
        assert resumed._state["W1.v"].sharding.spec == P(None, "batch")
        np.testing.assert_array_equal(resumed.step(data(40))["loss"], sharded.step(data(40))["loss"])
        assert_close(resumed.initializers, sharded.initializers, 0.0)

        # Memory per device: a model of one 64 x 4096 weight (1 MiB; with V and H 3 MiB).
        model = wide(4096)
        rows = {"x": data(0)["x"].repeat(4, axis=1), "target": data(0)["target"]}
        figures = {}
        for label, shard in [("replicated", False), ("sharded", True)]:
            session = training.Session(model, devices=devices, shard_parameters=shard)
            figures[label] = memory(session, rows)
            session.step(rows)
        for label, m in figures.items():
            print(
                f"{label}: arguments {m.argument_size_in_bytes} B, outputs "
                f"{m.output_size_in_bytes} B, temporaries {m.temp_size_in_bytes} B per device"
            )
        ratio = figures["sharded"].argument_size_in_bytes / figures["replicated"].argument_size_in_bytes
        print(f"argument bytes, sharded / replicated: {ratio:.3f}")
        assert figures["replicated"].argument_size_in_bytes > 3 * 64 * 4096 * 4  # W1, V, H whole
        assert ratio < 0.3, ratio
        assert figures["sharded"].output_size_in_bytes < 0.3 * figures["replicated"].output_size_in_bytes

        # Falling with the mesh: sharded over 1, 2, 4 and 8 devices, each device's arguments
        # (its part of W1, V and H, and of the batch) about halve with each doubling.
        sizes = []
        for n in (1, 2, 4, 8):
            session = training.Session(model, devices=devices[:n], shard_parameters=True)
            sizes.append(memory(session, rows).argument_size_in_bytes)
        print("argument bytes per device over 1, 2, 4, 8 devices:", sizes)
        for more, fewer in zip(sizes[1:], sizes[:-1]):
            assert 0.45 < more / fewer < 0.6, sizes
    print("ok")
    """
)


def test_sharded_parameters_match_replicated_and_save_whole() -> None:
    root = Path(onnx_optax.__file__).parents[1]
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", EIGHT_DEVICES],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(result.stdout)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), (
        result.stdout[-2000:] + result.stderr[-3000:]
    )


def test_shard_parameters_needs_devices() -> None:
    with pytest.raises(ValueError, match=r"shard_parameters=True .* give devices= as well"):
        training.Session(trainable(), shard_parameters=True)
