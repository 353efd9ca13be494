"""Lowering: each checked node as a step running the op registry's function on an
environment of values (a standard op, an optimizer node, a Gradient by ``jax.vjp``),
and a graph attribute as the callable its op reads (:class:`Subgraph`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.api_util import shaped_abstractify

from onnx_optax._src.graph.errors import node_errors, wrap
from onnx_optax._src.graph.feeds import host_array, to_jax
from onnx_optax._src.graph.nodes import graph_attributes, sequence_node
from onnx_optax._src.graph.packing import (
    Part,
    contiguous,
    materialize,
)
from onnx_optax._src.graph.remat import chain_depths, run_bounded, run_steps
from onnx_optax._src.graph.replay import NEVER_REPLAYED, REPLAY, REPLAY_HOST_LIMIT, OpTrace
from onnx_optax._src.graph.support import GRADIENT, STATIC_INITIALIZER_LIMIT, Env, latest_opset
from onnx_optax._src.onnx_nodes import (
    OptimizerNode,
    describe,
    listed,
    read_node,
)
from onnx_optax._src.ops import (
    Node,
    NotStaticError,
    check_omitted_inputs,
    check_size,
    collect_run_checks,
    domain_of,
    find_op,
    is_static,
    read_attributes,
    record_run_checks,
)
from onnx_optax._src.ops.values import (
    TensorSeq,
    is_sequence_or_optional,
    refuse_narrowing_in,
    tensors,
)


class Scope(Protocol):
    """What a step reads of the graph it belongs to (a GraphFunction)."""

    opsets: dict[str, int]
    max_bytes: int

    def defines(self, name: str) -> bool: ...

    def transposes_of(self, names: Sequence[str]) -> tuple[tuple[int, ...] | None, ...]: ...

    def stored_dtypes(self, names: Sequence[str]) -> tuple[np.dtype | None, ...]: ...

    def subgraph_functions(self, node: Any, where: str) -> Mapping[str, Any]: ...


# A lowering a pass offers for a node of a registry op: its step, or None (the op's own).
Lowering = Callable[[Any, Any], "Step | None"]


class Step:
    """One checked node and how to run it on an environment of values."""

    # Node runs a trace of this step makes (see GRADIENT_WORK); a Gradient's is set by
    # the graph once the steps computing its y are known.
    work = 1
    # Nodes on the longest chain through it that a Gradient around it differentiates
    # (see MAX_GRADIENT_DEPTH); a Gradient's: twice its own chain's.
    depth = 1
    # The steps it runs in one, where a pass merged some (a fused Gradient, stacked Gemms):
    # it reads what they read.
    parts: tuple[Step, ...] = ()

    def __init__(self, graph: Scope, node: Any) -> None:
        self.node = node
        self.where = describe(node)
        self.inputs = tuple(node.input)
        self.outputs = tuple(node.output)

    def run(self, env: Env) -> None:
        """Runs the node on ``env``; any error ends in a promised one naming it."""
        with node_errors(self.where):
            self._run(env)

    def _run(self, env: Env) -> None:
        raise NotImplementedError


class StandardStep(Step):
    """A node of an op in the registry (ai.onnx, ai.onnx.ml), read at its domain's opset."""

    # Whether a subclass (a pass's) computes the op's own values from the op's own inputs,
    # only held otherwise: then the constants pass folds it as it folds this class.
    folds_as_op = False

    def __init__(self, graph: Scope, node: Any) -> None:
        super().__init__(graph, node)
        domain = domain_of(node)
        opset = graph.opsets.get(domain, latest_opset(domain))
        op = find_op(node)
        assert op is not None  # the graph checked is_supported
        self.op = op
        check_omitted_inputs(node, opset, self.where)
        self.info = Node(
            attrs=read_attributes(node, opset, self.where),
            opset=opset,
            where=self.where,
            n_outputs=len(node.output),
            max_bytes=graph.max_bytes,
            inputs=self.inputs,
            outputs=self.outputs,
            input_perms=graph.transposes_of(self.inputs),
            input_dtypes=graph.stored_dtypes(self.inputs),
        )
        if op.check is not None:
            with node_errors(self.where):
                op.check(self.info)
        # Graph attributes (If's branches, Loop's and Scan's bodies), each a function of
        # its formal inputs and of the names it reads from the enclosing graphs.
        self.subgraphs = graph.subgraph_functions(node, self.where)
        # Inputs better known while tracing: the op's, and the condition of an If whose
        # branches give sequences or optionals (their lengths and emptiness may differ).
        self.prefer_static = op.prefer_static
        if node.op_type == "If" and any(
            o.type.WhichOneof("value") in ("sequence_type", "optional_type")
            for sub in graph_attributes(node).values()
            for o in sub.output
        ):
            self.prefer_static = (*op.prefer_static, 0)
        self.work = 1 + sum(sub.work for sub in self.subgraphs.values())
        self.depth = 1 + max((sub.chain for sub in self.subgraphs.values()), default=0)
        # What, besides its inputs, decides the function the op computes (see Replay).
        self.kind = (
            domain,
            node.op_type,
            opset,
            len(node.output),
            graph.max_bytes,
            tuple(a.SerializeToString(deterministic=True) for a in node.attribute),
            self.info.input_perms,
            self.info.input_dtypes,
        )

    def _call(self, args: list[Any]) -> Any:
        """The op on ``args``: called, or replayed from the trace's earlier calls of it."""
        replay = REPLAY.get()
        key = (
            None if replay is None or self.node.op_type in NEVER_REPLAYED else self._signature(args)
        )
        if key is None:
            return self.op.fn(self.info, *args)
        assert replay is not None
        if key not in replay.traces:  # the first call: the op, as it is
            replay.traces[key] = None
            return self.op.fn(self.info, *args)
        trace = replay.traces[key]
        if trace is None:  # the second: recorded
            trace = replay.traces[key] = self._trace(args)
        if trace is False:  # it checks values at run time, in its node's name: called
            return self.op.fn(self.info, *args)
        return trace.bind(args, replay.inline)

    def _signature(self, args: Sequence[Any]) -> tuple[Any, ...] | None:
        """The op's kind and its inputs' types (host inputs: values; repeated inputs marked)."""
        parts: list[Any] = [self.kind]
        first: dict[int, int] = {}
        for value in args:
            if value is None:
                parts.append(None)
            elif is_sequence_or_optional(value):
                return None  # never replayed: an op on sequences binds no equation of its own
            elif is_static(value):
                if value.size > REPLAY_HOST_LIMIT:
                    return None
                parts.append((value.dtype.str, value.shape, value.tobytes()))
            else:
                aval = shaped_abstractify(value)
                parts.append((aval, first.setdefault(id(value), len(first))))
        return tuple(parts)

    def _trace(self, args: list[Any]) -> OpTrace | Literal[False]:
        """The op's jaxpr as a function of its traced inputs (host inputs fixed); False
        for an op that records run-time checks (see :func:`check_at_run`): never replayed."""
        positions = tuple(i for i, a in enumerate(args) if a is not None and not is_static(a))
        outputs: list[Any] = []

        def fn(*traced: Any) -> list[Any]:
            full = list(args)
            for position, value in zip(positions, traced, strict=True):
                full[position] = value
            results = self.op.fn(self.info, *full)
            traced_outs: list[Any] = []
            for result in results if isinstance(results, tuple) else (results,):
                if result is None:
                    outputs.append(None)
                elif is_static(result):
                    outputs.append(("host", result))
                else:
                    outputs.append(("traced", len(traced_outs)))
                    traced_outs.append(result)
            return traced_outs

        specs = []
        for i in positions:
            aval = shaped_abstractify(args[i])
            specs.append(jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type))
        with collect_run_checks() as checks:  # kept apart: their tracers are this trace's
            closed = jax.make_jaxpr(fn)(*specs)
        if checks:  # a replay would check under the first node's name, or not at all
            return False
        return OpTrace(closed, positions, tuple(outputs))

    def _run(self, env: Env) -> None:
        args = [materialize(env[name]) if name else None for name in self.inputs]
        for name, value in zip(self.outputs, self._results(env, args), strict=False):
            if name:
                env[name] = value

    def _results(
        self, env: Env, args: list[Any], compute: Callable[[list[Any]], Any] | None = None
    ) -> tuple[Any, ...]:
        """The op's outputs on ``args`` (``compute``: a pass's function of them, for the
        op's own), checked: static inputs known, no narrowing, sizes within bounds."""
        for position in self.op.static:
            if (
                position < len(args)
                and args[position] is not None
                and not is_static(args[position])
            ):
                raise NotStaticError(
                    f"{self.where}: input '{self.inputs[position]}' must be known when the graph "
                    "is compiled (a constant, an initializer or computed from shapes); it is "
                    "traced: computed from the values fed, or from an initializer of more than "
                    f"{STATIC_INITIALIZER_LIMIT} elements (XLA receives those as data), and XLA "
                    "compiles static shapes"
                )
        traced = not all(a is None or is_static(a) for a in args)
        if traced:
            self._refuse_narrowing(args)
        # run() names the node in any error
        if self.subgraphs:  # bound to this run's values of the enclosing graphs: no replay
            bound = {name: Subgraph(fn, env) for name, fn in self.subgraphs.items()}
            info = dataclasses.replace(self.info, attrs={**self.info.attrs, **bound})
            results = self.op.fn(info, *args)
        elif compute is not None:
            results = compute(args)
        else:
            results = self._call(args) if traced else self.op.fn(self.info, *args)
        if not isinstance(results, tuple) or isinstance(results, TensorSeq):
            results = (results,)
        for name, value in zip(self.outputs, results, strict=False):
            for item in tensors(value):  # before XLA sees the shape or a later op reads it
                check_size(self.info, np.shape(item), item.dtype, f"output '{name}'")
        if not traced and not all(r is None or is_static(r) for r in results):
            self._refuse_narrowing(args)  # the op computed host values in JAX
        return results

    def _refuse_narrowing(self, args: Sequence[Any]) -> None:
        """Checks the host values an op reads as data, which become JAX arrays."""
        for position, value in enumerate(args):
            if position not in self.op.static:  # a sequence's host tensors too
                refuse_narrowing_in(f"{self.where}: input '{self.inputs[position]}'", value)


class Subgraph:
    """A graph attribute as the op reads it: called on its formal inputs, it returns its
    outputs (host values where they are known while tracing, else JAX values).

    It reads the names of the enclosing graphs from the values they have when the node
    holding it runs; an op calls it inside ``lax.cond``, ``lax.scan`` or
    ``lax.while_loop`` bodies, or directly (a constant condition).
    """

    def __init__(self, function: Any, env: Env) -> None:
        self.function = function
        self.env = env
        self.input_names = function.input_names
        self.output_names = function.output_names
        self.work = function.work  # node runs of one call
        self.nested = any(  # whether it holds subgraphs itself
            getattr(step, "subgraphs", None) for step in function.order
        )
        self.max_work = function.max_traced_nodes
        self.output_dtypes = function.output_dtypes  # declared (None where not)

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        function = self.function
        if len(inputs) != len(self.input_names):
            raise ValueError(
                f"subgraph '{function.name}' takes {len(self.input_names)} inputs "
                f"{list(self.input_names)}, given {len(inputs)}"
            )
        env: Env = {name: self.env[name] for name in function.outer_reads if name in self.env}
        env.update(function.static)
        env.update((n, host_array(f"initializer '{n}'", v)) for n, v in function.params.items())
        env.update(zip(self.input_names, inputs, strict=True))
        run_bounded(function.schedule, env)  # a Gradient around the node may transpose it
        return tuple(materialize(env[name]) for name in self.output_names)


class OptimizerStep(Step):
    def __init__(self, graph: Scope, node: Any) -> None:
        super().__init__(graph, node)
        self.optimizer: OptimizerNode = read_node(node)

    def _run(self, env: Env) -> None:
        values = [env[n] for n in self.inputs]
        try:
            results = self._run_packed(values)
            if results is None:
                args = [
                    to_jax(f"{self.where}: input '{n}'", materialize(v))
                    for n, v in zip(self.inputs, values, strict=True)
                ]
                results = self.optimizer.run(*args)
        except (TypeError, ValueError) as error:
            # Tagged: a graph's early shape check leaves optimizer nodes to their run.
            wrapped = wrap(self.where, error)
            wrapped.optimizer_node = True  # type: ignore[attr-defined]
            raise wrapped from None
        env.update(zip(self.outputs, results, strict=True))

    def _run_packed(self, values: Sequence[Any]) -> tuple[Any, ...] | None:
        """The node run on stretches of packed buffers, when its tensors lie side by side.

        Tensor i is packed when its X, G and state values are all Parts of one
        shape; each group's packed tensors must fill one stretch of a buffer, in
        order. The op then runs on those stretches (and on the other tensors as
        they are) and its outputs are Parts of the flat results. Anything else
        (a shape or dtype the op would refuse included) runs tensor by tensor.
        """
        n, k = self.optimizer.n_tensors, len(self.optimizer.operator.groups)
        groups = [values[2 + j * n : 2 + (j + 1) * n] for j in range(k)]
        packed = [
            i
            for i in range(n)
            if all(isinstance(g[i], Part) and g[i].shape == groups[0][i].shape for g in groups)
        ]
        if len(packed) < 2:
            return None
        flats = [contiguous([g[i] for i in packed]) for g in groups]
        if any(f is None for f in flats) or len({f.dtype for f in flats}) != 1:
            return None
        chosen = set(packed)
        rest = [i for i in range(n) if i not in chosen]
        args = [materialize(values[0]), materialize(values[1])]
        for j, (flat, g) in enumerate(zip(flats, groups, strict=True)):
            args.append(flat)
            args += [
                to_jax(f"{self.where}: input '{self.inputs[2 + j * n + i]}'", materialize(g[i]))
                for i in rest
            ]
        outputs = self.optimizer.run(*args)
        results: list[Any] = []
        width = 1 + len(rest)
        for first in range(0, len(outputs), width):
            flat, *others = outputs[first : first + width]
            tensors: list[Any] = [None] * n
            start = 0
            for i in packed:
                tensors[i] = Part(flat, start, groups[0][i].shape)
                start += tensors[i].size
            for i, tensor in zip(rest, others, strict=True):
                tensors[i] = tensor
            results += tensors
        return tuple(results)


class GradientStep(Step):
    def __init__(self, graph: Scope, node: Any) -> None:
        super().__init__(graph, node)
        attrs = read_attributes(node, 1, self.where)
        self.xs = tuple(attrs["xs"])
        self.zs = tuple(attrs.get("zs") or ())
        self.y = attrs["y"]
        if len(self.inputs) != len(self.xs) + len(self.zs):
            raise ValueError(
                f"{self.where}: has {len(self.inputs)} inputs, but xs {listed(list(self.xs))} "
                f"and zs {listed(list(self.zs))} name {len(self.xs) + len(self.zs)}; the inputs "
                "are the values of xs then zs"
            )
        if len(self.outputs) > len(self.xs):
            raise ValueError(
                f"{self.where}: has {len(self.outputs)} outputs but only {len(self.xs)} xs"
            )
        if set(self.xs) & set(self.zs) or len(set(self.xs)) != len(self.xs):
            raise ValueError(
                f"{self.where}: xs {listed(list(self.xs))} and zs {listed(list(self.zs))} overlap"
            )
        for label, names in (("y", [self.y]), ("xs", self.xs), ("zs", self.zs)):
            for name in names:
                if not graph.defines(name):
                    raise ValueError(
                        f"{self.where}: {label} names '{name}', which is no graph input, "
                        "initializer or node output"
                    )
        if not self.xs:
            raise ValueError(f"{self.where}: xs is empty")
        self.graph = graph
        self.order: list[Step] = []  # the nodes computing y from xs and zs, set by the graph

    def _run(self, env: Env) -> None:
        self.differentiate(env, ())

    def differentiate(self, env: Env, keep: Sequence[str]) -> None:
        """Sets the gradients of y w.r.t. xs in ``env``, and the values of ``keep`` (names
        the steps of ``order`` compute) as the differentiated function computed them:
        ``(y, vjp) = jax.vjp(f, *xs)``, each gradient ``vjp(1)``, ``keep`` from f's run."""
        values = [materialize(env[name]) for name in self.inputs]
        nx = len(self.xs)
        xs_values = [
            to_jax(f"{self.where}: input '{n}'", v)
            for n, v in zip(self.inputs[:nx], values[:nx], strict=True)
        ]
        for name, value in zip(self.xs, xs_values, strict=True):
            if not jnp.issubdtype(value.dtype, jnp.inexact):
                raise TypeError(
                    f"{self.where}: cannot differentiate with respect to '{name}' of dtype "
                    f"{value.dtype}; xs must be floating point"
                )
        zs_values = values[nx:]
        base = dict(env)
        host: dict[str, Any] = {}  # kept values known while tracing (no tracers: not aux)

        replay = REPLAY.get()

        def f(*xs: jax.Array) -> tuple[jax.Array, tuple[Any, dict[str, Any]]]:
            local = dict(base)
            local.update(zip(self.xs, xs, strict=True))
            local.update(zip(self.zs, zs_values, strict=True))
            # Differentiated: calls bound as they are (custom derivative rules kept).
            token = REPLAY.set(None if replay is None else replay.faithful())
            try:
                with collect_run_checks() as checks, chain_depths():  # aux: no tracer leaks
                    run_steps(self.order, local, [self.y, *keep])  # in segments under remat
            finally:
                REPLAY.reset(token)
            y = to_jax(f"{self.where}: y '{self.y}'", materialize(local[self.y]))
            if not jnp.issubdtype(y.dtype, jnp.inexact):
                raise TypeError(f"{self.where}: y '{self.y}' has dtype {y.dtype}; it must be float")
            traced = {}
            for name in keep:
                if isinstance(local[name], jax.Array):
                    traced[name] = local[name]
                else:
                    host[name] = local[name]
            return y, (checks, traced)

        y, pullback, (checks, traced) = jax.vjp(f, *xs_values, has_aux=True)
        record_run_checks(checks)
        env.update(host)
        env.update(traced)
        grads = pullback(jnp.ones_like(y))
        for name, grad in zip(self.outputs, grads, strict=False):
            if name:
                env[name] = grad


def chain_depth(steps: Sequence[Step]) -> int:
    """The nodes on the longest chain of ``steps`` (in an order that runs), each counted
    as its ``depth``: a chain runs through the names a step reads and writes."""
    depth: dict[str, int] = {}
    longest = 0
    for step in steps:
        reached = step.depth + max((depth.get(n, 0) for n in step.inputs if n), default=0)
        depth.update((n, reached) for n in step.outputs if n)
        longest = max(longest, reached)
    return longest


def refuse_sequences(step: GradientStep) -> None:
    """Refuses a Gradient whose path from xs to y crosses a sequence or optional op."""
    for inner in step.order:
        found = sequence_node(inner.node)
        if found is not None:
            raise ValueError(
                f"{step.where}: the path to y '{step.y}' crosses {describe(found)}; gradients "
                "do not flow through sequences and optionals"
            )


def make_step(graph: Scope, node: Any, lowerings: Sequence[Lowering] = ()) -> Step:
    """The step of a supported node: a registry op's, as the first of ``lowerings`` that
    offers one makes it (else its op's own), an optimizer node's or a Gradient's."""
    if find_op(node) is not None:
        for lower in lowerings:
            step = lower(graph, node)
            if step is not None:
                return step
        return StandardStep(graph, node)
    if node.op_type == GRADIENT:
        return GradientStep(graph, node)
    return OptimizerStep(graph, node)
