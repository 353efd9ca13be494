"""``onnx-optax bench``: optimizer steps against optax, torch, onnx.reference and a roofline.

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
triad's bandwidth and each implementation's speed relative to optax.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import onnx_optax

OPTIMIZERS = ("adagrad", "adam", "momentum", "nesterov")
STATE = {"adagrad": ("h",), "adam": ("v", "h"), "momentum": ("v",), "nesterov": ("v",)}
LEARNING_RATE = 1e-3


def bytes_per_element(name: str, param_bytes: int = 4, state_bytes: int = 4) -> int:
    """Bytes one step moves per parameter: read X, G and the state, write X and the state."""
    return 3 * param_bytes + 2 * state_bytes * len(STATE[name])


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


def workloads(quick: bool) -> list[Workload]:
    if quick:
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
    holder["states"] = [[jnp.zeros_like(p) for p in leaves] for _ in STATE[name]]
    op: Any = {
        "adagrad": onnx_optax.ops.adagrad,
        "adam": onnx_optax.ops.adam,
        "momentum": lambda *a: onnx_optax.ops.momentum(
            *a, alpha=0.9, beta=1.0, mode="standard", norm_coefficient=0.0
        ),
        "nesterov": lambda *a: onnx_optax.ops.momentum(
            *a, alpha=0.9, beta=1.0, mode="nesterov", norm_coefficient=0.0
        ),
    }[name]

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


def _onnx_transformation(name: str, accumulator_dtype: Any, packed: bool) -> Any:
    pack = 1 << 16 if packed else 0
    if name == "adagrad":
        return onnx_optax.adagrad(
            LEARNING_RATE, accumulator_dtype=accumulator_dtype, pack_leaves_below=pack
        )
    if name == "adam":
        return onnx_optax.adam(
            LEARNING_RATE, accumulator_dtype=accumulator_dtype, pack_leaves_below=pack
        )
    return onnx_optax.momentum(
        LEARNING_RATE,
        alpha=0.9,
        beta=1.0,
        norm_coefficient=0.0,
        mode="nesterov" if name == "nesterov" else "standard",
        accumulator_dtype=accumulator_dtype,
        pack_leaves_below=pack,
    )


def _optax_transformation(name: str, accumulator_dtype: Any) -> Any:
    if name == "adagrad":
        return optax.adagrad(LEARNING_RATE)
    if name == "adam":
        return optax.adam(LEARNING_RATE, mu_dtype=accumulator_dtype)
    return optax.sgd(
        LEARNING_RATE,
        momentum=0.9,
        nesterov=name == "nesterov",
        accumulator_dtype=accumulator_dtype,
    )


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
    optimizer = {
        "adagrad": lambda: torch.optim.Adagrad(tensors, lr=LEARNING_RATE, foreach=True),
        "adam": lambda: torch.optim.Adam(tensors, lr=LEARNING_RATE, foreach=True),
        "momentum": lambda: torch.optim.SGD(tensors, lr=LEARNING_RATE, momentum=0.9, foreach=True),
        "nesterov": lambda: torch.optim.SGD(
            tensors, lr=LEARNING_RATE, momentum=0.9, nesterov=True, foreach=True
        ),
    }[name]()

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
    groups = ["X", "G", *(s.upper() for s in STATE[name])]
    inputs = ["R", "T"] + [f"{g}{i}" for g in groups for i in range(n)]
    outputs = [f"{g}{i}_new" for g in ["X", *groups[2:]] for i in range(n)]
    attributes: dict[str, Any] = {}
    op_type = {"adagrad": "Adagrad", "adam": "Adam"}.get(name, "Momentum")
    if op_type == "Momentum":
        attributes = {
            "alpha": 0.9,
            "beta": 1.0,
            "norm_coefficient": 0.0,
            "mode": "nesterov" if name == "nesterov" else "standard",
        }
    node = helper.make_node(
        op_type, inputs, outputs, domain="ai.onnx.preview.training", **attributes
    )
    evaluator = ReferenceEvaluator(node)
    feeds: dict[str, Any] = {"R": np.float32(LEARNING_RATE), "T": np.int64(1)}
    values = leaves + [np.full_like(p, 0.001) for p in leaves]
    values += [np.zeros_like(p) for _ in STATE[name] for p in leaves]
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
    vs_optax: float  # optax's time / this time: > 1 is faster than optax


def _count(params: Any) -> int:
    return sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))


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
            "optax": _transform_step(_optax_transformation(name, accumulator), params),
            "onnx_optax transform": _transform_step(
                _onnx_transformation(name, accumulator, False), params
            ),
        }
        if workload.pytree:
            steps["onnx_optax transform, packed"] = _transform_step(
                _onnx_transformation(name, accumulator, True), params
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
                    times["optax"] / seconds,
                )
            )
    return rows, float(np.median(triads))


def scaling(sizes: list[int], *, min_time: float, repeats: int) -> dict[str, list[float]]:
    """Nanoseconds an element for Adam (onnx_optax, optax) and its roofline, by tensor size."""
    labels = ("onnx_optax adam", "optax adam", "roofline (triad at 28 B)")
    result: dict[str, list[float]] = {"elements": [float(n) for n in sizes]}
    result.update({label: [] for label in labels})
    for n in sizes:
        params = _tensor(n)()
        steps = {
            "onnx_optax adam": _transform_step(_onnx_transformation("adam", None, False), params),
            "optax adam": _transform_step(_optax_transformation("adam", None), params),
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
    widths = (-32, -9, -30, 10, 8, 11, 9)
    return " ".join(
        f"{cell:<{-w}}" if w < 0 else f"{cell:>{w}}" for cell, w in zip(cells, widths, strict=True)
    )


def format_table(rows: list[Row], triads: dict[str, float], markdown: bool) -> str:
    header = [
        "workload",
        "optimizer",
        "implementation",
        "ms/step",
        "GB/s",
        "of roofline",
        "vs optax",
    ]
    lines = []
    if markdown:
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    else:
        lines.append(_text_row(header))
    last = None
    for row in rows:
        name = row.workload if row.workload != last else ""
        if markdown:
            name = (
                f"{row.workload} (triad {triads[row.workload]:.1f} GB/s)"
                if row.workload != last
                else ""
            )
        last = row.workload
        cells = [
            name,
            row.optimizer,
            row.implementation,
            f"{row.seconds * 1e3:.3f}",
            f"{row.gbps:.1f}",
            f"{row.roofline:.2f}",
            f"{row.vs_optax:.2f}x",
        ]
        if markdown:
            lines.append("| " + " | ".join(cells) + " |")
        else:
            lines.append(_text_row(cells))
    return "\n".join(lines)


def summarize(rows: list[Row]) -> list[str]:
    """The issue's targets, as measured in this run."""

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
        and not r.workload.endswith(("1M", "64K"))
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
            best[key] = max(best.get(key, 0.0), row.vs_optax)
    if best:
        (w, o), ratio = min(best.items(), key=lambda kv: kv[1])
        lines.append(
            f"vs optax: onnx_optax's best transform is at least {ratio:.2f}x optax's speed on "
            f"every workload (lowest: {o} on {w})"
        )
    for row in rows:
        if (
            row.implementation == "onnx_optax transform, packed"
            and row.optimizer == "adam"
            and "leaves x" in row.workload
        ):
            lines.append(
                f"many small leaves ({row.workload}): packed adam {row.vs_optax:.2f}x the "
                "speed of optax.adam"
            )
    for other, label in (
        ("torch.optim foreach", "torch.optim foreach"),
        ("onnx.reference", "the onnx.reference formulas"),
    ):
        ratios = []
        for row in rows:
            if row.implementation == "onnx_optax transform":
                theirs = time_of(row.workload, row.optimizer, other)
                if theirs is not None:
                    ratios.append(theirs / row.seconds)
        if ratios:
            lines.append(
                f"vs {label}: onnx_optax transform {min(ratios):.1f}x to {max(ratios):.1f}x faster"
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
    fig.savefig(path)
    plt.close(fig)


def run_bench(*, quick: bool, markdown: str | None, plot: str | None, slow: bool = True) -> int:
    min_time = 0.02 if quick else 0.1
    repeats = 3 if quick else 9
    where = machine()
    print(f"onnx-optax bench on {where}")
    rows: list[Row] = []
    triads: dict[str, float] = {}
    for workload in workloads(quick):
        print(f"  timing {workload.name} ...", flush=True)
        new_rows, triads[workload.name] = run_workload(
            workload, min_time=min_time, repeats=repeats, slow=slow
        )
        rows += new_rows
    table = format_table(rows, triads, markdown=False)
    print()
    print(table)
    print()
    lines = summarize(rows)
    for line in lines:
        print(line)
    compile_report = compile_times(model_shaped(32 if quick else 320, 12, 64 if quick else 4096))
    compile_line = "first call (trace + compile + run), 147-leaf model: " + ", ".join(
        f"{k} {v:.2f} s" for k, v in compile_report.items()
    )
    print(compile_line)
    if plot:
        sizes = [1000 * 4**k for k in range(4 if quick else 9)]
        data = scaling(sizes, min_time=min_time, repeats=repeats)
        plot_scaling(data, plot, f"Adam step time per element; {where}")
        print(f"wrote {plot}")
    if markdown:
        with open(markdown, "w") as f:
            f.write(f"Measured on {where} by `onnx-optax bench`.\n\n")
            f.write(format_table(rows, triads, markdown=True))
            f.write("\n\n" + "\n".join(f"- {line}" for line in [*lines, compile_line]) + "\n")
        print(f"wrote {markdown}")
    return 0
