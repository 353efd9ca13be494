"""Grouped and depthwise convs on CPU: XLA's native grouped conv against shifted multiply-adds.

For each geometry it times, jitted, XLA's ``lax.conv_general_dilated`` with
``feature_group_count`` (``native``) and the sum over the kernel's taps of
strided slices times weights that ``Conv`` lowers small groups to on CPU
(``shifted``, ``onnx_optax._src.ops.convolution.shifted_conv``; with more than
``SHIFTED_CHANNELS`` channels a group, one matrix product of the stacked taps
batched over the groups, ``_patches_conv``): the forward alone, and
forward + backward (``jax.grad`` of ``sum(conv(X, W) * R)`` for a fixed random R,
with respect to X and W). Both give the same values (checked first). Times are
medians over rounds after a warm-up, the implementations in a freshly shuffled
order each round, ``block_until_ready`` inside the timed region; "x" is native's
time over shifted's (above 1: shifted is faster). "op" says what ``Conv`` runs on
CPU (``SHIFTED_CHANNELS``, ``SHIFTED_TERMS`` in ``conv.py``)::

    PYTHONPATH=. .venv/bin/python benchmarks/grouped_conv.py            # ~4 minutes on 2 cores
    PYTHONPATH=. .venv/bin/python benchmarks/grouped_conv.py --quick    # 5 cases
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from onnx_optax._src.ops import convolution


class Case(NamedTuple):
    """One conv: X (batch, channels, size, size), W (channels * multiplier, per_group, k, k)."""

    batch: int
    channels: int
    size: int
    kernel: int
    stride: int
    per_group: int = 1  # input channels per group: 1 is depthwise
    multiplier: int = 1  # output channels per input channel

    def __str__(self) -> str:
        group = "dw" if self.per_group == 1 else f"{self.per_group}/g"
        extra = f" x{self.multiplier}" if self.multiplier > 1 else ""
        return (
            f"[{self.batch},{self.channels},{self.size},{self.size}] "
            f"{self.kernel}x{self.kernel}/{self.stride} {group}{extra}"
        )


CASES = [
    Case(1, 88, 12, 3, 1),  # the PaddleOCR text-direction classifier's (issue 21)
    Case(4, 88, 12, 3, 1),
    Case(1, 32, 112, 3, 1),  # MobileNet's first depthwise stage
    Case(1, 96, 112, 3, 2),
    Case(1, 144, 56, 3, 1),
    Case(4, 144, 56, 3, 2),
    Case(32, 64, 28, 3, 1),
    Case(32, 16, 56, 3, 1),
    Case(1, 512, 7, 3, 1),
    Case(32, 512, 7, 3, 1),
    Case(1, 240, 28, 5, 1),
    Case(4, 128, 28, 5, 2),
    Case(4, 32, 28, 3, 1, multiplier=2),
    Case(4, 64, 28, 3, 1, per_group=2),
    Case(4, 64, 28, 3, 1, per_group=4),
    Case(4, 128, 28, 3, 1, per_group=8),
    Case(4, 128, 14, 3, 1, per_group=16),
    Case(32, 128, 14, 3, 1, per_group=8),
    Case(4, 128, 28, 5, 1, per_group=4),
    Case(1, 240, 28, 1, 1, per_group=60),  # ShuffleNet's 1x1 convs of 4 groups
    Case(8, 272, 28, 1, 1, per_group=68),
    Case(1, 1088, 7, 1, 1, per_group=272),
]
QUICK = [CASES[0], CASES[1], CASES[6], CASES[14], CASES[19]]


def _functions(case: Case) -> dict[str, Callable[..., Any]]:
    group = case.channels // case.per_group
    pad = case.kernel // 2
    geometry = convolution.Geometry([case.stride] * 2, [(pad, pad)] * 2, [1, 1], [1, 1], group)
    products = case.per_group > convolution.SHIFTED_CHANNELS
    rewrite = convolution.patches_conv if products else convolution.shifted_conv
    convs = {
        "native": lambda x, w: convolution.native_conv(x, w, geometry),
        "shifted": lambda x, w: rewrite(x, w, geometry),
    }
    fns = {}
    for name, fn in convs.items():
        fns[f"fwd {name}"] = jax.jit(fn)
        loss = lambda x, w, r, fn=fn: (fn(x, w) * r).sum()  # noqa: E731
        fns[f"grad {name}"] = jax.jit(jax.grad(loss, (0, 1)))
    return fns


def _op_choice(case: Case) -> str:
    """What Conv runs on CPU: the shifted sum, the shifted products or the native conv."""
    taps = case.kernel**2
    if case.per_group <= convolution.SHIFTED_CHANNELS:
        return "sum" if case.per_group * taps <= convolution.SHIFTED_TERMS else "native"
    return "products" if taps <= convolution.SHIFTED_TERMS else "native"


def _time(case: Case, rounds: int, budget: float) -> dict[str, float]:
    rng = np.random.default_rng(0)
    c, m = case.channels, case.channels * case.multiplier
    x = jax.device_put(rng.standard_normal((case.batch, c, case.size, case.size), np.float32))
    w = jax.device_put(
        rng.standard_normal((m, case.per_group, case.kernel, case.kernel), np.float32)
    )
    fns = _functions(case)
    y = np.asarray(fns["fwd native"](x, w))
    np.testing.assert_allclose(np.asarray(fns["fwd shifted"](x, w)), y, rtol=1e-4, atol=1e-4)
    r = jax.device_put(rng.standard_normal(y.shape, np.float32))
    for a, b in zip(fns["grad native"](x, w, r), fns["grad shifted"](x, w, r), strict=True):
        scale = float(np.abs(np.asarray(a)).max())
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5 * scale)
    inputs = {name: (x, w) if name.startswith("fwd") else (x, w, r) for name in fns}
    times: dict[str, list[float]] = {name: [] for name in fns}
    deadline = time.perf_counter() + budget
    for i in range(rounds):
        for name in random.sample(list(fns), len(fns)):
            start = time.perf_counter()
            jax.block_until_ready(fns[name](*inputs[name]))
            times[name].append(time.perf_counter() - start)
        if i >= 2 and time.perf_counter() > deadline:  # the slowest native gradients
            break
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--budget", type=float, default=6.0, help="seconds a case times at most")
    parser.add_argument("--quick", action="store_true", help="5 cases, 5 rounds")
    args = parser.parse_args()
    cases, rounds = (QUICK, 5) if args.quick else (CASES, args.rounds)
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}, float32, ms (median)\n")
    print("| case | fwd native | fwd shifted | x | fwd+bwd native | fwd+bwd shifted | x | op |")
    print("|---|--:|--:|--:|--:|--:|--:|---|")
    ratios = []
    for case in cases:
        t = _time(case, rounds, args.budget)
        fwd, grad = t["fwd native"] / t["fwd shifted"], t["grad native"] / t["grad shifted"]
        ratios.append((fwd, grad))
        print(
            f"| {case} | {t['fwd native']:.3f} | {t['fwd shifted']:.3f} | {fwd:.1f} | "
            f"{t['grad native']:.2f} | {t['grad shifted']:.2f} | {grad:.1f} | {_op_choice(case)} |",
            flush=True,
        )
    means = [math.exp(statistics.fmean(math.log(r[i]) for r in ratios)) for i in (0, 1)]
    print(f"\ngeometric mean of native / shifted: forward {means[0]:.1f}x, fwd+bwd {means[1]:.1f}x")


if __name__ == "__main__":
    main()
