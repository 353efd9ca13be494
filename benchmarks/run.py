"""Regenerates the benchmark results the README shows: ``python benchmarks/run.py``.

The same as ``python benchmarks/optimizer_step.py --markdown
benchmarks/results-<platform>.md --plot benchmarks/scaling-<platform>.png``
(``onnx-optax bench`` with those options), named after the device JAX uses.
``--quick`` runs the quick mode instead, which measures little (see its notes).
"""

from __future__ import annotations

import pathlib
import sys

import jax
from optimizer_step import run_bench  # this script's folder is on sys.path

if __name__ == "__main__":
    here = pathlib.Path(__file__).parent
    platform = jax.devices()[0].platform
    sys.exit(
        run_bench(
            mode="quick" if "--quick" in sys.argv else "full",
            markdown=str(here / f"results-{platform}.md"),
            plot=str(here / f"scaling-{platform}.png"),
        )
    )
