"""An ONNX graph as one JAX function: registered ops, optimizer nodes and ``Gradient``.

:class:`GraphFunction` checks a ``GraphProto`` once (every needed node
supported, attributes typed, names defined, no cycle), keeps only the nodes the
requested outputs need and orders them (:mod:`.passes.prune`), lowers each to a
step (:mod:`.steps`), lets the graph passes rewrite the steps (:mod:`.passes`: a
list, applied stage by stage) and evaluates them in one function of the graph
inputs and the float initializers (:meth:`GraphFunction.apply`), which
:class:`~.run.Runner` jits once per input signature (``__call__``).

``Gradient`` (``ai.onnx.preview.training``): its ``y`` is named by an attribute,
not an edge, so its dependencies are its inputs plus whatever the nodes computing
``y`` read (stopping at ``xs`` and ``zs``). It runs ``jax.vjp`` over exactly those
nodes, as a function of the values given for ``xs`` (``zs`` held fixed), inside
the same computation; Gradient of a Gradient nests. A non-scalar ``y`` is seeded
with ones: the outputs are the gradients of ``sum(y)``. When its inputs are its
``xs`` then ``zs`` by name, the nodes computing ``y`` that the graph also runs (a
training graph's forward, its loss an output) are not run a second time: the
Gradient's own forward gives their values (:class:`FusedGradientStep`), so the
traced step holds one forward, as ``jax.value_and_grad`` would.

Subgraphs (If's branches, Loop's and Scan's bodies) are GraphFunctions of their
own, built with the enclosing graph's names in scope; the names they read from
outside count as their node's dependencies. When the node runs, each reaches its
op as a :class:`Subgraph`, a callable bound to the enclosing values of that run
(the op traces it once into ``lax.cond``, ``lax.scan`` or ``lax.while_loop``).
"""

from __future__ import annotations

from collections.abc import Collection, Container, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from onnx_optax._src.graph.errors import PROMISED, too_much_work, unsupported_error, wrap
from onnx_optax._src.graph.feeds import declared_types, refuse_strings
from onnx_optax._src.graph.jit import paused_gc
from onnx_optax._src.graph.nodes import graph_attributes
from onnx_optax._src.graph.packing import ChannelsLast, materialize
from onnx_optax._src.graph.passes import Pass, RunPlan, chosen
from onnx_optax._src.graph.passes.constants import split_static, static_inputs
from onnx_optax._src.graph.passes.prune import Dependencies
from onnx_optax._src.graph.replay import REPLAY, Replay
from onnx_optax._src.graph.run import Runner
from onnx_optax._src.graph.steps import GradientStep, Step, chain_depth, make_step, refuse_sequences
from onnx_optax._src.graph.support import GRADIENT_WORK, Env, is_supported
from onnx_optax._src.limits import (
    MAX_GRADIENT_DEPTH,
    MAX_SUBGRAPH_DEPTH,
    MAX_TENSOR_BYTES,
    MAX_TRACED_NODES,
)
from onnx_optax._src.onnx_nodes import describe
from onnx_optax._src.onnx_tensors import read_tensor, tensor_dtype
from onnx_optax._src.ops import STANDARD_DOMAINS, RunChecks, collect_run_checks, is_static
from onnx_optax._src.ops.subgraphs import unroll_budget
from onnx_optax._src.ops.values import refuse_narrowing_in, tensors


class _Defined:
    """The names a graph defines, its enclosing graphs' included: a subgraph's scope."""

    def __init__(self, graph: GraphFunction) -> None:
        self.graph = graph

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.graph.defines(name)


class GraphFunction(Runner):
    """An ONNX graph as one jitted function of its graph inputs (initializers excluded).

    ``outer_values`` are values the graph reads from outside (a training
    algorithm reads the main graph's initializers); ``opsets`` maps a domain
    ('' for ai.onnx) to the model's opset version (default: the newest);
    ``max_bytes`` bounds every tensor a standard node computes (``Limits.tensor_bytes``);
    ``max_traced_nodes`` the node runs of one trace (``Limits.traced_nodes``: a node
    inside a Gradient counts :data:`GRADIENT_WORK` times per level of Gradient around
    it), refused before anything is traced; ``max_gradient_depth`` the nodes on the longest
    chain a Gradient differentiates (``Limits.gradient_depth``), refused alike.
    ``check_shapes``: trace the graph on its declared input shapes, when all are known, to
    fail at construction; that trace is the one the first call with those shapes
    compiles. A caller that traces the graph inside its own function (a training step)
    turns it off. ``scope`` and ``depth``
    are a subgraph's: the enclosing graphs' names it may read, and how many enclose it.
    ``passes``: the names of the graph passes to apply (default: all of
    :data:`~onnx_optax._src.graph.passes.PASS_NAMES`, today's pipeline); a test switches
    one off by leaving its name out (its subgraphs get the same).
    """

    def __init__(
        self,
        graph: Any,
        *,
        outer_values: Mapping[str, Any] | None = None,
        outputs: Sequence[str] | None = None,
        opsets: Mapping[str, int] | None = None,
        max_bytes: int = MAX_TENSOR_BYTES,
        max_traced_nodes: int = MAX_TRACED_NODES,
        max_gradient_depth: int = MAX_GRADIENT_DEPTH,
        check_shapes: bool = True,
        scope: Container[str] = frozenset(),
        depth: int = 0,
        passes: Collection[str] | None = None,
    ) -> None:
        self.name = graph.name
        self.depth = depth  # how many graphs enclose this one
        self.max_bytes = max_bytes
        self.max_traced_nodes = max_traced_nodes
        self.max_gradient_depth = max_gradient_depth
        self.passes: tuple[Pass, ...] = chosen(passes)
        self._lowerings = [each.lower for each in self.passes if each.lower is not None]
        self.opsets = {
            ("" if k in STANDARD_DOMAINS else k): int(v) for k, v in (opsets or {}).items()
        }
        outer = {name: np.asarray(v) for name, v in (outer_values or {}).items()}
        initializers = {init.name: init for init in graph.initializer}
        self._stored_types = {name: init.data_type for name, init in initializers.items()}
        self.initializer_shapes = {name: tuple(init.dims) for name, init in initializers.items()}
        self.input_names = tuple(
            i.name for i in graph.input if i.name not in outer and i.name not in initializers
        )
        # Graph inputs that are also initializers: defaults a feed may override in
        # onnxruntime; here a feed naming one is refused (see __call__), never ignored.
        self._initializer_inputs = frozenset(i.name for i in graph.input) & initializers.keys()
        self.output_names = tuple(outputs or (o.name for o in graph.output))
        available = {*self.input_names, *outer, *initializers}
        self.edges = Dependencies(graph.node, available, scope, depth, max_traced_nodes)
        self._steps: dict[int, Step] = {}
        needed = self.edges.needed(self.output_names)
        nodes = self.edges.nodes
        if any(not is_supported(nodes[i]) for i in needed):
            raise unsupported_error(nodes, self.opsets)
        refuse_strings(graph, [nodes[i] for i in sorted(needed)])
        self._inputs = frozenset(self.input_names)  # membership: a set, not the tuple
        declared = declared_types(graph, self._inputs, self.output_names)
        self.value_types, self.input_types, self.output_dtypes, self.output_kinds = declared
        self._lower(needed)
        # Only the initializers the outputs need are read: an unused one may be huge.
        read = {*self.output_names, *(name for i in needed for name in self.edges.deps(i))}
        # What a subgraph reads from the graphs around it: all of their values a call takes
        # (a copy of every value of the enclosing graph, per If run, grew with both).
        self.outer_reads = tuple(
            name for name in read if name not in available and name not in self.edges.producer
        )
        values = dict(outer)
        for name, init in initializers.items():
            if name in read:
                values[name] = read_tensor(init, f"graph '{graph.name}' initializer")
        self.static, self.params = split_static(values, self._steps.values())
        plan = RunPlan(constant_steps=[], run_schedule=self.schedule)
        for each in self.passes:
            plan = plan if each.plan is None else each.plan(self, plan)
        self._constant_steps, self._run_schedule = plan.constant_steps, plan.run_schedule
        self._transposed = plan.transposed
        self.prepare_run()
        self.static_inputs = static_inputs(
            graph, self._steps.values(), self.edges, self.input_names
        )
        if check_shapes and not self.static_inputs:
            self.check_declared_shapes(graph)

    # -- structure

    def _lower(self, needed: set[int]) -> None:
        """The needed nodes as steps, in an order that runs, and the schedule the passes
        make of it (and of each Gradient's order)."""
        for index in sorted(needed):
            self._step(index)
        self.order = [self._steps[i] for i in self.edges.topological(self.output_names, set())]
        self.work = sum(step.work for step in self.order)
        self.chain = chain_depth(self.order)  # a subgraph's: the depth its node counts
        if self.work > self.max_traced_nodes:
            raise too_much_work(f"graph '{self.name}': one trace", self.work, self.max_traced_nodes)
        # What a trace runs: ``order`` as the passes rewrite it (a Gradient fused with the
        # forward it shares, Gemms stacked), then each Gradient's own order.
        self.schedule = self._scheduled(self.order, inside_gradient=False)
        for step in self._steps.values():
            if isinstance(step, GradientStep):
                step.order = self._scheduled(step.order, inside_gradient=True)

    def _scheduled(self, steps: list[Step], *, inside_gradient: bool) -> list[Step]:
        for each in self.passes:
            if each.schedule is not None:
                steps = each.schedule(self, steps, inside_gradient)
        return steps

    def defines(self, name: str) -> bool:
        return self.edges.defines(name)

    def subgraph_functions(self, node: Any, where: str) -> dict[str, GraphFunction]:
        """The node's graph attributes, each as a GraphFunction reading this graph's names."""
        graphs = graph_attributes(node)
        if not graphs:
            return {}
        if self.depth + 1 > MAX_SUBGRAPH_DEPTH:
            raise ValueError(
                f"{where}: its subgraphs nest {self.depth + 1} deep, more than the limit of "
                f"{MAX_SUBGRAPH_DEPTH}"
            )
        scope = _Defined(self)
        functions = {}
        for name, sub in graphs.items():
            try:
                functions[name] = GraphFunction(
                    sub,
                    opsets=self.opsets,
                    max_bytes=self.max_bytes,
                    max_traced_nodes=self.max_traced_nodes,
                    max_gradient_depth=self.max_gradient_depth,
                    check_shapes=False,
                    scope=scope,
                    depth=self.depth + 1,
                    passes=[each.name for each in self.passes],
                )
            except PROMISED as error:
                raise wrap(f"{where}: subgraph '{name}'", error, always=True) from None
        work = 1 + sum(f.work for f in functions.values())
        if work > self.max_traced_nodes:
            raise too_much_work(
                f"{where}: with its subgraphs, its trace", work, self.max_traced_nodes
            )
        return functions

    def _step(self, index: int) -> Step:
        if index not in self._steps:
            step = make_step(self, self.edges.nodes[index], self._lowerings)
            self._steps[index] = step
            if isinstance(step, GradientStep):
                stop = set(step.xs) | set(step.zs)
                with self.edges.gradient(step.node):
                    order = self.edges.topological([step.y], stop, index)
                    step.order = [self._step(i) for i in order]
                refuse_sequences(step)
                chain = chain_depth(step.order)
                if chain > self.max_gradient_depth:
                    raise ValueError(
                        f"{step.where}: the longest chain of nodes it differentiates holds "
                        f"{chain} nodes, more than the limit of {self.max_gradient_depth} (XLA's "
                        "compile of a backward pass grows faster than its depth); raise it "
                        "with limits=Limits(gradient_depth=...) if the model is yours"
                    )
                step.depth = 2 * chain
                step.work = 1 + GRADIENT_WORK * sum(inner.work for inner in step.order)
                if step.work > self.max_traced_nodes:
                    raise too_much_work(
                        f"{step.where}: its trace", step.work, self.max_traced_nodes
                    )
        return self._steps[index]

    def step_reads(self, steps: Sequence[Step]) -> dict[int, tuple[str, ...]]:
        """What each of ``steps`` reads, by ``id``: its node's names (``Dependencies.deps``);
        a step a pass merged (a fused Gradient, stacked Gemms), what its parts read."""
        index = {id(step): i for i, step in self._steps.items()}

        def reads(step: Step) -> tuple[str, ...]:
            if step.parts:
                return tuple(name for part in step.parts for name in reads(part))
            return self.edges.deps(index[id(step)])

        return {id(step): reads(step) for step in steps}

    def stored_dtypes(self, names: Sequence[str]) -> tuple[np.dtype | None, ...]:
        """Per name, the dtype of the initializer of this graph it names, else None (see
        ``Node.input_dtypes``)."""
        dtypes: list[np.dtype | None] = []
        for name in names:
            elem = self._stored_types.get(name) if name else None
            try:
                dtypes.append(None if elem is None else tensor_dtype(elem, f"'{name}'"))
            except ValueError:  # a type refused where the initializer is read
                dtypes.append(None)
        return tuple(dtypes)

    def transposes_of(self, names: Sequence[str]) -> tuple[tuple[int, ...] | None, ...]:
        return self.edges.transposes_of(names)

    # -- running

    def apply(
        self,
        inputs: Mapping[str, Any],
        params: Mapping[str, Any] | None = None,
        *,
        differentiable: bool = True,
    ) -> tuple[Any, ...]:
        """The graph's outputs from its inputs (a pure function: jit it, differentiate it).

        ``params`` replaces float initializers by name (default: the model's values).
        Conditions only known at run time (an index read from a feed) are checked
        when the values are known (run eagerly), else dropped: :meth:`apply_checked`
        returns them. ``differentiable=False`` promises that nothing differentiates
        the result (a compiled training step): the trace then drops custom derivative
        rules it would otherwise keep (Relu's at 0), which makes it cheaper.
        """
        return self.apply_checked(inputs, params, differentiable=differentiable)[0]

    def apply_checked(
        self,
        inputs: Mapping[str, Any],
        params: Mapping[str, Any] | None = None,
        *,
        differentiable: bool = True,
    ) -> tuple[tuple[Any, ...], RunChecks]:
        """:meth:`apply`, and the run-time checks of its ops; after the run,
        :func:`raise_failed` raises the first that failed, naming its node."""
        env: Env = dict(self.static)
        env.update(self.params)
        env.update(params or {})
        env.update(inputs)
        with collect_run_checks() as checks:
            values = self.evaluate(env, differentiable=differentiable)
            outputs = tuple(materialize(value) for value in values)
        return outputs, RunChecks.of(checks)

    def evaluate(
        self,
        env: Env,
        *,
        differentiable: bool = True,
        steps: Sequence[Step] | None = None,
        outputs: Sequence[str] | None = None,
    ) -> tuple[Any, ...]:
        """Runs the nodes on ``env``; the outputs, Parts of packed buffers left as they are.

        ``differentiable``: the caller may differentiate the result, so custom
        derivative rules are kept (see :class:`Replay`). ``steps``: those of the
        schedule to run (default: all); ``outputs``: the names returned (default: the
        graph's outputs).
        """
        replay = REPLAY.set(Replay(inline=not differentiable))
        # ONNX broadcasts numpy-style (multidirectional): rank promotion is the
        # semantics here, whatever the caller's jax_numpy_rank_promotion says.
        try:
            # Unrolled Loop bodies (control_flow) run beyond the counted work: at most
            # what the limit leaves, for the whole trace.
            budget = unroll_budget(self.max_traced_nodes - self.work)
            with jax.numpy_rank_promotion("allow"), paused_gc(), budget:
                for step in self.schedule if steps is None else steps:
                    step.run(env)
        finally:
            REPLAY.reset(replay)
        names = self.output_names if outputs is None else outputs
        values = tuple(
            materialize(env[name]) if isinstance(env[name], ChannelsLast) else env[name]
            for name in names
        )
        for name, value in zip(names, values, strict=True):
            if any(map(is_static, tensors(value))):  # computed while tracing: JAX arrays here
                index = self.edges.producer.get(name)
                of = "" if index is None else f" of {describe(self.edges.nodes[index])}"
                refuse_narrowing_in(f"graph output '{name}'{of}", value)
        return values
