"""The ``onnx-optax`` command line: ``demo``, ``conformance``, ``bench``, ``attach``,
``check`` and ``train``.

Exit status: 0 success (every conformance case passes), 1 a check failed (a
conformance case, a training model's problems), 2 a usage error (a file that
cannot be read, a model the command cannot read or check, data that do not fit
the model) or a missing optional dependency, 128 + the signal after an
interrupt (130 for Ctrl-C; ``train`` saves first). With no command,
``onnx-optax`` prints its help and exits 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import pathlib
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import onnx_optax
from onnx_optax._src.extras import MissingExtraError, require
from onnx_optax._src.write import check_destination

if TYPE_CHECKING:
    import onnx

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 128 + 2  # SIGINT, as a shell reports it

# The benchmark harness lives in the repository, not in the package.
BENCHMARK = pathlib.Path("benchmarks") / "optimizer_step.py"


class UsageError(Exception):
    """A command's arguments cannot work (exit status 2); the message says why."""


def _writable_file(path: str, what: str) -> None:
    """Raises :class:`UsageError` unless ``path`` can be written: checked before the work.

    The write itself checks again (the file system may change meanwhile).
    """
    try:
        check_destination(path, what)
    except ValueError as error:
        raise UsageError(str(error)) from None


def _write_model(model: onnx.ModelProto, path: str) -> None:
    """Writes ``model`` through the package's one writer; its refusals are usage errors."""
    from onnx_optax.training._export import save_model

    try:
        save_model(model, path, None, {})
    except (ValueError, OSError) as error:
        raise UsageError(str(error)) from None


def _demo(args: argparse.Namespace) -> int:
    if args.epochs < 1:
        raise UsageError("--epochs must be at least 1")
    if args.output:
        _writable_file(args.output, "the plot")
    require("onnx-optax demo", "examples", "flax", "sklearn", "matplotlib")
    from onnx_optax._src.demo import run_demo

    return run_demo(epochs=args.epochs, seed=args.seed, output=args.output)


def _conformance(args: argparse.Namespace) -> int:
    if args.rounds < 1:
        raise UsageError("--rounds must be at least 1")
    require("onnx-optax conformance", "onnx", "onnx", "onnx.reference")
    from onnx_optax._src.conformance import run_conformance

    return run_conformance(seed=args.seed, rounds=args.rounds, long=args.long)


def find_benchmark() -> pathlib.Path | None:
    """``benchmarks/optimizer_step.py`` of the checkout the package runs from, or of the cwd."""
    source_root = pathlib.Path(onnx_optax.__file__).resolve().parent.parent
    for root in (source_root, pathlib.Path.cwd()):
        if (root / BENCHMARK).is_file():
            return root / BENCHMARK
    return None


def _load(path: pathlib.Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("onnx_optax_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _bench(args: argparse.Namespace) -> int:
    path = find_benchmark()
    if path is None:
        raise UsageError(
            f"the benchmark harness ({BENCHMARK}) is not installed with the package; run "
            "onnx-optax bench from a clone of the repository (git clone, then pip install -e .)"
        )
    for target in (args.markdown, args.plot):
        if target:
            _writable_file(target, "the output")
    if args.plot:
        require("onnx-optax bench --plot", "examples", "matplotlib")
    result: int = _load(path).run_bench(
        mode="smoke" if args.smoke else "quick" if args.quick else "full",
        markdown=args.markdown,
        plot=args.plot,
        slow=not args.no_slow,
    )
    return result


def _training() -> ModuleType:
    (training,) = require("onnx-optax training", "onnx", "onnx_optax.training")
    return training


def _read_model(training: ModuleType, path: str) -> object:
    if not pathlib.Path(path).is_file():
        raise UsageError(f"cannot read the model {path!r}: no such file")
    try:
        return training.load(path)
    except Exception as error:  # a stranger's file: any parse failure is a usage error
        raise UsageError(f"cannot read the model {path!r}: {error}") from None


def _attach(args: argparse.Namespace) -> int:
    training = _training()
    if args.output is None and not args.list:
        raise UsageError("attach needs -o/--output (or --list to print the plan alone)")
    if args.output is not None:
        _writable_file(args.output, "the model")
    model = _read_model(training, args.model)
    # What trains: the same arguments for the plan and for attach.
    chosen = {
        "output": args.output_name,
        "trainable": args.trainable,
        "frozen": args.frozen,
        "lift_constants": not args.keep_constants,
    }
    if args.list:
        try:
            plan = training.plan(model, **chosen)
        except (TypeError, ValueError) as error:
            raise UsageError(str(error)) from None
        print(plan)
        if args.output is None:
            return EXIT_OK
    kwargs: dict[str, float] = {}
    if args.optimizer in ("momentum", "nesterov"):
        kwargs = {"alpha": 0.9, "beta": 1.0, "norm_coefficient": 0.0}
    if args.alpha is not None:
        kwargs["alpha"] = args.alpha
    if args.beta is not None:
        kwargs["beta"] = args.beta
    if not math.isfinite(args.learning_rate) or args.learning_rate <= 0:
        raise UsageError(f"--learning-rate must be a finite number > 0, got {args.learning_rate}")
    factory = getattr(onnx_optax, args.optimizer)
    try:
        optimizer = factory(args.learning_rate, **kwargs)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", UserWarning)
            attached = training.attach(
                model,
                loss=args.loss,
                target=args.target,
                optimizer=optimizer,
                clip_global_norm=args.clip_global_norm,
                class_axis=args.class_axis,
                **chosen,
            )
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from None
    for warning in said:
        print(f"note: {warning.message}", file=sys.stderr)
    _write_model(attached, args.output)
    target = attached.training_info[0].algorithm.input[0].name
    print(
        f"wrote {args.output} (its step reads the targets from input '{target}')", file=sys.stderr
    )
    return EXIT_OK


def _check(args: argparse.Namespace) -> int:
    training = _training()
    model = _read_model(training, args.model)
    try:
        problems = training.check(model)
    except (TypeError, ValueError, NotImplementedError) as error:
        raise UsageError(f"{args.model}: {error}") from None
    blocking = [p for p in problems if p.blocking]
    for problem in problems:
        print(problem if problem.blocking else f"warning: {problem}")
    if blocking:
        print(f"{args.model}: {len(blocking)} problem(s)", file=sys.stderr)
        return EXIT_FAILED
    warned = len(problems) - len(blocking)
    print(f"{args.model}: ok" + (f" ({warned} warning(s))" if warned else ""))
    return EXIT_OK


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


def _train(args: argparse.Namespace) -> int:
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
    _writable_file(args.output, "the model")
    for path, what in ((args.inference, "inference model"), (args.log, "log"), (args.plot, "plot")):
        if path:
            _writable_file(path, f"the {what}")
    if args.plot:
        require("onnx-optax train --plot", "examples", "matplotlib")
    from onnx_optax._src.trainer import run_train

    return run_train(args, axes)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx-optax",
        description="ONNX training operators (Adagrad, Adam, Momentum) on JAX/XLA.",
        epilog="exit status: 0 success, 1 a check failed (conformance), 2 a usage error or a "
        "missing optional dependency, 130 interrupted (train saves first)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {onnx_optax.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="train a Flax MLP on scikit-learn digits with each ONNX optimizer",
        description="Train the same 64-64-10 Flax NNX MLP on scikit-learn's bundled digits "
        "(nothing is downloaded) with onnx_optax's adagrad, adam, momentum and nesterov and "
        "with optax's nearest built-ins; print the loss while training, then a table of test "
        "accuracy, final loss and time a step, and write a PNG of the loss curves. Needs the "
        "examples extra.",
    )
    demo.add_argument("--epochs", type=int, default=30, help="training epochs (default: 30)")
    demo.add_argument(
        "--seed", type=int, default=0, help="seed of the data split, init and batches (default: 0)"
    )
    demo.add_argument(
        "--output",
        default="onnx-optax-demo.png",
        help="PNG file for the loss curves (default: onnx-optax-demo.png); '' to skip; its "
        "folder must exist",
    )
    demo.set_defaults(run=_demo)

    conformance = commands.add_parser(
        "conformance",
        help="check onnx_optax against the ONNX node cases and onnx.reference on this device",
        description="Run the seven ONNX backend node cases and a randomized differential test "
        "against onnx.reference (T > 0, decay and both norm coefficients non-zero, float32 and "
        "float64, several tensors) on the device JAX sees; print a table of errors and exit 1 if "
        "any case fails. Needs the onnx extra.",
    )
    conformance.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    conformance.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="random cases per operator and dtype (default: 3)",
    )
    conformance.add_argument(
        "--long",
        action="store_true",
        help="50 random cases per operator and dtype, attributes over their whole valid range "
        "and T up to 2**31-1 (a few minutes); for a new device or JAX version",
    )
    conformance.set_defaults(run=_conformance)

    bench = commands.add_parser(
        "bench",
        help="time optimizer steps against optax, torch, onnx.reference and the memory roofline "
        "(from a clone of the repository)",
        description="Run the benchmark harness benchmarks/optimizer_step.py of a repository "
        "checkout: time one step of adagrad, adam, momentum and nesterov on large tensors, a "
        "model-shaped pytree, many small leaves and bfloat16 parameters: onnx_optax's "
        "transformation and op, optax's nearest built-in, torch.optim with foreach (if "
        "installed) and the onnx.reference formulas (if onnx is installed), against a jitted "
        "triad that measures the memory bandwidth. Prints a table of medians and ratios to "
        "optax's time. Not available from an installed wheel: run it from a clone.",
    )
    size = bench.add_mutually_exclusive_group()
    size.add_argument(
        "--quick",
        action="store_true",
        help="small, in-cache sizes and few repeats (about a minute): checks that everything "
        "runs, measures little",
    )
    size.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, one round (seconds): a test of the harness",
    )
    bench.add_argument("--markdown", metavar="PATH", help="also write the table as markdown")
    bench.add_argument(
        "--plot", metavar="PATH", help="also time Adam from 1e3 to 6.4e7 elements; write a PNG"
    )
    bench.add_argument("--no-slow", action="store_true", help="skip torch.optim and onnx.reference")
    bench.set_defaults(run=_bench)

    attach = commands.add_parser(
        "attach",
        help="make an inference ONNX model trainable: add a loss and an optimizer (training_info)",
        description="Add training_info to an inference model: the loss of one graph output "
        "against a new target input, its Gradient, an optimizer node, T + 1 and the bindings. "
        "The inference graph is left as it is. Needs the onnx extra.",
    )
    attach.add_argument("model", help="the inference model (.onnx)")
    attach.add_argument("-o", "--output", help="the training model to write")
    attach.add_argument(
        "--list",
        action="store_true",
        help="print the plan: every tensor the model stores, whether it trains and why "
        "(with no -o, print it and write nothing)",
    )
    attach.add_argument(
        "--loss",
        default="softmax_cross_entropy",
        help="softmax_cross_entropy (logits), log_loss (probabilities), nll "
        "(log-probabilities): int64 class targets; mse, l1, bce_with_logits (logits): targets "
        "shaped like the output (default: softmax_cross_entropy)",
    )
    attach.add_argument(
        "--optimizer", default="adam", choices=["adagrad", "adam", "momentum", "nesterov"]
    )
    attach.add_argument("--learning-rate", type=float, default=1e-3, help="R (default: 1e-3)")
    attach.add_argument("--alpha", type=float, help="the optimizer's alpha (Adam, Momentum)")
    attach.add_argument("--beta", type=float, help="the optimizer's beta (Adam, Momentum)")
    attach.add_argument(
        "--target", help="the new targets input (default: target, or a free name like it)"
    )
    attach.add_argument(
        "--output-name",
        help="the graph output the loss reads (required when the model has several)",
    )
    attach.add_argument(
        "--trainable",
        action="append",
        metavar="NAME",
        help="a tensor to train, an initializer or a Constant node's output (repeat; default: "
        "every weight the loss's output depends on; see --list)",
    )
    attach.add_argument(
        "--clip-global-norm",
        type=float,
        metavar="C",
        help="clip the gradients to global norm C, as optax.clip_by_global_norm (default: none)",
    )
    attach.add_argument(
        "--frozen",
        action="append",
        metavar="NAME",
        help="a weight not to train (repeat; the complement of --trainable)",
    )
    attach.add_argument(
        "--class-axis",
        type=int,
        metavar="AXIS",
        help="the output axis holding the classes, for class losses (default: 1; 2 or -1 for "
        "a time-major [T, N, C] output)",
    )
    attach.add_argument(
        "--keep-constants",
        action="store_true",
        help="leave float Constant nodes as they are (by default those in weight positions "
        "become initializers and train)",
    )
    attach.set_defaults(run=_attach)

    check = commands.add_parser(
        "check",
        help="check a training model's training_info (exit 1 and the list of problems)",
        description="Check what the ONNX checker does not: bindings, Gradient xs and y, "
        "optimizer state, T + 1, shapes. Exit 0 if sound, 1 with one problem a line. Lines "
        "starting 'warning:' (a constant or a weight the loss does not reach, trained) do not "
        "fail the check.",
    )
    check.add_argument("model", help="the model (.onnx)")
    check.set_defaults(run=_check)

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
    train.add_argument("--batch-size", type=int, default=32, help="rows a step (default: 32)")
    train.add_argument(
        "--shuffle",
        action="store_true",
        help="shuffle the rows of each epoch, in an order that depends on --seed and the "
        "epoch alone (default: in order)",
    )
    train.add_argument("--seed", type=int, default=0, help="seed of the shuffling (default: 0)")
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
    train.set_defaults(run=_train)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``onnx-optax`` command: ``demo``, ``conformance``, ``bench``,
    ``attach``, ``check``, ``train``.

    Returns the process exit status: 0 success, 1 a check failed, 2 a usage error
    or a missing optional dependency (the message says which extra to install).
    ``onnx-optax COMMAND --help`` explains each command's options.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        result: int = args.run(args)
    except (UsageError, MissingExtraError) as error:
        print(f"onnx-optax {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # before a command could save anything: no traceback
        print(f"onnx-optax {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (``| head``): no traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
