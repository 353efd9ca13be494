"""The ``onnx-optax`` command line: ``demo``, ``conformance`` and ``bench``.

Exit status: 0 success (every conformance case passes), 1 a check failed (a
conformance case), 2 a usage error or a missing optional dependency. With no
command, ``onnx-optax`` prints its help and exits 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import sys
from collections.abc import Sequence
from types import ModuleType

import onnx_optax
from onnx_optax._src.extras import MissingExtraError, require

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# The benchmark harness lives in the repository, not in the package.
BENCHMARK = pathlib.Path("benchmarks") / "optimizer_step.py"


class UsageError(Exception):
    """A command's arguments cannot work (exit status 2); the message says why."""


def _writable_file(path: str, what: str) -> None:
    """Raises :class:`UsageError` unless ``path`` can be written: checked before the work."""
    folder = pathlib.Path(path).parent
    if not folder.is_dir():
        raise UsageError(f"cannot write {what} {path!r}: the folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"cannot write {what} {path!r}: the folder {str(folder)!r} is read-only")
    if pathlib.Path(path).is_dir():
        raise UsageError(f"cannot write {what} {path!r}: it is a folder")


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx-optax",
        description="ONNX training operators (Adagrad, Adam, Momentum) on JAX/XLA.",
        epilog="exit status: 0 success, 1 a check failed (conformance), 2 a usage error or a "
        "missing optional dependency",
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``onnx-optax`` command: ``demo``, ``conformance``, ``bench``.

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
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
