"""What a graph may hold: the op types that run, and the constants every stage reads."""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from onnx_optax._src.onnx_nodes import (
    DOMAIN,
    OPERATORS,
)
from onnx_optax._src.ops import (
    ML_DOMAIN,
    REGISTRY,
    domain_of,
    find_op,
)

GRADIENT = "Gradient"
# Integer initializers up to this size are kept as trace-time constants (shapes, axes).
STATIC_INITIALIZER_LIMIT = 1 << 12
# A node inside a Gradient is traced this many times per level of Gradient around it:
# jax.vjp traces its forward and tangent, then transposes the tangent. Nested Gradients
# multiply (a Gradient of a Gradient of n nodes traces about 9 n).
GRADIENT_WORK = 3


Env = dict[str, Any]


def latest_opset(domain: str = "") -> int:
    """The newest opset the installed onnx defines for ``domain`` ('' for ai.onnx)."""

    if domain == ML_DOMAIN:
        return int(onnx.defs.onnx_ml_opset_version())
    return int(onnx.defs.onnx_opset_version())


def is_supported(node: Any) -> bool:
    if find_op(node) is not None:
        return True
    return domain_of(node) == DOMAIN and (node.op_type in OPERATORS or node.op_type == GRADIENT)


def supported_ops() -> dict[str, list[str]]:
    """Every op type that runs, by domain (the registry's domains and the training domain)."""
    ops = {domain or "ai.onnx": sorted(table) for domain, table in REGISTRY.items()}
    return {**ops, DOMAIN: sorted([*OPERATORS, GRADIENT])}


def node_graph(node: Any) -> Any:
    """A graph of one node, its inputs as graph inputs (for ``run_node``)."""

    inputs = [helper.make_empty_tensor_value_info(n) for n in dict.fromkeys(node.input) if n]
    outputs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
    return helper.make_graph([node], "node", inputs, outputs)
