"""One table of the four optimizers, shared by the tests.

For each: how to draw random ONNX attributes, the op, the transformation, the
oracle and the names of the state tensors, so that every test can loop over
the same table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import zlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax

import onnx_optax
from onnx_optax._src.registry import OPTIMIZERS as REGISTRY
from tests.support import oracle

INT32_MAX = int(np.iinfo(np.int32).max)
DOMAIN = "ai.onnx.preview.training"


def keyed_rng(*key: Any) -> np.random.Generator:
    """A generator seeded by ``key``, so that each parametrized case draws its own numbers."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def f32(value: float) -> float:
    """A float32-representable value: ONNX attributes are float32."""
    return float(np.float32(value))


def _sometimes_zero(rng: np.random.Generator, low: float, high: float) -> float:
    return 0.0 if rng.random() < 0.3 else f32(rng.uniform(low, high))


def _epsilon(rng: np.random.Generator) -> float:
    return f32(10.0 ** rng.uniform(-8, -2))


@dataclasses.dataclass(frozen=True)
class Optimizer:
    name: str
    state_names: tuple[str, ...]
    draw_attributes: Callable[[np.random.Generator], dict[str, Any]]
    op: Callable[..., tuple[Any, ...]]
    make: Callable[..., optax.GradientTransformationExtraArgs]
    oracle: Callable[..., tuple[np.ndarray, ...]]
    state_class: type
    default_initial_count: int
    # A learning rate, attributes and step count that minimise a quadratic and
    # the Rosenbrock function (contract tests).
    convergent: dict[str, Any]

    def transform(
        self, learning_rate: Any, attributes: dict[str, Any], **kwargs: Any
    ) -> optax.GradientTransformationExtraArgs:
        return self.make(learning_rate, **attributes, **kwargs)

    def reads_params(self, attributes: dict[str, Any]) -> bool:
        return bool(attributes.get("norm_coefficient", 0.0)) or bool(
            attributes.get("norm_coefficient_post", 0.0)
        )

    def state(self, count: Any, trees: list[Any]) -> Any:
        return self.state_class(count, *trees)


def _adagrad_attributes(rng: np.random.Generator) -> dict[str, Any]:
    return {
        "decay_factor": _sometimes_zero(rng, 0.0, 0.5),
        "epsilon": _epsilon(rng),
        "norm_coefficient": _sometimes_zero(rng, 0.0, 0.1),
    }


def _adam_attributes(rng: np.random.Generator) -> dict[str, Any]:
    return {
        "alpha": f32(rng.uniform(0.0, 0.999)),
        "beta": f32(1.0 - 10.0 ** rng.uniform(-4, -0.3)),
        "epsilon": _epsilon(rng),
        "norm_coefficient": _sometimes_zero(rng, 0.0, 0.1),
        "norm_coefficient_post": _sometimes_zero(rng, 0.0, 0.1),
    }


def _momentum_attributes(rng: np.random.Generator) -> dict[str, Any]:
    return {
        "alpha": f32(rng.uniform(0.0, 0.99)),
        "beta": f32(rng.uniform(0.0, 1.0)),
        "norm_coefficient": _sometimes_zero(rng, 0.0, 0.1),
    }


def _mode_bound(mode: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    def op(*args: Any, **kwargs: Any) -> Any:
        return onnx_optax.ops.momentum(*args, mode=mode, **kwargs)

    def reference(*args: Any, **kwargs: Any) -> Any:
        return oracle.momentum(*args, mode=mode, **kwargs)

    return op, reference


_momentum_op, _momentum_oracle = _mode_bound("standard")
_nesterov_op, _nesterov_oracle = _mode_bound("nesterov")

OPTIMIZERS: dict[str, Optimizer] = {
    "adagrad": Optimizer(
        name="adagrad",
        state_names=REGISTRY["adagrad"][0].fields,
        draw_attributes=_adagrad_attributes,
        op=onnx_optax.ops.adagrad,
        make=onnx_optax.adagrad,
        oracle=oracle.adagrad,
        state_class=onnx_optax.AdagradState,
        default_initial_count=0,
        convergent={"learning_rate": 0.5, "attributes": {}, "steps": 3000},
    ),
    "adam": Optimizer(
        name="adam",
        state_names=REGISTRY["adam"][0].fields,
        draw_attributes=_adam_attributes,
        op=onnx_optax.ops.adam,
        make=onnx_optax.adam,
        oracle=oracle.adam,
        state_class=onnx_optax.AdamState,
        default_initial_count=1,
        convergent={"learning_rate": 0.01, "attributes": {}, "steps": 3000},
    ),
    "momentum": Optimizer(
        name="momentum",
        state_names=REGISTRY["momentum"][0].fields,
        draw_attributes=_momentum_attributes,
        op=_momentum_op,
        make=onnx_optax.momentum,
        oracle=_momentum_oracle,
        state_class=onnx_optax.MomentumState,
        default_initial_count=0,
        convergent={
            "learning_rate": 5e-4,
            "attributes": {"alpha": 0.9, "beta": 1.0, "norm_coefficient": 0.0},
            "steps": 3000,
        },
    ),
    "nesterov": Optimizer(
        name="nesterov",
        state_names=REGISTRY["nesterov"][0].fields,
        draw_attributes=_momentum_attributes,
        op=_nesterov_op,
        make=onnx_optax.nesterov,
        oracle=_nesterov_oracle,
        state_class=onnx_optax.MomentumState,
        default_initial_count=0,
        convergent={
            "learning_rate": 5e-4,
            "attributes": {"alpha": 0.9, "beta": 1.0, "norm_coefficient": 0.0},
            "steps": 3000,
        },
    ),
}

NAMES = tuple(OPTIMIZERS)


def random_state_tensor(
    rng: np.random.Generator, state_name: str, shape: tuple[int, ...], dtype: Any
) -> np.ndarray:
    """V is any real; H (a sum or average of squares) is non-negative."""
    value = rng.standard_normal(shape)
    if state_name == "h":
        value = np.abs(value)
    return value.astype(dtype)


def tolerance(dtype: Any, steps: int = 1) -> dict[str, float]:
    """rtol/atol for comparing with the float64 oracle, relative to O(1) data.

    One step runs ~10 roundings of the tensor dtype; allow 16 ulp per step.
    """
    eps = float(np.finfo(dtype).eps)
    return {"rtol": 16 * eps * steps, "atol": 16 * eps * steps}


def assert_close_to_oracle(
    actual: Any, expected: np.ndarray, dtype: Any, *, scale: float = 1.0, steps: int = 1
) -> None:
    """``actual`` within ``tolerance`` of ``expected``; atol scales with the data."""
    tol = tolerance(dtype, steps)
    np.testing.assert_allclose(
        np.asarray(actual, dtype=np.float64),
        expected,
        rtol=tol["rtol"],
        atol=tol["atol"] * max(scale, 1.0),
    )


# Fixed ONNX attributes per optimizer, for the determinism tests (test_long_runs).
ATTRIBUTES: dict[str, dict[str, Any]] = {
    "adagrad": {"decay_factor": 1e-3, "epsilon": 1e-6, "norm_coefficient": 1e-3},
    "adam": {
        "alpha": 0.9,
        "beta": 0.999,
        "epsilon": 1e-6,
        "norm_coefficient": 1e-3,
        "norm_coefficient_post": 1e-5,
    },
    "momentum": {"alpha": 0.9, "beta": 0.1, "norm_coefficient": 1e-3},
    "nesterov": {"alpha": 0.9, "beta": 0.1, "norm_coefficient": 1e-3},
}


def fixed_inputs(name: str) -> tuple[Any, ...]:
    """The op's arguments for optimizer ``name`` (R, T, X, G, states), drawn with seed 5."""
    rng = np.random.default_rng(5)
    tensors = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2)]
    states = [
        np.abs(rng.standard_normal((3, 4))).astype(np.float32) for _ in OPTIMIZERS[name].state_names
    ]
    return (np.float32(0.05), 4, *tensors, *states)


def digest(arrays: Any) -> str:
    """The SHA-256 of the bytes of every leaf of ``arrays``, in tree order."""
    h = hashlib.sha256()
    for a in jax.tree.leaves(arrays):
        h.update(np.asarray(a).tobytes())
    return h.hexdigest()
