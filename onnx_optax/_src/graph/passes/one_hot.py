"""One-hot products as gathers: a MatMul whose A is a one-hot of integer ids runs as
the rows of B the ids pick.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from onnx_optax._src.graph.errors import node_errors
from onnx_optax._src.graph.packing import (
    materialize,
)
from onnx_optax._src.graph.passes.base import Pass, PassGraph
from onnx_optax._src.graph.steps import Env, Scope, StandardStep
from onnx_optax._src.onnx_nodes import (
    describe,
)
from onnx_optax._src.onnx_tensors import (
    tensor_dtype,
)
from onnx_optax._src.ops import (
    check_size,
    domain_of,
    is_static,
)
from onnx_optax._src.ops.nn import one_hot_product

# The Cast types of a one-hot a MatMul multiplies (one_hot_of): ONNX's
# FLOAT, FLOAT16, DOUBLE and BFLOAT16.
ONE_HOT_TYPES = frozenset((1, 10, 11, 16))


class OneHotProductStep(StandardStep):
    """A MatMul whose A an exporter computed as a one-hot of integer ids: Cast (to B's
    type) of Equal between the ids, maybe through an Expand, and a constant range
    0..K-1 along the last axis (jax2tf's one_hot and then an einsum: magika's
    embedding, [2048, 257] by [257, 64] a byte sequence).

    It runs as the rows of B (K, M) the ids pick (``one_hot_product``): the product's
    values without writing and multiplying the one-hot matrix (0.48 of magika's 2.2 ms
    at batch 1). The graph makes one only where no Gradient differentiates with respect
    to A. Where the pattern does not hold once the values are known (the constant is
    no such range, the ids no integers whose last axis has one element, B not 2-D of K
    rows and A's type, or ids known while tracing), the MatMul runs as it is.
    """

    def __init__(
        self,
        graph: Scope,
        node: Any,
        equal_inputs: tuple[str, str],
        expanded: Mapping[str, str],
        dtype: np.dtype,
    ) -> None:
        super().__init__(graph, node)
        self.equal_inputs = equal_inputs
        self.expanded = dict(expanded)  # an Equal input an Expand computed: its input
        self.dtype = dtype  # the Cast's type

    def _run(self, env: Env) -> None:
        picked = self._ids_and_table(env)
        if picked is None:
            super()._run(env)
            return
        ids, table = picked
        with node_errors(self.where):
            check_size(self.info, [*ids.shape, table.shape[1]], table.dtype, "output")
        env[self.outputs[0]] = one_hot_product(ids, table)

    def _ids_and_table(self, env: Env) -> tuple[Any, Any] | None:
        """The ids (A's last axis dropped) and B, where the one-hot pattern holds."""
        table = materialize(env[self.inputs[1]])
        if is_static(table) or np.ndim(table) != 2 or table.dtype != self.dtype:
            return None
        if not table.shape[0]:  # K = 0: the product's zeros, as it is
            return None
        values = [materialize(env[name]) for name in self.equal_inputs]
        for side, (span, other) in enumerate((values, values[::-1])):
            if not is_static(span) or not _is_range(span) or span.shape[-1] != table.shape[0]:
                continue
            try:
                one_hot_shape = np.broadcast_shapes(np.shape(other), span.shape)
            except ValueError:
                return None
            source = self.expanded.get(self.equal_inputs[1 - side])
            for ids in (other, *(() if source is None else (materialize(env[source]),))):
                if (
                    not is_static(ids)  # host ids: the graph computes the one-hot once
                    and jnp.issubdtype(ids.dtype, jnp.integer)
                    and np.ndim(ids) == len(one_hot_shape) >= 2
                    and ids.shape[-1] == 1
                    and np.broadcast_shapes(ids.shape, span.shape) == one_hot_shape
                ):
                    return ids[..., 0], table
        return None


def _is_range(value: np.ndarray) -> bool:
    """Whether a host value holds integers 0, 1, ..., K-1 along its last axis, alone."""
    return (
        bool(np.issubdtype(value.dtype, np.integer))
        and value.ndim >= 1
        and all(d == 1 for d in value.shape[:-1])
        and np.array_equal(value.reshape(-1), np.arange(value.shape[-1]))
    )


def one_hot_of(
    graph: PassGraph, node: Any
) -> tuple[tuple[str, str], dict[str, str], np.dtype] | None:
    """For a MatMul whose A is Cast (to a float type) of Equal, which a Gradient does
    not differentiate with respect to: the Equal's inputs, those an Expand computed
    with the Expand's input, and the Cast's type (see :class:`OneHotProductStep`)."""
    if node.op_type != "MatMul" or domain_of(node) != "" or len(node.input) != 2:
        return None
    cast = graph.edges.made_by(node.input[0], "Cast")
    to = None if cast is None else next((a.i for a in cast.attribute if a.name == "to"), None)
    if to not in ONE_HOT_TYPES:
        return None
    assert cast is not None
    equal = graph.edges.made_by(cast.input[0], "Equal")
    if equal is None or len(equal.input) != 2 or equal.attribute:
        return None
    if node.input[0] in graph.edges.differentiated:
        return None
    expanded = {}
    for name in equal.input:
        expand = graph.edges.made_by(name, "Expand")
        if expand is not None:
            expanded[name] = expand.input[0]
    return (equal.input[0], equal.input[1]), expanded, tensor_dtype(to, describe(cast))


def one_hot_step(graph: PassGraph, node: Any) -> OneHotProductStep | None:
    """The step of a MatMul of a one-hot (see :func:`one_hot_of`), else None."""
    found = one_hot_of(graph, node)
    return None if found is None else OneHotProductStep(graph, node, *found)


ONE_HOT = Pass("one_hot", lower=one_hot_step)
