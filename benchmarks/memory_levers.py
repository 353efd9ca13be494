"""Memory and step time of ``training.Session``'s memory levers on one deep MLP.

The model: x[N, 64] -> 16 x (Gemm 256, Tanh) -> MatMul to 3 logits, softmax
cross-entropy and Adam (``attach``), float32, a batch of ``--batch`` rows. For
each configuration (the default, ``micro_batches=k``, ``remat=True`` and both),
XLA's own accounting of the compiled step (``memory_analysis()``: temporaries and
arguments, in bytes) and the step time: the median over ``--rounds`` rounds, the
configurations interleaved within each round so that a slower moment of the
machine falls on all of them alike. ``Session.step`` returns host numpy arrays,
so each timed step has finished. Run::

    PYTHONPATH=. .venv/bin/python benchmarks/memory_levers.py [--batch 1024] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

import onnx_optax
from onnx_optax import training
from tests.support.training_models import deep
from tests.support.training_models import deep_batch as batch

CONFIGURATIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "micro_batches=4": {"micro_batches": 4},
    "micro_batches=16": {"micro_batches": 16},
    "remat=True": {"remat": True},
    "remat=True, micro_batches=4": {"remat": True, "micro_batches": 4},
}


def memory(session: training.Session, inputs: dict[str, np.ndarray]) -> Any:
    """XLA's memory analysis of the session's compiled step for these feeds."""
    arguments = (session._state, session._checked_feeds(inputs), session._constants)
    return session._step.lower(*arguments).compile().memory_analysis()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3, help="steps per round")
    args = parser.parse_args()
    model = training.attach(deep(width=256, depth=16, inputs=64), optimizer=onnx_optax.adam(1e-3))
    inputs = batch(0, args.batch, inputs=64)
    sessions = {
        name: training.Session(model, **options) for name, options in CONFIGURATIONS.items()
    }
    analyses = {name: memory(session, inputs) for name, session in sessions.items()}
    for session in sessions.values():  # warm-up: compiled and run once
        session.step(inputs)
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(args.rounds):
        for name, session in sessions.items():
            start = time.perf_counter()
            for _ in range(args.repeat):
                session.step(inputs)
            times[name].append((time.perf_counter() - start) / args.repeat)
    base = analyses["default"].temp_size_in_bytes
    print(f"batch {args.batch}, {args.rounds} rounds of {args.repeat} steps\n")
    print("| configuration | temporaries | vs default | arguments | step time (median) |")
    print("|---|---|---|---|---|")
    for name, analysis in analyses.items():
        temp = analysis.temp_size_in_bytes
        print(
            f"| {name} | {temp:,} B | {temp / base:.2f} | {analysis.argument_size_in_bytes:,} B "
            f"| {statistics.median(times[name]) * 1e3:.1f} ms |"
        )


if __name__ == "__main__":
    onnx_optax.reuse_host_memory()  # as the onnx-optax command does (docs/performance.md)
    main()
