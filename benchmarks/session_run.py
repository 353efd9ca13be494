"""Per-call time of ``training.Session.run`` on a small CNN, against the other ways to run it.

The CNN (Conv 3->8 3x3, Relu, GlobalAveragePool, Flatten, Gemm 8->10; batch 8 of
3x16x16) is made trainable with ``attach`` (softmax cross-entropy, Adam). Timed,
after a warm-up, as medians over rounds of ``--repeat`` calls:

- ``Session.run`` alone, and alternated with ``Session.step`` (a step between two
  runs must not force a recompile);
- ``backend.prepare(session.to_inference_model()).run``;
- onnxruntime's CPU provider on the same inference model, if installed.

Every call returns host numpy arrays, so each timed call has finished. Run::

    .venv/bin/python benchmarks/session_run.py [--rounds 9] [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import onnx_optax
from onnx_optax import backend, training


def cnn() -> Any:
    rng = np.random.default_rng(0)
    values = {
        "W": (rng.normal(size=(8, 3, 3, 3)) / 5).astype(np.float32),
        "B": np.zeros(8, np.float32),
        "G": (rng.normal(size=(8, 10)) / 3).astype(np.float32),
        "c": np.zeros(10, np.float32),
    }
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "W", "B"], ["h"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["h"], ["a"]),
            helper.make_node("GlobalAveragePool", ["a"], ["p"]),
            helper.make_node("Flatten", ["p"], ["f"]),
            helper.make_node("Gemm", ["f", "G", "c"], ["logits"]),
        ],
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        initializer=[numpy_helper.from_array(v, n) for n, v in values.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def median_ms(fn: Callable[[], Any], rounds: int, repeat: int) -> float:
    fn()  # warm-up: compiles
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        times.append((time.perf_counter() - start) / repeat)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    model = training.attach(
        cnn(), loss="softmax_cross_entropy", target="t", optimizer=onnx_optax.adam(0.01)
    )
    session = training.Session(model)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 3, 16, 16)).astype(np.float32)
    t = rng.integers(0, 10, size=8).astype(np.int64)

    def step_then_run() -> None:
        session.step({"x": x, "t": t})
        session.run({"x": x})

    rows = [
        ("Session.run", lambda: session.run({"x": x})),
        ("Session.step + Session.run", step_then_run),
        ("Session.step", lambda: session.step({"x": x, "t": t})),
    ]
    inference = session.to_inference_model()
    rep = backend.prepare(inference)
    rows.append(("backend.prepare(...).run", lambda: rep.run([x])))
    try:
        import onnxruntime

        ort = onnxruntime.InferenceSession(
            inference.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        rows.append(("onnxruntime (CPU)", lambda: ort.run(None, {"x": x})))
    except ImportError:
        print("onnxruntime is not installed: left out")
    for name, fn in rows:
        print(f"{name:<28} {median_ms(fn, args.rounds, args.repeat):9.3f} ms/call")


if __name__ == "__main__":
    onnx_optax.reuse_host_memory()  # as the onnx-optax command does (docs/performance.md)
    main()
