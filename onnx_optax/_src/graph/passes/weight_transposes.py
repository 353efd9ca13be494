"""Weight transposes: an initializer a stacked Gemm reads transposed is computed
transposed once per device, with the constants.
"""

from __future__ import annotations

import dataclasses

from onnx_optax._src.graph.passes.base import Pass, PassGraph, RunPlan
from onnx_optax._src.graph.passes.batched_products import BatchedGemmStep


def transposed_weights(graph: PassGraph) -> dict[str, str]:
    """The initializers that a stacked Gemm reads transposed (transB=1), each with the
    name its transpose goes by among a run's values; a run computes them with the constants, and
    each :class:`BatchedGemmStep` that reads one is told its name.

    Not a weight that a Gradient node differentiates with respect to (its transpose
    would be a constant there), nor where the name is taken.
    """
    readers = [
        step
        for step in graph.schedule
        if isinstance(step, BatchedGemmStep)
        and step.members[0].info.attrs.get("transB")
        and step.members[0].inputs[1] in graph.params
        and step.members[0].inputs[1] not in graph.edges.differentiated
    ]
    if not readers:  # most graphs: no set of names built
        return {}
    taken = {*graph.params, *graph.static, *graph.edges.producer, *graph.input_names}
    found: dict[str, str] = {}
    for step in readers:
        b = step.members[0].inputs[1]
        name = f"{b}\x00transposed"
        if name not in taken:
            step.transposed = found[b] = name
    return found


def transpose_weights(graph: PassGraph, plan: RunPlan) -> RunPlan:
    """The run's plan with the weights stacked Gemms read transposed (see above)."""
    return dataclasses.replace(plan, transposed=transposed_weights(graph))


WEIGHT_TRANSPOSES = Pass("weight_transposes", plan=transpose_weights)
