"""The ``onnx-optax`` command line: ``demo``, ``conformance`` and ``bench``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    from onnx_optax._src.demo import run_demo

    return run_demo(epochs=args.epochs, seed=args.seed, output=args.output)


def _conformance(args: argparse.Namespace) -> int:
    from onnx_optax._src.conformance import run_conformance

    return run_conformance(seed=args.seed, rounds=args.rounds, long=args.long)


def _bench(args: argparse.Namespace) -> int:
    from onnx_optax._src.bench import run_bench

    return run_bench(
        quick=args.quick, markdown=args.markdown, plot=args.plot, slow=not args.no_slow
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx-optax",
        description="ONNX training operators (Adagrad, Adam, Momentum) on JAX/XLA.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
        help="PNG file for the loss curves (default: onnx-optax-demo.png); '' to skip",
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
        help="time optimizer steps against optax, torch, onnx.reference and the memory roofline",
        description="Time one step of adagrad, adam, momentum and nesterov on large tensors, a "
        "model-shaped pytree, many small leaves and bfloat16 parameters: onnx_optax's "
        "transformation and op, optax's nearest built-in, torch.optim with foreach (if "
        "installed) and the onnx.reference formulas (if onnx is installed), against a jitted "
        "triad that measures the memory bandwidth. Prints a table of medians and ratios.",
    )
    bench.add_argument("--quick", action="store_true", help="small sizes, a minute or less")
    bench.add_argument("--markdown", metavar="PATH", help="also write the table as markdown")
    bench.add_argument(
        "--plot", metavar="PATH", help="also time Adam from 1e3 to 6.4e7 elements; write a PNG"
    )
    bench.add_argument("--no-slow", action="store_true", help="skip torch.optim and onnx.reference")
    bench.set_defaults(run=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``onnx-optax`` command: ``demo``, ``conformance``, ``bench``.

    Returns the process exit status (0 on success); ``onnx-optax COMMAND --help``
    explains each command's options.
    """
    args = build_parser().parse_args(argv)
    result: int = args.run(args)
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
