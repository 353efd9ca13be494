"""What the run-time index checks cost: a Gather-heavy graph and a training step, on and off.

An index an op reads from a feed (Gather, GatherElements, a loss's class labels)
is checked in the compiled graph: a comparison and a reduction over the indices,
returned beside the outputs and raised on the host after the run (a training
step whose check fails also keeps its state, one select over the parameters).
"Off" drops those checks (``check_at_run`` records nothing traced), as the code
did before them. Workloads:

- ``gather``: 16 Gathers of 8,192 fed int64 indices from 16 embedding tables of
  20,000 x 64 float32, summed; ``backend.prepare(model).run``.
- ``step``: ``training.Session.step`` of an MLP 784-1024-1024-10 (batch 256,
  ``attach``: softmax cross-entropy, Adam), whose labels the loss node checks.

Medians over rounds in which on and off take turns, after a warm-up. Run::

    .venv/bin/python benchmarks/run_checks.py [--rounds 15] [--repeat 10]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from onnx import TensorProto, helper, numpy_helper

import onnx_optax
from onnx_optax import backend, training
from onnx_optax._src.ops import arrays


@contextlib.contextmanager
def checks_off() -> Iterator[None]:
    """Run-time checks record nothing while tracing (static indices are still checked)."""
    original = arrays.check_at_run

    def static_only(message: str, bad: Any, values: Any) -> None:
        if not isinstance(bad, jax.core.Tracer):
            original(message, bad, values)

    arrays.check_at_run = static_only  # type: ignore[assignment]
    try:
        yield
    finally:
        arrays.check_at_run = original  # type: ignore[assignment]


def gather_workload(on: bool) -> Callable[[], Any]:
    rng = np.random.default_rng(0)
    tables = [rng.normal(size=(20_000, 64)).astype(np.float32) for _ in range(16)]
    nodes = [helper.make_node("Gather", [f"t{k}", "i"], [f"g{k}"]) for k in range(16)]
    nodes.append(helper.make_node("Sum", [f"g{k}" for k in range(16)], ["y"]))
    graph = helper.make_graph(
        nodes,
        "gathers",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [8192])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8192, 64])],
        initializer=[numpy_helper.from_array(t, f"t{k}") for k, t in enumerate(tables)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with contextlib.nullcontext() if on else checks_off():
        rep = backend.prepare(model)
        feeds = {"i": rng.integers(-20_000, 20_000, 8192)}
        rep.run(feeds)  # compiled here, with or without the checks
    return lambda: rep.run(feeds)


def step_workload(on: bool) -> Callable[[], Any]:
    rng = np.random.default_rng(0)
    sizes = [784, 1024, 1024, 10]
    params = {}
    nodes = []
    h = "X"
    for k, (m, n) in enumerate(itertools.pairwise(sizes)):
        params[f"W{k}"] = (rng.normal(size=(m, n)) / np.sqrt(m)).astype(np.float32)
        params[f"b{k}"] = np.zeros(n, np.float32)
        nodes.append(helper.make_node("Gemm", [h, f"W{k}", f"b{k}"], [f"z{k}"]))
        h = f"z{k}"
        if k < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [h], [f"h{k}"]))
            h = f"h{k}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 784])],
        [helper.make_tensor_value_info(h, TensorProto.FLOAT, ["N", 10])],
        initializer=[numpy_helper.from_array(v, n) for n, v in params.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model = training.attach(
        model, loss="softmax_cross_entropy", target="t", optimizer=onnx_optax.adam(1e-3)
    )
    feeds = {
        "X": rng.normal(size=(256, 784)).astype(np.float32),
        "t": rng.integers(0, 10, 256).astype(np.int64),
    }
    with contextlib.nullcontext() if on else checks_off():
        session = training.Session(model)
        session.step(feeds)  # compiled here, with or without the checks
    return lambda: session.step(feeds)


def medians(fns: dict[str, Callable[[], Any]], rounds: int, repeat: int) -> dict[str, float]:
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(repeat):
                fn()  # returns numpy arrays: the device work is done
            times[name].append((time.perf_counter() - start) / repeat)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    print(f"JAX {jax.__version__} on {jax.devices()[0].device_kind}; medians of {args.rounds}")
    print("| workload | checks on | checks off | on / off |")
    print("|---|---|---|---|")
    for name, workload in (("gather", gather_workload), ("step", step_workload)):
        found = medians({"on": workload(True), "off": workload(False)}, args.rounds, args.repeat)
        print(
            f"| {name} | {found['on'] * 1e3:.2f} ms | {found['off'] * 1e3:.2f} ms | "
            f"{found['on'] / found['off']:.3f} |"
        )


if __name__ == "__main__":
    onnx_optax.reuse_host_memory()  # as the onnx-optax command does (docs/performance.md)
    main()
