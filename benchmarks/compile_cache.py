"""How much JAX's persistent compilation cache saves a second process: first calls of real models.

The first ``backend.prepare(model).run`` and the first ``training.Session.step``
of a process trace the graph and have XLA compile it; XLA's part can be kept on
disk by JAX (``JAX_COMPILATION_CACHE_DIR``, or
``jax.config.update("jax_compilation_cache_dir", path)``), so that the next
process with the same model, shapes and JAX version loads it instead. Each model
is timed in three fresh processes: without the cache, with an empty cache (it
fills it) and with the filled cache. Models: the real exports of
``tests/support/real_models.py`` (their packages are in the ``test`` extra), fine-tuned
as the tests fine-tune them (``attach`` with their loss, Adam).

Run from the repository root::

    .venv/bin/python benchmarks/compile_cache.py [--models captcha_crnn,paddle_cls]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx_optax

ROOT = Path(__file__).resolve().parent.parent


def child(name: str) -> None:
    """One process: the first forward and the first step of ``name``, as JSON on stdout."""
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from onnx_optax import backend, training
    from tests.support.real_models import MODELS, attach_for_fine_tune, load

    real = {m.name: m for m in MODELS}[name]
    model = load(real)
    feeds = real.make_feeds()
    start = time.perf_counter()
    backend.prepare(model).run(feeds)
    forward = time.perf_counter() - start
    tune = real.fine_tune
    attached = attach_for_fine_tune(real, model)
    session = training.Session(attached)
    target = attached.training_info[0].algorithm.input[0].name
    labels = np.random.default_rng(0).integers(0, tune.classes, tune.target_shape)
    start = time.perf_counter()
    session.step({**feeds, target: labels})
    step = time.perf_counter() - start
    print(json.dumps({"forward": forward, "step": step}))


def measure(name: str, cache: str | None) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    if cache is not None:
        env["JAX_COMPILATION_CACHE_DIR"] = cache
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # every compile kept
    result = subprocess.run(
        [sys.executable, __file__, "--child", name],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="captcha_crnn,paddle_cls,magika,mtcnn_onet")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    columns = ("model", "first forward: no cache / cache filled", "first step: the same")
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---|")
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as cache:
            cold = measure(name, None)
            measure(name, cache)  # fills the cache
            warm = measure(name, cache)
        print(
            f"| {name} | {cold['forward']:.2f} s / {warm['forward']:.2f} s "
            f"({warm['forward'] / cold['forward']:.2f}x) | {cold['step']:.2f} s / "
            f"{warm['step']:.2f} s ({warm['step'] / cold['step']:.2f}x) |"
        )


if __name__ == "__main__":
    onnx_optax.reuse_host_memory()  # as the onnx-optax command does (docs/performance.md)
    main()
