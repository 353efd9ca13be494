"""The ``onnx-optax`` command line: ``demo`` and ``conformance``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    from onnx_optax._src.demo import run_demo

    return run_demo(epochs=args.epochs, seed=args.seed, output=args.output)


def _conformance(args: argparse.Namespace) -> int:
    from onnx_optax._src.conformance import run_conformance

    return run_conformance(seed=args.seed, rounds=args.rounds)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx-optax",
        description="ONNX training operators (Adagrad, Adam, Momentum) on JAX/XLA.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="train a small model with each ONNX optimizer and print the losses",
        description="Train a small classifier with onnx_optax's adagrad, adam, momentum and "
        "nesterov and print the loss of each.",
    )
    demo.add_argument("--epochs", type=int, default=30, help="training epochs (default: 30)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    demo.add_argument(
        "--output",
        default=None,
        help="where to write a PNG of the loss curves (default: no plot)",
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
    conformance.set_defaults(run=_conformance)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``onnx-optax`` command."""
    args = build_parser().parse_args(argv)
    result: int = args.run(args)
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
