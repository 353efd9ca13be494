"""Mobile networks on CPU: onnx_optax against onnxruntime and against the same network
written by hand in JAX.

The networks are PyTorch's exports of ``benchmarks/mobile`` (MobileNetV2 1.0 at 224 px
and 0.5 at 128 px, a MobileNetV3-Small-style network; seeded random weights), the light
zoo's ShuffleNet and SqueezeNet and PaddleOCR's classifier (PaddlePaddle's export, the
tests' real model). For each, at batch 1 and 8, the forward (``backend.prepare(model).run``,
``ours``), the same without the channels-last pass (``channels-first``: the lowering
before issue 35) and an onnxruntime ``InferenceSession`` with 2 threads; for MobileNetV2
also ``benchmarks/mobile/reference.py`` (``hand``), the network written by hand in JAX,
channels-last, jitted. Times are medians, each runtime timed in blocks after a pause (see
``models._medians``).

Training (``--train``): at batch 8, ``training.attach`` (softmax cross-entropy on the
logits, Adam, every float weight trained) and ``Session.step`` against the hand-written
network's jitted Adam step (optax.adam, the same loss) on the same batch; the first step
(attach, Session and the first step: its trace and compile) apart. ::

    PYTHONPATH=. .venv/bin/python benchmarks/mobile_nets.py --train   # ~6 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import jax
import numpy as np
import onnx
import onnxruntime as ort

import onnx_optax
from benchmarks.mobile import nets, reference
from benchmarks.models import _medians, _resized, _session, _zoo, channels_first
from onnx_optax import backend, training
from tests.support.real_models import MODELS, load

NAMES = (*nets.NETS, "light_shufflenet", "light_squeezenet", "paddle_cls")


def _model(name: str, batch: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    if name in nets.NETS:
        model = nets.load(name)
        return model, nets.image(model, batch)
    if name.startswith("light_"):
        model, feeds = _zoo(name)  # its batch is fixed at 1
        return model, feeds if batch == 1 else {}
    real = next(m for m in MODELS if m.name == name)
    return load(real), _resized(real.make_feeds(), batch)


def forward(name: str, batch: int, rounds: int) -> dict[str, float] | None:
    model, feeds = _model(name, batch)
    if not feeds:
        return None
    session = _session(model)
    want = session.run(None, feeds)
    ours = backend.prepare(model)
    with channels_first():
        first = backend.prepare(model)
    fns = {
        "ort": lambda: session.run(None, feeds),
        "ours": lambda: ours.run(feeds),
        "channels-first": lambda: first.run(feeds),
    }
    if name.startswith("mobilenet_v2"):
        params = reference.as_jax(reference.weights(model))
        hand = jax.jit(reference.forward)
        image = jax.numpy.asarray(feeds["image"])
        fns["hand"] = lambda: hand(params, image)
    for fn in fns.values():
        for got, expected in zip(jax.tree.leaves(fn()), want, strict=False):
            np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-3, atol=1e-3)
    return _medians(fns, rounds)


def train(name: str, batch: int, rounds: int) -> dict[str, float]:
    model, feeds = _model(name, batch)
    start = time.perf_counter()
    attached = training.attach(model, optimizer=onnx_optax.adam(1e-3))
    session = training.Session(attached)
    target = attached.training_info[0].algorithm.input[0].name
    labels = np.random.default_rng(1).integers(0, 1000, (batch,))
    step_feeds = {**feeds, target: labels}
    jax.block_until_ready(session.step(step_feeds))
    first = time.perf_counter() - start
    fns: dict[str, Any] = {"ours": lambda: session.step(step_feeds)}
    if name.startswith("mobilenet_v2"):
        params = reference.as_jax(reference.weights(model))
        step, state = reference.train_step(params)
        image, y = jax.numpy.asarray(feeds["image"]), jax.numpy.asarray(labels)
        held = {"params": params, "state": state}

        def hand() -> Any:
            held["params"], held["state"], loss = step(held["params"], held["state"], image, y)
            return loss

        fns["hand"] = hand
    return {**_medians(fns, rounds), "first": first}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--only", help="comma-separated model names")
    args = parser.parse_args()
    names = [n for n in NAMES if not args.only or n in args.only.split(",")]
    print(
        f"onnx_optax on jax {jax.__version__} against onnxruntime {ort.__version__} (2 threads),"
        f" ms (medians of {args.rounds})\n"
    )
    print("| model | batch | onnxruntime | ours | x ort | channels-first | x ort | hand JAX |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    ratios = []
    for name in names:
        for batch in (1, 8):
            t = forward(name, batch, args.rounds)
            if t is None:
                continue
            ratios.append(t["ours"] / t["ort"])
            hand = f"{t['hand'] * 1e3:.2f}" if "hand" in t else ""
            print(
                f"| {name} | {batch} | {t['ort'] * 1e3:.2f} | {t['ours'] * 1e3:.2f} | "
                f"{t['ours'] / t['ort']:.2f} | {t['channels-first'] * 1e3:.2f} | "
                f"{t['channels-first'] / t['ort']:.2f} | {hand} |",
                flush=True,
            )
    mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"\ngeometric mean of ours / onnxruntime: {mean:.2f}x")
    if args.train:
        print("\nTraining step (Adam), batch 8, ms (median); first step in s\n")
        print("| model | ours | hand JAX | ours / hand | first step (attach, Session, step) |")
        print("|---|--:|--:|--:|--:|")
        for name in (n for n in names if n in nets.NETS):
            t = train(name, 8, args.rounds)
            hand = f"{t['hand'] * 1e3:.1f} | {t['ours'] / t['hand']:.2f}" if "hand" in t else " | "
            print(f"| {name} | {t['ours'] * 1e3:.1f} | {hand} | {t['first']:.2f} |", flush=True)


if __name__ == "__main__":
    onnx_optax.reuse_host_memory()  # as the onnx-optax command does (docs/performance.md)
    main()
