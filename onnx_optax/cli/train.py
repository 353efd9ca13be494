"""``onnx-optax train``: its options and their checks (each file writable, no output
replacing an input); the run itself is :mod:`onnx_optax.cli.trainer`'s."""

from __future__ import annotations

import argparse

from onnx_optax._src.extras import require
from onnx_optax.cli.common import Commands, UsageError, file_key, writable_file
from onnx_optax.cli.trainer import run_train


def _batch_axes(specs: list[str] | None) -> dict[str, int]:
    """``--batch-axis NAME=AXIS`` options as a mapping from name to axis."""
    axes: dict[str, int] = {}
    for spec in specs or []:
        name, _, axis = spec.rpartition("=")
        try:
            number = int(axis)
        except ValueError:
            number = None
        if not name or number is None:
            raise UsageError(f"--batch-axis takes NAME=AXIS (such as target=1), got {spec!r}")
        if name in axes:
            raise UsageError(f"--batch-axis names '{name}' twice")
        axes[name] = number
    return axes


def run(args: argparse.Namespace) -> int:
    """``onnx-optax train``: every option and file checked before the run starts."""
    for option, value, least in (
        ("--steps", args.steps, 1),
        ("--epochs", args.epochs, 1),
        ("--batch-size", args.batch_size, 1),
        ("--log-every", args.log_every, 1),
        ("--val-every", args.val_every, 1),
        ("--save-every", args.save_every, 1),
        ("--seed", args.seed, 0),
    ):
        if value is not None and value < least:
            raise UsageError(f"{option} must be at least {least}, got {value}")
    if args.val_every is not None and not args.val_data:
        raise UsageError("--val-every needs --val-data")
    axes = _batch_axes(args.batch_axis)
    writable_file(args.output, "the model")
    written = {file_key(args.output): "-o"}
    for path, what, option in (
        (args.inference, "inference model", "--inference"),
        (args.log, "log", "--log"),
        (args.plot, "plot", "--plot"),
    ):
        if path:
            writable_file(path, f"the {what}")
            if file_key(path) in written:  # one write would replace the other's file
                raise UsageError(
                    f"{option} {path!r} is the file {written[file_key(path)]} names; give "
                    "each output its own file"
                )
            written[file_key(path)] = option
    for path, option in (
        (args.model, "the model"),
        (args.data, "--data"),
        (args.val_data, "--val-data"),
    ):
        writer = written.get(file_key(path)) if path else None
        if writer and not (writer == "-o" and option == "the model"):  # -o may replace the model
            raise UsageError(
                f"{writer} names the file {option} reads ({path!r}); give each output its own file"
            )
    if args.plot:
        require("onnx-optax train --plot", "examples", "matplotlib")
    return run_train(args, axes)


def _batch_options(train: argparse.ArgumentParser) -> None:
    """The batches: their size, order, seed, last batch and axes."""
    train.add_argument("--batch-size", type=int, default=32, help="rows a step (default: 32)")
    train.add_argument(
        "--shuffle",
        action="store_true",
        help="shuffle the rows of each epoch, in an order that depends on --seed and the "
        "epoch alone (default: in order)",
    )
    train.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the shuffling and of training-mode Dropout's masks (default: 0)",
    )
    train.add_argument(
        "--drop-last",
        action="store_true",
        help="leave out each epoch's last batch when it is smaller than --batch-size (one "
        "shape, one compilation)",
    )
    train.add_argument(
        "--batch-axis",
        action="append",
        metavar="NAME=AXIS",
        help="the batch axis of input NAME (repeat; default 0; target=1 for a time-major "
        "[T, N] target)",
    )


def _report_options(train: argparse.ArgumentParser) -> None:
    """Validation, the log, the plot, checkpoints, progress and the files written."""
    train.add_argument(
        "--val-data", metavar="FILE", help=".npz file of validation arrays, named as --data's"
    )
    train.add_argument(
        "--val-every",
        type=int,
        metavar="K",
        help="validation loss (and accuracy, for class targets) every K steps and at the end "
        "(default: every epoch)",
    )
    train.add_argument(
        "--log-every",
        type=int,
        default=10,
        metavar="K",
        help="a line of progress (without a terminal) and a row of the log every K steps "
        "(default: 10)",
    )
    train.add_argument(
        "--log",
        metavar="FILE",
        help="the log: CSV, or JSON lines if FILE ends in .jsonl (step, epoch, loss, "
        "validation, learning rate, seconds)",
    )
    train.add_argument(
        "--plot",
        metavar="FILE.png",
        help="the training and validation loss curves (needs the examples extra)",
    )
    train.add_argument(
        "--save-every",
        type=int,
        metavar="K",
        help="also write the model every K steps (default: at the end and on SIGINT/SIGTERM)",
    )
    train.add_argument(
        "--quiet", action="store_true", help="no progress bar or progress lines on stderr"
    )
    train.add_argument(
        "-o",
        "--output",
        required=True,
        help="the trained model to write (each save replaces it whole)",
    )
    train.add_argument(
        "--inference",
        metavar="PATH",
        help="also write the inference model: the trained weights, no training_info or state",
    )


def add_parser(commands: Commands) -> None:
    """Adds ``train`` and its options to ``commands``."""
    train = commands.add_parser(
        "train",
        help="train a model from its own training_info on arrays of an .npz file",
        description="Run the model's training_info on batches of the arrays in --data (named "
        "as the inputs a step reads, one row per example along each one's batch axis) for "
        "--steps steps or --epochs epochs, show the progress on stderr and write the trained "
        "model. The model records where the run stands (epoch, row, seed, steps), so a "
        "train on it continues the same sequence of batches: after an interrupt (SIGINT or "
        "SIGTERM saves, then exits 128 + the signal: 130 for Ctrl-C), the same command on "
        "the saved model finishes the run exactly as if it had not stopped.",
    )
    train.add_argument("model", help="the training model (.onnx)")
    train.add_argument("--data", required=True, help=".npz file of arrays named as the inputs")
    length = train.add_mutually_exclusive_group(required=True)
    length.add_argument("--steps", type=int, help="steps of the run")
    length.add_argument(
        "--epochs", type=int, help="passes over the data (the batches of an epoch, times N)"
    )
    _batch_options(train)
    _report_options(train)
    train.set_defaults(run=run)
