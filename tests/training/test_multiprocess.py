"""training.Session over two processes (jax.distributed on localhost, 4 CPU devices each).

The processes' steps, each fed its own rows, are compared with one process on one
device over the same global batch, with the state replicated (process 0 saves) and
split over all 8 devices (every process gathers and saves); this process resumes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

import onnx_optax
from onnx_optax import training
from tests.support.training_models import session_data as data
from tests.support.training_models import trainable

PROCESSES = 2
LOCAL_DEVICES = 4
STEPS = 4
ROWS = 16  # the global batch: 8 rows from each process, 2 on each of the 8 devices
TIMEOUT = 120  # seconds, for both processes together

# argv: process id, coordinator port, output folder.
CHILD = (
    textwrap.dedent(
        """
    import os, sys
    import jax, numpy as np

    pid, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.distributed.initialize(
        f"localhost:{port}", num_processes=PROCESSES, process_id=pid, initialization_timeout=60
    )
    from onnx_optax import training
    from tests.support.training_models import session_data as data, trainable

    assert training.__file__.startswith(os.getcwd()), training.__file__  # this checkout's
    assert jax.process_count() == PROCESSES and len(jax.local_devices()) == LOCAL_DEVICES
    assert len(jax.devices()) == PROCESSES * LOCAL_DEVICES
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        session = training.Session(trainable(), devices=jax.devices())
        # The parameters and optimizer state split over both processes' devices too.
        sharded = training.Session(trainable(), devices=jax.devices(), shard_parameters=True)
        assert not sharded._state["W1.v"].sharding.is_fully_replicated
        share = ROWS // PROCESSES
        losses, sharded_losses = [], []
        for i in range(STEPS):
            rows = {n: v[pid * share : (pid + 1) * share] for n, v in data(i, n=ROWS).items()}
            feeds = session.global_feeds(rows)
            assert feeds["x"].shape == (ROWS, 16) and not feeds["x"].is_fully_addressable
            losses.append(session.step(feeds)["loss"])
            sharded_losses.append(sharded.step(feeds)["loss"])
        try:
            session.global_feeds({"x": np.zeros((3, 16), np.float32)})
        except ValueError as error:
            assert "feed 'x' has 3 rows here, which this process's 4 devices" in str(error)
        else:
            raise AssertionError("3 rows on 4 devices were accepted")
        state = session.initializers
        np.savez(f"{out}/state{pid}.npz", losses=np.array(losses), **state)
        if pid == 0:
            session.save(f"{out}/saved.onnx")
        # Gathering a split array is a collective: every process asks for the state.
        state = sharded.initializers
        np.savez(f"{out}/sharded{pid}.npz", losses=np.array(sharded_losses), **state)
        sharded.save(f"{out}/sharded{pid}.onnx")
    jax.distributed.shutdown()
    print("ok")
    """
    )
    .replace("PROCESSES", str(PROCESSES))
    .replace("LOCAL_DEVICES", str(LOCAL_DEVICES))
)
CHILD = CHILD.replace("STEPS", str(STEPS)).replace("ROWS", str(ROWS))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def run_processes(out: Path) -> None:
    """Starts the processes and waits for both; fails with their output if one fails."""
    root = Path(onnx_optax.__file__).parents[1]
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={LOCAL_DEVICES}",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    port = free_port()
    children = [
        subprocess.Popen(
            [sys.executable, "-W", "error", "-c", CHILD, str(pid), str(port), str(out)],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in range(PROCESSES)
    ]
    outputs = []
    try:
        for child in children:
            outputs.append(child.communicate(timeout=TIMEOUT))
    except subprocess.TimeoutExpired:
        for child in children:
            child.kill()
        reports = [f"process {i}:\n{c.communicate()[1][-3000:]}" for i, c in enumerate(children)]
        pytest.fail(f"the processes ran past {TIMEOUT} s\n" + "\n".join(reports))
    failed = [
        f"process {i} (exit {c.returncode}):\n{stdout[-1000:]}\n{err[-3000:]}"
        for i, (c, (stdout, err)) in enumerate(zip(children, outputs, strict=True))
        if c.returncode or not stdout.endswith("\nok\n")  # gloo prints to stdout too
    ]
    assert not failed, "\n".join(failed)


def test_two_processes_match_one_device_and_resume(tmp_path: Path) -> None:
    """Replicated state, saved by process 0; sharded state, gathered and saved by each."""
    run_processes(tmp_path)
    for layout, saved in [("state", "saved.onnx"), ("sharded", "sharded1.onnx")]:
        check_run(tmp_path, layout, saved)


def check_run(out: Path, layout: str, saved: str) -> None:
    states = [dict(np.load(out / f"{layout}{pid}.npz")) for pid in range(PROCESSES)]
    # The reference: one process, one device, the same global batches.
    one = training.Session(trainable())
    want = [float(one.step(data(i, n=ROWS))["loss"]) for i in range(STEPS)]
    losses = [state.pop("losses") for state in states]
    np.testing.assert_allclose(losses[0], want, rtol=1e-5)
    # Every process sees the same state (replicated, or gathered), each of its stored dtype.
    np.testing.assert_array_equal(losses[1], losses[0])
    assert list(states[0]) == list(one.initializers)
    for name, value in one.initializers.items():
        for state in states:
            assert state[name].dtype == value.dtype, name
            np.testing.assert_array_equal(state[name], states[0][name], err_msg=name)
        if value.dtype.kind == "f":
            np.testing.assert_allclose(states[0][name], value, rtol=1e-5, atol=1e-7, err_msg=name)
        else:  # T
            np.testing.assert_array_equal(states[0][name], value, err_msg=name)
    # Resumed in this process: the saved weights, V, H and T bit for bit.
    resumed = training.Session(out / saved)
    assert list(resumed.initializers) == list(states[0])
    for name, value in resumed.initializers.items():
        assert value.dtype == states[0][name].dtype, name
        np.testing.assert_array_equal(value, states[0][name], err_msg=name)
    start = training.Session(trainable()).initializers["T"]
    assert resumed.initializers["T"] == start + STEPS  # the processes' steps all counted


def test_global_feeds_needs_devices() -> None:
    with pytest.raises(ValueError, match=r"global_feeds: the session runs on JAX's default device"):
        training.Session(trainable()).global_feeds(data(0))
    # One process: the rows are the whole batch, split as step splits it.
    session = training.Session(trainable(), devices=jax.devices())
    feeds = session.global_feeds(data(0))
    np.testing.assert_array_equal(np.asarray(feeds["x"]), data(0)["x"])
    assert feeds["x"].sharding == session._split
    one = training.Session(trainable())
    np.testing.assert_array_equal(session.step(feeds)["loss"], one.step(data(0))["loss"])
