"""The training loop: ``training.batches``, Python feeds, and ``onnx-optax train`` around them.

The interrupt is a real SIGINT to a real ``python -m onnx_optax train`` process;
the other CLI runs go through ``cli.main`` in this process, to stay fast.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import onnx_optax  # noqa: E402
from onnx_optax import cli, training  # noqa: E402
from onnx_optax.cli import common, curves  # noqa: E402

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- batches


def _data(rows: int = 10) -> dict[str, np.ndarray]:
    return {"x": np.arange(rows * 2, dtype=np.float32).reshape(rows, 2), "t": np.arange(rows)}


@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_give_every_row_once_an_epoch(shuffle: bool) -> None:
    data = _data(10)
    for epoch in range(3):
        epoch_batches = training.batches(data, 3, shuffle=shuffle, seed=5, epoch=epoch)
        taken = list(epoch_batches)
        assert len(taken) == len(epoch_batches) == 4
        assert [len(b["t"]) for b in taken] == [3, 3, 3, 1]
        rows = np.concatenate([b["t"] for b in taken])
        assert sorted(rows) == list(range(10))
        for batch in taken:  # the arrays keep their rows together
            np.testing.assert_array_equal(batch["x"][:, 0], 2 * batch["t"])
    kept = list(training.batches(data, 3, shuffle=shuffle, seed=5, drop_last=True))
    rows = np.concatenate([b["t"] for b in kept])
    assert [len(b["t"]) for b in kept] == [3, 3, 3] and len(set(rows)) == 9


def test_the_order_of_an_epoch_depends_on_seed_and_epoch_alone() -> None:
    data = _data(50)

    def order(**kwargs: Any) -> list[int]:
        return [int(t) for b in training.batches(data, 7, **kwargs) for t in b["t"]]

    assert order() == list(range(50))
    first = order(shuffle=True, seed=1, epoch=4)
    assert first == order(shuffle=True, seed=1, epoch=4)  # the same in any process
    assert first == np.random.default_rng([1, 4]).permutation(50).tolist()
    assert first != order(shuffle=True, seed=1, epoch=5)
    assert first != order(shuffle=True, seed=2, epoch=4)
    # A resumed epoch: the batches after the rows already taken, the same as without a stop.
    assert order(shuffle=True, seed=1, epoch=4, start=21) == first[21:]
    assert order(shuffle=True, seed=1, epoch=4, start=50) == []
    again = training.batches(data, 7, shuffle=True, seed=1, epoch=4)
    assert [b["t"].tolist() for b in again] == [b["t"].tolist() for b in again]


def test_a_batch_axis_per_array_takes_time_major_arrays() -> None:
    steps, n = 5, 8
    x = np.arange(n, dtype=np.float32)[None, :, None] * np.ones((steps, n, 3), np.float32)
    t = np.tile(np.arange(n), (steps, 1))  # [T, N]: row n holds n
    lists = {"x": x.tolist(), "t": t.tolist()}  # anything numpy.asarray takes
    for batch in training.batches(lists, 3, shuffle=True, axis={"x": 1, "t": -1}):
        assert batch["x"].shape[::2] == (steps, 3) and batch["t"].shape[0] == steps
        np.testing.assert_array_equal(batch["x"][:, :, 0], batch["t"])


@pytest.mark.parametrize(
    ("arrays", "kwargs", "message"),
    [
        ({"x": np.zeros((4, 2)), "t": np.zeros(5)}, {}, "the same number of rows"),
        ({"x": np.zeros(()), "t": np.zeros(5)}, {}, "'x' is a scalar"),
        ({"x": np.zeros((4, 2))}, {"axis": 2}, "batch axis 2 is out of range"),
        ({"x": np.zeros((4, 2))}, {"axis": {"y": 1}}, "axis names ['y']"),
        ({"x": np.zeros((4, 2))}, {"start": 5}, "start must be an integer in [0, 4]"),
        ({"x": np.zeros((4, 2))}, {"seed": -1}, "seed must be an integer >= 0"),
        ({"x": np.zeros((4, 2))}, {"epoch": 1.5}, "epoch must be an integer"),
        ({"x": np.zeros((4, 2))}, {"drop_last": True}, "drop_last leaves no batch"),
        ({}, {}, "non-empty mapping"),
    ],
)
def test_batches_refuse_what_cannot_be_batched(
    arrays: dict[str, Any], kwargs: dict[str, Any], message: str
) -> None:
    size = 8 if kwargs.get("drop_last") else 2
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        training.batches(arrays, size, **kwargs)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        training.batches({"x": np.zeros(3)}, 0)


# ----------------------------------------------------------------------------- Python feeds


def _linear(rank: int = 2) -> onnx.ModelProto:
    """A 4-3 linear classifier: logits [N, 3], or [T, N, 3] for rank 3."""
    rng = np.random.default_rng(0)
    dims: list[Any] = ["N", 4] if rank == 2 else ["S", "N", 4]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["logits"]),
        ],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [*dims[:-1], 3])],
        initializer=[
            numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "W"),
            numpy_helper.from_array(np.zeros(3, np.float32), "b"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_step_takes_python_lists_and_scalars_as_numpy_would() -> None:
    model = training.attach(_linear(), target="t", optimizer=onnx_optax.adam(0.1))
    x = [[1, 2, 3, 4], [0.5, -1, 0, 2]]  # ints and floats: float32, as declared
    by_list, by_array = training.Session(model), training.Session(model)
    for _ in range(2):
        loss = by_list.step({"x": x, "t": [0, 2.0]})["loss"]  # 2.0 is an integer: int64
        assert loss == by_array.step({"x": np.float32(x), "t": np.array([0, 2])})["loss"]
    for name, value in by_array.initializers.items():
        np.testing.assert_array_equal(by_list.initializers[name], value, err_msg=name)
    assert by_list.evaluate({"x": x, "t": (1, 1)})["loss"].dtype == np.float32
    np.testing.assert_array_equal(
        by_list.run({"x": [[1, 0, 0, 0]]})["logits"],
        by_array.run({"x": np.eye(1, 4, dtype=np.float32)})["logits"],
    )


def test_a_scalar_feed_from_a_python_number() -> None:
    session = training.Session(_scalar_model())
    assert session.run({"x": [1.0, 2.0], "scale": 3})["y"].tolist() == [3.0, 6.0]
    assert session.step({"x": [1.0, 2.0], "scale": 3, "t": [6, 12]})["loss"] == 9.0 * 5 / 2
    with pytest.raises(
        ValueError, match="feed 'scale': the value 1e\\+300 is outside the range of float32"
    ):
        session.step({"x": [1.0], "scale": 1e300, "t": [0]})


def _scalar_model() -> onnx.ModelProto:
    """y = (x * w) * scale, w trained; scale a scalar input."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "w"], ["xw"]),
            helper.make_node("Mul", ["xw", "scale"], ["y"]),
        ],
        "scaled",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"]),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])],
        initializer=[numpy_helper.from_array(np.ones(1, np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return training.attach(
        model, loss="mse", target="t", trainable=["w"], optimizer=onnx_optax.adam(0.1)
    )


@pytest.mark.parametrize(
    ("feeds", "error", "message"),
    [
        (
            {"t": [0, 1.5]},
            ValueError,
            r"feed 't': the value 1.5 is not an integer in the range of int64",
        ),
        ({"t": [2**63]}, ValueError, r"feed 't': the value 9223372036854775808 is not an integer"),
        ({"t": [2**70]}, ValueError, r"feed 't' holds values numpy keeps as Python objects"),
        (
            {"x": [[1e39, 0, 0, 0]] * 2},
            ValueError,
            r"feed 'x': the value 1e\+39 is outside the range of float32",
        ),
        ({"x": [[1, 2, 3], [4]]}, ValueError, r"feed 'x' is not an array of one shape"),
        ({"x": [["a"] * 4] * 2}, TypeError, r"feed 'x' holds <U1 values"),
        ({"t": [0.0, 5.0]}, ValueError, r"feed 't' holds the label 5, outside \[0, 3\)"),
        ({"x": np.zeros((2, 4))}, TypeError, r"feed 'x' has dtype float64"),  # arrays: exact dtypes
    ],
)
def test_lossy_python_feeds_are_refused_naming_the_feed(
    feeds: dict[str, Any], error: type[Exception], message: str
) -> None:
    session = training.Session(
        training.attach(_linear(), target="t", optimizer=onnx_optax.adam(0.1))
    )
    before = session.initializers
    with pytest.raises(error, match=message):
        session.step({"x": np.zeros((2, 4), np.float32), "t": [0, 1], **feeds})
    assert session.initializers["T"] == before["T"]  # nothing ran


# ----------------------------------------------------------------------------- the CLI


@pytest.fixture
def files(tmp_path: pathlib.Path) -> pathlib.Path:
    """t.onnx (the linear classifier, Adam on a linear schedule), d.npz (100 rows), v.npz (32)."""
    schedule = training.schedules.linear_schedule(0.05, 0.01, 40)
    model = training.attach(_linear(), target="target", optimizer=onnx_optax.adam(schedule))
    onnx.save(model, str(tmp_path / "t.onnx"))
    rng = np.random.default_rng(1)
    for name, rows in (("d", 100), ("v", 32)):
        x = rng.normal(size=(rows, 4)).astype(np.float32)
        np.savez(tmp_path / f"{name}.npz", x=x, target=np.argmax(x[:, :3], axis=1))
    return tmp_path


def _train(folder: pathlib.Path, model: str, *args: str) -> int:
    return cli.main(["train", str(folder / model), "--data", str(folder / "d.npz"), *args])


def _weights(path: pathlib.Path) -> dict[str, np.ndarray]:
    return training.Session(path).initializers


def _position(path: pathlib.Path) -> dict[str, Any]:
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    position: dict[str, Any] = json.loads(props[common.POSITION_KEY])
    return position


def _assert_same_state(a: pathlib.Path, b: pathlib.Path) -> None:
    first, second = _weights(a), _weights(b)
    assert list(first) == list(second)
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
    where, other = _position(a), _position(b)
    for key in ("seconds", "run_start", "goal"):
        del where[key], other[key]
    assert where == other


def test_sigint_saves_exits_130_and_the_same_command_resumes_bit_identically(
    files: pathlib.Path,
) -> None:
    options = ["--batch-size", "16", "--shuffle", "--seed", "3", "--log-every", "5"]
    command = [
        sys.executable, "-m", "onnx_optax", "train", str(files / "t.onnx"),
        "--data", str(files / "d.npz"), "--steps", "1000000", "--save-every", "2",
        *options, "-o", str(files / "run.onnx"),
    ]  # fmt: skip
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPOSITORY)}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 120
        while not (files / "run.onnx").exists():  # its first checkpoint: it is training
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no checkpoint in 120 s"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted (SIGINT) at step" in stderr and "wrote" in stderr
    done = _position(files / "run.onnx")["step"]
    session = training.Session(files / "run.onnx")  # a complete, usable model
    assert session.initializers["T"] == 1 + done
    assert session.evaluate({"x": np.zeros((2, 4), np.float32), "target": [0, 1]})["loss"] > 0
    # The same run, told to end 9 steps later (past two epoch ends), against one never stopped.
    goal = str(done + 9)
    assert _train(files, "run.onnx", "--steps", goal, *options, "-o", str(files / "run.onnx")) == 0
    assert _train(files, "t.onnx", "--steps", goal, *options, "-o", str(files / "ref.onnx")) == 0
    _assert_same_state(files / "run.onnx", files / "ref.onnx")
    assert _position(files / "ref.onnx")["step"] == done + 9


def test_a_finished_run_trains_on_from_its_position(
    files: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = ["--batch-size", "16", "--shuffle", "--seed", "9"]
    assert _train(files, "t.onnx", "--steps", "5", *options, "-o", str(files / "a.onnx")) == 0
    assert _train(files, "a.onnx", "--epochs", "2", *options, "-o", str(files / "a.onnx")) == 0
    # 2 epochs of 7 batches (the last of 4 rows) after 5 steps: 19 steps in one run.
    assert _train(files, "t.onnx", "--steps", "19", *options, "-o", str(files / "b.onnx")) == 0
    _assert_same_state(files / "a.onnx", files / "b.onnx")
    assert _position(files / "a.onnx") | {"seconds": 0} == {
        "axes": {}, "batch_size": 16, "drop_last": False, "epoch": 2, "goal": 19, "rows": 100,
        "run_start": 5, "seconds": 0, "seed": 9, "shuffle": True, "start": 80, "step": 19,
    }  # fmt: skip
    # Other options: the batches start again from epoch 0 (the step count goes on).
    capsys.readouterr()
    assert (
        _train(files, "a.onnx", "--steps", "1", "--batch-size", "8", "-o", str(files / "c.onnx"))
        == 0
    )
    assert "its batches start again from epoch 0" in capsys.readouterr().err
    assert _position(files / "c.onnx")["step"] == 20


def test_the_log_and_the_plot(files: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--steps", "12", "--batch-size", "16", "--log-every", "5", "--val-every", "4"]
    val = ["--val-data", str(files / "v.npz")]
    for log in ("log.csv", "log.jsonl"):
        out = [
            "--log",
            str(files / log),
            "--plot",
            str(files / "loss.png"),
            "-o",
            str(files / "o.onnx"),
        ]
        assert _train(files, "t.onnx", *args, *val, *out) == 0
    with open(files / "log.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    lines = [json.loads(line) for line in (files / "log.jsonl").read_text().splitlines()]
    assert list(rows[0]) == list(lines[0]) == [
        "step", "epoch", "loss", "val_loss", "val_accuracy", "learning_rate", "seconds",
    ]  # fmt: skip
    assert [int(r["step"]) for r in rows] == [r["step"] for r in lines] == [1, 4, 5, 8, 10, 12]
    assert [r["epoch"] for r in lines] == [0.16, 0.64, 0.8, 1.16, 1.48, 1.8]
    validated = [r["step"] for r in lines if r["val_loss"] is not None]
    assert validated == [4, 8, 12] and [r["step"] for r in rows if r["val_loss"]] == [
        "4",
        "8",
        "12",
    ]
    schedule = training.schedules.linear_schedule(0.05, 0.01, 40)
    # R of the step: the schedule at the T it read (Adam counts from T = 1).
    expected = [float(schedule(r["step"])) for r in lines]
    np.testing.assert_allclose([r["learning_rate"] for r in lines], expected, rtol=1e-6)
    seconds = [r["seconds"] for r in lines]
    assert seconds == sorted(seconds)
    assert (files / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert curves.log_scale([3.0, 0.01]) and not curves.log_scale([3.0, 0.1])
    assert not curves.log_scale([1.0, -0.5, 1e-5])  # a loss below 0: linear


def _softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return float(-np.take_along_axis(log_p, labels[..., None], axis=-1).mean())


def test_validation_loss_and_accuracy_agree_with_numpy(files: pathlib.Path) -> None:
    out = files / "o.onnx"
    args = ["--steps", "6", "--batch-size", "16", "--val-data", str(files / "v.npz")]
    assert _train(files, "t.onnx", *args, "--log", str(files / "l.jsonl"), "-o", str(out)) == 0
    last = json.loads((files / "l.jsonl").read_text().splitlines()[-1])
    weights = _weights(out)
    val = np.load(files / "v.npz")
    logits = val["x"] @ weights["W"] + weights["b"]
    assert last["step"] == 6
    np.testing.assert_allclose(
        last["val_loss"], _softmax_cross_entropy(logits, val["target"]), rtol=1e-5
    )
    assert last["val_accuracy"] == np.mean(np.argmax(logits, axis=1) == val["target"])


def test_time_major_data_with_batch_axes(tmp_path: pathlib.Path) -> None:
    """A [T, N, 4] input and a [T, N] target, batched on axis 1; accuracy through the Transpose."""
    model = training.attach(
        _linear(rank=3), target="target", class_axis=2, optimizer=onnx_optax.adam(0.05)
    )
    onnx.save(model, str(tmp_path / "t.onnx"))
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5, 40, 4)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, target=np.argmax(x[..., :3], axis=-1))
    args = [
        "--epochs",
        "2",
        "--batch-size",
        "16",
        "--shuffle",
        "--val-data",
        str(tmp_path / "d.npz"),
    ]
    out = ["--log", str(tmp_path / "l.jsonl"), "-o", str(tmp_path / "o.onnx")]
    # On axis 0 (time) the arrays have 5 "rows", fewer than a batch: refused.
    assert _train(tmp_path, "t.onnx", *args, *out) == 2
    axes = ["--batch-axis", "x=1", "--batch-axis", "target=1"]
    assert _train(tmp_path, "t.onnx", *args, *axes, *out) == 0
    weights = _weights(tmp_path / "o.onnx")
    logits = x @ weights["W"] + weights["b"]
    last = json.loads((tmp_path / "l.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 6 and last["epoch"] == 2.0  # 40 rows of 16: 3 batches an epoch
    assert last["val_accuracy"] == np.mean(
        np.argmax(logits, axis=-1) == np.argmax(x[..., :3], axis=-1)
    )


def test_a_bad_batch_mid_run_keeps_the_steps_before_it(
    files: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = np.zeros((48, 4), np.float32)
    target = np.zeros(48, np.int64)
    target[40] = 7  # in the third batch of 16: not a class
    np.savez(files / "bad.npz", x=x, target=target)
    out = files / "o.onnx"
    argv = ["train", str(files / "t.onnx"), "--data", str(files / "bad.npz"), "--steps", "5"]
    assert cli.main([*argv, "--batch-size", "16", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds the label 7" in err and "the state after step 2 of the run is saved" in err
    assert _weights(out)["T"] == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "5", "--log-every", "0"], "--log-every must be at least 1"),
        (["--steps", "0"], "--steps must be at least 1"),
        (["--epochs", "0"], "--epochs must be at least 1"),
        (["--steps", "5", "--save-every", "0"], "--save-every must be at least 1"),
        (["--steps", "5", "--seed", "-1"], "--seed must be at least 0"),
        (["--steps", "5", "--val-every", "3"], "--val-every needs --val-data"),
        (["--steps", "5", "--batch-axis", "x"], "--batch-axis takes NAME=AXIS"),
        (["--steps", "5", "--batch-axis", "y=1"], "--batch-axis names ['y']"),
        (["--steps", "5", "--batch-axis", "x=1", "--batch-axis", "x=0"], "names 'x' twice"),
        (["--steps", "5", "--batch-size", "101"], "larger than the 100 rows"),
        (["--steps", "5", "--log", "missing/l.csv"], "cannot write the log"),
    ],
)
def test_train_usage_errors_exit_2(
    files: pathlib.Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    capsys.readouterr()
    argv = [a.replace("missing/", str(files / "missing") + "/") for a in argv]
    assert _train(files, "t.onnx", *argv, "-o", str(files / "o.onnx")) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (files / "o.onnx").exists()


def test_steps_and_epochs_are_exclusive_and_one_is_needed(files: pathlib.Path) -> None:
    for argv in (["--steps", "1", "--epochs", "1"], []):
        with pytest.raises(SystemExit) as exit_:
            _train(files, "t.onnx", *argv, "-o", str(files / "o.onnx"))
        assert exit_.value.code == 2


def test_plot_without_matplotlib_exits_2(
    files: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    args = ["--steps", "1", "--plot", str(files / "p.png"), "-o", str(files / "o.onnx")]
    assert _train(files, "t.onnx", *args) == 2
    assert "needs the examples extra" in capsys.readouterr().err


@pytest.mark.parametrize("rate", ["-1", "0", "inf", "nan"])
def test_attach_refuses_a_learning_rate_that_is_not_finite_and_positive(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], rate: str
) -> None:
    onnx.save(_linear(), str(tmp_path / "in.onnx"))
    argv = [
        "attach",
        str(tmp_path / "in.onnx"),
        "--learning-rate",
        rate,
        "-o",
        str(tmp_path / "t.onnx"),
    ]
    assert cli.main(argv) == 2
    assert "--learning-rate must be a finite number > 0" in capsys.readouterr().err
    assert not (tmp_path / "t.onnx").exists()
