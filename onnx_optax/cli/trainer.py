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
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

import numpy as np

from onnx_optax._src.limits import MAX_COUNT
from onnx_optax._src.npz import read_npz
from onnx_optax.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    POSITION_KEY,  # of the saved model's metadata_props: the loop's position (JSON)
    TRACEBACK_VARIABLE,
    UsageError,
    drop_position,
    read_model,
    training_module,
    unforeseen,
    write_model,
)
from onnx_optax.cli.curves import plot
from onnx_optax.cli.interrupt import Interrupt
from onnx_optax.cli.position import Position, saved_position
from onnx_optax.cli.progress import Progress
from onnx_optax.cli.train_log import LOG_SECONDS, read_log, write_log


class SaveError(UsageError):
    """A checkpoint, log or plot could not be written (exit status 2)."""


def _read_arrays(path: str, names: list[str], what: str) -> dict[str, np.ndarray]:
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
    training: ModuleType = training_module()
    model = read_model(training, args.model)
    saved = saved_position(model, args.model)
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
        read_log(args.log, position.step)
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
            write_log(self.args.log, self.columns, self.rows)
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
            write_model(inference, a.inference)
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
            said = error if isinstance(error, UsageError) else unforeseen(error)
            raise UsageError(
                f"{said} (the state after step {p.step - p.run_start} of the run is saved in "
                f"{a.output}; a train on it resumes there)"
            ) from None
        self.save(interrupt)
        if interrupt.signal is None or p.step == p.goal:  # a signal after the last step
            return EXIT_OK
        return 128 + interrupt.signal
