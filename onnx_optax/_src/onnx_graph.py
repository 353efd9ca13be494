"""Running an ONNX graph with XLA: kept for its importers; the compiler is :mod:`graph`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from onnx_optax._src.graph import GraphFunction, node_graph, supported_ops, to_jax
from onnx_optax._src.onnx_nodes import describe
from onnx_optax._src.onnx_ops import read_attributes

__all__ = [
    "GraphFunction",
    "check_feed",
    "cone",
    "constant_value",
    "count_function",
    "node_graph",
    "supported_ops",
]


def constant_value(node: Any) -> np.ndarray:
    """The value of a Constant node."""
    from onnx_optax._src.graph import latest_opset
    from onnx_optax._src.onnx_ops import OPS, Node

    where = describe(node)
    attrs = read_attributes(node, latest_opset(), where)
    return np.asarray(OPS["Constant"].fn(Node(attrs, latest_opset(), where, 1)))


def check_feed(name: str, value: Any) -> Any:
    """An input as a JAX array, refusing what 32-bit JAX would silently truncate."""
    return to_jax(f"input '{name}'", value)


def cone(graph: Any, outputs: Sequence[str]) -> list[Any]:
    """The nodes of ``graph`` that ``outputs`` depend on, in graph order."""
    needed = set(outputs)
    picked = []
    for node in reversed(graph.node):
        if needed & set(node.output):
            picked.append(node)
            needed.update(name for name in node.input if name)
    return picked[::-1]


def count_function(algorithm: Any, T_name: str, T_now: int, output: str) -> GraphFunction:
    """The part of ``algorithm`` that computes ``output``, with T fixed at ``T_now``.

    What checks that an ``update_binding`` of a stored T is T + 1 evaluates:
    the function's ``input_names`` say whether ``output`` also depends on the
    algorithm's inputs (then it is no count).
    """
    from onnx import helper

    nodes = cone(algorithm, [output])
    subgraph = helper.make_graph(
        nodes,
        "count",
        [i for i in algorithm.input if any(i.name in n.input for n in nodes)],
        [o for o in algorithm.output if o.name == output],
        initializer=list(algorithm.initializer),
    )
    return GraphFunction(subgraph, outer_values={T_name: np.asarray(T_now)})
