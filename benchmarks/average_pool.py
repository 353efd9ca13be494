"""AveragePool on ResNet-like shapes: the jitted op, and optionally another version of it.

Each case runs the registered ``AveragePool`` function under ``jax.jit`` on one
random float32 input; times are medians over ``--rounds`` rounds after a warm-up,
with ``block_until_ready`` inside the timed region. ``--against FILE`` loads an
other version of the module holding AveragePool (``onnx_optax/_src/ops/pools.py``;
``conv.py`` before the split into conv and pools, ``nn.py`` before the split into
nn, conv and normalization), checks
that both give the same values and times the two in a freshly shuffled order each
round, in one process, so that a shared machine's drift falls on both alike::

    git show f9a32ac:onnx_optax/_src/ops/nn.py > /tmp/nn_f9a32ac.py
    PYTHONPATH=. .venv/bin/python benchmarks/average_pool.py --against /tmp/nn_f9a32ac.py
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from onnx_optax._src.ops import pools
from onnx_optax._src.ops.registry import Node

# name -> (X's shape, attributes): ResNet-like stems and stages, and the pad-free case
CASES: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {
    "3x3/2 pad 1 [16,64,112,112]": (
        (16, 64, 112, 112),
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
    ),
    "3x3/1 pad 1 [16,256,28,28]": ((16, 256, 28, 28), dict(kernel_shape=[3, 3], pads=[1] * 4)),
    "3x3/2 ceil, incl. pad [16,128,56,56]": (
        (16, 128, 56, 56),
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4, ceil_mode=1, count_include_pad=1),
    ),
    "2x2/2 no pad [16,256,56,56]": ((16, 256, 56, 56), dict(kernel_shape=[2, 2], strides=[2, 2])),
}
DEFAULTS = dict(auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, pads=None)


def _other(path: str) -> Callable[..., Any]:
    """The AveragePool function of another checkout's module holding it (its import
    registers it: undone after)."""
    spec = importlib.util.spec_from_file_location("other_nn", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    importlib.reload(pools)  # the registry holds this checkout's ops again
    name = "average_pool" if hasattr(module, "average_pool") else "_average_pool"  # older
    return getattr(module, name)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument(
        "--against",
        help="another pools.py (conv.py, nn.py before the splits) to time against this one",
    )
    args = parser.parse_args()
    versions = {"this": pools.average_pool}
    if args.against:
        versions["against"] = _other(args.against)
    rng = np.random.default_rng(0)
    print(f"{'case':38s} " + " ".join(f"{name:>10s}" for name in versions))
    for case, (shape, attrs) in CASES.items():
        node = Node({**DEFAULTS, "strides": None, **attrs}, 21, "node (AveragePool)", 1)
        x = jax.device_put(rng.standard_normal(shape).astype(np.float32))
        fns = {k: jax.jit(lambda x, fn=fn, node=node: fn(node, x)) for k, fn in versions.items()}
        values = [np.asarray(f(x)) for f in fns.values()]
        for value in values[1:]:
            np.testing.assert_allclose(value, values[0], rtol=1e-6, atol=1e-6)
        for f in fns.values():
            for _ in range(3):
                f(x).block_until_ready()
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(args.rounds):
            for k in random.sample(list(fns), len(fns)):
                start = time.perf_counter()
                fns[k](x).block_until_ready()
                times[k].append(time.perf_counter() - start)
        medians = [statistics.median(t) * 1e3 for t in times.values()]
        print(f"{case:38s} " + " ".join(f"{m:7.2f} ms" for m in medians))


if __name__ == "__main__":
    main()
