"""What a node names beyond its inputs: its graph attributes, a Gradient's y and the
names it stops at, the names its subgraphs read from the graphs around it.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from onnx_optax._src.limits import (
    MAX_SUBGRAPH_DEPTH,
)
from onnx_optax._src.onnx_nodes import (
    describe,
)
from onnx_optax._src.onnx_tensors import (
    utf8,
)
from onnx_optax._src.ops import (
    domain_of,
)
from onnx_optax._src.ops.sequence import SEQUENCE_OPS


def gradient_names(node: Any) -> tuple[str, set[str]]:
    """A Gradient node's y and the names its differentiation stops at (xs and zs)."""

    def text(value: Any) -> str:
        return utf8(value, f"{describe(node)}: a name") if isinstance(value, bytes) else str(value)

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    stop = {text(v) for k in ("xs", "zs") for v in attrs.get(k, [])}
    return text(attrs.get("y", b"")), stop


def graph_attributes(node: Any) -> dict[str, Any]:
    """A node's graph attributes by name (GRAPHS ones as name[i])."""

    found = {}
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            found[attribute.name] = attribute.g
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            found.update((f"{attribute.name}[{i}]", g) for i, g in enumerate(attribute.graphs))
    return found


def free_names(node: Any, depth: int) -> list[str]:
    """The names a node's subgraphs read from the graphs around the node (nested ones too)."""
    graphs = graph_attributes(node)
    if not graphs:
        return []
    if depth + 1 > MAX_SUBGRAPH_DEPTH:
        raise ValueError(
            f"{describe(node)}: its subgraphs nest {depth + 1} deep, more than the limit of "
            f"{MAX_SUBGRAPH_DEPTH}"
        )
    free: dict[str, None] = {}
    for sub in graphs.values():
        defined = {i.name for i in sub.input} | {t.name for t in sub.initializer}
        defined |= {t.values.name for t in sub.sparse_initializer}
        defined |= {n for inner in sub.node for n in inner.output}
        for inner in sub.node:
            for name in (*inner.input, *free_names(inner, depth + 1)):
                if name and name not in defined:
                    free[name] = None
        free.update((o.name, None) for o in sub.output if o.name not in defined)
    return list(free)


def sequence_node(node: Any) -> Any:
    """The node of a sequence or optional op that ``node`` is or holds in a subgraph, if any."""
    if domain_of(node) == "" and node.op_type in SEQUENCE_OPS:
        return node
    for graph in graph_attributes(node).values():
        for inner in graph.node:
            found = sequence_node(inner)
            if found is not None:
                return found
    return None
