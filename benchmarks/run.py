"""Regenerates the benchmark results the README shows: ``python benchmarks/run.py``.

The same as ``onnx-optax bench --markdown benchmarks/results-<platform>.md
--plot benchmarks/scaling-<platform>.png``, named after the device JAX uses.
"""

from __future__ import annotations

import pathlib
import sys

import jax

from onnx_optax._src.bench import run_bench

if __name__ == "__main__":
    here = pathlib.Path(__file__).parent
    platform = jax.devices()[0].platform
    sys.exit(
        run_bench(
            quick="--quick" in sys.argv,
            markdown=str(here / f"results-{platform}.md"),
            plot=str(here / f"scaling-{platform}.png"),
        )
    )
