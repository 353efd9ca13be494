"""The ONNX training operators, gathered from their own descriptions.

Each operator module describes itself once (``adagrad.OPERATOR``, ...); the
ONNX node reader and writer, interop, conformance, the benchmark and the tests'
tables read this registry rather than keeping tables of their own.
"""

from __future__ import annotations

from typing import Any

from onnx_optax._src import adagrad, adam, momentum
from onnx_optax._src.driver import Operator, Transformation

OPERATORS: dict[str, Operator] = {
    operator.op_type: operator for operator in (adagrad.OPERATOR, adam.OPERATOR, momentum.OPERATOR)
}

# The four optimizers a user picks from: Momentum in its two modes.
OPTIMIZERS: dict[str, tuple[Operator, dict[str, Any]]] = {
    "adagrad": (adagrad.OPERATOR, {}),
    "adam": (adam.OPERATOR, {}),
    "momentum": (momentum.OPERATOR, {"mode": "standard"}),
    "nesterov": (momentum.OPERATOR, {"mode": "nesterov"}),
}


def operator_of(transformation: Any) -> Operator:
    """The operator of a transformation built by onnx_optax; a clear error otherwise."""
    if not isinstance(transformation, Transformation) or transformation.operator is None:
        raise TypeError(
            "expected a transformation built by onnx_optax.adagrad, adam, momentum or nesterov, "
            f"got {type(transformation).__name__}; wrappers such as optax.chain or "
            "optax.inject_hyperparams hide it, so pass the inner one"
        )
    return transformation.operator
