"""``onnx-optax conformance``: check onnx_optax against ONNX on the device JAX sees.

Runs the seven ONNX backend node cases through :mod:`onnx_optax.backend`, then a
randomized differential test against ``onnx.reference.ReferenceEvaluator``
(T > 0, non-zero decay, norm_coefficient and norm_coefficient_post, float32 and
float64, several tensors), and prints one row per case: the largest absolute
and (normwise) relative error, the tolerance and pass/fail. The command's options
are :func:`add_parser`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from typing import Any

import jax
import numpy as np

from onnx_optax._src.extras import require
from onnx_optax._src.registry import OPTIMIZERS
from onnx_optax.cli.common import Commands, UsageError

DOMAIN = "ai.onnx.preview.training"
NODE_CASES = (
    "test_adagrad",
    "test_adagrad_multiple",
    "test_adam",
    "test_adam_multiple",
    "test_momentum",
    "test_nesterov_momentum",
    "test_momentum_multiple",
)


def _progress(message: str) -> None:
    """A progress line on stderr, shown at once: stdout keeps only the table."""
    print(message, file=sys.stderr, flush=True)


@dataclasses.dataclass
class Row:
    case: str
    dtype: str
    max_abs: float
    max_rel: float
    tolerance: str
    passed: bool


def _errors(
    ours: list[np.ndarray], expected: list[np.ndarray], rtol: float, atol: float
) -> tuple[float, float, bool]:
    max_abs = max_rel = 0.0
    passed = len(ours) == len(expected)
    for a, b in zip(ours, expected, strict=False):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        passed &= a64.shape == b64.shape
        if not a64.size:
            continue
        diff = float(np.max(np.abs(a64 - b64)))
        max_abs = max(max_abs, diff)
        max_rel = max(max_rel, diff / max(float(np.max(np.abs(b64))), np.finfo(np.float64).tiny))
        passed &= bool(np.allclose(a64, b64, rtol=rtol, atol=atol))
    return max_abs, max_rel, passed


def _node_case_rows() -> list[Row]:
    from onnx.backend.test.case.node import collect_testcases

    from onnx_optax.backend import run_node

    _progress("  collecting the ONNX node cases ...")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # generating every node case warns for other ops
        cases = {c.name: c for c in collect_testcases(None) if c.name in NODE_CASES}
    rows = []
    for index, name in enumerate(NODE_CASES, 1):
        _progress(f"  node case {index}/{len(NODE_CASES)}: {name}")
        case: Any = cases[name]
        (node,) = case.model.graph.node
        for inputs, expected in case.data_sets:
            ours = list(run_node(node, inputs))
            dtype_ok = [np.asarray(o).dtype for o in ours] == [e.dtype for e in expected]
            max_abs, max_rel, passed = _errors(ours, list(expected), case.rtol, case.atol)
            rows.append(
                Row(
                    name,
                    str(expected[0].dtype),
                    max_abs,
                    max_rel,
                    f"rtol={case.rtol:g} atol={case.atol:g}",
                    passed and dtype_ok,
                )
            )
    return rows


FOOTNOTE = (
    "[1] float64 Adam is judged at float32 precision: onnx.reference computes Adam's\n"
    "    attribute terms (1 - alpha, 1 - beta, ...) from float32 attribute scalars and casts\n"
    "    multi-tensor outputs to float32, so its float64 results carry float32 rounding."
)

# (low, high) of each attribute: non-zero values, and with --long their whole range.
_RANGES: dict[str, dict[str, dict[str, tuple[float, float]]]] = {
    "adagrad": {
        "narrow": {
            "decay_factor": (0.05, 0.5),
            "epsilon": (1e-7, 1e-3),
            "norm_coefficient": (1e-3, 0.1),
        },
        "wide": {
            "decay_factor": (1e-6, 1e3),
            "epsilon": (1e-8, 1e3),
            "norm_coefficient": (1e-6, 1.0),
        },
    },
    "adam": {
        "narrow": {
            "alpha": (0.5, 0.99),
            "beta": (0.9, 0.9999),
            "epsilon": (1e-7, 1e-3),
            "norm_coefficient": (1e-3, 0.1),
            "norm_coefficient_post": (1e-3, 0.1),
        },
        "wide": {
            "alpha": (0.0, 0.9999),
            "one_minus_beta": (1e-7, 1.0),
            "epsilon": (1e-8, 1e3),
            "norm_coefficient": (1e-6, 1.0),
            "norm_coefficient_post": (1e-6, 0.5),
        },
    },
    "momentum": {
        "narrow": {"alpha": (0.5, 0.99), "beta": (0.1, 1.0), "norm_coefficient": (1e-3, 0.1)},
        "wide": {"alpha": (0.0, 1.0), "beta": (0.0, 2.0), "norm_coefficient": (1e-6, 1.0)},
    },
}


def _attributes(op: str, rng: np.random.Generator, wide: bool) -> dict[str, Any]:
    """Non-zero attributes as float32 values; ``wide`` draws positive ranges log-uniformly."""
    ranges = _RANGES["momentum" if op == "nesterov" else op]["wide" if wide else "narrow"]
    values: dict[str, Any] = {}
    for name, (low, high) in ranges.items():
        if wide and low > 0:
            value = 10.0 ** rng.uniform(np.log10(low), np.log10(high))
        else:
            value = rng.uniform(low, high)
        if name == "one_minus_beta":
            name, value = "beta", 1.0 - value
        values[name] = float(np.float32(value))
    return {**values, **OPTIMIZERS[op][1]}


def _differential_rows(seed: int, rounds: int, wide: bool = False) -> list[Row]:
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    from onnx_optax.backend import run_node

    rng = np.random.default_rng(seed)
    rows = []
    for op, (operator, _) in OPTIMIZERS.items():
        groups = operator.groups[2:]
        for dtype in ("float32", "float64"):
            _progress(f"  onnx.reference differential: {op} {dtype}, {rounds} case(s)")
            for case in range(1, rounds + 1):
                n = int(rng.integers(2, 5))
                T = int(rng.choice([1, 2, 7, 100, 1000]))
                if wide:
                    T = int(rng.choice([T, int(rng.integers(1, 2**31))]))
                shapes = [tuple(rng.integers(1, 6, size=rng.integers(0, 4))) for _ in range(n)]
                attributes = _attributes(op, rng, wide)
                names = [f"{g}{i}" for g in ("X", "G", *groups) for i in range(n)]
                outputs = [f"{g}{i}_new" for g in ("X", *groups) for i in range(n)]
                node = helper.make_node(
                    operator.op_type, ["R", "T", *names], outputs, domain=DOMAIN, **attributes
                )
                tensors = []
                for g in ("X", "G", *groups):
                    for s in shapes:
                        value = rng.standard_normal(s)
                        tensors.append((np.abs(value) if g == "H" else value).astype(dtype))
                R = np.asarray(rng.uniform(0.01, 0.5), dtype)
                feeds = [R, np.int64(T), *tensors]
                reference: Any = ReferenceEvaluator(node).run(
                    None, dict(zip(["R", "T", *names], feeds, strict=True))
                )
                ours = list(run_node(node, feeds))
                # onnx.reference evaluates Adam's attribute terms in float32 (and casts
                # multi-tensor outputs to float32): compare Adam at float32 precision.
                precision = "float32" if op == "adam" else dtype
                eps = float(np.finfo(precision).eps)
                scale = max(float(np.max(np.abs(t))) for t in tensors)
                rtol, atol = 16 * eps, 16 * eps * max(scale, 1.0)
                max_abs, max_rel, passed = _errors(ours, reference, rtol, atol)
                passed &= all(np.asarray(o).dtype == np.dtype(dtype) for o in ours)
                rows.append(
                    Row(
                        f"onnx.reference {op} #{case} n={n} T={T}",
                        dtype,
                        max_abs,
                        max_rel,
                        f"16 ulp({precision})" + (" [1]" if precision != dtype else ""),
                        passed,
                    )
                )
    return rows


def run_conformance(seed: int = 0, rounds: int = 3, long: bool = False) -> int:
    """Prints the conformance table; returns 0 if every case passes, else 1.

    ``long`` runs 50 rounds per operator and dtype (unless ``rounds`` says more)
    with attributes over their whole valid range and T up to 2**31 - 1.
    """
    if long:
        rounds = max(rounds, 50)
    jax.config.update("jax_enable_x64", True)  # float64 cases need it; float32 stays float32
    devices = ", ".join(f"{d.platform}:{d.id} ({d.device_kind})" for d in jax.devices())
    print(f"onnx_optax conformance on {devices}; jax {jax.__version__}", flush=True)
    rows = _node_case_rows() + _differential_rows(seed, rounds, wide=long)
    width = max(40, *(len(row.case) for row in rows))  # --long's T needs more room
    header = (
        f"{'case':<{width}} {'dtype':<8} {'max abs err':>12} {'max rel err':>12}  "
        f"{'tolerance':<24} result"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row.case:<{width}} {row.dtype:<8} {row.max_abs:>12.3e} {row.max_rel:>12.3e}  "
            f"{row.tolerance:<24} {'pass' if row.passed else 'FAIL'}"
        )
    if any(row.tolerance.endswith(" [1]") for row in rows):
        print(FOOTNOTE)
    failed = sum(not row.passed for row in rows)
    if failed:
        print(f"{failed} of {len(rows)} cases FAIL")
        return 1
    print(f"all {len(rows)} cases pass")
    return 0


def run(args: argparse.Namespace) -> int:
    """``onnx-optax conformance``: its options checked (and the onnx extra), then the table."""
    if args.rounds < 1:
        raise UsageError("--rounds must be at least 1")
    require("onnx-optax conformance", "onnx", "onnx", "onnx.reference")
    return run_conformance(seed=args.seed, rounds=args.rounds, long=args.long)


def add_parser(commands: Commands) -> None:
    """Adds ``conformance`` and its options to ``commands``."""
    conformance = commands.add_parser(
        "conformance",
        help="check onnx_optax against the ONNX node cases and onnx.reference on this device",
        description="Run the seven ONNX backend node cases and a randomized differential test "
        "against onnx.reference (T > 0, decay and both norm coefficients non-zero, float32 and "
        "float64, several tensors) on the device JAX sees; print a table of errors and exit 1 if "
        "any case fails. Needs the onnx extra.",
    )
    conformance.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    conformance.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="random cases per operator and dtype (default: 3)",
    )
    conformance.add_argument(
        "--long",
        action="store_true",
        help="50 random cases per operator and dtype, attributes over their whole valid range "
        "and T up to 2**31-1 (a few minutes); for a new device or JAX version",
    )
    conformance.set_defaults(run=run)
