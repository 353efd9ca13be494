"""``onnx-optax bench``: its options, and running the benchmark harness of a clone."""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import tomllib
from types import ModuleType

import onnx_optax
from onnx_optax._src.extras import require
from onnx_optax.cli.common import Commands, UsageError, writable_file

# The benchmark harness lives in the repository, not in the package.
BENCHMARK = pathlib.Path("benchmarks") / "optimizer_step.py"


def find_benchmark() -> pathlib.Path | None:
    """``benchmarks/optimizer_step.py`` of the checkout the package runs from, or of the cwd
    when the cwd is a clone of onnx_optax (its ``pyproject.toml`` names the project): bench
    runs that file, so it never runs one that a folder of someone else's holds."""
    source_root = pathlib.Path(onnx_optax.__file__).resolve().parent.parent
    if (source_root / BENCHMARK).is_file():
        return source_root / BENCHMARK
    cwd = pathlib.Path.cwd()
    if (cwd / BENCHMARK).is_file() and _is_clone(cwd):
        return cwd / BENCHMARK
    return None


def _is_clone(root: pathlib.Path) -> bool:
    """Whether ``root/pyproject.toml`` (read up to 1 MiB) names the project onnx-optax."""
    try:
        with open(root / "pyproject.toml", "rb") as file:
            text = file.read(2**20 + 1)
        if len(text) > 2**20:
            return False
        project = tomllib.loads(text.decode("utf-8")).get("project")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return False
    return isinstance(project, dict) and project.get("name") == "onnx-optax"


def _load(path: pathlib.Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("onnx_optax_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run(args: argparse.Namespace) -> int:
    """``onnx-optax bench``: the harness of this checkout, with the options given."""
    path = find_benchmark()
    if path is None:
        raise UsageError(
            f"the benchmark harness ({BENCHMARK}) is not installed with the package; run "
            "onnx-optax bench from a clone of the repository (git clone, then pip install -e .)"
        )
    for target in (args.markdown, args.plot):
        if target:
            writable_file(target, "the output")
    if args.plot:
        require("onnx-optax bench --plot", "examples", "matplotlib")
    result: int = _load(path).run_bench(
        mode="smoke" if args.smoke else "quick" if args.quick else "full",
        markdown=args.markdown,
        plot=args.plot,
        slow=not args.no_slow,
    )
    return result


def add_parser(commands: Commands) -> None:
    """Adds ``bench`` and its options to ``commands``."""
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
    bench.set_defaults(run=run)
