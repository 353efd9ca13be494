"""``onnx-optax train``: epochs of batches, progress, validation, logs, curves, checkpoints.

The loop's position (epoch, rows of the epoch taken, seed, steps done, where
the run began and ends) travels in the saved model's ``metadata_props`` under
:data:`POSITION_KEY`, so ``train`` on a saved model continues the same
sequence of batches: an interrupted run, resumed with the same options, ends
bit-identical to one that never stopped. Every file goes through
:mod:`onnx_optax._src.write` (a new file renamed into place), so an interrupt
never leaves half a model, log or plot.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import FrameType, ModuleType
from typing import Any

import numpy as np

from onnx_optax._src.write import write_file
from onnx_optax.cli import EXIT_FAILED, EXIT_OK, UsageError, _read_model, _training, _write_model

# The key of the saved model's metadata_props holding the loop's position (JSON).
POSITION_KEY = "onnx_optax.train"
# A log file is rewritten at most this often (and at every save and at the end).
LOG_SECONDS = 5.0


class SaveError(UsageError):
    """A checkpoint, log or plot could not be written (exit status 2)."""


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
        """The position in ``text``, or a ValueError saying what is wrong with it."""
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - set(fields))
        if unknown or set(value) != set(fields):
            raise ValueError(f"its fields are {sorted(value)}, not {sorted(fields)}")
        for name, field in fields.items():
            kinds: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float)}
            want = {**kinds, "bool": (bool,)}.get(str(field.type), (dict,))
            item = value[name]
            if not isinstance(item, want) or (bool not in want and isinstance(item, bool)):
                raise ValueError(f"'{name}' is {item!r}")
        position = cls(**value)
        if (
            min(position.epoch, position.start, position.step, position.run_start) < 0
            or not position.run_start <= position.step
            or not all(isinstance(k, str) and isinstance(a, int) for k, a in position.axes.items())
        ):
            raise ValueError(f"it does not hold together: {text}")
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
        raise UsageError(
            f"{path}: no array for the input(s) {missing}; the model trains on "
            f"{names} and the file holds {sorted(held)}"
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


def _read_log(path: str, last: int) -> list[dict[str, Any]]:
    """The rows of an earlier log up to step ``last`` (for a resumed run); [] if unreadable."""
    try:
        with open(path, encoding="utf-8") as file:
            if _log_format(path) == "jsonl":
                rows = [json.loads(line) for line in file if line.strip()]
            else:
                rows = [
                    {k: (float(v) if v else None) for k, v in row.items()}
                    for row in csv.DictReader(file)
                ]
        kept = [r for r in rows if isinstance(r, dict) and float(r["step"]) <= last]
        for row in kept:
            row["step"] = int(row["step"])
        return kept
    except (OSError, ValueError, KeyError, TypeError):
        return []


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


def _saved_position(model: Any, say: Callable[[str], None]) -> Position | None:
    props = {p.key: p.value for p in model.metadata_props}
    if POSITION_KEY not in props:
        return None
    try:
        return Position.from_json(props[POSITION_KEY])
    except ValueError as error:
        say(f"note: ignoring the saved position ({POSITION_KEY}): {error}")
        return None


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
    if val:
        epoch_of(val, args.val_data)
    options = _options(args, rows, axes)
    saved = _saved_position(model, lambda text: print(text, file=sys.stderr))
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
    if position.goal <= position.step:
        raise UsageError(
            f"the saved run stopped after {position.step - position.run_start} of its steps: "
            f"{'--steps ' + str(args.steps) if args.steps else '--epochs ' + str(args.epochs)} "
            "leaves none to run"
        )
    if resumed:
        print(
            f"resuming the run at step {position.step - position.run_start} of "
            f"{position.goal - position.run_start} (epoch {position.epoch}, row "
            f"{position.start} of {rows})",
            file=sys.stderr,
        )
    return Loop(args, training, model, session, data, val, axes, position, resumed).run()


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
        resumed: bool,
    ) -> None:
        from onnx_optax.training import _metrics

        self.args, self.training, self.model, self.session = args, training, model, session
        self.data, self.val, self.axes, self.position = data, val, axes, position
        self.metrics = _metrics
        self.first_step = position.step  # of this process
        self.rate, why = _metrics.learning_rate(model)
        self.columns = ["step", "epoch", "loss"]
        if val:
            self.columns.append("val_loss")
            self.scores, why_not = _metrics.class_scores(model)
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
        self.rows: list[dict[str, Any]] = []
        if resumed and args.log and os.path.isfile(args.log):
            self.rows = _read_log(args.log, position.step)
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
            row["learning_rate"] = self.rate.rate(counted)
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
        return iter(
            self.training.batches(
                self.data,
                a.batch_size,
                shuffle=a.shuffle,
                seed=a.seed,
                axis=self.axes,
                epoch=p.epoch,
                start=p.start,
                drop_last=a.drop_last,
            )
        )

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
            _write_model(self.session.to_inference_model(), a.inference)
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
        batches = self._epoch()
        try:
            while p.step < p.goal and interrupt.signal is None:
                batch = next(batches)
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
                    self.loss = self.metrics.loss_output(self.model, list(outputs))
                    self.first_done = time.monotonic()
                    if self.loss is None:
                        raise UsageError(f"{a.model}: a step reports no output (no loss to show)")
                self._report(p.step, outputs)
                if a.save_every and p.step % a.save_every == 0 and p.step < p.goal:
                    self.save(interrupt)
        except UsageError as error:
            if p.step == self.first_step or isinstance(error, SaveError):
                raise
            self.save(interrupt)  # keep what the steps before the error did
            raise UsageError(
                f"{error} (the state after step {p.step - p.run_start} of the run is saved in "
                f"{a.output}; a train on it resumes there)"
            ) from None
        self.save(interrupt)
        if interrupt.signal is None or p.step == p.goal:  # a signal after the last step
            return EXIT_OK
        return 128 + interrupt.signal
