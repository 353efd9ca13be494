"""How onnx_optax's costs grow with the size of a graph: each should grow linearly.

Workloads, each a model of cheap nodes on a 4-element float32 tensor:

- **chain N** (1k, 10k, 20k, 100k nodes): Add, Mul and Relu alternating (two shared weights).
  ``backend.prepare`` (it traces the graph on the declared shapes), the first ``run`` (lowering
  and XLA's compile of that trace) and the second (cached); then ``training.attach`` (mse loss,
  Adam, the Add weight trained), ``training.Session`` (its check traces the step on the
  declared shapes) and its first and second ``step``;
- **Gradient of chain N**: the chain plus a ``Gradient`` of its output with respect to the Add
  weight, through ``backend.prepare`` and two runs;
- **nested Gradient k** (depth 1..12): a Gradient of a Gradient of ... of ``sin(x) * w``; the
  traced work triples with each level (``Limits.traced_nodes`` counts it; raised here so
  that every depth runs);
- **N training_info entries**: a one-node model whose ``training_info`` holds N entries,
  each counting its own T: ``training.check``, ``Session`` and two steps.

Times are wall-clock seconds of one call, each row in a fresh process (no cache shared
between rows), ``block_until_ready`` inside the timed call (the outputs come back as numpy).
A column ``... xla`` is the part of that call XLA spent compiling (JAX's
``/jax/core/compile/backend_compile_duration`` events); the rest is ours (tracing the graph in
Python, lowering to StableHLO, checks). A row that exceeds ``--budget`` seconds is stopped
and reported. Run from a checkout (the file imports the onnx_optax beside it)::

    .venv/bin/python benchmarks/graph_scale.py [--sizes 1000,10000,20000,100000]
        [--gradient-sizes 1000,10000,20000] [--depths 1,2,4,8,10,12]
        [--entries 10,100,1000,2000] [--budget 300]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnx_optax

# The checkout this file lives in, not whichever onnx_optax is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TRAINING = "ai.onnx.preview.training"
F32 = TensorProto.FLOAT
SHAPE = [4]


def chain(n: int, *, gradient: bool = False) -> onnx.ModelProto:
    """N nodes: Add(w_add), Mul(w_mul), Relu, repeated; optionally a Gradient of the output."""
    nodes = []
    h = "x"
    ops = ("Add", "Mul", "Relu")
    for i in range(n):
        op = ops[i % 3]
        inputs = [h] if op == "Relu" else [h, "w_add" if op == "Add" else "w_mul"]
        nodes.append(helper.make_node(op, inputs, [f"h{i}"]))
        h = f"h{i}"
    outputs = [helper.make_tensor_value_info(h, F32, SHAPE)]
    if gradient:
        nodes.append(
            helper.make_node("Gradient", ["w_add"], ["g"], domain=TRAINING, xs=["w_add"], y=h)
        )
        outputs = [helper.make_tensor_value_info("g", F32, SHAPE)]
    inits = [
        numpy_helper.from_array(np.full(SHAPE, 0.001, np.float32), "w_add"),
        numpy_helper.from_array(np.full(SHAPE, 0.9999, np.float32), "w_mul"),
    ]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", F32, SHAPE)], outputs, inits
    )
    opsets = [helper.make_opsetid("", 17)]
    if gradient:
        opsets.append(helper.make_opsetid(TRAINING, 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def nested(depth: int) -> onnx.ModelProto:
    """A Gradient of a Gradient ... ``depth`` levels deep of y = sin(x) * w."""
    nodes = [
        helper.make_node("Sin", ["x"], ["s"]),
        helper.make_node("Mul", ["s", "w"], ["g0"]),
    ]
    for level in range(1, depth + 1):
        nodes.append(
            helper.make_node(
                "Gradient", ["x"], [f"g{level}"], domain=TRAINING, xs=["x"], y=f"g{level - 1}"
            )
        )
    graph = helper.make_graph(
        nodes,
        "nested",
        [helper.make_tensor_value_info("x", F32, SHAPE)],
        [helper.make_tensor_value_info(f"g{depth}", F32, SHAPE)],
        [numpy_helper.from_array(np.full(SHAPE, 0.5, np.float32), "w")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(TRAINING, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def entries(n: int) -> onnx.ModelProto:
    """A small model whose training_info holds ``n`` entries, each counting its own T."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "main",
        [helper.make_tensor_value_info("x", F32, SHAPE)],
        [helper.make_tensor_value_info("y", F32, SHAPE)],
        [numpy_helper.from_array(np.asarray(0, np.int64), f"T{i}") for i in range(n)]
        + [numpy_helper.from_array(np.asarray(1, np.int64), "one")],
    )
    infos = []
    for i in range(n):
        algorithm = helper.make_graph(
            [helper.make_node("Add", [f"T{i}", "one"], [f"T{i}.next"])],
            f"count{i}",
            [],
            [helper.make_tensor_value_info(f"T{i}.next", TensorProto.INT64, [])],
        )
        infos.append(helper.make_training_info(algorithm, [(f"T{i}", f"T{i}.next")], None, None))
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(TRAINING, 1)],
        ir_version=8,
    )
    model.training_info.extend(infos)
    return model


def _no_work_limit(backend: Any) -> Any:
    """Limits that let every workload here run (the traced-work limit is what nested measures)."""
    fields = backend.Limits._fields
    return backend.Limits(traced_nodes=10**9) if "traced_nodes" in fields else backend.Limits()


class _Clock:
    """Wall-clock time of a call, and how much of it XLA spent compiling (JAX's own events)."""

    # Where each stage's row goes as soon as it is measured (set in the row's process), so a
    # row stopped at the budget still reports the stages it finished.
    queue: Any = None

    def __init__(self) -> None:
        import jax

        self.xla = 0.0

        def listener(event: str, duration: float, **kwargs: Any) -> None:
            if event == "/jax/core/compile/backend_compile_duration":
                self.xla += duration

        jax.monitoring.register_event_duration_secs_listener(listener)

    def __call__(self, row: dict[str, Any], column: str, fn: Callable[[], Any]) -> Any:
        """Runs ``fn``; its time in ``row[column]``, XLA's compile in ``row[column + ' xla']``."""
        self.xla = 0.0
        start = time.perf_counter()
        result = fn()
        row[column] = time.perf_counter() - start
        if self.xla:
            row[f"{column} xla"] = self.xla
        if _Clock.queue is not None:
            _Clock.queue.put(dict(row))
        return result


def chain_row(n: int) -> dict[str, Any]:
    from onnx_optax import backend, training
    from onnx_optax._src.adam import adam

    clock = _Clock()
    model = chain(n)
    x = np.full(SHAPE, 0.5, np.float32)
    row: dict[str, Any] = {"workload": f"chain {n}"}
    limits = _no_work_limit(backend)
    rep = clock(row, "prepare", lambda: backend.prepare(model, limits=limits))
    clock(row, "first run", lambda: rep.run([x]))
    clock(row, "second run", lambda: rep.run([x]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trained = clock(
            row,
            "attach",
            lambda: training.attach(model, loss="mse", optimizer=adam(1e-3), trainable=["w_add"]),
        )
    session = clock(row, "Session", lambda: training.Session(trained))
    feeds = {"x": x, "target": np.zeros(SHAPE, np.float32)}
    clock(row, "first step", lambda: session.step(feeds))
    clock(row, "second step", lambda: session.step(feeds))
    return row


def _prepared_row(name: str, model: onnx.ModelProto) -> dict[str, Any]:
    from onnx_optax import backend

    clock = _Clock()
    x = np.full(SHAPE, 0.5, np.float32)
    row: dict[str, Any] = {"workload": name}
    limits = _no_work_limit(backend)
    rep = clock(row, "prepare", lambda: backend.prepare(model, limits=limits))
    clock(row, "first run", lambda: rep.run([x]))
    clock(row, "second run", lambda: rep.run([x]))
    return row


def gradient_row(n: int) -> dict[str, Any]:
    return _prepared_row(f"Gradient of chain {n}", chain(n, gradient=True))


def nested_row(depth: int) -> dict[str, Any]:
    from onnx_optax import backend

    model = nested(depth)
    row: dict[str, Any] = {}
    if "traced_nodes" in backend.Limits._fields:  # how long the default limit takes to refuse
        start = time.perf_counter()
        try:
            backend.prepare(model)
        except ValueError:
            row["refused by default limits"] = time.perf_counter() - start
    return {**_prepared_row(f"nested Gradient {depth}", model), **row}


def entries_row(n: int) -> dict[str, Any]:
    from onnx_optax import training

    clock = _Clock()
    model = entries(n)
    x = np.full(SHAPE, 0.5, np.float32)
    row: dict[str, Any] = {"workload": f"{n} training_info entries"}
    clock(row, "check", lambda: training.check(model))
    session = clock(row, "Session", lambda: training.Session(model))
    clock(row, "first step", lambda: session.step({"x": x}))
    clock(row, "second step", lambda: session.step({"x": x}))
    return row


COLUMNS = [
    "workload",
    "prepare",
    "first run",
    "first run xla",
    "second run",
    "attach",
    "check",
    "Session",
    "first step",
    "first step xla",
    "second step",
    "refused by default limits",
]


def _child(kind: str, size: int, queue: Any) -> None:
    rows = {"chain": chain_row, "gradient": gradient_row, "nested": nested_row}
    rows["entries"] = entries_row
    _Clock.queue = queue
    try:
        queue.put({**rows[kind](size), "done": True})
    except BaseException as error:  # reported in the table, whatever it is
        queue.put({"error": f"{type(error).__name__}: {error}"[:80], "done": True})


def measure(kind: str, size: int, budget: float) -> dict[str, Any]:
    """One row, in a fresh process (no cache shared between rows), stopped after ``budget``."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(kind, size, queue))
    process.start()
    row: dict[str, Any] = {"workload": f"{kind} {size}"}
    deadline = time.perf_counter() + budget
    while True:
        try:
            update = queue.get(timeout=max(0.1, deadline - time.perf_counter()))
        except Exception:  # queue.Empty: the budget is spent
            process.kill()
            row["error"] = f"stopped at {budget:.0f} s"
            break
        row.update(update)
        if row.pop("done", False):
            break
    process.join()
    return row


def table(rows: list[dict[str, Any]]) -> str:
    seen = {c for r in rows for c in r if c not in ("workload", "error")}
    used = ["workload", *(c for c in COLUMNS[1:] if c in seen), *sorted(seen - set(COLUMNS))]
    lines = ["| " + " | ".join(used) + " | note |", "|" + " --- |" * (len(used) + 1)]
    for row in rows:
        cells = [
            row.get(c, "") if c == "workload" else (f"{row[c]:.2f}" if c in row else "")
            for c in used
        ]
        lines.append("| " + " | ".join(cells) + f" | {row.get('error', '')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,20000,100000")
    parser.add_argument("--gradient-sizes", default="1000,10000,20000")
    parser.add_argument("--depths", default="1,2,4,8,10,12")
    parser.add_argument("--entries", default="10,100,1000,2000")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds per row")
    args = parser.parse_args()

    def numbers(text: str) -> list[int]:
        return [int(s) for s in text.split(",") if s]

    rows = []
    for kind, sizes in (
        ("chain", numbers(args.sizes)),
        ("gradient", numbers(args.gradient_sizes)),
        ("nested", numbers(args.depths)),
        ("entries", numbers(args.entries)),
    ):
        for size in sizes:
            row = measure(kind, size, args.budget)
            print(row, flush=True)
            rows.append(row)
    print()
    print(table(rows))


if __name__ == "__main__":
    onnx_optax.reuse_host_memory()  # as the onnx-optax command does (docs/performance.md)
    main()
