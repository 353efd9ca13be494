"""Optimizer steps against optax, torch, onnx.reference and a memory roofline.

Run from a clone of the repository: ``python benchmarks/optimizer_step.py
[--quick | --smoke]``, ``onnx-optax bench`` (the same), or
``python benchmarks/run.py`` to regenerate the results the README shows.

An optimizer step is a memory-bound elementwise pass, so its speed is measured
against the machine's memory bandwidth, measured in the same run by a jitted,
donated triad ``a + s * b`` (12 bytes an element). For each workload and each
of adagrad, adam, momentum and nesterov, one run times:

* onnx_optax's transformation (update + ``optax.apply_updates`` jitted, params
  and state donated), per-leaf state and, for pytrees, the packed layout;
* onnx_optax's op (jitted, X and state donated);
* optax's nearest built-in (``adagrad``, ``adam``, ``sgd`` with momentum or
  Nesterov), the same way;
* ``torch.optim`` with ``foreach=True``, if torch is installed;
* ``onnx.reference``'s ReferenceEvaluator (numpy), if onnx is installed.

Times are medians of repeated steps; the table gives ms a step, GB/s (bytes
an element: Adagrad and Momentum 20, Adam 28 for float32), the fraction of the
triad's bandwidth and each implementation's time as a multiple of optax's.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import os
import pathlib
import platform
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import onnx_optax
from onnx_optax._src.registry import OPTIMIZERS as REGISTRY
from onnx_optax._src.write import write_file

# ------------------------------------------------------------ the optimizers
# Every per-optimizer table the harness reads is in this section.

OPTIMIZERS = tuple(REGISTRY)  # adagrad, adam, momentum, nesterov
LEARNING_RATE = 1e-3
# Momentum's attributes have no defaults: heavy ball, as optax.sgd(momentum=0.9).
REQUIRED = {"alpha": 0.9, "beta": 1.0, "norm_coefficient": 0.0}


def _attributes(name: str) -> dict[str, Any]:
    """The attributes the harness sets: Momentum's required ones and its mode."""
    operator, fixed = REGISTRY[name]
    fields = operator.attributes._fields
    required = [f for f in fields if f not in operator.attributes._field_defaults]
    return {**{f: REQUIRED[f] for f in required if f not in fixed}, **fixed}


def state_fields(name: str) -> tuple[str, ...]:
    return REGISTRY[name][0].fields


def onnx_op(name: str) -> Callable[..., Any]:
    """onnx_optax's op for ``name``, attributes bound: ``op(R, T, *X, *G, *state)``."""
    op, attributes = REGISTRY[name][0].op, _attributes(name)
    return lambda *args: op(*args, **attributes)


def onnx_transformation(name: str, accumulator_dtype: Any, packed: bool) -> Any:
    pack = 1 << 16 if packed else 0
    options = {"accumulator_dtype": accumulator_dtype, "pack_leaves_below": pack}
    return REGISTRY[name][0].factory(LEARNING_RATE, **_attributes(name), **options)


def optax_transformation(name: str, accumulator_dtype: Any) -> Any:
    """optax's nearest built-in."""
    if name == "adagrad":
        return optax.adagrad(LEARNING_RATE)
    if name == "adam":
        return optax.adam(LEARNING_RATE, mu_dtype=accumulator_dtype)
    return optax.sgd(
        LEARNING_RATE,
        momentum=REQUIRED["alpha"],
        nesterov=name == "nesterov",
        accumulator_dtype=accumulator_dtype,
    )


def torch_optimizer(name: str, tensors: list[Any]) -> Any:
    import torch

    if name == "adagrad":
        return torch.optim.Adagrad(tensors, lr=LEARNING_RATE, foreach=True)
    if name == "adam":
        return torch.optim.Adam(tensors, lr=LEARNING_RATE, foreach=True)
    return torch.optim.SGD(
        tensors,
        lr=LEARNING_RATE,
        momentum=REQUIRED["alpha"],
        nesterov=name == "nesterov",
        foreach=True,
    )


def onnx_node_type(name: str) -> tuple[str, dict[str, Any]]:
    """The ONNX op type and attributes of ``name``."""
    return REGISTRY[name][0].op_type, _attributes(name)


def bytes_per_element(name: str, param_bytes: int = 4, state_bytes: int = 4) -> int:
    """Bytes one step moves per parameter: read X, G and the state, write X and the state."""
    return 3 * param_bytes + 2 * state_bytes * len(state_fields(name))


# ----------------------------------------------------------------- workloads


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    make: Callable[[], Any]  # builds the parameter pytree
    accumulator_dtype: Any = None
    pytree: bool = False  # several leaves: also time the packed layout

    def params(self) -> Any:
        return self.make()


def _tensor(n: int, dtype: Any = jnp.float32) -> Callable[[], Any]:
    return lambda: jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32).astype(dtype)


def model_shaped(width: int = 320, blocks: int = 12, vocab: int = 4096) -> dict[str, Any]:
    """A transformer-shaped pytree: 147 leaves of mixed sizes, about 16M parameters."""

    def w(*shape: int) -> jax.Array:
        return jnp.full(shape, 0.01, jnp.float32)

    params: dict[str, Any] = {
        "embed": w(vocab, width),
        "final_norm": {"scale": w(width), "bias": w(width)},
    }
    for b in range(blocks):
        params[f"block{b:02d}"] = {
            "attn": {
                "qkv": w(width, 3 * width),
                "qkv_bias": w(3 * width),
                "out": w(width, width),
                "out_bias": w(width),
            },
            "mlp": {
                "up": w(width, 4 * width),
                "up_bias": w(4 * width),
                "down": w(4 * width, width),
                "down_bias": w(width),
            },
            "norm1": {"scale": w(width), "bias": w(width)},
            "norm2": {"scale": w(width), "bias": w(width)},
        }
    return params


def many_small(leaves: int = 500, size: int = 1000) -> dict[str, jax.Array]:
    return {f"p{i:03d}": jnp.full((size,), 0.01, jnp.float32) for i in range(leaves)}


MODES = ("full", "quick", "smoke")


def workloads(mode: str) -> list[Workload]:
    if mode == "smoke":
        return [
            Workload("1 tensor, 4K", _tensor(1 << 12)),
            Workload("20 leaves x 100", lambda: many_small(20, 100), pytree=True),
        ]
    if mode == "quick":
        return [
            Workload("1 tensor, 64K", _tensor(1 << 16)),
            Workload("model-shaped, 147 leaves", lambda: model_shaped(32, 12, 64), pytree=True),
            Workload("50 leaves x 1,000", lambda: many_small(50), pytree=True),
            Workload("bf16 params, f32 state, 64K", _tensor(1 << 16, jnp.bfloat16), jnp.float32),
        ]
    return [
        Workload("1 tensor, 1M", _tensor(1 << 20)),
        Workload("1 tensor, 16M", _tensor(1 << 24)),
        Workload("1 tensor, 64M", _tensor(1 << 26)),
        Workload("model-shaped, 147 leaves, 16M", model_shaped, pytree=True),
        Workload("500 leaves x 1,000", many_small, pytree=True),
        Workload("bf16 params, f32 state, 16M", _tensor(1 << 24, jnp.bfloat16), jnp.float32),
    ]


# ------------------------------------------------------------------- timing


def _calibrate(step: Callable[[], Any], min_time: float) -> int:
    """Compiles and warms ``step`` up; returns how many calls last about ``min_time``."""
    step()
    step()
    start = time.perf_counter()
    step()
    once = max(time.perf_counter() - start, 1e-7)
    return max(1, int(min_time / once))


def _time_round_robin(
    steps: dict[str, Callable[[], Any]], min_time: float, repeats: int, seed: int
) -> dict[str, float]:
    """Median seconds a step for each of ``steps``, timed in turn.

    Each round times every step (``inner`` calls lasting about ``min_time``) in a
    freshly shuffled order: on a shared, noisy machine, drift and the position in
    a round otherwise bias the comparison.
    """
    inner = {label: _calibrate(step, min_time) for label, step in steps.items()}
    samples: dict[str, list[float]] = {label: [] for label in steps}
    order = list(steps)
    rng = np.random.default_rng(seed)
    for _ in range(repeats):
        rng.shuffle(order)
        for label in order:
            step, n = steps[label], inner[label]
            start = time.perf_counter()
            for _ in range(n):
                step()
            samples[label].append((time.perf_counter() - start) / n)
    return {label: float(np.median(values)) for label, values in samples.items()}


def _grads_like(params: Any) -> Any:
    return jax.tree.map(lambda p: jnp.full_like(p, 0.001), params)


def _training_step(tx: Any) -> Callable[[Any, Any, Any], Any]:
    """One training step with ``tx``: ``(params, state, grads) -> (params, state)``."""

    def step(params: Any, state: Any, grads: Any) -> Any:
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step


def _transform_step(tx: Any, params: Any) -> Callable[[], Any]:
    grads = _grads_like(params)
    holder = {"params": jax.tree.map(jnp.copy, params)}
    holder["state"] = tx.init(holder["params"])
    step_fn = jax.jit(_training_step(tx), donate_argnums=(0, 1))

    def step() -> Any:
        holder["params"], holder["state"] = step_fn(holder["params"], holder["state"], grads)
        return jax.block_until_ready(holder["params"])

    return step


def _op_step(name: str, params: Any) -> Callable[[], Any]:
    leaves = jax.tree.leaves(params)
    n = len(leaves)
    grads = [jnp.full_like(p, 0.001) for p in leaves]
    holder: dict[str, Any] = {"xs": [jnp.copy(p) for p in leaves]}
    holder["states"] = [[jnp.zeros_like(p) for p in leaves] for _ in state_fields(name)]
    op = onnx_op(name)

    def run(xs: Any, states: Any, grads: Any, T: Any) -> Any:
        flat_states = [t for s in states for t in s]
        out = op(jnp.float32(LEARNING_RATE), T, *xs, *grads, *flat_states)
        return list(out[:n]), [list(out[n * (k + 1) : n * (k + 2)]) for k in range(len(states))]

    run_fn = jax.jit(run, donate_argnums=(0, 1))
    T = jnp.asarray(1, jnp.int32)

    def step() -> Any:
        holder["xs"], holder["states"] = run_fn(holder["xs"], holder["states"], grads, T)
        return jax.block_until_ready(holder["xs"])

    return step


def _torch_step(name: str, params: Any) -> Callable[[], Any] | None:
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    leaves = jax.tree.leaves(params)
    if any(p.dtype != jnp.float32 for p in leaves):
        return None
    # torch on the device JAX uses, when it is a GPU torch can see.
    on_gpu = jax.default_backend() == "gpu" and torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    tensors = [
        torch.full(p.shape, 0.01, dtype=torch.float32, device=device, requires_grad=True)
        for p in leaves
    ]
    for t in tensors:
        t.grad = torch.full_like(t, 0.001)
    optimizer = torch_optimizer(name, tensors)

    def step() -> Any:
        optimizer.step()
        if on_gpu:
            torch.cuda.synchronize()

    return step


def _reference_step(name: str, params: Any) -> Callable[[], Any] | None:
    if importlib.util.find_spec("onnx") is None:
        return None
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    leaves = [np.asarray(p) for p in jax.tree.leaves(params)]
    if any(p.dtype != np.float32 for p in leaves):
        return None
    n = len(leaves)
    groups = list(REGISTRY[name][0].groups)
    inputs = ["R", "T"] + [f"{g}{i}" for g in groups for i in range(n)]
    outputs = [f"{g}{i}_new" for g in ["X", *groups[2:]] for i in range(n)]
    op_type, attributes = onnx_node_type(name)
    node = helper.make_node(
        op_type, inputs, outputs, domain="ai.onnx.preview.training", **attributes
    )
    evaluator = ReferenceEvaluator(node)
    feeds: dict[str, Any] = {"R": np.float32(LEARNING_RATE), "T": np.int64(1)}
    values = leaves + [np.full_like(p, 0.001) for p in leaves]
    values += [np.zeros_like(p) for _ in state_fields(name) for p in leaves]
    feeds.update(zip(inputs[2:], values, strict=True))

    def step() -> Any:
        return evaluator.run(None, feeds)

    return step


def _triad_step(n: int) -> Callable[[], Any]:
    b = jnp.full((n,), 0.5, jnp.float32)
    holder = {"a": jnp.zeros((n,), jnp.float32)}
    triad = jax.jit(lambda a, b: a + jnp.float32(0.5) * b, donate_argnums=(0,))

    def step() -> Any:
        holder["a"] = triad(holder["a"], b)
        return holder["a"].block_until_ready()

    return step


# ------------------------------------------------------------------ the run


@dataclasses.dataclass
class Row:
    workload: str
    optimizer: str
    implementation: str
    seconds: float
    gbps: float
    roofline: float
    time_vs_optax: float  # this time / optax's time: below 1 is faster than optax


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a mode times: sizes, and how long and how often."""

    mode: str
    min_time: float  # seconds of calls in one sample
    repeats: int  # samples (rounds) per implementation
    scaling_sizes: tuple[int, ...]
    compile_model: tuple[int, int, int]  # model_shaped(width, blocks, vocab)


SETTINGS = {
    "full": Settings("full", 0.1, 9, tuple(1000 * 4**k for k in range(9)), (320, 12, 4096)),
    "quick": Settings("quick", 0.02, 3, tuple(1000 * 4**k for k in range(4)), (32, 12, 64)),
    "smoke": Settings("smoke", 0.002, 1, (1000, 4000), (8, 2, 16)),
}


def _count(params: Any) -> int:
    return sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))


def skipped_competitors(slow: bool) -> dict[str, str]:
    """The competitors this run leaves out, each with the reason."""
    if not slow:
        return {
            "torch.optim foreach": "--no-slow",
            "onnx.reference": "--no-slow",
        }
    skipped = {}
    if importlib.util.find_spec("torch") is None:
        skipped["torch.optim foreach"] = "torch is not installed (it is not a dependency)"
    if importlib.util.find_spec("onnx") is None:
        skipped["onnx.reference"] = (
            'onnx is not installed (pip install "onnx-optax[onnx]", from a clone: '
            'pip install ".[onnx]")'
        )
    return skipped


def run_workload(
    workload: Workload, *, min_time: float, repeats: int, slow: bool
) -> tuple[list[Row], float]:
    params = workload.params()
    elements = _count(params)
    param_bytes = jax.tree.leaves(params)[0].dtype.itemsize
    state_bytes = (
        jnp.dtype(workload.accumulator_dtype).itemsize
        if workload.accumulator_dtype
        else param_bytes
    )
    accumulator = workload.accumulator_dtype
    rows = []
    triads = []
    for index, name in enumerate(OPTIMIZERS):
        moved = bytes_per_element(name, param_bytes, state_bytes) * elements
        steps: dict[str, Callable[[], Any]] = {
            "triad": _triad_step(elements),
            "optax": _transform_step(optax_transformation(name, accumulator), params),
            "onnx_optax transform": _transform_step(
                onnx_transformation(name, accumulator, False), params
            ),
        }
        if workload.pytree:
            steps["onnx_optax transform, packed"] = _transform_step(
                onnx_transformation(name, accumulator, True), params
            )
        if accumulator is None:
            steps["onnx_optax op"] = _op_step(name, params)
        if slow:
            for label, build in (
                ("torch.optim foreach", _torch_step),
                ("onnx.reference", _reference_step),
            ):
                step = build(name, params)
                if step is not None:
                    steps[label] = step
        times = _time_round_robin(steps, min_time, repeats, seed=index)
        del steps
        gc.collect()
        triad_gbps = 12 * elements / times.pop("triad") / 1e9
        triads.append(triad_gbps)
        for label, seconds in times.items():
            gbps = moved / seconds / 1e9
            rows.append(
                Row(
                    workload.name,
                    name,
                    label,
                    seconds,
                    gbps,
                    gbps / triad_gbps,
                    seconds / times["optax"],
                )
            )
    return rows, float(np.median(triads))


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache of this host (Linux sysfs), or None where it cannot be read."""
    sizes = []
    for path in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            sizes.append(int(text.rstrip("KMG")) * scale)
        except ValueError:
            continue
    return max(sizes) if sizes else None


def working_set_bytes(workload: Workload) -> int:
    """Bytes Adam touches in one step (X, G, V, H), the largest of the four optimizers."""
    params = workload.params()
    param_bytes = jax.tree.leaves(params)[0].dtype.itemsize
    state_bytes = jnp.dtype(workload.accumulator_dtype or jnp.float32).itemsize
    return (2 * param_bytes + 2 * state_bytes) * _count(params)


def scaling(sizes: list[int], *, min_time: float, repeats: int) -> dict[str, list[float]]:
    """Nanoseconds an element for Adam (onnx_optax, optax) and its roofline, by tensor size."""
    labels = ("onnx_optax adam", "optax adam", "roofline (triad at 28 B)")
    result: dict[str, list[float]] = {"elements": [float(n) for n in sizes]}
    result.update({label: [] for label in labels})
    for n in sizes:
        params = _tensor(n)()
        steps = {
            "onnx_optax adam": _transform_step(onnx_transformation("adam", None, False), params),
            "optax adam": _transform_step(optax_transformation("adam", None), params),
            "roofline (triad at 28 B)": _triad_step(n),
        }
        times = _time_round_robin(steps, min_time, repeats, seed=n)
        # The triad moves 12 bytes an element, Adam 28: scale it to Adam's bytes.
        times["roofline (triad at 28 B)"] *= bytes_per_element("adam") / 12
        for label in labels:
            result[label].append(1e9 * times[label] / n)
        del steps
        gc.collect()
    return result


def compile_times(params: Any) -> dict[str, float]:
    """Seconds of the first call (trace + compile + run) of a jitted Adam step."""
    result = {}
    for label, make in (
        ("optax adam", lambda: optax.adam(LEARNING_RATE)),
        ("onnx_optax adam", lambda: onnx_optax.adam(LEARNING_RATE)),
    ):
        jax.clear_caches()
        tx = make()
        state = tx.init(params)
        grads = _grads_like(params)
        start = time.perf_counter()
        jax.block_until_ready(jax.jit(_training_step(tx))(params, state, grads))
        result[label] = time.perf_counter() - start
    return result


def machine() -> str:
    devices = jax.devices()
    kind = devices[0].device_kind
    cpu = platform.processor() or platform.machine()
    cores = os.cpu_count()
    return (
        f"{devices[0].platform} ({kind}, {len(devices)} device(s)); host {cpu}, {cores} cores; "
        f"jax {jax.__version__}"
    )


def _text_row(cells: list[str]) -> str:
    widths = (-34, -9, -30, 10, 8, 11, 15)
    return " ".join(
        f"{cell:<{-w}}" if w < 0 else f"{cell:>{w}}" for cell, w in zip(cells, widths, strict=True)
    )


HEADER = [
    "workload",
    "optimizer",
    "implementation",
    "ms/step",
    "GB/s",
    "of roofline",
    "x optax's time",
]


def format_table(
    rows: list[Row], triads: dict[str, float], markdown: bool, in_cache: set[str]
) -> str:
    """The table; workloads in ``in_cache`` are marked with a ``*``."""
    lines = []
    if markdown:
        lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    else:
        lines.append(_text_row(HEADER))
    last = None
    for row in rows:
        name = row.workload + (" *" if row.workload in in_cache else "")
        if markdown:
            name = f"{name} (triad {triads[row.workload]:.1f} GB/s)"
        cells = [
            name if row.workload != last else "",
            row.optimizer,
            row.implementation,
            f"{row.seconds * 1e3:.3f}",
            f"{row.gbps:.1f}",
            f"{row.roofline:.2f}",
            f"{row.time_vs_optax:.2f}x",
        ]
        last = row.workload
        if markdown:
            lines.append("| " + " | ".join(cells) + " |")
        else:
            lines.append(_text_row(cells))
    return "\n".join(lines)


def notes(
    rows: list[Row], mode: str, skipped: dict[str, str], in_cache: dict[str, int], cache: int | None
) -> list[str]:
    """What the table can and cannot carry: cache, quick mode, what was left out."""
    lines = ["x optax's time: this row's time over optax's on the same workload (below 1: faster)"]
    if in_cache and cache:
        sizes = ", ".join(f"{w} {b / 2**20:.1f} MiB" for w, b in in_cache.items())
        lines.append(
            f"starred (*) workloads: the working set (X, G and state: {sizes}) fits in this host's "
            f"{cache / 2**20:.0f} MiB last-level cache: these rows measure cache, not memory "
            "bandwidth, and 'of roofline' (against a triad that also runs from cache) can "
            "exceed 1"
        )
    elif any(row.roofline > 1 for row in rows):
        lines.append(
            "'of roofline' above 1: the working set fits in a cache, so these rows do not "
            "measure memory bandwidth"
        )
    if mode == "quick":
        lines.append(
            f"quick mode: sizes that fit in cache, {SETTINGS[mode].repeats} rounds of "
            f"{SETTINGS[mode].min_time * 1e3:.0f} ms: it checks that every implementation runs "
            "and gives rough ratios, which move by 10-30 % between runs. It cannot show "
            "memory-bound speed on large tensors, nor the packed layout's gain on 500 leaves "
            "(the README's figure; here 50 leaves); for those run the full benchmark, "
            "python benchmarks/run.py"
        )
    if mode == "smoke":
        lines.append(
            "smoke mode: tiny sizes, one round of 2 ms: a test that the harness and every "
            "implementation run; its times and ratios mean nothing"
        )
    for competitor, reason in skipped.items():
        lines.append(f"skipped {competitor}: {reason}")
    if any(w.accumulator_dtype is not None for w in workloads(mode)):
        lines.append(
            "bf16 workload: no op row (the op takes X and state in one dtype) and no "
            "torch.optim or onnx.reference rows (timed on float32 parameters only)"
        )
    return lines


def summarize(rows: list[Row]) -> list[str]:
    """The issue's targets, as measured in this run (a full run: large tensors, 500 leaves)."""

    def time_of(workload: str, optimizer: str, implementation: str) -> float | None:
        for row in rows:
            if (row.workload, row.optimizer, row.implementation) == (
                workload,
                optimizer,
                implementation,
            ):
                return row.seconds
        return None

    lines = []
    large = [
        r
        for r in rows
        if r.workload.startswith("1 tensor")
        and not r.workload.endswith("1M")
        and r.implementation.startswith("onnx_optax")
    ]
    if large:
        worst = min(large, key=lambda r: r.roofline)
        lines.append(
            f"large tensors: onnx_optax at {worst.roofline:.2f}-"
            f"{max(r.roofline for r in large):.2f} of the triad roofline (lowest: "
            f"{worst.optimizer} {worst.implementation}, {worst.workload})"
        )
    best: dict[tuple[str, str], float] = {}
    for row in rows:
        if row.implementation.startswith("onnx_optax transform"):
            key = (row.workload, row.optimizer)
            best[key] = min(best.get(key, np.inf), row.time_vs_optax)
    if best:
        (w, o), ratio = max(best.items(), key=lambda kv: kv[1])
        lines.append(
            f"vs optax: onnx_optax's best transform takes at most {ratio:.2f}x optax's time on "
            f"every workload (highest: {o} on {w})"
        )
    for row in rows:
        if (
            row.implementation == "onnx_optax transform, packed"
            and row.optimizer == "adam"
            and "leaves x" in row.workload
        ):
            lines.append(
                f"many small leaves ({row.workload}): packed adam takes {row.time_vs_optax:.2f}x "
                "optax.adam's time"
            )
    for other, label in (
        ("torch.optim foreach", "torch.optim foreach's"),
        ("onnx.reference", "the onnx.reference formulas'"),
    ):
        ratios = []
        for row in rows:
            if row.implementation == "onnx_optax transform":
                theirs = time_of(row.workload, row.optimizer, other)
                if theirs is not None:
                    ratios.append(row.seconds / theirs)
        if ratios:
            lines.append(
                f"vs {other}: onnx_optax transform takes {min(ratios):.2f}x to "
                f"{max(ratios):.2f}x {label} time"
            )
    return lines


def plot_scaling(data: dict[str, list[float]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for label, values in data.items():
        if label != "elements":
            ax.loglog(data["elements"], values, marker="o", label=label)
    ax.set_xlabel("elements in the tensor")
    ax.set_ylabel("ns per element per step")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    suffix = pathlib.PurePath(path).suffix.lstrip(".").lower() or None
    try:  # the package's one writer: a new file renamed into place, never through a link
        write_file(path, lambda file: fig.savefig(file, format=suffix), what="the plot")
    finally:
        plt.close(fig)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_bench(
    *, mode: str = "full", markdown: str | None = None, plot: str | None = None, slow: bool = True
) -> int:
    """Times every workload of ``mode`` ("full", "quick" or "smoke"); prints the table."""
    settings = SETTINGS[mode]
    where = machine()
    print(f"onnx-optax bench ({mode}) on {where}", flush=True)
    rows: list[Row] = []
    triads: dict[str, float] = {}
    cache = last_level_cache_bytes() if jax.default_backend() == "cpu" else None
    in_cache: dict[str, int] = {}
    for workload in workloads(mode):
        _progress(f"  timing {workload.name} ...")
        new_rows, triads[workload.name] = run_workload(
            workload, min_time=settings.min_time, repeats=settings.repeats, slow=slow
        )
        rows += new_rows
        if cache and working_set_bytes(workload) <= cache:
            in_cache[workload.name] = working_set_bytes(workload)
    print()
    print(format_table(rows, triads, markdown=False, in_cache=set(in_cache)))
    print()
    lines = notes(rows, mode, skipped_competitors(slow), in_cache, cache)
    if mode == "full":
        lines += summarize(rows)
    _progress("  timing the first call ...")
    compile_model = model_shaped(*settings.compile_model)
    compile_report = compile_times(compile_model)
    lines.append(
        f"first call (trace + compile + run), {len(jax.tree.leaves(compile_model))}-leaf model: "
        + ", ".join(f"{k} {v:.2f} s" for k, v in compile_report.items())
    )
    for line in lines:
        print(textwrap.fill(line, 100, subsequent_indent="  "))
    if plot:
        _progress("  timing Adam by size for the plot ...")
        data = scaling(
            list(settings.scaling_sizes), min_time=settings.min_time, repeats=settings.repeats
        )
        plot_scaling(data, plot, f"Adam step time per element; {where}")
        print(f"wrote {plot}")
    if markdown:
        text = (
            f"Measured on {where} by `onnx-optax bench`.\n\n"
            + format_table(rows, triads, markdown=True, in_cache=set(in_cache))
            + "\n\n"
            + "\n".join(f"- {line}" for line in lines)
            + "\n"
        )
        write_file(markdown, text.encode(), what="the table")
        print(f"wrote {markdown}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small, in-cache sizes (a minute)")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, one round (seconds)")
    parser.add_argument("--markdown", metavar="PATH", help="also write the table as markdown")
    parser.add_argument("--plot", metavar="PATH", help="also time Adam by size; write a PNG")
    parser.add_argument("--no-slow", action="store_true", help="skip torch and onnx.reference")
    args = parser.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    return run_bench(mode=mode, markdown=args.markdown, plot=args.plot, slow=not args.no_slow)


if __name__ == "__main__":
    sys.exit(main())
