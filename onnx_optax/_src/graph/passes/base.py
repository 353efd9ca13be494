"""What a graph pass is: a small, model-agnostic rewrite at one stage of the pipeline.

A :class:`Pass` acts at one or more of three stages, each a hook:

- ``lower(graph, node)``: the step a node of a registry op runs as, where the pass has
  a better one than the op's own (a one-hot product as a gather); None leaves the node
  to the next pass, and then to its op;
- ``schedule(graph, steps, inside_gradient)``: the steps a trace runs, rewritten (a
  Gradient fused with the forward it shares, Gemms stacked into one product); applied
  to the graph's schedule, then (``inside_gradient``) to each Gradient's own order;
- ``plan(graph, plan)``: the :class:`RunPlan` of a compiled run, rewritten (the steps
  reading constants alone computed once per device, weights computed transposed).

The interpreter applies the passes it is given, in order, at each stage: adding a pass
touches the passes alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from onnx_optax._src.graph.passes.prune import Dependencies
from onnx_optax._src.graph.steps import Scope, Step

# How many times over its steps a graph may look while batching Gemms (batched_products)
# and fusing Gradients (gradient_fusion): each set of Gemms looks over the steps between
# its first and last, each Gradient over the whole schedule. Past that, the rest run as
# they are (computing the same): 2,000 Gradients took 11 s, and twice as many four times
# that.
REORDER_PASSES = 16


class PassGraph(Scope, Protocol):
    """What a pass reads of the graph it rewrites (a GraphFunction)."""

    input_names: tuple[str, ...]
    schedule: list[Step]
    static: dict[str, Any]
    params: dict[str, Any]
    initializer_shapes: dict[str, tuple[int, ...]]  # as declared, known when lowering
    input_types: dict[str, Any]  # the graph inputs' declared tensor types
    edges: Dependencies

    def step_reads(self, steps: Sequence[Step]) -> dict[int, tuple[str, ...]]: ...


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """How a compiled run computes the schedule: ``constant_steps`` once per device (from
    the initializers alone), ``run_schedule`` on every run; ``transposed``: initializers
    computed transposed with the constants, by name, with the name of their transpose."""

    constant_steps: list[Step]
    run_schedule: list[Step]
    transposed: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Pass:
    """A graph pass by name, and its hooks (see the module)."""

    name: str
    lower: Callable[[Any, Any], Step | None] | None = None
    schedule: Callable[[Any, list[Step], bool], list[Step]] | None = None
    plan: Callable[[Any, RunPlan], RunPlan] | None = None
