"""The ``onnx-optax`` command line: ``demo``, ``conformance``, ``bench``, ``attach``,
``check`` and ``train``.

Exit status: 0 success (every conformance case passes), 1 a check failed (a
conformance case, a training model's problems), 2 a usage error (a file that
cannot be read, a model the command cannot read or check, data that do not fit
the model, a position or log ``train`` did not write) or a missing optional
dependency, 128 + the signal after an interrupt (130 for Ctrl-C; ``train``
saves first). With no command, ``onnx-optax`` prints its help and exits 2.
Every error is one line on stderr, never a traceback: an exception no check
foresaw is exit 2 too, its line naming its type and where it was raised.

The wing: one module a command (:mod:`~onnx_optax.cli.demo`,
:mod:`~onnx_optax.cli.conformance`, :mod:`~onnx_optax.cli.bench`,
:mod:`~onnx_optax.cli.attach`, :mod:`~onnx_optax.cli.check`,
:mod:`~onnx_optax.cli.train`), each owning its options (``add_parser``) and its
``run``; what they share in :mod:`~onnx_optax.cli.common`; ``train``'s loop in
:mod:`~onnx_optax.cli.trainer` and the modules it reads (position, log, curves,
progress, interrupt). This module only assembles the parser and runs a command.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import onnx_optax
from onnx_optax._src.extras import MissingExtraError
from onnx_optax._src.host_memory import reuse_host_memory
from onnx_optax.cli import attach, bench, check, conformance, demo, train
from onnx_optax.cli.attach import (  # the names cli.py had before it became a package
    DEFAULT_LEARNING_RATE,
    GLOB,
    HYPERPARAMETER_HELP,
    HYPERPARAMETERS,
    MOMENTUM_DEFAULTS,
    SCHEDULE_DEFAULTS,
    SCHEDULE_RATE,
    SCHEDULES,
    WEIGHT_DECAY,
)
from onnx_optax.cli.bench import BENCHMARK, find_benchmark
from onnx_optax.cli.common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    MESSAGE_CHARACTERS,
    POSITION_KEY,
    TRACEBACK_VARIABLE,
    UsageError,
    drop_position,
    one_line,
    unforeseen,
)

__all__ = [
    "BENCHMARK",
    "DEFAULT_LEARNING_RATE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "GLOB",
    "HYPERPARAMETERS",
    "HYPERPARAMETER_HELP",
    "MESSAGE_CHARACTERS",
    "MOMENTUM_DEFAULTS",
    "POSITION_KEY",
    "SCHEDULES",
    "SCHEDULE_DEFAULTS",
    "SCHEDULE_RATE",
    "TRACEBACK_VARIABLE",
    "WEIGHT_DECAY",
    "UsageError",
    "build_parser",
    "drop_position",
    "find_benchmark",
    "main",
    "one_line",
]


def build_parser() -> argparse.ArgumentParser:
    """The ``onnx-optax`` parser: each command adds its own options."""
    parser = argparse.ArgumentParser(
        prog="onnx-optax",
        description="ONNX training operators (Adagrad, Adam, Momentum) on JAX/XLA.",
        epilog="exit status: 0 success, 1 a check failed (conformance), 2 a usage error or a "
        "missing optional dependency, 130 interrupted (train saves first)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {onnx_optax.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (demo, conformance, bench, attach, check, train):
        command.add_parser(commands)
    return parser


# The commands that run ONNX graphs tune the process first (onnx_optax.reuse_host_memory):
# demo and bench time optax and Flax code, as they did before the tuning became a call.
GRAPH_COMMANDS = frozenset({"attach", "check", "train", "conformance"})


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``onnx-optax`` command: ``demo``, ``conformance``, ``bench``,
    ``attach``, ``check``, ``train``.

    Returns the process exit status: 0 success, 1 a check failed, 2 a usage error
    or a missing optional dependency (the message says which extra to install),
    or any other exception of the command (one line, never a traceback), 130
    after Ctrl-C. ``onnx-optax COMMAND --help`` explains each command's options.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command in GRAPH_COMMANDS:  # a process of its own: see docs/performance.md
        reuse_host_memory()
    try:
        result: int = args.run(args)
    except (UsageError, MissingExtraError) as error:
        print(f"onnx-optax {args.command}: {one_line(str(error))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # before a command could save anything: no traceback
        print(f"onnx-optax {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (``| head``): no traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except Exception as error:  # what no check foresaw (a bug): still one line, exit 2
        if os.environ.get(TRACEBACK_VARIABLE):  # for a bug report, and for fuzzers
            raise
        print(f"onnx-optax {args.command}: {unforeseen(error)}", file=sys.stderr)
        return EXIT_USAGE
    return result
