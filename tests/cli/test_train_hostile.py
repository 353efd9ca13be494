"""Hostile attributes against the ops added since the last audit (issue 20, a third audit).

Each test is a finding of the audit of 027012a and fails there: inputs and attributes
onnxruntime refuses that were computed (a 2-D or scalar TopK K, a NonMaxSuppression
iou_threshold outside [0, 1] or center_point_box outside {0, 1}, an Attention scale of 0,
a MatMulInteger zero point that broadcast its input to a larger shape), and a
QuantizeLinear block longer than its axis, which onnxruntime computes as one block and
which ended in an OverflowError. Expected values are onnxruntime's (its refusal, or its
outputs for the same model), or numpy written here.

Hostile training models: check, Session and the CLI end in a result or a clear error.

Each model is a sound one (attached by ``training.attach`` or written by
``interop.to_model``) with one field broken by hand; the expected outcome is a
``ValueError``/``TypeError``/``NotImplementedError`` or a ``check`` problem
naming the node, tensor or binding, never an AttributeError, IndexError or an
opaque numpy message.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402

from onnx_optax import cli, training  # noqa: E402
from tests.support.training_models import adagrad_model as _adagrad_model  # noqa: E402
from tests.support.training_models import attached_mse as _attached  # noqa: E402
from tests.support.training_models import gradient_node as _gradient  # noqa: E402
from tests.support.training_models import mlp  # noqa: E402
from tests.support.training_models import set_attribute as _set_attribute  # noqa: E402
from tests.support.training_models import set_initializer as _set_initializer  # noqa: E402


@pytest.mark.parametrize(
    "second",
    [["--inference", "{o}"], ["--log", "{o}"], ["--inference", "{d}/sub/../m.onnx"]],
    ids=["inference", "log", "inference-by-another-path"],
)
def test_train_refuses_two_outputs_in_one_file(
    tmp_path: pathlib.Path, second: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """-o m.onnx --inference m.onnx wrote the trained model, then replaced it with the
    inference model: the training state was lost, exit 0. Now exit 2 before any step."""
    from onnx_optax import cli
    from tests.support.builders import inference_model as _inference_model
    from tests.support.builders import write_npz as _npz

    _inference_model(tmp_path / "in.onnx")
    assert cli.main(["attach", str(tmp_path / "in.onnx"), "-o", str(tmp_path / "t.onnx")]) == 0
    _npz(tmp_path / "d.npz", x=np.zeros((8, 4), np.float32), target=np.zeros(8, np.int64))
    (tmp_path / "sub").mkdir()
    out = str(tmp_path / "m.onnx")
    extra = [arg.format(o=out, d=tmp_path) for arg in second]
    capsys.readouterr()
    status = cli.main([
        "train", str(tmp_path / "t.onnx"), "--data", str(tmp_path / "d.npz"),
        "--steps", "1", "--batch-size", "4", "-o", out, *extra,
    ])  # fmt: skip
    assert status == 2
    assert "give each output its own file" in capsys.readouterr().err
    assert not (tmp_path / "m.onnx").exists()


def _cli(
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    model: onnx.ModelProto,
    command: str,
) -> tuple[int, str]:
    """The CLI's exit status and what it printed (problems on stdout, errors on stderr)."""
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    argv = [command, str(path)]
    if command == "train":
        np.savez(tmp_path / "d.npz", x=np.zeros((4, 4), np.float32))
        argv += ["--data", str(tmp_path / "d.npz"), "--steps", "1", "-o", str(tmp_path / "o.onnx")]
    capsys.readouterr()
    status = cli.main(argv)
    captured = capsys.readouterr()
    return status, captured.out + captured.err


# ----------------------------------------------------------------------------- F12: the CLI


@pytest.mark.parametrize("command", ["check", "train"])
def test_the_cli_turns_a_non_scalar_T_into_one_line(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    model = _adagrad_model()
    _set_initializer(model, numpy_helper.from_array(np.array([1, 1], np.int64), "T"))
    status, text = _cli(tmp_path, capsys, model, command)
    assert status in (1, 2)
    assert "'T'" in text


@pytest.mark.parametrize("command", ["check", "train"])
def test_the_cli_turns_a_bad_gradient_attribute_into_an_error(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    model = _attached()
    _set_attribute(_gradient(model), helper.make_attribute("xs", [1, 2]))
    status, text = _cli(tmp_path, capsys, model, command)
    assert status in (1, 2)
    assert "xs" in text


@pytest.mark.parametrize("command", ["check", "train"])
@pytest.mark.parametrize("error", [TypeError, ValueError, NotImplementedError])
def test_the_cli_turns_an_error_of_check_or_session_into_exit_2(
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    error: type[Exception],
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise error("node 'n': refused by the test")

    monkeypatch.setattr(training, "check" if command == "check" else "Session", refuse)
    status, text = _cli(tmp_path, capsys, _attached(), command)
    assert status == 2
    assert text.strip().splitlines() == [
        f"onnx-optax {command}: {tmp_path / 'm.onnx'}: node 'n': refused by the test"
    ]


@pytest.mark.parametrize("content", [b"not a zip file", None])
def test_train_on_data_that_is_not_an_npz_exits_2(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], content: bytes | None
) -> None:
    (tmp_path / "m.onnx").write_bytes(_attached().SerializeToString())
    data = tmp_path / "d.npz"
    if content is None:
        with data.open("wb") as file:
            np.save(file, np.zeros((4, 4), np.float32))
    else:
        data.write_bytes(content)
    capsys.readouterr()
    argv = ["train", str(tmp_path / "m.onnx"), "--data", str(data), "--steps", "1"]
    status = cli.main([*argv, "-o", str(tmp_path / "o.onnx")])
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith(f"onnx-optax train: cannot read the data {str(data)!r}")
    assert len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- the CLI's own files
# Issue 33: what train reads back from the files it wrote (the position in the model's
# metadata_props, the log on resume) is a stranger's too. Every value is checked where
# it is read; every failure is exit 2 and one line naming the file and the field.

POSITION = "onnx_optax.train"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """s.onnx: one step of 4 rows of d.npz (8 rows) saved by train; its position as JSON."""
    folder = tmp_path_factory.mktemp("saved")
    (folder / "m.onnx").write_bytes(_attached().SerializeToString())
    rng = np.random.default_rng(0)
    np.savez(
        folder / "d.npz",
        x=rng.normal(size=(8, 4)).astype(np.float32),
        t=rng.normal(size=(8, 3)).astype(np.float32),
    )
    argv = ["train", str(folder / "m.onnx"), "--data", str(folder / "d.npz"), "--quiet"]
    assert cli.main([*argv, "--steps", "1", "--batch-size", "4", "-o", str(folder / "s.onnx")]) == 0
    return folder


def _saved_position(saved: pathlib.Path) -> dict[str, object]:

    model = onnx.load(str(saved / "s.onnx"))
    (value,) = [p.value for p in model.metadata_props if p.key == POSITION]
    position: dict[str, object] = json.loads(value)
    assert position["step"] == 1 and position["start"] == 4 and position["rows"] == 8
    return position


def _train_on(
    saved: pathlib.Path,
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    position: object,
    *args: str,
    twice: bool = False,
) -> tuple[int, list[str]]:
    """train on s.onnx with its position replaced by ``position`` (JSON text, or a dict
    dumped), 4 rows a step; the exit status and the lines on stderr."""

    model = onnx.load(str(saved / "s.onnx"))
    text = position if isinstance(position, str) else json.dumps(position)
    kept = [(p.key, p.value) for p in model.metadata_props if p.key != POSITION]
    del model.metadata_props[:]
    for key, value in [*kept, *[(POSITION, text)] * (2 if twice else 1)]:
        model.metadata_props.add(key=key, value=value)
    (tmp_path / "r.onnx").write_bytes(model.SerializeToString())
    capsys.readouterr()
    argv = ["train", str(tmp_path / "r.onnx"), "--data", str(saved / "d.npz"), "--quiet"]
    status = cli.main([*argv, "--batch-size", "4", *args, "-o", str(tmp_path / "o.onnx")])
    return status, capsys.readouterr().err.strip().splitlines()


def _refused(status: int, lines: list[str], *words: str) -> None:
    assert status == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("onnx-optax train: ") and len(lines[0]) < 500, lines
    assert all(w in lines[0] for w in words), lines


def _edited(saved: pathlib.Path, **fields: object) -> dict[str, object]:
    return {**_saved_position(saved), **fields}


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        # The cases: a RecursionError, and a start Loop._epoch() refused unguarded.
        ("[" * 100_000 + "]" * 100_000, ["nests too deep"]),
        ({"start": 10**9}, ["field 'start'", "1000000000", "8 rows"]),
        # Not JSON, not an object, a repeated key, megabytes, an integer of 5,000 digits.
        ("{", ["not JSON"]),
        ("[]", ["not an object"]),
        ('{"step": 1, "step": 1}', ["'step' appears twice"]),
        ('{"a": "' + "x" * 3_000_000 + '"}', ["characters, more than the 1048576"]),
        ('{"step": ' + "9" * 5_000 + "}", ["not JSON"]),
        # Each field: missing, unknown, a wrong type, negative, a float, NaN, huge.
        ({"goal": None}, ["field 'goal'"]),
        ({"extra": 1}, ["field 'extra'"]),
        ({"epoch": -1}, ["field 'epoch'", "-1"]),
        ({"epoch": True}, ["field 'epoch'"]),
        ({"step": 1.5}, ["field 'step'", "1.5"]),
        ({"step": 10**30, "goal": 10**30}, ["field 'step'"]),
        ({"run_start": "0"}, ["field 'run_start'"]),
        ({"rows": 0}, ["field 'rows'"]),
        ({"batch_size": 0}, ["field 'batch_size'"]),
        ({"batch_size": 16}, ["field 'batch_size'", "16"]),
        ({"seed": -3}, ["field 'seed'"]),
        ({"seed": 2**63}, ["field 'seed'"]),
        ({"seconds": float("nan")}, ["field 'seconds'", "nan"]),
        ({"seconds": float("inf")}, ["field 'seconds'", "inf"]),
        ({"seconds": -1.0}, ["field 'seconds'"]),
        ({"shuffle": "yes"}, ["field 'shuffle'"]),
        ({"drop_last": 1}, ["field 'drop_last'"]),
        ({"axes": [1]}, ["field 'axes'"]),
        ({"axes": {"x": 10**9}}, ["field 'axes'", "'x'"]),
        ({"axes": {"x": [[[]]]}}, ["field 'axes'"]),
        # The fields together.
        ({"step": 7, "goal": 5}, ["'run_start', 'step' and 'goal'"]),
        ({"run_start": 2}, ["'run_start', 'step' and 'goal'"]),
        ({"start": 8}, ["field 'start'", "8 rows"]),
        ({"start": 3}, ["field 'start'", "whole number of batches"]),
        ({"rows": 10, "start": 8, "drop_last": True}, ["field 'start'", "drop_last"]),
    ],
)
def test_a_saved_position_that_train_did_not_write_is_exit_2_naming_the_field(
    saved: pathlib.Path,
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    edit: object,
    words: list[str],
) -> None:
    if isinstance(edit, dict):
        edit = {k: v for k, v in _edited(saved, **edit).items() if v is not None}
    status, lines = _train_on(saved, tmp_path, capsys, edit, "--steps", "1")
    _refused(status, lines, str(tmp_path / "r.onnx"), f"metadata '{POSITION}'", *words)
    assert not (tmp_path / "o.onnx").exists()


COUNTS = ("epoch", "start", "step", "run_start", "goal", "rows", "batch_size", "seed")


@pytest.mark.parametrize("field", COUNTS)
@pytest.mark.parametrize(
    "value", [-1, 1.5, float("nan"), float("inf"), 2**63, 10**100, "1", None, True, [1], {}]
)
def test_every_count_of_the_position_is_an_integer_in_range(
    saved: pathlib.Path,
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    field: str,
    value: object,
) -> None:

    text = json.dumps(_edited(saved, **{field: value}))  # null: present, not an integer
    status, lines = _train_on(saved, tmp_path, capsys, text, "--steps", "1")
    _refused(status, lines, f"metadata '{POSITION}'", f"field '{field}'")


def test_a_position_stored_twice_is_exit_2(
    saved: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, lines = _train_on(saved, tmp_path, capsys, _edited(saved), "--steps", "1", twice=True)
    _refused(status, lines, f"metadata '{POSITION}'", "appears 2 times")


def test_a_sound_position_still_resumes(
    saved: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checks refuse nothing train writes: NaN in no field, the interrupted run finishes."""
    status, lines = _train_on(saved, tmp_path, capsys, _edited(saved, goal=3), "--steps", "3")
    assert status == 0, lines
    assert lines[0] == "resuming the run at step 1 of 3 (epoch 0, row 4 of 8)"


def test_a_run_past_2_63_steps_is_refused_before_it_starts(
    saved: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = 2**63 - 3
    edit = _edited(saved, step=big, run_start=big, goal=big)
    status, lines = _train_on(saved, tmp_path, capsys, edit, "--steps", "5")
    _refused(status, lines, "--steps", "2**63 - 1")


# A log as train writes it, with one row per step 1 and 2 (the saved run is at step 1 of 5).
_JSONL = (
    '{"step": 1, "epoch": 0.5, "loss": 0.7, "seconds": 0.1}\n'
    '{"step": 2, "epoch": 1.0, "loss": NaN, "seconds": 0.2}\n'
)

_CSV = "step,epoch,loss,seconds\n1,0.5,0.7,0.1\n2,1.0,nan,0.2\n"


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        # The case, and a depth within a line that json's parser cannot take.
        ("l.jsonl", "[" * 100_000 + "]" * 100_000 + "\n", ["line 1", "longer than"]),
        ("l.jsonl", "[" * 2_000 + "]" * 2_000 + "\n", ["line 1", "nests too deep"]),
        # Garbage lines, a truncated log, bytes that are not UTF-8.
        ("l.jsonl", _JSONL + "hello\n", ["line 3", "not JSON"]),
        ("l.jsonl", _JSONL[:70], ["line 2", "not JSON"]),
        ("l.jsonl", "\xff\n", ["line 1", "not UTF-8"]),
        ("l.csv", _CSV + "\x00,\x00\n", ["line 4", "2 fields"]),
        ("l.csv", _CSV[:40], ["line 3", "2 fields, the header 4"]),
        ("l.csv", "step,epoch,loss,seconds\n" + "1," * 600_000 + "\n", ["line 2", "longer"]),
        ("l.csv", "a,b\n1,2\n", ["line 1", "header"]),
        ("l.csv", "step,step,loss,seconds\n", ["line 1", "header"]),
        ("l.csv", 'step,epoch,loss,seconds\n"1,0.5,0.7,0.1\n', ["line 2", "not a line of CSV"]),
        # Wrong types, values out of range, steps out of order, in each format.
        ("l.jsonl", "[1, 2]\n", ["line 1", "not an object"]),
        ("l.jsonl", '{"step": "1", "epoch": 0, "loss": 1, "seconds": 0}\n', ["field 'step'"]),
        ("l.jsonl", '{"step": 1.5, "epoch": 0, "loss": 1, "seconds": 0}\n', ["field 'step'"]),
        ("l.jsonl", '{"step": true, "epoch": 0, "loss": 1, "seconds": 0}\n', ["field 'step'"]),
        ("l.jsonl", '{"step": 0, "epoch": 0, "loss": 1, "seconds": 0}\n', ["field 'step'"]),
        ("l.jsonl", '{"step": 1, "epoch": -1, "loss": 1, "seconds": 0}\n', ["field 'epoch'"]),
        ("l.jsonl", '{"step": 1, "epoch": 0, "loss": 1, "seconds": NaN}\n', ["field 'seconds'"]),
        ("l.jsonl", '{"step": 1, "epoch": 1e999, "loss": 1, "seconds": 0}\n', ["field 'epoch'"]),
        ("l.jsonl", '{"step": 1, "epoch": 0, "loss": "low", "seconds": 0}\n', ["field 'loss'"]),
        ("l.jsonl", '{"step": 1, "epoch": 0, "loss": [1], "seconds": 0}\n', ["field 'loss'"]),
        ("l.jsonl", '{"step": 1, "epoch": 0, "seconds": 0}\n', ["field 'loss' is missing"]),
        ("l.jsonl", '{"step": 1, "epoch": 0, "loss": 1, "seconds": 0, "x": 1}\n', ["'x'"]),
        (
            "l.jsonl",
            '{"step": 1, "epoch": 0, "loss": 1, "seconds": 0, "val_accuracy": 2}\n',
            ["field 'val_accuracy'"],
        ),
        ("l.jsonl", _JSONL + _JSONL, ["line 3", "does not follow the step 2"]),
        ("l.csv", "step,epoch,loss,seconds\nx,0,1,0\n", ["line 2", "field 'step'"]),
        ("l.csv", "step,epoch,loss,seconds\n1,-1,1,0\n", ["line 2", "field 'epoch'"]),
        ("l.csv", "step,epoch,loss,seconds\n1,0,1,inf\n", ["line 2", "field 'seconds'"]),
        ("l.csv", "step,epoch,loss,seconds\n1,0,,0\n", ["line 2", "field 'loss'"]),
        ("l.csv", f"step,epoch,loss,seconds\n{10**30},0,1,0\n", ["line 2", "field 'step'"]),
    ],
)
def test_a_log_read_back_on_resume_is_checked_line_by_line(
    saved: pathlib.Path,
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    text: str,
    words: list[str],
) -> None:
    log = tmp_path / name
    log.write_bytes(text.encode("utf-8", "surrogateescape").replace(b"\xc3\xbf", b"\xff"))
    before = log.read_bytes()
    args = ["--steps", "5", "--log", str(log)]
    status, lines = _train_on(saved, tmp_path, capsys, _edited(saved, goal=5), *args)
    _refused(status, lines, f"the log {str(log)!r}", *words)
    assert log.read_bytes() == before and not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("name", ["l.jsonl", "l.csv"])
def test_a_sound_log_resumes_with_its_rows(
    saved: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """NaN losses, blank lines and rows past the saved step are what train writes: kept, dropped."""

    log = tmp_path / name
    log.write_text((_JSONL if name.endswith("jsonl") else _CSV).replace("\n", "\n\n", 1))
    args = ["--steps", "3", "--log-every", "1", "--log", str(log)]
    status, lines = _train_on(saved, tmp_path, capsys, _edited(saved, goal=3), *args)
    assert status == 0, lines
    rows = log.read_text().splitlines()
    if name.endswith("jsonl"):
        steps = [json.loads(r)["step"] for r in rows]
        assert json.loads(rows[0])["loss"] == 0.7
    else:
        steps = [int(r.split(",")[0]) for r in rows[1:]]
    assert steps == [1, 2, 3]  # step 1 of the earlier log, then this run's


def test_a_log_that_is_a_link_or_too_large_is_exit_2(
    saved: pathlib.Path,
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from onnx_optax.cli import train_log

    outside = tmp_path / "outside.jsonl"
    outside.write_text(_JSONL)
    (tmp_path / "l.jsonl").symlink_to(outside)
    args = ["--steps", "5", "--log", str(tmp_path / "l.jsonl")]
    status, lines = _train_on(saved, tmp_path, capsys, _edited(saved, goal=5), *args)
    _refused(status, lines, "the log", "symbolic link")
    (tmp_path / "l.jsonl").unlink()
    (tmp_path / "l.jsonl").write_text(_JSONL)
    monkeypatch.setattr(train_log, "MAX_LOG_BYTES", 60)
    status, lines = _train_on(saved, tmp_path, capsys, _edited(saved, goal=5), *args)
    _refused(status, lines, "the log", "more than the 60 bytes")


def test_validation_data_without_rows_is_exit_2(
    saved: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It divided by zero rows validated (a ZeroDivisionError after the first epoch)."""
    val = tmp_path / "v.npz"
    np.savez(val, x=np.zeros((0, 4), np.float32), t=np.zeros((0, 3), np.float32))
    argv = ["train", str(saved / "m.onnx"), "--data", str(saved / "d.npz"), "--quiet"]
    capsys.readouterr()
    status = cli.main(
        [
            *argv,
            "--steps",
            "2",
            "--batch-size",
            "4",
            "--val-data",
            str(val),
            "-o",
            str(tmp_path / "o.onnx"),
        ]
    )
    _refused(status, capsys.readouterr().err.strip().splitlines(), str(val), "no rows")


def test_data_naming_many_arrays_but_not_the_inputs_is_one_short_line(
    saved: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "many.npz"
    np.savez(data, **{f"array_{i}": np.zeros(1) for i in range(1_000)})
    argv = ["train", str(saved / "m.onnx"), "--data", str(data), "--steps", "1"]
    capsys.readouterr()
    status = cli.main([*argv, "-o", str(tmp_path / "o.onnx")])
    _refused(status, capsys.readouterr().err.strip().splitlines(), "no array", "980 more")


@pytest.mark.parametrize("error", [RuntimeError("boom\nsecond line"), MemoryError(), KeyError("k")])
def test_whatever_a_command_raises_is_exit_2_and_one_line(
    saved: pathlib.Path,
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
) -> None:
    """Even where no check foresaw it (in Loop._epoch, before the loop's own error handling)."""
    from onnx_optax.cli import trainer

    def fail(self: object) -> None:
        raise error

    monkeypatch.setattr(trainer.Loop, "_epoch", fail)
    monkeypatch.delenv(cli.TRACEBACK_VARIABLE, raising=False)
    status, lines = _train_on(saved, tmp_path, capsys, _edited(saved), "--steps", "1")
    _refused(status, lines, f"unexpected {type(error).__name__}", "trainer.py:")
    assert "Traceback" not in lines[0] and f"{cli.TRACEBACK_VARIABLE}=1 shows" in lines[0]
    # For a bug report (and a fuzzer): the exception itself, with its traceback.
    monkeypatch.setenv(cli.TRACEBACK_VARIABLE, "1")
    with pytest.raises(type(error)):
        _train_on(saved, tmp_path, capsys, _edited(saved), "--steps", "1")


def test_an_interrupt_keeps_its_exit_status(
    saved: pathlib.Path,
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from onnx_optax.cli import trainer

    def interrupt(self: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer.Loop, "_epoch", interrupt)
    status, lines = _train_on(saved, tmp_path, capsys, _edited(saved), "--steps", "1")
    assert status == 130 and lines == ["onnx-optax train: interrupted"]


def test_one_line_escapes_control_characters_and_bounds_the_length() -> None:
    assert cli.one_line("a\nb\x00c\td") == "a\\nb\\x00c\\td"
    long = cli.one_line("x" * 10**6)
    assert len(long) < 2_100 and "characters" in long and "\n" not in long


def test_check_reports_a_saved_position_train_would_refuse(
    saved: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """check reads the model's metadata as train does: a bad position is a problem (exit 1)."""
    assert cli.main(["check", str(saved / "s.onnx")]) == 0
    assert capsys.readouterr().out.strip().splitlines() == [f"{saved / 's.onnx'}: ok"]
    _train_on(saved, tmp_path, capsys, _edited(saved, start=10**9), "--steps", "1")
    assert cli.main(["check", str(tmp_path / "r.onnx")]) == 1
    captured = capsys.readouterr()
    assert captured.out.strip().splitlines() == [
        f"{tmp_path / 'r.onnx'}: metadata '{POSITION}' (where a train stopped): field 'start': "
        "1000000000 is not below the 8 rows (field 'rows')"
    ]
    assert captured.err.strip() == f"{tmp_path / 'r.onnx'}: 1 problem(s)"


def test_a_learning_rate_that_cannot_be_computed_mid_run_leaves_the_column(
    saved: pathlib.Path,
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """R read from the model as an empty tensor (IndexError) or a string: a note, no column."""
    from onnx_optax.training import _metrics

    def empty(value: object) -> float:
        return float(np.asarray(value).reshape(-1)[5])

    monkeypatch.setattr(_metrics, "shortest_float", empty)
    log = tmp_path / "l.jsonl"
    status, lines = _train_on(
        saved, tmp_path, capsys, _edited(saved), "--steps", "2", "--log", str(log)
    )
    assert status == 0, lines
    assert lines[0].startswith("note: the log has no learning_rate from here: index 5"), lines
    assert "learning_rate" not in log.read_text()


@pytest.mark.parametrize("reader", ["learning_rate", "class_scores"])
def test_what_the_loop_reads_from_the_model_failing_is_a_note(
    saved: pathlib.Path,
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    reader: str,
) -> None:
    """R and the class scores are read from a stranger's model: an error there is why not."""
    from onnx_optax.training import _metrics

    def fail(model: object) -> None:
        raise KeyError("a Cast to 9999")

    monkeypatch.setattr(_metrics, reader, fail)
    args = ["--steps", "2", "--val-data", str(saved / "d.npz"), "--log", str(tmp_path / "l.csv")]
    status, lines = _train_on(saved, tmp_path, capsys, _edited(saved), *args)
    assert status == 0, lines
    assert any("cannot be read from the model: 'a Cast to 9999'" in line for line in lines), lines


def test_an_unforeseen_error_mid_run_keeps_the_steps_before_it(
    saved: pathlib.Path,
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from onnx_optax.cli import trainer

    report = trainer.Loop._report

    def fail_second(self: trainer.Loop, step: int, outputs: object) -> None:
        if step == 3:
            raise RuntimeError("out of device memory")
        report(self, step, outputs)  # type: ignore[arg-type]

    monkeypatch.setattr(trainer.Loop, "_report", fail_second)
    monkeypatch.delenv(cli.TRACEBACK_VARIABLE, raising=False)
    status, lines = _train_on(saved, tmp_path, capsys, _edited(saved), "--steps", "5")
    _refused(status, lines, "unexpected RuntimeError", "out of device memory", "after step 2")
    assert training.Session(tmp_path / "o.onnx").initializers["T"] == 4  # Adam counts from 1


@pytest.mark.parametrize(
    ("option", "read", "words"),
    [
        ("--log", "d.npz", "--log names the file --data reads"),
        ("--log", "s.onnx", "--log names the file the model reads"),
        ("--inference", "s.onnx", "--inference names the file the model reads"),
        ("-o", "d.npz", "-o names the file --data reads"),
        ("--plot", "v.npz", "--plot names the file --val-data reads"),
    ],
)
def test_an_output_that_would_replace_an_input_is_refused_before_training(
    saved: pathlib.Path,
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    option: str,
    read: str,
    words: str,
) -> None:
    """A train that replaced its data or its model with a log would lose them: refused."""
    import shutil

    for name in ("s.onnx", "d.npz"):
        shutil.copy(saved / name, tmp_path / name)
    shutil.copy(saved / "d.npz", tmp_path / "v.npz")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    argv = ["train", str(tmp_path / "s.onnx"), "--data", str(tmp_path / "d.npz"), "--steps", "1"]
    argv += ["--val-data", str(tmp_path / "v.npz"), "--batch-size", "4"]
    outputs = {"-o": str(tmp_path / "o.onnx"), option: str(tmp_path / read)}
    capsys.readouterr()
    status = cli.main([*argv, *[a for item in outputs.items() for a in item]])
    _refused(status, capsys.readouterr().err.strip().splitlines(), words)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_neither_an_inference_model_nor_an_attached_one_carries_a_position(
    saved: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """train --inference wrote the position the model was read with, and attach kept it: a
    train on the model attached again resumed a run that was not its own."""

    def keys(path: pathlib.Path) -> list[str]:
        return [p.key for p in onnx.load(str(path)).metadata_props]

    args = ["--steps", "2", "--inference", str(tmp_path / "i.onnx")]
    status, lines = _train_on(saved, tmp_path, capsys, _edited(saved), *args)
    assert status == 0, lines
    assert POSITION in keys(tmp_path / "o.onnx") and keys(tmp_path / "i.onnx") == []
    model = mlp()
    model.metadata_props.add(key=POSITION, value=json.dumps(_edited(saved)))
    model.metadata_props.add(key="author", value="kept")
    onnx.save(model, str(tmp_path / "in.onnx"))
    argv = ["attach", str(tmp_path / "in.onnx"), "--loss", "mse", "--target", "t"]
    assert cli.main([*argv, "-o", str(tmp_path / "a.onnx")]) == 0
    assert "left out the position of an earlier train" in capsys.readouterr().err
    assert keys(tmp_path / "a.onnx") == ["author"]
