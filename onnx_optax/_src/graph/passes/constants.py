"""Constants: what is known while tracing (small integer initializers, inputs read as
shapes) and the pass that computes the steps reading constants alone once per device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from onnx_optax._src.graph.passes.base import Pass, PassGraph, RunPlan
from onnx_optax._src.graph.passes.prune import Dependencies
from onnx_optax._src.graph.steps import StandardStep, Step
from onnx_optax._src.graph.support import STATIC_INITIALIZER_LIMIT
from onnx_optax._src.ops.sequence import SEQUENCE_OPS

# A graph input of at most this many elements (declared) that a shape, an axis, or a
# Loop's trip count or condition is computed from is read as a compile-time value
# (see small_sources).
SMALL_SOURCE = 16


# Ops whose output is set by their inputs' shapes (and attributes), never their values.
SHAPE_ONLY = frozenset({"Shape", "Size"})


# Ops never computed ahead of a run from constant inputs (split_constants): those
# that draw random numbers, and those on sequences (not arrays).
NOT_FOLDED = (
    frozenset(("Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike"))
    | frozenset(("RandomUniformLike", "Bernoulli", "Multinomial"))
    | SEQUENCE_OPS
)


def split_static(
    values: Mapping[str, np.ndarray], steps: Iterable[Step]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The initializers known while tracing (``static``), and the rest (``params``).

    Small integer tensors are shape data: kept on the host, known while tracing; so are
    small tensors an op reads as a shape, of any dtype (Resize's float scales). The rest
    is data, passed to the compiled graph (checked on the first run).
    """
    shape_reads = {
        step.inputs[p]
        for step in steps
        if isinstance(step, StandardStep)
        for p in step.op.static
        if p < len(step.inputs)
    }
    static = {
        name: v
        for name, v in values.items()
        if (np.issubdtype(v.dtype, np.integer) or v.dtype == bool or name in shape_reads)
        and v.size <= STATIC_INITIALIZER_LIMIT
    }
    params = {name: v for name, v in values.items() if name not in static}
    return static, params


def static_inputs(
    model_graph: Any, steps: Iterable[Step], edges: Dependencies, input_names: Sequence[str]
) -> tuple[str, ...]:
    """The graph inputs read as shapes or axes: compile-time values, one compilation each."""
    read_as_shapes = {
        step.inputs[p]
        for step in steps
        if isinstance(step, StandardStep)
        for p in (*step.op.static, *step.prefer_static)
        if p < len(step.inputs)
    }
    read_as_shapes |= small_sources(model_graph, read_as_shapes, edges, input_names)
    return tuple(n for n in input_names if n in read_as_shapes)


def split_constants(graph: PassGraph, plan: RunPlan) -> RunPlan:
    """The schedule's steps that read initializers and constants alone, apart from the rest.

    A run computes the first once per device, as onnxruntime folds constants
    when it creates a session: a weight an exporter wrote as a ConstantOfShape (the
    light zoo models), an initializer dequantized or scaled, is then an argument of
    the compiled graph instead of computed (and materialized) on every run.
    """
    known = set(graph.static) | set(graph.params)
    constant: list[Step] = []
    rest: list[Step] = []
    for step in graph.schedule:
        if (
            isinstance(step, StandardStep)
            and (type(step) is StandardStep or step.folds_as_op)
            and not step.subgraphs
            and step.node.op_type not in NOT_FOLDED
            and all(not name or name in known for name in step.inputs)
        ):
            constant.append(step)
            known.update(name for name in step.outputs if name)
        else:
            rest.append(step)
    return dataclasses.replace(plan, constant_steps=constant, run_schedule=rest)


def small_sources(
    model_graph: Any, read_as_shapes: set[str], edges: Dependencies, input_names: Sequence[str]
) -> set[str]:
    """Graph inputs of at most SMALL_SOURCE elements (declared) that an input read
    while tracing (``read_as_shapes``) is computed from: a Loop's trip count or
    condition (test_range's expanded form: M from start, limit and delta), a shape or
    an axis (a window's size through Cast and Sub, AffineGrid's size through Slice).
    Read as compile-time values, as a shape fed directly is: one compilation per
    value, the loop a scan, the shape arithmetic folded."""
    declared: dict[str, int] = {}
    for info in model_graph.input:
        kind = info.type.tensor_type
        if kind.HasField("shape") and all(d.HasField("dim_value") for d in kind.shape.dim):
            declared[info.name] = int(np.prod([d.dim_value for d in kind.shape.dim]))
    todo = [name for name in read_as_shapes if name]  # the names ops read while tracing
    found: set[str] = set()
    seen = set(todo)
    while todo:
        name = todo.pop()
        if declared.get(name, SMALL_SOURCE + 1) <= SMALL_SOURCE:
            found.add(name)
        index = edges.producer.get(name)
        if index is None or edges.nodes[index].op_type in SHAPE_ONLY:
            continue  # a graph input, or a value set by its inputs' shapes alone
        for dep in edges.deps(index):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return found & set(input_names)


CONSTANTS = Pass("constants", plan=split_constants)
