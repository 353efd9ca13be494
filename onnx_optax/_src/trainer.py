"""``onnx-optax train``: epochs of batches, progress, validation, logs, curves, checkpoints.

The loop's position (epoch, rows of the epoch taken, seed, steps done, where
the run began and ends) travels in the saved model's ``metadata_props`` under
:data:`POSITION_KEY`, so ``train`` on a saved model continues the same
sequence of batches: an interrupted run, resumed with the same options, ends
bit-identical to one that never stopped. Every file goes through
:mod:`onnx_optax._src.write` (a new file renamed into place), so an interrupt
never leaves half a model, log or plot.

What ``train`` reads back from its own files (the position in a model, the
log of an interrupted run) may come from a stranger as much as the model: each
is read bounded (its size, its lines, its nesting), every field is checked
where it is read, and a position or a log that ``train`` did not write is a
usage error naming the file, the line and the field.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import itertools
import json
import math
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import FrameType, ModuleType
from typing import Any

import numpy as np

from onnx_optax._src.limits import MAX_COUNT, MAX_LOG_BYTES, MAX_LOG_LINE, MAX_POSITION_CHARS
from onnx_optax._src.write import write_file
from onnx_optax.cli import (
    EXIT_FAILED,
    EXIT_OK,
    POSITION_KEY,  # of the saved model's metadata_props: the loop's position (JSON)
    TRACEBACK_VARIABLE,
    UsageError,
    _read_model,
    _training,
    _unforeseen,
    _write_model,
    drop_position,
    one_line,
)

# A log file is rewritten at most this often (and at every save and at the end).
LOG_SECONDS = 5.0
# The columns a log may have, in the order train writes them.
LOG_COLUMNS = ("step", "epoch", "loss", "val_loss", "val_accuracy", "learning_rate", "seconds")
# Characters of a value a message quotes.
_QUOTED = 40


class SaveError(UsageError):
    """A checkpoint, log or plot could not be written (exit status 2)."""


def quoted(value: object) -> str:
    """``value`` for a one-line message: its ``repr`` cut short; an array or object described."""
    if isinstance(value, list | dict):  # never the repr of a stranger's nesting
        return f"a JSON {'array' if isinstance(value, list) else 'object'} of {len(value)} items"
    if isinstance(value, str) and len(value) > _QUOTED:
        value = value[:_QUOTED]
    text = repr(value)
    return text if len(text) <= _QUOTED else text[: _QUOTED - 3] + "..."


class _Refused(ValueError):
    """JSON that parses, refused while parsing (a repeated key)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"the key {quoted(key)} appears twice in an object")
            seen.add(key)
    return value


def parse_json(text: str) -> Any:
    """``text`` as JSON, or a ValueError of one bounded line.

    Objects with a repeated key and nesting deeper than the interpreter's
    stack are refused (NaN and Infinity are read as floats, for the caller's
    checks of each field); the caller bounds the length of ``text`` first, so
    the work is linear in it.
    """
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("it nests too deep to be what train writes") from None
    except _Refused:
        raise
    except ValueError as error:  # JSONDecodeError; an integer of over 4,300 digits
        raise ValueError(f"it is not JSON: {str(error)[:200]}") from None


def _count(name: str, value: Any, least: int = 0) -> int:
    """``value``, a field of the position, as a count in [least, MAX_COUNT]; else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"field '{name}': {quoted(value)} is not an integer")
    if not least <= value <= MAX_COUNT:
        raise ValueError(f"field '{name}': {quoted(value)} is not in [{least}, 2**63 - 1]")
    return value


@dataclasses.dataclass
class Position:
    """Where a run of ``train`` stands; saved as JSON with the model."""

    epoch: int = 0  # the epoch of the next batch
    start: int = 0  # rows of that epoch already taken
    step: int = 0  # steps ``train`` has run on this model, all runs together
    run_start: int = 0  # ``step`` when the current run began
    goal: int = 0  # ``step`` when the current run ends
    seconds: float = 0.0  # spent in the current run
    # What the position means: the same data and options give the same batches.
    rows: int = 0
    batch_size: int = 0
    shuffle: bool = False
    seed: int = 0
    drop_last: bool = False
    axes: dict[str, int] = dataclasses.field(default_factory=dict)

    def options(self) -> tuple[Any, ...]:
        return (self.rows, self.batch_size, self.shuffle, self.seed, self.drop_last, self.axes)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Position:
        """The position in ``text``, or a ValueError of one bounded line naming the field.

        Every field is checked as ``train`` writes it: counts in [0, 2**63 - 1]
        (rows and batch size from 1), seconds finite and >= 0, the flags
        booleans, the axes names and integers, and the fields together (the
        step between the run's start and goal, the rows taken a whole number
        of batches short of the rows), so a position read here starts a run
        that ``batches`` accepts.
        """
        if not isinstance(text, str) or len(text) > MAX_POSITION_CHARS:
            size = len(text) if isinstance(text, str) else type(text).__name__
            raise ValueError(
                f"it is {size} characters, more than the {MAX_POSITION_CHARS} train writes"
            )
        value = parse_json(text)
        if not isinstance(value, dict):
            raise ValueError(f"it is a JSON {type(value).__name__}, not an object")
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise ValueError(f"field {quoted(unknown[0])} is not one train writes")
        missing = [name for name in fields if name not in value]
        if missing:
            raise ValueError(f"field '{missing[0]}' is missing")
        counts = {
            name: _count(name, value[name], 1 if name in ("rows", "batch_size") else 0)
            for name in (
                "epoch",
                "start",
                "step",
                "run_start",
                "goal",
                "rows",
                "batch_size",
                "seed",
            )
        }
        seconds = value["seconds"]
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 <= seconds < math.inf
        ):
            raise ValueError(f"field 'seconds': {quoted(seconds)} is not a number >= 0")
        for name in ("shuffle", "drop_last"):
            if not isinstance(value[name], bool):
                raise ValueError(f"field '{name}': {quoted(value[name])} is not true or false")
        axes = value["axes"]
        if not isinstance(axes, dict):
            raise ValueError(f"field 'axes': {quoted(axes)} is not an object")
        for name, axis in axes.items():
            if isinstance(axis, bool) or not isinstance(axis, int) or not -64 <= axis < 64:
                raise ValueError(
                    f"field 'axes': the axis of {quoted(name)}, {quoted(axis)}, is not an "
                    "integer in [-64, 64)"
                )
        position = cls(
            **counts,
            seconds=float(seconds),
            shuffle=value["shuffle"],
            drop_last=value["drop_last"],
            axes=axes,
        )
        p = position
        if not p.run_start <= p.step <= p.goal:
            raise ValueError(
                f"fields 'run_start', 'step' and 'goal': {p.run_start}, {p.step} and "
                f"{p.goal} are not in order"
            )
        if p.batch_size > p.rows:
            raise ValueError(
                f"field 'batch_size': {p.batch_size} is more than the {p.rows} rows (field 'rows')"
            )
        if p.start >= p.rows:
            raise ValueError(
                f"field 'start': {p.start} is not below the {p.rows} rows (field 'rows')"
            )
        if p.start % p.batch_size:
            raise ValueError(
                f"field 'start': {p.start} is not a whole number of batches of {p.batch_size} "
                "(field 'batch_size')"
            )
        if p.drop_last and p.rows - p.start < p.batch_size:
            raise ValueError(
                f"field 'start': {p.start} leaves no whole batch of {p.batch_size} of the "
                f"{p.rows} rows, and 'drop_last' is true"
            )
        return position


class Interrupt:
    """SIGINT and SIGTERM handlers: the first asks the loop to save and stop after its step.

    A second signal while training (a long compilation, a slow step) quits at
    once without saving; while saving, signals wait for the save to end.
    """

    def __init__(self, say: Callable[[str], None]) -> None:
        self.signal: int | None = None
        self.saving = False
        self._say = say
        self._previous: dict[int, Any] = {}

    def _handle(self, number: int, frame: FrameType | None) -> None:
        del frame
        if self.signal is None:
            self.signal = number
            self._say(
                f"{signal.Signals(number).name}: saving after this step "
                "(again to quit without saving)"
            )
        elif not self.saving:
            raise KeyboardInterrupt

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)


# ----------------------------------------------------------------------------- files


def _read_arrays(path: str, names: list[str], what: str) -> dict[str, np.ndarray]:
    from onnx_optax._src.npz import read_npz

    if not os.path.isfile(path):
        raise UsageError(f"cannot read the {what} {path!r}: no such file")
    try:  # only the arrays a step reads, each checked against the size limit before inflating
        data, held = read_npz(path, names)
    except Exception as error:  # a stranger's file: any parse failure is a usage error
        raise UsageError(f"cannot read the {what} {path!r}: {error}") from None
    missing = [n for n in names if n not in data]
    if missing:
        shown = sorted(held)[:20]  # a zip may name a million members
        more = f" and {len(held) - len(shown)} more" if len(held) > len(shown) else ""
        raise UsageError(
            f"{path}: no array for the input(s) {missing}; the model trains on "
            f"{names} and the file holds {shown}{more}"
        )
    return {n: data[n] for n in names}


def _log_format(path: str) -> str:
    return "jsonl" if path.lower().endswith(".jsonl") else "csv"


def _write_log(path: str, columns: list[str], rows: list[dict[str, Any]]) -> None:
    if _log_format(path) == "jsonl":
        text = "".join(json.dumps({c: row.get(c) for c in columns}) + "\n" for row in rows)
    else:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if row.get(c) is None else row[c] for c in columns])
        text = buffer.getvalue()
    write_file(path, text.encode(), what="the log")


def _log_number(name: str, value: Any) -> float | None:
    """A value of column ``name`` of a log row: a number (None where it may be left empty)."""
    if value is None and name in ("val_loss", "val_accuracy", "learning_rate"):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"field '{name}': {quoted(value)} is not a number")
    number = float(value)
    if name in ("epoch", "seconds") and not 0 <= number < math.inf:
        raise ValueError(f"field '{name}': {quoted(value)} is not a number >= 0")
    if name == "val_accuracy" and not 0 <= number <= 1:
        raise ValueError(f"field '{name}': {quoted(value)} is not in [0, 1]")
    return number  # a loss or a rate may be NaN or infinite: train logs what it computed


def _log_row(row: Any, previous: int) -> dict[str, Any]:
    """One row of a log as train writes it (a JSON object, or CSV by its header), checked."""
    if not isinstance(row, dict):
        raise ValueError(f"it is {quoted(row)}, not an object of the columns")
    unknown = [name for name in row if name not in LOG_COLUMNS]
    if unknown:
        raise ValueError(f"field {quoted(unknown[0])} is not a column train writes")
    missing = [n for n in ("step", "epoch", "loss", "seconds") if n not in row]
    if missing:
        raise ValueError(f"field '{missing[0]}' is missing")
    step = row["step"]
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= MAX_COUNT:
        raise ValueError(f"field 'step': {quoted(step)} is not an integer in [1, 2**63 - 1]")
    if step <= previous:
        raise ValueError(f"field 'step': {step} does not follow the step {previous} before it")
    return {"step": step, **{n: _log_number(n, row[n]) for n in LOG_COLUMNS[1:] if n in row}}


def _csv_fields(text: str) -> list[str]:
    try:
        (fields,) = list(csv.reader([text.rstrip("\r\n")], strict=True)) or [[]]
    except (csv.Error, ValueError) as error:
        raise ValueError(f"it is not a line of CSV: {str(error)[:100]}") from None
    return fields


def _csv_row(header: list[str], text: str) -> dict[str, Any]:
    fields = _csv_fields(text)
    if len(fields) != len(header):
        raise ValueError(f"it has {len(fields)} fields, the header {len(header)}")
    row: dict[str, Any] = {}
    for name, field in zip(header, fields, strict=True):
        try:
            row[name] = None if not field else int(field) if name == "step" else float(field)
        except ValueError:
            raise ValueError(f"field '{name}': {quoted(field)} is not a number") from None
    return row


def _read_log(path: str, last: int) -> list[dict[str, Any]]:
    """The rows of the earlier log ``path`` up to step ``last``, for a resumed run.

    The log is a stranger's file too: it is read as train writes it, a line at a
    time (each at most :data:`MAX_LOG_LINE` bytes, all at most
    :data:`MAX_LOG_BYTES`), never through a symbolic link, and every row is
    checked (its columns, the step after the one before, the numbers). Raises
    UsageError naming the log, the line and the field.
    """
    where = f"the log {path!r}"
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        descriptor = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        if os.path.islink(path):
            raise UsageError(
                f"{where} is a symbolic link: train reads back only the log it wrote, a file "
                "(give another --log)"
            ) from None
        raise UsageError(f"cannot read {where}: {error.strerror}") from None
    rows: list[dict[str, Any]] = []
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise UsageError(f"cannot read {where}: it is not a file")
        jsonl = _log_format(path) == "jsonl"
        header: list[str] | None = None
        previous, size = 0, 0
        for number in itertools.count(1):
            line = file.readline(MAX_LOG_LINE + 1)
            if not line:
                break
            size += len(line)
            if size > MAX_LOG_BYTES:
                raise UsageError(
                    f"{where} is more than the {MAX_LOG_BYTES} bytes train reads back "
                    "(give another --log)"
                )
            try:
                if len(line) > MAX_LOG_LINE:
                    raise ValueError(f"it is longer than the {MAX_LOG_LINE} bytes of a row")
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError("it is not UTF-8") from None
                if not text.strip():
                    continue
                if jsonl:
                    row = _log_row(parse_json(text), previous)
                elif header is None:
                    header = _csv_fields(text)
                    needed = ("step", "epoch", "loss", "seconds")
                    if (
                        any(n not in LOG_COLUMNS for n in header)
                        or len(set(header)) != len(header)
                        or any(n not in header for n in needed)
                    ):
                        raise ValueError(
                            f"its header {quoted(','.join(header))} is not of the columns "
                            f"{','.join(LOG_COLUMNS)}, each once, with {','.join(needed)}"
                        )
                    continue
                else:
                    row = _log_row(_csv_row(header, text), previous)
            except ValueError as error:
                raise UsageError(f"{where}, line {number}: {error}") from None
            previous = row["step"]
            if row["step"] <= last:
                rows.append(row)
    return rows


def log_scale(values: list[float]) -> bool:
    """Whether losses read better on a log scale: all positive, spanning more than two decades."""
    return bool(values) and min(values) > 0 and max(values) / min(values) > 100


def plot(path: str, title: str, rows: list[dict[str, Any]]) -> None:
    """Training and validation loss against the step, as a PNG written through the one writer.

    The y axis is logarithmic when the (positive) losses span more than two decades.
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.5, 4.5), layout="constrained")
    axes = figure.subplots()
    curves = [
        ("loss", "training loss (mean since the previous point)", "-"),
        ("val_loss", "validation loss", "o-"),
    ]
    values: list[float] = []
    for key, label, style in curves:
        points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        points = [(s, v) for s, v in points if math.isfinite(v)]
        if points:
            steps, losses = zip(*points, strict=True)
            axes.plot(steps, losses, style, label=label, markersize=3)
            values.extend(losses)
    if log_scale(values):
        axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.set_ylabel("loss" + (" (log scale)" if axes.get_yscale() == "log" else ""))
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    if values:
        axes.legend()
    write_file(path, lambda file: figure.savefig(file, format="png", dpi=110), what="the plot")


# ----------------------------------------------------------------------------- the loop


def _saved_position(model: Any, path: str) -> Position | None:
    """The position a train saved in ``model`` (read from ``path``), checked; None if none.

    A position that is not one train writes is a UsageError naming the model,
    the metadata entry and the field.
    """
    values = [p.value for p in model.metadata_props if p.key == POSITION_KEY]
    if not values:
        return None
    where = f"{path}: metadata '{POSITION_KEY}' (where a train stopped)"
    if len(values) > 1:
        raise UsageError(f"{where} appears {len(values)} times")
    try:
        return Position.from_json(values[0])
    except ValueError as error:
        raise UsageError(f"{where}: {error}") from None


class Progress:
    """A tqdm bar on a terminal; otherwise a line at each logged step; nothing with --quiet."""

    def __init__(self, quiet: bool, total: int, done: int) -> None:
        from tqdm import tqdm

        self.bar_on = not quiet and sys.stderr.isatty()
        self.lines = not quiet and not self.bar_on
        self.bar = tqdm(
            total=total,
            initial=done,
            unit="step",
            file=sys.stderr,
            disable=not self.bar_on,
            dynamic_ncols=True,
            smoothing=0.1,
        )

    def say(self, text: str) -> None:
        """A line on stderr that does not break the bar."""
        text = one_line(text)
        if self.bar_on:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        self.bar.close()


def _options(args: argparse.Namespace, rows: int, axes: dict[str, int]) -> Position:
    return Position(
        rows=rows,
        batch_size=args.batch_size,
        shuffle=args.shuffle,
        seed=args.seed,
        drop_last=args.drop_last,
        axes=dict(sorted(axes.items())),
    )


def run_train(args: argparse.Namespace, axes: dict[str, int]) -> int:
    """``onnx-optax train`` once its arguments are checked; returns the exit status."""
    training: ModuleType = _training()
    model = _read_model(training, args.model)
    saved = _saved_position(model, args.model)
    try:
        session = training.Session(model, seed=args.seed)  # Dropout's masks, if it drops
    except training.TrainingModelError as error:
        print(str(error), file=sys.stderr)
        return EXIT_FAILED
    except (TypeError, ValueError, NotImplementedError) as error:
        raise UsageError(f"{args.model}: {error}") from None
    unknown = sorted(set(axes) - set(session.inputs))
    if unknown:
        raise UsageError(
            f"--batch-axis names {unknown}, which the model does not read; a step reads "
            f"{session.inputs}"
        )
    data = _read_arrays(args.data, session.inputs, "data")
    val = _read_arrays(args.val_data, session.inputs, "validation data") if args.val_data else {}

    def epoch_of(source: dict[str, np.ndarray], name: str, **kwargs: Any) -> Any:
        try:
            return training.batches(source, args.batch_size, axis=axes, **kwargs)
        except ValueError as error:
            raise UsageError(f"{name}: {error}") from None

    rows = epoch_of(data, args.data).rows
    if args.batch_size > rows:
        raise UsageError(f"--batch-size {args.batch_size} is larger than the {rows} rows of data")
    if val and not epoch_of(val, args.val_data).rows:
        raise UsageError(f"{args.val_data}: the arrays have no rows to validate on")
    options = _options(args, rows, axes)
    position = dataclasses.replace(options)
    resumed = False
    if saved is not None:
        position.step = position.run_start = saved.step
        if saved.options() == options.options():
            position.epoch, position.start = saved.epoch, saved.start
            if saved.step < saved.goal:  # an interrupted run: finish it
                resumed = True
                position.run_start, position.seconds = saved.run_start, saved.seconds
        else:
            print(
                "note: the model was saved by a train with other data or options (rows, "
                "--batch-size, --shuffle, --seed, --drop-last, --batch-axis); its batches "
                "start again from epoch 0",
                file=sys.stderr,
            )
    per_epoch = len(epoch_of(data, args.data, drop_last=args.drop_last))
    position.goal = position.run_start + (args.steps or args.epochs * per_epoch)
    if position.goal > MAX_COUNT:
        raise UsageError(
            f"{'--steps' if args.steps else '--epochs'} would end the run after step "
            f"{position.goal}, beyond the 2**63 - 1 steps a model counts"
        )
    if position.goal <= position.step:
        raise UsageError(
            f"the saved run stopped after {position.step - position.run_start} of its steps: "
            f"{'--steps ' + str(args.steps) if args.steps else '--epochs ' + str(args.epochs)} "
            "leaves none to run"
        )
    # The earlier log's rows, checked before anything is said or written.
    logged = (
        _read_log(args.log, position.step)
        if resumed and args.log and os.path.lexists(args.log)
        else []
    )
    if resumed:
        print(
            f"resuming the run at step {position.step - position.run_start} of "
            f"{position.goal - position.run_start} (epoch {position.epoch}, row "
            f"{position.start} of {rows})",
            file=sys.stderr,
        )
    return Loop(args, training, model, session, data, val, axes, position, logged).run()


def _read(reader: Callable[[Any], tuple[Any, str]], model: Any, what: str) -> tuple[Any, str]:
    """``reader(model)``, one of _metrics' (a result and "", or None and why not); an error
    reading a stranger's model there is a why not."""
    try:
        return reader(model)
    except (TypeError, ValueError, KeyError, IndexError, OverflowError) as error:
        return None, f"{what} cannot be read from the model: {error}"


class Loop:
    """One run of ``train``: steps until the goal or a signal, with what reports on them."""

    def __init__(
        self,
        args: argparse.Namespace,
        training: ModuleType,
        model: Any,
        session: Any,
        data: dict[str, np.ndarray],
        val: dict[str, np.ndarray],
        axes: dict[str, int],
        position: Position,
        logged: list[dict[str, Any]],
    ) -> None:
        from onnx_optax.training import _metrics

        self.args, self.training, self.model, self.session = args, training, model, session
        self.data, self.val, self.axes, self.position = data, val, axes, position
        self.metrics = _metrics
        self.first_step = position.step  # of this process
        self.rate, why = _read(_metrics.learning_rate, model, "R")
        self.columns = ["step", "epoch", "loss"]
        if val:
            self.columns.append("val_loss")
            self.scores, why_not = _read(_metrics.class_scores, model, "the class scores")
            if self.scores is not None:
                self.columns.append("val_accuracy")
        else:
            self.scores, why_not = None, ""
        if self.rate is not None:
            self.columns.append("learning_rate")
        self.columns.append("seconds")
        self.notes: list[str] = []
        if args.log and self.rate is None:
            self.notes.append(f"note: the log has no learning_rate: {why}")
        if val and self.scores is None:
            self.notes.append(f"note: no validation accuracy: {why_not}")
        self.rows = logged  # of the earlier log, for a resumed run
        self.val_every = args.val_every or len(
            training.batches(data, args.batch_size, axis=axes, drop_last=args.drop_last)
        )
        self.sums: dict[str, float] = {}
        self.count = 0
        self.loss: str | None = None
        self.last_val: dict[str, float] = {}
        self.logged_at = 0.0
        self.started = self.first_done = time.monotonic()

    # -- reports

    def _row_due(self, step: int) -> bool:
        p, a = self.position, self.args
        return (
            step == p.run_start + 1
            or step == p.goal
            or step % a.log_every == 0
            or (bool(self.val) and step % self.val_every == 0)
        )

    def _validate(self) -> dict[str, float]:
        total, seen, right, counted = 0.0, 0, 0, 0
        assert self.loss is not None
        epoch = self.training.batches(self.val, self.args.batch_size, axis=self.axes)
        for index, batch in enumerate(epoch):
            n = min(self.args.batch_size, epoch.rows - index * self.args.batch_size)
            try:
                outputs = self.session.evaluate(batch)
            except (TypeError, ValueError, NotImplementedError) as error:
                raise UsageError(f"{self.args.val_data}: {error}") from None
            total += float(np.mean(outputs[self.loss])) * n
            seen += n
            if self.scores is not None:
                try:
                    values = self.session.run(batch, [self.scores.output])[self.scores.output]
                    good, all_ = self.metrics.correct(
                        self.scores, np.asarray(values), batch[self.scores.target]
                    )
                except (TypeError, ValueError, NotImplementedError) as error:
                    self.progress.say(f"note: no validation accuracy: {error}")
                    self.scores = None
                    self.columns.remove("val_accuracy")
                    continue
                right, counted = right + good, counted + all_
        result = {"val_loss": total / seen}
        if self.scores is not None and counted:
            result["val_accuracy"] = right / counted
        return result

    def _report(self, step: int, outputs: Mapping[str, np.ndarray]) -> None:
        for name, value in outputs.items():
            if np.asarray(value).dtype.kind in "biuf":  # the numbers a step reports
                self.sums[name] = self.sums.get(name, 0.0) + float(np.mean(value))
        self.count += 1
        p = self.position
        epochs = p.epoch + p.start / p.rows
        assert self.loss is not None
        if self.progress.bar_on:
            postfix = {"epoch": f"{epochs:.2f}", "loss": f"{self.sums[self.loss] / self.count:.4g}"}
            postfix.update({k: f"{v:.4g}" for k, v in self.last_val.items()})
            self.progress.bar.set_postfix(postfix, refresh=False)
            self.progress.bar.update(1)
        if not self._row_due(step):
            return
        means = {k: v / self.count for k, v in self.sums.items()}
        self.sums, self.count = {}, 0
        row: dict[str, Any] = {"step": step, "epoch": round(epochs, 6), "loss": means[self.loss]}
        if self.val and (step % self.val_every == 0 or step == p.goal):
            self.last_val = self._validate()
            row.update(self.last_val)
        if self.rate is not None:
            counted = self.rate.stored + (step - 1 - self.first_step) * self.rate.counts
            try:
                row["learning_rate"] = self.rate.rate(counted)
            except (TypeError, ValueError, NotImplementedError, IndexError) as error:
                self.progress.say(f"note: the log has no learning_rate from here: {error}")
                self.rate = None
                self.columns.remove("learning_rate")
        row["seconds"] = round(p.seconds + time.monotonic() - self.started, 3)
        self.rows.append(row)
        if self.progress.lines:
            shown = " ".join(f"{k}={v:.6g}" for k, v in means.items())
            extra = "".join(f" {k}={row[k]:.6g}" for k in ("val_loss", "val_accuracy") if k in row)
            rate = ""
            if step > self.first_step + 1:
                done = step - self.first_step - 1
                rate = f" {done / max(time.monotonic() - self.first_done, 1e-9):.3g} steps/s"
            self.progress.say(
                f"step {step - p.run_start}/{p.goal - p.run_start} {shown}{extra} "
                f"epoch={epochs:.4g}{rate}"
            )
        if self.args.log and time.monotonic() - self.logged_at > LOG_SECONDS:
            self._write_reports()

    def _write_reports(self) -> None:
        if self.args.log:
            _write_log(self.args.log, self.columns, self.rows)
            self.logged_at = time.monotonic()
        if self.args.plot:
            plot(self.args.plot, os.path.basename(self.args.output), self.rows)

    def save(self, interrupt: Interrupt) -> None:
        """The model, its position, the log and the plot, each written whole or not at all."""
        p = self.position
        p.seconds = round(p.seconds + time.monotonic() - self.started, 3)
        self.started = time.monotonic()
        interrupt.saving = True
        try:
            self.session.save(self.args.output, metadata={POSITION_KEY: p.to_json()})
            self._write_reports()
        except (ValueError, OSError) as error:
            raise SaveError(str(error)) from None
        finally:
            interrupt.saving = False

    # -- the steps

    def _epoch(self) -> Iterator[dict[str, np.ndarray]]:
        """The batches of the position's epoch from its row on."""
        p, a = self.position, self.args
        try:
            epoch = self.training.batches(
                self.data,
                a.batch_size,
                shuffle=a.shuffle,
                seed=a.seed,
                axis=self.axes,
                epoch=p.epoch,
                start=p.start,
                drop_last=a.drop_last,
            )
        except ValueError as error:  # the position was checked where it was read
            raise UsageError(f"{a.model}: metadata '{POSITION_KEY}': {error}") from None
        return iter(epoch)

    def run(self) -> int:
        p, a = self.position, self.args
        self.started = self.first_done = time.monotonic()
        self.progress = Progress(a.quiet, p.goal - p.run_start, p.step - p.run_start)
        for note in self.notes:
            self.progress.say(note)
        with Interrupt(self.progress.say) as interrupt:
            try:
                status = self._steps(interrupt)
            finally:
                self.progress.close()
        if a.inference:
            inference = self.session.to_inference_model()
            drop_position(inference)  # the model's when it was read: no run to resume
            _write_model(inference, a.inference)
        if status == EXIT_OK:
            print(f"wrote {a.output}", file=sys.stderr)
        else:
            print(
                f"interrupted ({signal.Signals(status - 128).name}) at step "
                f"{p.step - p.run_start} of {p.goal - p.run_start}: wrote {a.output}; a train "
                "on it with the same options finishes the run",
                file=sys.stderr,
            )
        if a.inference:
            print(f"wrote {a.inference}", file=sys.stderr)
        return status

    def _steps(self, interrupt: Interrupt) -> int:
        p, a = self.position, self.args
        try:
            batches = self._epoch()
            while p.step < p.goal and interrupt.signal is None:
                batch = next(batches, None)
                if batch is None:  # the position leaves no batch: checked where it is read
                    raise UsageError(
                        f"{a.model}: metadata '{POSITION_KEY}': epoch {p.epoch} has no batch "
                        f"after row {p.start}"
                    )
                try:
                    outputs = self.session.step(batch)
                except (TypeError, ValueError, NotImplementedError) as error:
                    raise UsageError(f"{a.data}: {error}") from None
                p.step += 1
                p.start += min(a.batch_size, p.rows - p.start)
                if p.start >= p.rows or (a.drop_last and p.rows - p.start < a.batch_size):
                    p.epoch, p.start = p.epoch + 1, 0
                    batches = self._epoch()
                if self.loss is None:
                    numbers = [n for n, v in outputs.items() if np.asarray(v).dtype.kind in "biuf"]
                    self.loss = self.metrics.loss_output(self.model, numbers)
                    self.first_done = time.monotonic()
                    if self.loss is None:
                        raise UsageError(
                            f"{a.model}: a step reports no output of numbers (no loss to show)"
                        )
                self._report(p.step, outputs)
                if a.save_every and p.step % a.save_every == 0 and p.step < p.goal:
                    self.save(interrupt)
        except Exception as error:  # a usage error, or one no check foresaw
            if p.step == self.first_step or isinstance(error, SaveError):
                raise
            self.save(interrupt)  # keep what the steps before the error did
            if not isinstance(error, UsageError) and os.environ.get(TRACEBACK_VARIABLE):
                raise
            said = error if isinstance(error, UsageError) else _unforeseen(error)
            raise UsageError(
                f"{said} (the state after step {p.step - p.run_start} of the run is saved in "
                f"{a.output}; a train on it resumes there)"
            ) from None
        self.save(interrupt)
        if interrupt.signal is None or p.step == p.goal:  # a signal after the last step
            return EXIT_OK
        return 128 + interrupt.signal
