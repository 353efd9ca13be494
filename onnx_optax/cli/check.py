"""``onnx-optax check``: its options, and the problems of a training model's training_info
(and of the position a train saved in it), one a line."""

from __future__ import annotations

import argparse
import sys

from onnx_optax.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    Commands,
    UsageError,
    one_line,
    read_model,
    training_module,
)
from onnx_optax.cli.position import saved_position


def run(args: argparse.Namespace) -> int:
    """``onnx-optax check``: one problem a line; exit 1 if any blocks."""
    training = training_module()
    model = read_model(training, args.model)
    try:
        problems = training.check(model)
    except (TypeError, ValueError, NotImplementedError) as error:
        raise UsageError(f"{args.model}: {error}") from None
    blocking: list[object] = [p for p in problems if p.blocking]
    for problem in problems:  # one problem a line, whatever names the model holds
        print(one_line(str(problem) if problem.blocking else f"warning: {problem}"))
    try:  # where a train stopped, as train reads it
        saved_position(model, args.model)
    except UsageError as error:
        print(one_line(str(error)))
        blocking.append(error)
    if blocking:
        print(f"{args.model}: {len(blocking)} problem(s)", file=sys.stderr)
        return EXIT_FAILED
    warned = len(problems) - len(blocking)
    print(f"{args.model}: ok" + (f" ({warned} warning(s))" if warned else ""))
    return EXIT_OK


def add_parser(commands: Commands) -> None:
    """Adds ``check`` and its options to ``commands``."""
    check = commands.add_parser(
        "check",
        help="check a training model's training_info (exit 1 and the list of problems)",
        description="Check what the ONNX checker does not: bindings, Gradient xs and y, "
        "optimizer state, T + 1, shapes. Exit 0 if sound, 1 with one problem a line. Lines "
        "starting 'warning:' (a constant or a weight the loss does not reach, trained) do not "
        "fail the check.",
    )
    check.add_argument("model", help="the model (.onnx)")
    check.set_defaults(run=run)
