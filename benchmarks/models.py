"""Real exported models on CPU: onnx_optax's forward (and training step) against onnxruntime.

The models are the real exports the tests pin (``tests/real_models.py``: magika,
PaddleOCR's text-direction classifier, MTCNN's onet and rnet, captcha-whisperer's
CRNN) and, with ``--zoo``, light zoo models shipped inside the onnx wheel
(``onnx/backend/test/data/light``: ShuffleNet and ResNet-50; their weights are
generated, their shapes and ops the zoo's; their batch is fixed at 1). Each real
model is fed the tests' deterministic batch, its batch axis resized to ``--batch``.

Forward: ``onnx_optax.backend.prepare(model).run`` (``ours``) and an onnxruntime
``InferenceSession`` with ``intra_op_num_threads=2`` (``ort``) on the same
inputs; ``ours, native conv`` is onnx_optax with every grouped conv left to
XLA's native lowering (``nn._native_conv`` while it is traced: the lowering
before issue 21). Times are medians over rounds after a warm-up, the
implementations in a freshly shuffled order each round; ``x ort`` is a time
over onnxruntime's (below 1: faster than onnxruntime). ``first`` is
prepare (session creation) plus the first run: for onnx_optax, the compile.

Training (``--train``): ``training.attach`` with the tests' loss and Adam, then
``Session.step`` on the batch and random targets, blocked on; the first step
(its compile) apart. onnxruntime-training is not a dependency: only ours is timed.
::

    PYTHONPATH=. .venv/bin/python benchmarks/models.py                 # ~3 minutes on 2 cores
    PYTHONPATH=. .venv/bin/python benchmarks/models.py --zoo --train --batch 4
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import onnx
import onnxruntime as ort

from onnx_optax import backend, training
from onnx_optax._src.ops import nn
from tests.real_models import MODELS, RealModel, attach_for_fine_tune, load

# light_squeezenet is left out: onnx_optax's output is NaN where onnxruntime's is 0.001
ZOO = ("light_shufflenet", "light_resnet50")


@contextlib.contextmanager
def native_convs() -> Iterator[None]:
    """Every grouped conv traced meanwhile is XLA's native one (the lowering before issue 21)."""
    saved = nn._grouped_conv
    nn._grouped_conv = nn._native_conv
    try:
        yield
    finally:
        nn._grouped_conv = saved


def _resized(feeds: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
    """The feeds with their batch axis ``batch`` long (rows repeated, or cut)."""
    out = {}
    for name, value in feeds.items():
        rows = np.resize(np.arange(value.shape[0]), batch)
        out[name] = np.ascontiguousarray(value[rows])
    return out


def _zoo(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    folder = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    model = onnx.load(os.path.join(folder, f"{name}.onnx"))
    initializers = {i.name for i in model.graph.initializer}
    (feed,) = [i for i in model.graph.input if i.name not in initializers]
    shape = [d.dim_value for d in feed.type.tensor_type.shape.dim]
    rng = np.random.default_rng(0)
    return model, {feed.name: rng.standard_normal(shape).astype(np.float32)}


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = jax.block_until_ready(fn())
    return result, time.perf_counter() - start


def _medians(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    for fn in fns.values():
        _timed(fn)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name in random.sample(list(fns), len(fns)):
            times[name].append(_timed(fns[name])[1])
    return {name: statistics.median(t) for name, t in times.items()}


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def forward(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rounds: int) -> dict[str, float]:
    """Medians of the forward (seconds), and the first calls'."""
    reps: dict[str, Any] = {}
    first: dict[str, float] = {}
    start = time.perf_counter()
    session = _session(model)
    want = session.run(None, feeds)
    first["ort"] = time.perf_counter() - start
    for name, context in (("ours", contextlib.nullcontext), ("native", native_convs)):
        with context():
            start = time.perf_counter()
            reps[name] = backend.prepare(model)
            outs = jax.block_until_ready(reps[name].run(feeds))
            first[name] = time.perf_counter() - start
        for ours, theirs in zip(outs, want, strict=True):
            np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-3, atol=1e-4)
    medians = _medians(
        {
            "ort": lambda: session.run(None, feeds),
            "ours": lambda: reps["ours"].run(feeds),
            "native": lambda: reps["native"].run(feeds),
        },
        rounds,
    )
    return {**medians, **{f"first {k}": v for k, v in first.items()}}


def train(real: RealModel, feeds: dict[str, np.ndarray], rounds: int) -> dict[str, float]:
    """Medians of one Adam step (seconds), with and without the grouped-conv rewrite."""
    tune = real.fine_tune
    attached = attach_for_fine_tune(real)
    target = attached.training_info[0].algorithm.input[0].name
    # the targets' shape for the tests' batch, its batch axis resized (CRNN's is time-major)
    batch, test_batch = next(iter(feeds.values())).shape[0], real.feeds[0].shape[0]
    shape = tuple(batch if d == test_batch else d for d in tune.target_shape)
    feeds = {**feeds, target: np.random.default_rng(1).integers(0, tune.classes, shape)}
    sessions: dict[str, Any] = {}
    first: dict[str, float] = {}
    for name, context in (("ours", contextlib.nullcontext), ("native", native_convs)):
        with context():
            sessions[name] = training.Session(attached)
            _, first[name] = _timed(lambda name=name: sessions[name].step(feeds))
    medians = _medians({k: lambda k=k: sessions[k].step(feeds) for k in sessions}, rounds)
    return {**medians, **{f"first {k}": v for k, v in first.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--zoo", action="store_true", help="the light zoo models too")
    parser.add_argument("--train", action="store_true", help="time a training step too")
    parser.add_argument("--only", help="comma-separated model names")
    args = parser.parse_args()
    names = [m.name for m in MODELS] + (list(ZOO) if args.zoo else [])
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    print(
        f"onnx_optax on jax {jax.__version__} ({jax.devices()[0].device_kind}) against "
        f"onnxruntime {ort.__version__} (2 threads), ms (median of "
        f"{args.rounds}), first call in s\n"
    )
    columns = ["model", "batch", "ort", "ours", "x ort", "ours, native conv", "x ort"]
    print("| " + " | ".join([*columns, "first: ort", "ours", "native"]) + " |")
    print("|---|" + "--:|" * (len(columns) + 2))
    steps = []
    for name in names:
        real = next((m for m in MODELS if m.name == name), None)
        if real is not None:
            model, feeds = load(real), _resized(real.make_feeds(), args.batch)
        else:
            model, feeds = _zoo(name)
        t = forward(model, feeds, args.rounds)
        row = [name, str(next(iter(feeds.values())).shape[0])]
        row += [f"{t[k] * 1e3:.2f}" for k in ("ort", "ours")] + [f"{t['ours'] / t['ort']:.2f}"]
        row += [f"{t['native'] * 1e3:.2f}", f"{t['native'] / t['ort']:.2f}"]
        row += [f"{t[f'first {k}']:.2f}" for k in ("ort", "ours", "native")]
        print("| " + " | ".join(row) + " |", flush=True)
        if args.train and real is not None:
            steps.append((name, train(real, feeds, args.rounds)))
    if steps:
        print("\nTraining step (Adam), ms (median), first step in s\n")
        print("| model | ours | ours, native conv | native / ours | first step | native |")
        print("|---|--:|--:|--:|--:|--:|")
        for name, t in steps:
            print(
                f"| {name} | {t['ours'] * 1e3:.2f} | {t['native'] * 1e3:.2f} | "
                f"{t['native'] / t['ours']:.2f} | {t['first ours']:.2f} | "
                f"{t['first native']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
