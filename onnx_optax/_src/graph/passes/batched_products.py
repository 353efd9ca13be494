"""Batched products: Gemm nodes of the same B, C and attributes, none reading what
another computes (an exporter's unrolled recurrence), as one stacked product.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from onnx_optax._src.graph.packing import (
    materialize,
)
from onnx_optax._src.graph.passes.base import REORDER_PASSES, Pass, PassGraph
from onnx_optax._src.graph.passes.prune import sorted_steps
from onnx_optax._src.graph.steps import Env, StandardStep, Step
from onnx_optax._src.ops import (
    domain_of,
    is_static,
)


class BatchedGemmStep(Step):
    """Gemm nodes of the same B, C and attributes, none reading what another computes,
    as one product: their A's stacked by rows, the result split back into their Y's.

    An exporter's unrolled recurrence writes such nodes, one a time step (PyTorch's
    LSTM: ``x_t W_ih^T`` for every t, 40 of them in the CRNN): XLA then reads B once
    instead of once a node, and a gradient with respect to B is one product instead of
    a sum of one a node (the CRNN's training step: 80 products of 6.5 MB summed).
    Where the stacked product cannot be made as it is (A's of other ranks, dtypes or
    widths, a C of rows, values known while tracing) or refuses, each node runs itself.

    ``transposed``: the name under which a run's values hold B transposed, where B is an
    initializer read with transB=1 (``weight_transposes.transposed_weights``): the product
    then reads that as it lies. YNNPACK packs a transposed weight for each product, and
    more slowly (the CRNN's [20, 4096] by [400, 4096]: 273 against 197 µs alone); a run
    computes it once per device, with the constants, and the device then holds B twice.
    """

    def __init__(self, members: Sequence[StandardStep]) -> None:
        self.members = tuple(members)
        self.parts = self.members
        self.node = members[0].node
        self.where = members[0].where
        self.inputs = tuple(name for step in members for name in step.inputs)
        self.outputs = tuple(name for step in members for name in step.outputs)
        self.work = sum(step.work for step in members)
        self.transposed: str | None = None

    def run(self, env: Env) -> None:
        first = self.members[0]
        a = [materialize(env[step.inputs[0]]) for step in self.members]
        rest = [materialize(env[name]) if name else None for name in first.inputs[1:]]
        info = first.info
        if self.transposed is not None and self.transposed in env:
            rest[0] = env[self.transposed]
            info = dataclasses.replace(info, attrs={**info.attrs, "transB": 0})
        c = rest[1] if len(rest) > 1 else None
        stackable = (
            not any(map(is_static, a))
            and all(np.ndim(x) == 2 for x in a)
            and len({(x.dtype, x.shape[1]) for x in a}) == 1
            and (c is None or np.ndim(c) < 2 or np.shape(c)[0] == 1)
        )
        if stackable:
            try:
                y = first.op.fn(info, jnp.concatenate(a, axis=0), *rest)
            except (TypeError, ValueError):  # each node then says what it refuses
                stackable = False
        if not stackable:
            for step in self.members:
                step.run(env)
            return
        ends = np.cumsum([x.shape[0] for x in a])[:-1]
        for step, part in zip(self.members, jnp.split(y, ends), strict=True):
            env[step.outputs[0]] = part


def batched(graph: PassGraph, steps: list[Step]) -> list[Step]:
    """``steps`` (in an order that runs) with each set of Gemm nodes that can be one
    product replaced by a :class:`BatchedGemmStep`, re-sorted.

    A set: the Gemms (transA 0) of the same B, C and attributes whose A is computed
    from none of their outputs, through any step of ``steps``.
    """
    groups: dict[Any, list[StandardStep]] = {}
    for step in steps:
        if (
            type(step) is StandardStep
            and step.node.op_type == "Gemm"
            and domain_of(step.node) == ""
            and not step.info.attrs.get("transA")
            and len(step.outputs) == 1
        ):
            groups.setdefault((step.inputs[1:], step.kind), []).append(step)
    if not any(len(members) > 1 for members in groups.values()):
        return steps
    reads = graph.step_reads(steps)
    position = {id(step): i for i, step in enumerate(steps)}
    budget = REORDER_PASSES * len(steps)
    batches: dict[int, BatchedGemmStep] = {}  # by the id of its first member
    gone: set[int] = set()
    for members in groups.values():
        # What the members compute from one another lies between the first and last.
        first, last = position[id(members[0])], position[id(members[-1])]
        if len(members) < 2 or last - first >= budget:
            continue
        budget -= last - first + 1
        ids = {id(step) for step in members}
        downstream = {name for step in members for name in step.outputs if name}
        for step in steps[first : last + 1]:
            if id(step) not in ids and any(name in downstream for name in reads[id(step)]):
                downstream.update(name for name in step.outputs if name)
        free = [step for step in members if not any(name in downstream for name in reads[id(step)])]
        if len(free) < 2:
            continue
        gone.update(id(step) for step in free)
        batch = batches[id(free[0])] = BatchedGemmStep(free)
        reads[id(batch)] = tuple(name for step in free for name in reads[id(step)])
    if not batches:
        return steps
    # Each batch where its first member was.
    batched = [
        batches.get(id(step), step) for step in steps if id(step) in batches or id(step) not in gone
    ]
    order = sorted_steps(batched, reads)
    return steps if order is None else order


def batch_products(graph: PassGraph, steps: list[Step], inside_gradient: bool) -> list[Step]:
    """The steps with their Gemms batched, in the graph's schedule and each Gradient's."""
    return batched(graph, steps)


BATCHED_PRODUCTS = Pass("batched_products", schedule=batch_products)
