"""Gradient fusion: a Gradient whose inputs are its xs then zs computes, for the graph
around it, the forward it shares with it: the step traces one forward, as
``jax.value_and_grad`` would.
"""

from __future__ import annotations

from collections.abc import Sequence

from onnx_optax._src.graph.errors import node_errors
from onnx_optax._src.graph.passes.base import REORDER_PASSES, Pass, PassGraph
from onnx_optax._src.graph.passes.prune import sorted_steps
from onnx_optax._src.graph.remat import is_rematerializing
from onnx_optax._src.graph.steps import Env, GradientStep, StandardStep, Step


class FusedGradientStep(Step):
    """A Gradient that also computes, for the graph around it, the steps of its ``order``
    that graph runs (``absorbed``): their values are those of the differentiated
    function's own forward, so the forward is traced once, not beside it a second time.

    Under remat the Gradient's forward is checkpointed in segments: the absorbed steps
    then run apart first, as in an unfused schedule.
    """

    def __init__(self, gradient: GradientStep, absorbed: Sequence[Step]) -> None:
        self.node = gradient.node
        self.where = gradient.where
        self.inputs = gradient.inputs
        self.gradient = gradient
        self.parts = (gradient,)
        self.absorbed = tuple(absorbed)
        self.kept = tuple(n for step in absorbed for n in step.outputs if n)
        self.outputs = (*gradient.outputs, *self.kept)
        self.order = gradient.order
        # Counted as unfused: the Gradient's traces, and the absorbed steps' once more.
        self.work = gradient.work + sum(step.work for step in absorbed)

    def run(self, env: Env) -> None:
        """Runs the Gradient and the absorbed steps; each names its own node in errors."""
        if is_rematerializing():
            for step in self.absorbed:
                step.run(env)
            self.gradient.run(env)
            return
        with node_errors(self.where):
            self.gradient.differentiate(env, self.kept)


def fused(graph: PassGraph, order: list[Step]) -> list[Step]:
    """``order`` with each Gradient that can be fused replaced by a
    :class:`FusedGradientStep`, the steps it absorbs dropped, re-sorted.

    All at once, sorted once; where that finds a cycle, one Gradient at a time (each
    sorted on its own) as far as REORDER_PASSES allows. Merging steps adds no way
    round a cycle, so all at once fuses what one at a time would.
    """
    present = {id(step) for step in order}
    fusions: dict[int, FusedGradientStep] = {}
    gone: set[int] = set()
    for step in order:
        if isinstance(step, GradientStep):
            absorbed = absorbable(step, present)
            absorbed = [inner for inner in absorbed if id(inner) not in gone]
            if absorbed:
                fusions[id(step)] = FusedGradientStep(step, absorbed)
                gone.update(id(inner) for inner in absorbed)
    if not fusions:
        return order
    steps = [fusions.get(id(step), step) for step in order if id(step) not in gone]
    together = sorted_steps(steps, graph.step_reads(steps))
    if together is not None:
        return together
    schedule = order
    budget = REORDER_PASSES * len(order)
    for fusion in fusions.values():
        if budget >= len(schedule):
            budget -= len(schedule)  # what one _fuse looks over and sorts
            schedule = fuse(graph, fusion.gradient, schedule) or schedule
    return schedule


def absorbable(gradient: GradientStep, present: set[int]) -> list[Step]:
    """The steps of ``gradient``'s order (by id among ``present``) that fusing it
    would absorb; none where it cannot be fused.

    Fused only when the Gradient's inputs are its xs then zs by name (so f's forward
    reads the values the graph's does) and its order holds standard nodes alone (a
    nested Gradient keeps its own schedule).
    """
    if gradient.inputs != (*gradient.xs, *gradient.zs):
        return []
    if not all(isinstance(step, StandardStep) for step in gradient.order):
        return []
    return [step for step in gradient.order if id(step) in present]


def fuse(graph: PassGraph, gradient: GradientStep, schedule: list[Step]) -> list[Step] | None:
    """``schedule`` with ``gradient`` fused with the steps of its order that it holds;
    None where that cannot be done as it is.

    The fused step reads what the Gradient reads (its inputs, and what y's nodes read
    from outside them) and produces what the absorbed steps produce; re-sorting finds
    a cycle where an x or a z, or what y reads, is computed from an absorbed step's
    output: then nothing is fused.
    """
    absorbed = absorbable(gradient, {id(step) for step in schedule})
    if not absorbed:
        return None
    fused = FusedGradientStep(gradient, absorbed)
    gone = {id(step) for step in absorbed}
    steps = [fused if step is gradient else step for step in schedule if id(step) not in gone]
    return sorted_steps(steps, graph.step_reads(steps))


def fuse_gradients(graph: PassGraph, steps: list[Step], inside_gradient: bool) -> list[Step]:
    """The graph's schedule with its Gradients fused (a Gradient's own order: as it is)."""
    return steps if inside_gradient else fused(graph, steps)


GRADIENT_FUSION = Pass("gradient_fusion", schedule=fuse_gradients)
