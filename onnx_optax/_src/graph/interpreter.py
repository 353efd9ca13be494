"""An ONNX graph as one JAX function: registered ops, optimizer nodes and ``Gradient``.

:class:`GraphFunction` checks a ``GraphProto`` once (every needed node
supported, attributes typed, names defined, no cycle), keeps only the nodes the
requested outputs need, orders them and evaluates them in one function of the
graph inputs and the float initializers, jitted once per input signature.

``Gradient`` (``ai.onnx.preview.training``): its ``y`` is named by an attribute,
not an edge, so its dependencies are its inputs plus whatever the nodes computing
``y`` read (stopping at ``xs`` and ``zs``). It runs ``jax.vjp`` over exactly those
nodes, as a function of the values given for ``xs`` (``zs`` held fixed), inside
the same computation; Gradient of a Gradient nests. A non-scalar ``y`` is seeded
with ones: the outputs are the gradients of ``sum(y)``. When its inputs are its
``xs`` then ``zs`` by name, the nodes computing ``y`` that the graph also runs (a
training graph's forward, its loss an output) are not run a second time: the
Gradient's own forward gives their values (:class:`_FusedGradientStep`), so the
traced step holds one forward, as ``jax.value_and_grad`` would.

Subgraphs (If's branches, Loop's and Scan's bodies) are GraphFunctions of their
own, built with the enclosing graph's names in scope; the names they read from
outside count as their node's dependencies. When the node runs, each reaches its
op as a :class:`Subgraph`, a callable bound to the enclosing values of that run
(the op traces it once into ``lax.cond``, ``lax.scan`` or ``lax.while_loop``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import gc
import math
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.api_util import shaped_abstractify

from onnx_optax._src.graph_packing import (
    PACK_BELOW,
    Layout,
    Part,
    contiguous,
    cut,
    materialize,
    outputs_of,
    pack,
    unpack,
)
from onnx_optax._src.limits import (
    MAX_GRADIENT_DEPTH,
    MAX_SUBGRAPH_DEPTH,
    MAX_TENSOR_BYTES,
    MAX_TRACED_NODES,
)
from onnx_optax._src.onnx_nodes import (
    DOMAIN,
    LISTED,
    OPERATORS,
    OptimizerNode,
    UnsupportedOperatorError,
    describe,
    listed,
    read_node,
    shown,
)
from onnx_optax._src.onnx_tensors import (
    STRINGS_ADVICE,
    read_tensor,
    refuse_narrowing,
    tensor_dtype,
    utf8,
)
from onnx_optax._src.ops import (
    ADVICE,
    ML_DOMAIN,
    REGISTRY,
    STANDARD_DOMAINS,
    Node,
    NotStaticError,
    RunChecks,
    check_omitted_inputs,
    check_size,
    collect_run_checks,
    domain_of,
    find_op,
    is_static,
    raise_failed,
    read_attributes,
    record_run_checks,
)
from onnx_optax._src.ops.nn import one_hot_product
from onnx_optax._src.ops.sequence import SEQUENCE_OPS, feed_value, host_value
from onnx_optax._src.ops.subgraphs import unroll_budget
from onnx_optax._src.ops.values import (
    TensorSeq,
    is_sequence_or_optional,
    refuse_narrowing_in,
    tensors,
)
from onnx_optax._src.remat import chain_depths, is_rematerializing, run_bounded, run_steps

GRADIENT = "Gradient"
# Integer initializers up to this size are kept as trace-time constants (shapes, axes).
STATIC_INITIALIZER_LIMIT = 1 << 12
# A node inside a Gradient is traced this many times per level of Gradient around it:
# jax.vjp traces its forward and tangent, then transposes the tangent. Nested Gradients
# multiply (a Gradient of a Gradient of n nodes traces about 9 n).
GRADIENT_WORK = 3
# A graph input of at most this many elements (declared) that a shape, an axis, or a
# Loop's trip count or condition is computed from is read as a compile-time value
# (see _small_sources).
SMALL_SOURCE = 16
# Ops whose output is set by their inputs' shapes (and attributes), never their values.
SHAPE_ONLY = frozenset({"Shape", "Size"})

Env = dict[str, Any]


def latest_opset(domain: str = "") -> int:
    """The newest opset the installed onnx defines for ``domain`` ('' for ai.onnx)."""
    import onnx

    if domain == ML_DOMAIN:
        return int(onnx.defs.onnx_ml_opset_version())
    return int(onnx.defs.onnx_opset_version())


def is_supported(node: Any) -> bool:
    if find_op(node) is not None:
        return True
    return domain_of(node) == DOMAIN and (node.op_type in OPERATORS or node.op_type == GRADIENT)


def supported_ops() -> dict[str, list[str]]:
    """Every op type that runs, by domain (the registry's domains and the training domain)."""
    ops = {domain or "ai.onnx": sorted(table) for domain, table in REGISTRY.items()}
    return {**ops, DOMAIN: sorted([*OPERATORS, GRADIENT])}


def as_array(what: str, value: Any) -> np.ndarray:
    """A host value as a numpy array; a TypeError naming it where it is none."""
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{what} is not a tensor ({type(value).__name__}): {error}") from None


def host_array(what: str, value: Any) -> np.ndarray:
    """A host value (a feed, an initializer) as a numpy array that JAX holds exactly."""
    array = as_array(what, value)
    refuse_narrowing(what, array)
    return array


def to_jax(what: str, value: Any) -> jax.Array:
    """A host value as a JAX array, refusing what JAX cannot hold or would silently narrow."""
    if isinstance(value, jax.Array):
        return value
    return jnp.asarray(host_array(what, value))


PROMISED = (TypeError, ValueError, NotImplementedError)


def _wrap(where: str, error: Exception, *, always: bool = False) -> Exception:
    """A promised error (TypeError, ValueError, NotImplementedError) naming the node.

    One that names a node already (raised by a node inside a Gradient, or by the
    step itself) is returned as it is; another is rebuilt with the node's name in
    front, of its own type when that type takes a message alone, else of the
    promised type it derives from. ``always``: prefixed even then (an error inside a
    subgraph, named by its node there, prefixed with the node holding the subgraph).
    """
    message = str(error)
    if message.startswith("node ") and not always:
        return error
    message = f"{where}: {message}"
    try:
        wrapped = type(error)(message)
    except Exception:  # a subclass with another signature (JAX's tracer errors)
        wrapped = None
    if wrapped is None or str(wrapped) != message:
        wrapped = next(kind for kind in PROMISED if isinstance(error, kind))(message)
    return wrapped


def _unexpected(where: str, error: Exception) -> ValueError:
    """Any other exception raised while running a node, as a ValueError naming it."""
    if isinstance(error, MemoryError):
        return ValueError(
            f"{where}: ran out of host memory while computing it ({error or 'MemoryError'}); "
            "lower limits=Limits(tensor_bytes=...) to have such a tensor refused by name"
        )
    return ValueError(f"{where}: cannot run it: {type(error).__name__}: {error}")


@contextlib.contextmanager
def node_errors(where: str) -> Iterator[None]:
    """The one boundary around running a node: whatever it raises ends in a promised error.

    TypeError, ValueError and NotImplementedError are given the node's name (see
    :func:`_wrap`); any other ``Exception`` (ZeroDivisionError, IndexError,
    KeyError, OverflowError, RecursionError, MemoryError: a model's numbers
    reaching an op's arithmetic) becomes a ValueError naming the node, the original
    kept as ``__cause__``. MemoryError is included: the model chose the size that
    failed, so the caller gets the node to blame rather than a bare MemoryError.
    What is not an ``Exception`` (KeyboardInterrupt, SystemExit) passes untouched.
    """
    try:
        yield
    except PROMISED as error:
        wrapped = _wrap(where, error)
        if wrapped is error:
            raise
        raise wrapped from None
    except Exception as error:
        raise _unexpected(where, error) from error


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off while a graph is traced or lowered.

    A trace builds hundreds of thousands of long-lived objects (jaxpr equations,
    tracers, MLIR operations); each full collection walks all of them, which
    doubled the trace of a 20,000-node chain. Nested uses do nothing; the
    collector is turned back on only if it was on (another thread may turn it on
    earlier: that costs time, not correctness).
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# Host values (shapes, axes) up to this many elements key an op's trace in a _Replay.
REPLAY_HOST_LIMIT = 1024
# Ops whose result may differ between two calls with equal inputs (random ops without a
# seed), and the quantization pair, whose integer tensor carries its straight-through
# derivative beside it (ops.quantization's shadows, which a replayed trace would drop):
# never replayed. Every other op must be a function of its attributes, its inputs' types
# and its host inputs' values while tracing, as the registry's ops are.
UNREPLAYED = frozenset(
    (
        "Dropout",  # draws from the step's key (random_keys), read when it is called
        "RandomNormalLike",
        "RandomUniformLike",
        "Bernoulli",
        "Multinomial",
        "QuantizeLinear",
        "DequantizeLinear",
    )
)


class _OpTrace(NamedTuple):
    """An op's jaxpr for one signature of its inputs, and how its outputs come out of it."""

    closed: Any  # the ClosedJaxpr of the op as a function of its traced inputs
    positions: tuple[int, ...]  # the traced inputs' positions among the op's inputs
    outputs: tuple[Any, ...]  # per output: None, ("host", value) or ("traced", index)

    def bind(self, args: Sequence[Any], inline: bool) -> tuple[Any, ...]:
        outs = _inline(self.closed, *[args[i] for i in self.positions], calls=inline)
        return tuple(
            None
            if out is None
            else np.array(out[1], copy=True)  # each node its own host value, as the op gave
            if out[0] == "host"
            else outs[out[1]]
            for out in self.outputs
        )


# Sequence ops return no JAX values of their own (a TensorSeq of their inputs' pieces).
_UNREPLAYED = UNREPLAYED | SEQUENCE_OPS

# The Cast types of a one-hot a MatMul multiplies (GraphFunction.one_hot_of): ONNX's
# FLOAT, FLOAT16, DOUBLE and BFLOAT16.
_ONE_HOT_TYPES = frozenset((1, 10, 11, 16))

# Graph._constants_function: below this many bytes computed from constants alone, they
# are computed in the graph on each run.
HOISTED_BYTES = 1 << 20
# How many times over its steps a graph may look while batching Gemms (_batched) and
# fusing Gradients (_fused), together: each set of Gemms looks over the steps between its
# first and last, each Gradient over the whole schedule. Past that, the rest run as they
# are (computing the same): 2,000 Gradients took 11 s, and twice as many four times that.
REORDER_PASSES = 16

# Ops never computed ahead of a run from constant inputs (Graph._split_constants): those
# that draw random numbers, and those on sequences (not arrays).
_NOT_FOLDED = (
    frozenset(("Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike"))
    | frozenset(("RandomUniformLike", "Bernoulli", "Multinomial"))
    | SEQUENCE_OPS
)

# A signature's entry in a _Replay: None once seen, its trace once recorded, False for an
# op that checks values at run time (never replayed).
_Traced = _OpTrace | Literal[False] | None


class _Replay:
    """The ops one trace of a graph has seen: a repeated call is traced once, then replayed.

    A node whose op, attributes and inputs' types (host inputs: values) equal
    two earlier nodes' computes the same function of its traced inputs: the
    second such node records the op's jaxpr, and every later one binds that
    jaxpr's equations on the trace instead of calling the op again (jax.numpy's
    dispatch, about 0.1 ms a call, and Relu's custom_jvp, about 0.5 ms, cost far
    more than binding the one equation each emits). ``inline``: nothing
    differentiates this trace (a compiled graph's own function), so calls are
    inlined as they are bound (see :func:`flattened`); inside a Gradient they are
    bound as they are, keeping custom derivative rules (Relu's at 0).
    """

    def __init__(self, inline: bool, traces: dict[Any, _Traced] | None = None) -> None:
        self.inline = inline
        self.traces: dict[Any, _Traced] = {} if traces is None else traces

    def faithful(self) -> _Replay:
        """The same traces, bound without inlining (for a trace that is differentiated)."""
        return self if not self.inline else _Replay(False, self.traces)


_REPLAY: contextvars.ContextVar[_Replay | None] = contextvars.ContextVar(
    "onnx_optax_replay", default=None
)


class _Step:
    """One checked node and how to run it on an environment of values."""

    # Node runs a trace of this step makes (see GRADIENT_WORK); a Gradient's is set by
    # the graph once the steps computing its y are known.
    work = 1
    # Nodes on the longest chain through it that a Gradient around it differentiates
    # (see MAX_GRADIENT_DEPTH); a Gradient's: twice its own chain's.
    depth = 1

    def __init__(self, graph: GraphFunction, node: Any) -> None:
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


class _StandardStep(_Step):
    """A node of an op in the registry (ai.onnx, ai.onnx.ml), read at its domain's opset."""

    def __init__(self, graph: GraphFunction, node: Any) -> None:
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
            for sub in _subgraphs(node).values()
            for o in sub.output
        ):
            self.prefer_static = (*op.prefer_static, 0)
        self.work = 1 + sum(sub.work for sub in self.subgraphs.values())
        self.depth = 1 + max((sub.chain for sub in self.subgraphs.values()), default=0)
        # What, besides its inputs, decides the function the op computes (see _Replay).
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
        replay = _REPLAY.get()
        key = None if replay is None or self.node.op_type in _UNREPLAYED else self._signature(args)
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

    def _trace(self, args: list[Any]) -> _OpTrace | Literal[False]:
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
        return _OpTrace(closed, positions, tuple(outputs))

    def _run(self, env: Env) -> None:
        args = [materialize(env[name]) if name else None for name in self.inputs]
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
        else:
            results = self._call(args) if traced else self.op.fn(self.info, *args)
        if not isinstance(results, tuple) or isinstance(results, TensorSeq):
            results = (results,)
        for name, value in zip(self.outputs, results, strict=False):
            for item in tensors(value):  # before XLA sees the shape or a later op reads it
                check_size(self.info, np.shape(item), item.dtype, f"output '{name}'")
        if not traced and not all(r is None or is_static(r) for r in results):
            self._refuse_narrowing(args)  # the op computed host values in JAX
        for name, value in zip(self.outputs, results, strict=False):
            if name:
                env[name] = value

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

    def __init__(self, function: GraphFunction, env: Env) -> None:
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


class _OptimizerStep(_Step):
    def __init__(self, graph: GraphFunction, node: Any) -> None:
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
            wrapped = _wrap(self.where, error)
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


class _GradientStep(_Step):
    def __init__(self, graph: GraphFunction, node: Any) -> None:
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
        self.order: list[_Step] = []  # the nodes computing y from xs and zs, set by the graph

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

        replay = _REPLAY.get()

        def f(*xs: jax.Array) -> tuple[jax.Array, tuple[Any, dict[str, Any]]]:
            local = dict(base)
            local.update(zip(self.xs, xs, strict=True))
            local.update(zip(self.zs, zs_values, strict=True))
            # Differentiated: calls bound as they are (custom derivative rules kept).
            token = _REPLAY.set(None if replay is None else replay.faithful())
            try:
                with collect_run_checks() as checks, chain_depths():  # aux: no tracer leaks
                    run_steps(self.order, local, [self.y, *keep])  # in segments under remat
            finally:
                _REPLAY.reset(token)
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


class _FusedGradientStep(_Step):
    """A Gradient that also computes, for the graph around it, the steps of its ``order``
    that graph runs (``absorbed``): their values are those of the differentiated
    function's own forward, so the forward is traced once, not beside it a second time.

    Under remat the Gradient's forward is checkpointed in segments: the absorbed steps
    then run apart first, as in an unfused schedule.
    """

    def __init__(self, gradient: _GradientStep, absorbed: Sequence[_Step]) -> None:
        self.node = gradient.node
        self.where = gradient.where
        self.inputs = gradient.inputs
        self.gradient = gradient
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


class _BatchedGemmStep(_Step):
    """Gemm nodes of the same B, C and attributes, none reading what another computes,
    as one product: their A's stacked by rows, the result split back into their Y's.

    An exporter's unrolled recurrence writes such nodes, one a time step (PyTorch's
    LSTM: ``x_t W_ih^T`` for every t, 40 of them in the CRNN): XLA then reads B once
    instead of once a node, and a gradient with respect to B is one product instead of
    a sum of one a node (the CRNN's training step: 80 products of 6.5 MB summed).
    Where the stacked product cannot be made as it is (A's of other ranks, dtypes or
    widths, a C of rows, values known while tracing) or refuses, each node runs itself.

    ``transposed``: the name under which a run's values hold B transposed, where B is an
    initializer read with transB=1 (``GraphFunction._transposed_weights``): the product
    then reads that as it lies. YNNPACK packs a transposed weight for each product, and
    more slowly (the CRNN's [20, 4096] by [400, 4096]: 273 against 197 µs alone); a run
    computes it once per device, with the constants, and the device then holds B twice.
    """

    def __init__(self, members: Sequence[_StandardStep]) -> None:
        self.members = tuple(members)
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


class _OneHotProductStep(_StandardStep):
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
        graph: GraphFunction,
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


def _gradient_names(node: Any) -> tuple[str, set[str]]:
    """A Gradient node's y and the names its differentiation stops at (xs and zs)."""
    from onnx import helper

    def text(value: Any) -> str:
        return utf8(value, f"{describe(node)}: a name") if isinstance(value, bytes) else str(value)

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    stop = {text(v) for k in ("xs", "zs") for v in attrs.get(k, [])}
    return text(attrs.get("y", b"")), stop


def _subgraphs(node: Any) -> dict[str, Any]:
    """A node's graph attributes by name (GRAPHS ones as name[i])."""
    import onnx

    found = {}
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            found[attribute.name] = attribute.g
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            found.update((f"{attribute.name}[{i}]", g) for i, g in enumerate(attribute.graphs))
    return found


def _free_names(node: Any, depth: int) -> list[str]:
    """The names a node's subgraphs read from the graphs around the node (nested ones too)."""
    graphs = _subgraphs(node)
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
            for name in (*inner.input, *_free_names(inner, depth + 1)):
                if name and name not in defined:
                    free[name] = None
        free.update((o.name, None) for o in sub.output if o.name not in defined)
    return list(free)


def _chain_depth(steps: Sequence[_Step]) -> int:
    """The nodes on the longest chain of ``steps`` (in an order that runs), each counted
    as its ``depth``: a chain runs through the names a step reads and writes."""
    depth: dict[str, int] = {}
    longest = 0
    for step in steps:
        reached = step.depth + max((depth.get(n, 0) for n in step.inputs if n), default=0)
        depth.update((n, reached) for n in step.outputs if n)
        longest = max(longest, reached)
    return longest


def _sequence_node(node: Any) -> Any:
    """The node of a sequence or optional op that ``node`` is or holds in a subgraph, if any."""
    if domain_of(node) == "" and node.op_type in SEQUENCE_OPS:
        return node
    for graph in _subgraphs(node).values():
        for inner in graph.node:
            found = _sequence_node(inner)
            if found is not None:
                return found
    return None


def _refuse_sequences(step: _GradientStep) -> None:
    """Refuses a Gradient whose path from xs to y crosses a sequence or optional op."""
    for inner in step.order:
        found = _sequence_node(inner.node)
        if found is not None:
            raise ValueError(
                f"{step.where}: the path to y '{step.y}' crosses {describe(found)}; gradients "
                "do not flow through sequences and optionals"
            )


def _postorder(
    roots: Iterable[Any],
    visit: Callable[[Any, Any], Any],
    children: Callable[[Any], Iterable[Any]],
    cycle: Callable[[Any], Exception],
) -> list[Any]:
    """Nodes in depth-first postorder, walked with its own stack: a chain of many nodes
    needs no Python recursion.

    ``visit(item, parent)`` is the node an item leads to, or None where the walk stops
    there (``parent``: the node whose item it is, None for a root); ``children(node)``
    the items a node leads on to. Each node comes once, after every node its items lead
    to; ``cycle(node)`` is raised when the walk meets a node on its current path.
    """
    order: list[Any] = []
    path: set[Any] = set()
    done: set[Any] = set()

    def enter(item: Any, parent: Any) -> Any:
        node = visit(item, parent)
        if node is None or node in done:
            return None
        if node in path:
            raise cycle(node)
        path.add(node)
        return node

    for root in roots:
        first = enter(root, None)
        stack = [] if first is None else [(first, iter(children(first)))]
        while stack:
            node, todo = stack[-1]
            for item in todo:
                child = enter(item, node)
                if child is not None:
                    stack.append((child, iter(children(child))))
                    break
            else:
                stack.pop()
                path.discard(node)
                done.add(node)
                order.append(node)
    return order


def _sorted_steps(steps: list[_Step], reads: Mapping[int, Sequence[str]]) -> list[_Step] | None:
    """``steps`` in an order that runs (each after the producers of what it reads, by
    ``id(step)`` in ``reads``), else in their given order; None if they form a cycle."""
    producer = {name: step for step in steps for name in step.outputs if name}

    def producers(step: _Step) -> Iterator[_Step]:
        return (producer[name] for name in reads[id(step)] if name in producer)

    try:
        return _postorder(steps, lambda step, _: step, producers, lambda _: LookupError())
    except LookupError:
        return None


def _make_step(graph: GraphFunction, node: Any) -> _Step:
    if find_op(node) is not None:
        one_hot = graph.one_hot_of(node)
        if one_hot is not None:
            return _OneHotProductStep(graph, node, *one_hot)
        return _StandardStep(graph, node)
    if node.op_type == GRADIENT:
        return _GradientStep(graph, node)
    return _OptimizerStep(graph, node)


def unsupported_error(nodes: Sequence[Any], opsets: Mapping[str, int]) -> UnsupportedOperatorError:
    """One error naming the unsupported (domain, op, opset) among ``nodes``: how many,
    and the first LISTED of them (sorted)."""
    found = sorted(
        {
            (node.domain or "ai.onnx", node.op_type, opsets.get(domain_of(node), 0))
            for node in nodes
            if not is_supported(node)
        }
    )
    first = next(node for node in nodes if not is_supported(node))
    ops = ", ".join(f"{shown(d)}.{shown(op)} (opset {v})" for d, op, v in found[:LISTED])
    if len(found) > LISTED:
        ops += f" and {len(found) - LISTED:,} more"
    advice = "".join(f" {ADVICE[op]}." for d, op, _ in found if d == ML_DOMAIN and op in ADVICE)
    runs = ", ".join(f"{len(table)} ops of {d or 'ai.onnx'}" for d, table in REGISTRY.items())
    return UnsupportedOperatorError(
        f"{describe(first)}: unsupported op {shown(first.op_type)} in domain "
        f"'{shown(first.domain or 'ai.onnx')}'; the graph needs {len(found)} unsupported "
        f"op(s): {ops}."
        f"{advice} onnx_optax runs {runs} (see docs/onnx-ops.md), and Adagrad, Adam, "
        f"Momentum and Gradient of '{DOMAIN}'"
    )


def _refuse_strings(graph: Any, nodes: Sequence[Any]) -> None:
    """Refuses, by node, a string tensor that ``nodes`` read or compute (XLA holds none).

    The types are the declared ones: initializers, graph inputs and outputs, value_info
    (a sequence's or an optional's elements: tensors).
    """
    import onnx

    strings = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.STRING}
    for info in (*graph.input, *graph.output, *graph.value_info):
        if _tensor_type(info.type).elem_type == onnx.TensorProto.STRING:  # sequences' too
            strings.add(info.name)
    if not strings:
        return
    for node in nodes:
        for kind, names in (("input", node.input), ("output", node.output)):
            for name in names:
                if name in strings:
                    raise TypeError(
                        f"{describe(node)}: its {kind} '{name}' is a string tensor; "
                        f"{STRINGS_ADVICE}"
                    )


def _tensor_type(type_proto: Any) -> Any:
    """The tensor type of a value's type: its own, a sequence's or an optional's elements'."""
    while type_proto.WhichOneof("value") in ("sequence_type", "optional_type"):
        kind = type_proto.WhichOneof("value")
        type_proto = getattr(type_proto, kind).elem_type
    return type_proto.tensor_type


def refuse_undefined_types(graph: Any, inputs: Container[str]) -> None:
    """Refuses a model's graph whose inputs (``inputs``: those fed) or outputs declare a
    tensor of element type 0, as onnxruntime does when it loads the model ("Invalid
    tensor data type 0"). (An input of no type the ONNX checker refuses.)
    """
    for what, values in (("input", graph.input), ("output", graph.output)):
        for value in values:
            if what == "input" and value.name not in inputs:
                continue  # an initializer's default
            if (
                value.type.WhichOneof("value") == "tensor_type"
                and not value.type.tensor_type.elem_type
            ):
                raise ValueError(
                    f"graph {what} '{value.name}' declares a tensor of element type 0 (undefined)"
                )


def _feed_tensor(what: str, value: Any) -> Any:
    """A fed tensor: a JAX array as it is, anything else checked on the host."""
    return value if isinstance(value, jax.Array) else host_array(what, value)


def refuse_unlike_declared(what: str, tensor: Any, declared: Any) -> None:
    """Refuses a fed tensor of another element type, rank or fixed size than its graph
    input declares (``declared``: a ``TypeProto.Tensor``), as onnxruntime does.

    The graph is traced for the declared types, and onnxruntime refuses such a feed
    ("Unexpected input data type", "Invalid rank for input", "Got invalid
    dimensions"), so a result here would be one where it refuses. As there, an
    element type of 0, a shape of no dims, and a symbolic or negative size check
    nothing. A JAX array may hold a 64-bit type as its 32-bit form (32-bit JAX).
    """
    if declared.elem_type:
        want = tensor_dtype(declared.elem_type, what)
        got = np.dtype(tensor.dtype)
        narrowed = isinstance(tensor, jax.Array) and got == jax.dtypes.canonicalize_dtype(want)
        if got != want and not narrowed:
            raise TypeError(f"{what} is {got}; the graph declares {want}: feed {want}")
    dims = declared.shape.dim if declared.HasField("shape") else ()
    if not dims:
        return
    if len(tensor.shape) != len(dims):
        raise ValueError(
            f"{what} has shape {list(tensor.shape)}, of rank {len(tensor.shape)}; the graph "
            f"declares rank {len(dims)}"
        )
    for axis, (size, dim) in enumerate(zip(tensor.shape, dims, strict=True)):
        if dim.HasField("dim_value") and dim.dim_value >= 0 and size != dim.dim_value:
            raise ValueError(
                f"{what} has size {size} on axis {axis} (shape {list(tensor.shape)}); the graph "
                f"declares {dim.dim_value}"
            )


def _declared(name: str, out: Any, dtype: np.dtype | None, kind: str | None = None) -> Any:
    """An output in its declared type: never converted, except back to a 64-bit integer.

    ``kind``: what the output declares itself (``tensor_type``, ``sequence_type``, ...);
    a tensor declared a sequence, or a sequence declared a tensor, is refused, as
    onnxruntime refuses it ("does not match expected type").

    32-bit JAX computes int64 as int32 (values beyond int32 are refused on the way
    in), so such an output is widened back losslessly. Any other difference
    between the declared and the computed type is an error naming the output,
    rather than a silent conversion (an X_new declared INT8 would round).
    """
    computed = "sequence_type" if isinstance(out, list) else "tensor_type"
    if kind in ("tensor_type", "sequence_type") and out is not None and kind != computed:
        raise TypeError(
            f"graph output '{name}' is declared a {kind.removesuffix('_type')} but the graph "
            f"computes a {computed.removesuffix('_type')}"
        )
    if isinstance(out, list):  # a sequence: each tensor
        return [_declared(f"{name}[{i}]", item, dtype) for i, item in enumerate(out)]
    if dtype is None or out is None or out.dtype == dtype:
        return out
    if np.issubdtype(dtype, np.integer) and out.dtype == jax.dtypes.canonicalize_dtype(dtype):
        return out.astype(dtype)
    raise TypeError(
        f"graph output '{name}' is declared {dtype} but the graph computes {out.dtype}; "
        "onnx_optax does not convert outputs (fix the declared type, or enable 64-bit JAX "
        "for double outputs)"
    )


class _Defined:
    """The names a graph defines, its enclosing graphs' included: a subgraph's scope."""

    def __init__(self, graph: GraphFunction) -> None:
        self.graph = graph

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.graph.defines(name)


class GraphFunction:
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
    ) -> None:
        self.name = graph.name
        self.depth = depth  # how many graphs enclose this one
        self.max_bytes = max_bytes
        self.max_traced_nodes = max_traced_nodes
        self.max_gradient_depth = max_gradient_depth
        self._nesting = 0  # Gradients whose reach is being found, one inside the other
        self.opsets = {
            ("" if k in STANDARD_DOMAINS else k): int(v) for k, v in (opsets or {}).items()
        }
        outer = {name: np.asarray(v) for name, v in (outer_values or {}).items()}
        initializers = {init.name: init for init in graph.initializer}
        self._stored_types = {name: init.data_type for name, init in initializers.items()}
        self.input_names = tuple(
            i.name for i in graph.input if i.name not in outer and i.name not in initializers
        )
        # Graph inputs that are also initializers: defaults a feed may override in
        # onnxruntime; here a feed naming one is refused (see __call__), never ignored.
        self._initializer_inputs = frozenset(i.name for i in graph.input) & initializers.keys()
        self.output_names = tuple(outputs or (o.name for o in graph.output))
        self._available = {*self.input_names, *outer, *initializers}
        # The enclosing graphs' names: looked up there, never copied (a copy for each
        # subgraph grew with the enclosing graph's names times its subgraphs).
        self._scope = scope
        self._nodes = list(graph.node)
        self._producer: dict[str, int] = {}
        for index, node in enumerate(self._nodes):
            for name in node.output:
                if not name:
                    continue
                if name in self._producer or name in self._available or name in scope:
                    raise ValueError(f"{describe(node)}: output '{name}' is already defined")
                self._producer[name] = index
        self._steps: dict[int, _Step] = {}
        self._deps_memo: dict[int, tuple[str, ...]] = {}
        needed = self._needed(self.output_names)
        if any(not is_supported(self._nodes[i]) for i in needed):
            raise unsupported_error(self._nodes, self.opsets)
        _refuse_strings(graph, [self._nodes[i] for i in sorted(needed)])
        declared = {
            o.name: _tensor_type(o.type).elem_type
            for o in graph.output
            if _tensor_type(o.type).elem_type
        }
        # Graph inputs of sequence or optional type, fed as lists or None (see _feed).
        self._inputs = frozenset(self.input_names)  # membership: a set, not the tuple
        self.value_types = {
            i.name: i.type
            for i in graph.input
            if i.name in self._inputs
            and i.type.WhichOneof("value") in ("sequence_type", "optional_type")
        }
        self.output_dtypes = tuple(
            tensor_dtype(declared[n], f"graph output '{n}'") if n in declared else None
            for n in self.output_names
        )
        # Each output's declared kind (tensor_type, sequence_type, ...; None: undeclared).
        kinds = {o.name: o.type.WhichOneof("value") for o in graph.output}
        self.output_kinds = tuple(kinds.get(n) for n in self.output_names)
        # Tensor inputs' declared types, which each feed must match (see _feed).
        self.input_types = {
            i.name: i.type.tensor_type
            for i in graph.input
            if i.name in self._inputs and i.type.WhichOneof("value") == "tensor_type"
        }
        for index in sorted(needed):
            self._step(index)
        self.order = [self._steps[i] for i in self._topological(self.output_names, set())]
        self.work = sum(step.work for step in self.order)
        self.chain = _chain_depth(self.order)  # a subgraph's: the depth its node counts
        if self.work > max_traced_nodes:
            raise self._too_much_work(f"graph '{graph.name}': one trace", self.work)
        # What a trace runs: ``order`` with each Gradient fused with the forward it shares.
        self.schedule = self._batched(self._fused(self.order))
        for step in self._steps.values():
            if isinstance(step, _GradientStep):
                step.order = self._batched(step.order)
        # Only the initializers the outputs need are read: an unused one may be huge.
        read = {*self.output_names, *(name for i in needed for name in self._deps(i))}
        # What a subgraph reads from the graphs around it: all of their values a call takes
        # (a copy of every value of the enclosing graph, per If run, grew with both).
        self.outer_reads = tuple(
            name for name in read if name not in self._available and name not in self._producer
        )
        values = dict(outer)
        for name, init in initializers.items():
            if name in read:
                values[name] = read_tensor(init, f"graph '{graph.name}' initializer")
        # Small integer tensors are shape data: kept on the host, known while tracing; so
        # are small tensors an op reads as a shape, of any dtype (Resize's float scales).
        shape_reads = {
            step.inputs[p]
            for step in self._steps.values()
            if isinstance(step, _StandardStep)
            for p in step.op.static
            if p < len(step.inputs)
        }
        self.static = {
            name: v
            for name, v in values.items()
            if (np.issubdtype(v.dtype, np.integer) or v.dtype == bool or name in shape_reads)
            and v.size <= STATIC_INITIALIZER_LIMIT
        }
        # The rest is data, passed to the compiled graph (checked on the first run).
        self.params = {name: v for name, v in values.items() if name not in self.static}
        self._constant_steps, self._run_schedule = self._split_constants()
        self._transposed = self._transposed_weights()
        # What ``_constants`` computed: on the host (once), on each device.
        self._host_constants: dict[str, Any] = {}
        self._device_constants: dict[Any, dict[str, jax.Array]] = {}
        self._constants_jit: Any = None
        # Small feeds and initializers that only optimizer nodes read (as tensors) are
        # packed, in the nodes' order, so each group of a node fills one stretch of a
        # buffer; a value another node reads would be sliced out, which XLA compiles
        # slowly by the thousand.
        optimizer_reads: dict[str, None] = {}
        other_reads: set[str] = set()
        for step in self._steps.values():
            first = 2 if isinstance(step, _OptimizerStep) else len(step.inputs)
            optimizer_reads.update(dict.fromkeys(step.inputs[first:]))
            other_reads.update(step.inputs[:first])
        self._packable = tuple(n for n in optimizer_reads if n not in other_reads)
        self._packed_params: tuple[Layout, list[np.ndarray], dict[str, np.ndarray]] | None = None
        # The packed initializers on each device a call has named (None: the default one).
        self._device_params: dict[Any, tuple[list[jax.Array], dict[str, jax.Array]]] = {}
        self._params_shapes: tuple[Layout, list[Any], dict[str, Any]] | None = None
        # Graph inputs read as shapes or axes are compile-time values: one compilation each.
        read_as_shapes = {
            step.inputs[p]
            for step in self._steps.values()
            if isinstance(step, _StandardStep)
            for p in (*step.op.static, *step.prefer_static)
            if p < len(step.inputs)
        }
        read_as_shapes |= self._small_sources(graph, read_as_shapes)
        self.static_inputs = tuple(n for n in self.input_names if n in read_as_shapes)
        self._compilations: dict[Any, tuple[Any, list[Layout]]] = {}
        if check_shapes and not self.static_inputs:
            self._check_shapes(graph)

    # -- structure

    def _split_constants(self) -> tuple[list[_Step], list[_Step]]:
        """The schedule's steps that read initializers and constants alone, and the rest.

        ``__call__`` computes the first once per device, as onnxruntime folds constants
        when it creates a session: a weight an exporter wrote as a ConstantOfShape (the
        light zoo models), an initializer dequantized or scaled, is then an argument of
        the compiled graph instead of computed (and materialized) on every run.
        """
        known = set(self.static) | set(self.params)
        constant: list[_Step] = []
        rest: list[_Step] = []
        for step in self.schedule:
            if (
                type(step) is _StandardStep
                and not step.subgraphs
                and step.node.op_type not in _NOT_FOLDED
                and all(not name or name in known for name in step.inputs)
            ):
                constant.append(step)
                known.update(name for name in step.outputs if name)
            else:
                rest.append(step)
        return constant, rest

    def _transposed_weights(self) -> dict[str, str]:
        """The initializers that a stacked Gemm reads transposed (transB=1), each with the
        name its transpose goes by among a run's values; ``_constants`` computes them, and
        each :class:`_BatchedGemmStep` that reads one is told its name.

        Not a weight that a Gradient node differentiates with respect to (its transpose
        would be a constant there), nor where the name is taken.
        """
        readers = [
            step
            for step in self.schedule
            if isinstance(step, _BatchedGemmStep)
            and step.members[0].info.attrs.get("transB")
            and step.members[0].inputs[1] in self.params
            and step.members[0].inputs[1] not in self._differentiated
        ]
        if not readers:  # most graphs: no set of names built
            return {}
        taken = {*self.params, *self.static, *self._producer, *self.input_names}
        found: dict[str, str] = {}
        for step in readers:
            b = step.members[0].inputs[1]
            name = f"{b}\x00transposed"
            if name not in taken:
                step.transposed = found[b] = name
        return found

    def _constants(self, device: jax.Device | None) -> dict[str, Any]:
        """The values of ``_constant_steps``'s outputs that the other steps or the graph's
        outputs read, computed once per device (see ``_constants_function``)."""
        if device not in self._device_constants:
            function = self._constants_function()
            traced: dict[str, Any] = {}
            if function is not None:
                p_buffers, p_own = self._device_params[device]
                with paused_gc():
                    traced, checks = function(p_buffers, p_own)
                raise_failed(checks)
            self._device_constants[device] = traced
        return self._device_constants[device]

    def _constants_function(self) -> Any:
        """The jitted function of the initializers computing ``_constant_steps``'s outputs
        that the other steps or the graph's outputs read: those computed in JAX are
        returned; those computed on the host (shape data) go to ``_host_constants``,
        which the compiled graph reads while it is traced.

        None where what it would return holds less than HOISTED_BYTES: the steps are
        then put back in the graph's schedule (a second compilation would cost more
        than computing them on each run).
        """
        if self._constants_jit is not None or not (self._constant_steps or self._transposed):
            return self._constants_jit
        produced = {name for step in self._constant_steps for name in step.outputs if name}
        constant_ids = {id(step) for step in self._constant_steps}
        read = set(self.output_names)
        for index, step in self._steps.items():
            if id(step) not in constant_ids:
                read.update(self._deps(index))
        wanted = sorted(produced & read)
        p_layout = self._params_layout()[0]

        def compute(
            p_buffers: list[Any], p_own: dict[str, Any]
        ) -> tuple[dict[str, Any], RunChecks]:
            env: Env = dict(self.static)
            env.update(unpack(p_layout, p_buffers))
            env.update(p_own)
            with collect_run_checks() as checks:
                self._evaluate(env, differentiable=False, steps=self._constant_steps, outputs=())
            traced = {}
            for name in wanted:
                value = materialize(env[name])
                if is_static(value):
                    self._host_constants[name] = value
                else:
                    traced[name] = value
            for name, transposed in self._transposed.items():
                traced[transposed] = jnp.transpose(materialize(env[name]))
            return traced, RunChecks.of(checks)

        shapes = jax.eval_shape(compute, *self._params_layout()[1:])[0]
        if sum(s.size * s.dtype.itemsize for s in shapes.values()) < HOISTED_BYTES:
            self._constant_steps, self._run_schedule = [], self.schedule
            self._host_constants.clear()
            return None
        self._constants_jit = jit_graph(compute, flat=False)
        return self._constants_jit

    def _small_sources(self, graph: Any, read_as_shapes: set[str]) -> set[str]:
        """Graph inputs of at most SMALL_SOURCE elements (declared) that an input read
        while tracing (``read_as_shapes``) is computed from: a Loop's trip count or
        condition (test_range's expanded form: M from start, limit and delta), a shape or
        an axis (a window's size through Cast and Sub, AffineGrid's size through Slice).
        Read as compile-time values, as a shape fed directly is: one compilation per
        value, the loop a scan, the shape arithmetic folded."""
        declared: dict[str, int] = {}
        for info in graph.input:
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
            index = self._producer.get(name)
            if index is None or self._nodes[index].op_type in SHAPE_ONLY:
                continue  # a graph input, or a value set by its inputs' shapes alone
            for dep in self._deps(index):
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        return found & set(self.input_names)

    def defines(self, name: str) -> bool:
        return name in self._available or name in self._producer or name in self._scope

    def subgraph_functions(self, node: Any, where: str) -> dict[str, GraphFunction]:
        """The node's graph attributes, each as a GraphFunction reading this graph's names."""
        graphs = _subgraphs(node)
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
                )
            except PROMISED as error:
                raise _wrap(f"{where}: subgraph '{name}'", error, always=True) from None
        work = 1 + sum(f.work for f in functions.values())
        if work > self.max_traced_nodes:
            raise self._too_much_work(f"{where}: with its subgraphs, its trace", work)
        return functions

    def _too_much_work(self, what: str, work: int, *, at_least: bool = False) -> ValueError:
        return ValueError(
            f"{what} runs {'at least ' if at_least else ''}{work} nodes (a node inside a "
            f"Gradient counts {GRADIENT_WORK} times per level of Gradient around it: its "
            "forward, tangent and transpose are traced), more than the limit of "
            f"{self.max_traced_nodes}; raise it with limits=Limits(traced_nodes=...) if the "
            "model is yours"
        )

    def _enter_gradient(self, node: Any) -> None:
        """One more Gradient nested in the one being read; refused past the work limit.

        A Gradient whose y needs another Gradient traces that one GRADIENT_WORK times,
        so k nested Gradients run at least GRADIENT_WORK**k nodes: refused before the
        walk goes deeper (which would also exhaust Python's recursion).
        """
        self._nesting += 1
        if GRADIENT_WORK**self._nesting > self.max_traced_nodes:
            raise self._too_much_work(
                f"{describe(node)}: with {self._nesting} Gradients nested in its y, its trace",
                GRADIENT_WORK**self._nesting,
                at_least=True,
            )

    def _step(self, index: int) -> _Step:
        if index not in self._steps:
            step = _make_step(self, self._nodes[index])
            self._steps[index] = step
            if isinstance(step, _GradientStep):
                stop = set(step.xs) | set(step.zs)
                self._enter_gradient(step.node)
                try:
                    step.order = [self._step(i) for i in self._topological([step.y], stop, index)]
                finally:
                    self._nesting -= 1
                _refuse_sequences(step)
                chain = _chain_depth(step.order)
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
                    raise self._too_much_work(f"{step.where}: its trace", step.work)
        return self._steps[index]

    def _made_by(self, name: str, op_type: str) -> Any:
        """The ai.onnx node of ``op_type`` of this graph that computes ``name``, else None."""
        index = self._producer.get(name) if name else None
        node = None if index is None else self._nodes[index]
        if node is None or node.op_type != op_type or domain_of(node) != "":
            return None
        return node

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
        """Per name, the perm of the ai.onnx Transpose node of this graph computing it (()
        for the default perm), else None (see ``Node.input_perms``)."""
        perms: list[tuple[int, ...] | None] = []
        for name in names:
            node = self._made_by(name, "Transpose")
            if node is None:
                perms.append(None)
                continue
            perm = next((a for a in node.attribute if a.name == "perm"), None)
            perms.append(() if perm is None else tuple(int(i) for i in perm.ints))
        return tuple(perms)

    def one_hot_of(self, node: Any) -> tuple[tuple[str, str], dict[str, str], np.dtype] | None:
        """For a MatMul whose A is Cast (to a float type) of Equal, which a Gradient does
        not differentiate with respect to: the Equal's inputs, those an Expand computed
        with the Expand's input, and the Cast's type (see :class:`_OneHotProductStep`)."""
        if node.op_type != "MatMul" or domain_of(node) != "" or len(node.input) != 2:
            return None
        cast = self._made_by(node.input[0], "Cast")
        to = None if cast is None else next((a.i for a in cast.attribute if a.name == "to"), None)
        if to not in _ONE_HOT_TYPES:
            return None
        assert cast is not None
        equal = self._made_by(cast.input[0], "Equal")
        if equal is None or len(equal.input) != 2 or equal.attribute:
            return None
        if node.input[0] in self._differentiated:
            return None
        expanded = {}
        for name in equal.input:
            expand = self._made_by(name, "Expand")
            if expand is not None:
                expanded[name] = expand.input[0]
        return (equal.input[0], equal.input[1]), expanded, tensor_dtype(to, describe(cast))

    @functools.cached_property
    def _differentiated(self) -> frozenset[str]:
        """The names a Gradient node of this graph differentiates with respect to (its
        nodes do not change: read once)."""
        names: set[str] = set()
        for node in self._nodes:
            if node.op_type == GRADIENT:
                try:
                    names |= _gradient_names(node)[1]
                except ValueError:  # its own step says what is wrong
                    continue
        return frozenset(names)

    def _batched(self, steps: list[_Step]) -> list[_Step]:
        """``steps`` (in an order that runs) with each set of Gemm nodes that can be one
        product replaced by a :class:`_BatchedGemmStep`, re-sorted.

        A set: the Gemms (transA 0) of the same B, C and attributes whose A is computed
        from none of their outputs, through any step of ``steps``.
        """
        groups: dict[Any, list[_StandardStep]] = {}
        for step in steps:
            if (
                type(step) is _StandardStep
                and step.node.op_type == "Gemm"
                and domain_of(step.node) == ""
                and not step.info.attrs.get("transA")
                and len(step.outputs) == 1
            ):
                groups.setdefault((step.inputs[1:], step.kind), []).append(step)
        if not any(len(members) > 1 for members in groups.values()):
            return steps
        reads = self._step_reads(steps)
        position = {id(step): i for i, step in enumerate(steps)}
        budget = REORDER_PASSES * len(steps)
        batches: dict[int, _BatchedGemmStep] = {}  # by the id of its first member
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
            free = [
                step for step in members if not any(name in downstream for name in reads[id(step)])
            ]
            if len(free) < 2:
                continue
            gone.update(id(step) for step in free)
            batch = batches[id(free[0])] = _BatchedGemmStep(free)
            reads[id(batch)] = tuple(name for step in free for name in reads[id(step)])
        if not batches:
            return steps
        # Each batch where its first member was.
        batched = [
            batches.get(id(step), step)
            for step in steps
            if id(step) in batches or id(step) not in gone
        ]
        order = _sorted_steps(batched, reads)
        return steps if order is None else order

    def _step_reads(self, steps: Sequence[_Step]) -> dict[int, tuple[str, ...]]:
        """What each of ``steps`` reads, by ``id``: its node's names (``_deps``); a fused
        Gradient's, its Gradient's; a batched Gemm's, its members'."""
        index = {id(step): i for i, step in self._steps.items()}

        def reads(step: _Step) -> tuple[str, ...]:
            if isinstance(step, _BatchedGemmStep):
                return tuple(name for member in step.members for name in reads(member))
            inner = step.gradient if isinstance(step, _FusedGradientStep) else step
            return self._deps(index[id(inner)])

        return {id(step): reads(step) for step in steps}

    def _fused(self, order: list[_Step]) -> list[_Step]:
        """``order`` with each Gradient that can be fused replaced by a
        :class:`_FusedGradientStep`, the steps it absorbs dropped, re-sorted.

        All at once, sorted once; where that finds a cycle, one Gradient at a time (each
        sorted on its own) as far as REORDER_PASSES allows. Merging steps adds no way
        round a cycle, so all at once fuses what one at a time would.
        """
        present = {id(step) for step in order}
        fusions: dict[int, _FusedGradientStep] = {}
        gone: set[int] = set()
        for step in order:
            if isinstance(step, _GradientStep):
                absorbed = self._absorbable(step, present)
                absorbed = [inner for inner in absorbed if id(inner) not in gone]
                if absorbed:
                    fusions[id(step)] = _FusedGradientStep(step, absorbed)
                    gone.update(id(inner) for inner in absorbed)
        if not fusions:
            return order
        steps = [fusions.get(id(step), step) for step in order if id(step) not in gone]
        together = _sorted_steps(steps, self._step_reads(steps))
        if together is not None:
            return together
        schedule = order
        budget = REORDER_PASSES * len(order)
        for fusion in fusions.values():
            if budget >= len(schedule):
                budget -= len(schedule)  # what one _fuse looks over and sorts
                schedule = self._fuse(fusion.gradient, schedule) or schedule
        return schedule

    def _absorbable(self, gradient: _GradientStep, present: set[int]) -> list[_Step]:
        """The steps of ``gradient``'s order (by id among ``present``) that fusing it
        would absorb; none where it cannot be fused.

        Fused only when the Gradient's inputs are its xs then zs by name (so f's forward
        reads the values the graph's does) and its order holds standard nodes alone (a
        nested Gradient keeps its own schedule).
        """
        if gradient.inputs != (*gradient.xs, *gradient.zs):
            return []
        if not all(isinstance(step, _StandardStep) for step in gradient.order):
            return []
        return [step for step in gradient.order if id(step) in present]

    def _fuse(self, gradient: _GradientStep, schedule: list[_Step]) -> list[_Step] | None:
        """``schedule`` with ``gradient`` fused with the steps of its order that it holds;
        None where that cannot be done as it is.

        The fused step reads what the Gradient reads (its inputs, and what y's nodes read
        from outside them) and produces what the absorbed steps produce; re-sorting finds
        a cycle where an x or a z, or what y reads, is computed from an absorbed step's
        output: then nothing is fused.
        """
        absorbed = self._absorbable(gradient, {id(step) for step in schedule})
        if not absorbed:
            return None
        fused = _FusedGradientStep(gradient, absorbed)
        gone = {id(step) for step in absorbed}
        steps = [fused if step is gradient else step for step in schedule if id(step) not in gone]
        return _sorted_steps(steps, self._step_reads(steps))

    def _deps(self, index: int) -> tuple[str, ...]:
        """The names a node reads: its inputs, and for Gradient what computing y reads."""
        if index in self._deps_memo:
            return self._deps_memo[index]
        node = self._nodes[index]
        deps = [name for name in node.input if name]
        deps += _free_names(node, self.depth)
        if domain_of(node) == DOMAIN and node.op_type == GRADIENT:
            self._deps_memo[index] = tuple(deps)  # guards against y depending on itself
            y, stop = _gradient_names(node)
            self._enter_gradient(node)
            try:
                reached = self._reach([y] if y else [], stop, index)
            finally:
                self._nesting -= 1
            produced = {n for i in reached for n in self._nodes[i].output}
            for i in reached:
                deps += [n for n in self._deps(i) if n not in produced and n not in stop]
        self._deps_memo[index] = tuple(dict.fromkeys(deps))
        return self._deps_memo[index]

    def _reach(self, names: Sequence[str], stop: set[str], owner: int | None = None) -> set[int]:
        """Indices of the nodes that ``names`` depend on, not looking past ``stop``."""
        reached: set[int] = set()
        todo = [n for n in names if n not in stop]
        while todo:
            name = todo.pop()
            index = self._producer.get(name)
            if index is None or index in reached:
                continue
            if index == owner:
                raise ValueError(f"{describe(self._nodes[index])}: y depends on the node itself")
            reached.add(index)
            todo += [n for n in self._deps(index) if n not in stop]
        return reached

    def _needed(self, outputs: Sequence[str]) -> set[int]:
        """Every node the outputs need, including those computing each Gradient's y."""
        for name in outputs:
            if not self.defines(name):
                raise ValueError(f"graph output '{name}' is produced by no node")
        needed = self._reach(outputs, set())
        todo = list(needed)
        while todo:
            index = todo.pop()
            node = self._nodes[index]
            if domain_of(node) == DOMAIN and node.op_type == GRADIENT:
                y, stop = _gradient_names(node)
                for found in self._reach([y] if y else [], stop, index) - needed:
                    needed.add(found)
                    todo.append(found)
        return needed

    def _topological(
        self, names: Sequence[str], stop: set[str], owner: int | None = None
    ) -> list[int]:
        """The nodes computing ``names`` (not past ``stop``) in an order that runs."""

        def producer(name: str, reader: int | None) -> int | None:
            """The node computing ``name``, None past the graph's edge; checks the edge."""
            if name in stop or name in self._available or name in self._scope:
                return None
            index = self._producer.get(name)
            if index is None:
                where = (
                    describe(self._nodes[reader])
                    if reader is not None
                    else "graph output"
                    if owner is None
                    else describe(self._nodes[owner])
                )
                raise ValueError(
                    f"{where}: input '{name}' is not a graph input, an initializer or the output "
                    "of a node"
                )
            if index == owner:
                raise cycle(index)
            return index

        def cycle(index: int) -> ValueError:
            return ValueError(f"{describe(self._nodes[index])}: the graph has a cycle through it")

        order: list[int] = _postorder(names, producer, self._deps, cycle)
        return order

    def _check_shapes(self, graph: Any) -> None:
        """Traces the graph on the declared input shapes, when all are known, to fail early."""
        declared = {
            i.name: i.type.tensor_type for i in graph.input if i.type.HasField("tensor_type")
        }
        specs = {}
        for name in self.input_names:
            kind = declared.get(name)
            if kind is None or not kind.elem_type or not kind.HasField("shape"):
                return
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in kind.shape.dim]
            if any(d < 0 for d in dims):
                return
            try:
                dtype = tensor_dtype(kind.elem_type, f"graph input '{name}'")
            except ValueError:
                return
            # Stand-ins packed as the caller's arrays will be: zeros where small (a
            # buffer's part), shapes alone where large.
            size = int(np.prod(dims))
            specs[name] = (
                np.zeros(dims, dtype)
                if size < PACK_BELOW
                else jax.ShapeDtypeStruct(dims, jax.dtypes.canonicalize_dtype(dtype))
            )
        layout, buffers, own = pack(specs, self._packable)
        p_buffers, p_own = self._params_layout()[1:]
        function = self._constants_function()
        constants = {} if function is None else jax.eval_shape(function, p_buffers, p_own)[0]
        arguments = jax.tree.map(_abstract, (buffers, own, p_buffers, {**p_own, **constants}))
        try:
            # The jitted function a first call of these shapes runs: JAX keeps this trace
            # for it, so the graph is traced once for both.
            self._compiled({}, layout)[0].trace(*arguments)
        except (TypeError, ValueError) as error:
            # Optimizer nodes check their arguments when they run (declared shapes of
            # optimizer inputs are not binding); everything else fails here.
            if not getattr(error, "optimizer_node", False):
                raise

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
            values = self._evaluate(env, differentiable=differentiable)
            outputs = tuple(materialize(value) for value in values)
        return outputs, RunChecks.of(checks)

    def _evaluate(
        self,
        env: Env,
        *,
        differentiable: bool = True,
        steps: Sequence[_Step] | None = None,
        outputs: Sequence[str] | None = None,
    ) -> tuple[Any, ...]:
        """Runs the nodes on ``env``; the outputs, Parts of packed buffers left as they are.

        ``differentiable``: the caller may differentiate the result, so custom
        derivative rules are kept (see :class:`_Replay`). ``steps``: those of the
        schedule to run (default: all); ``outputs``: the names returned (default: the
        graph's outputs).
        """
        replay = _REPLAY.set(_Replay(inline=not differentiable))
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
            _REPLAY.reset(replay)
        names = self.output_names if outputs is None else outputs
        values = tuple(env[name] for name in names)
        for name, value in zip(names, values, strict=True):
            if any(map(is_static, tensors(value))):  # computed while tracing: JAX arrays here
                index = self._producer.get(name)
                of = "" if index is None else f" of {describe(self._nodes[index])}"
                refuse_narrowing_in(f"graph output '{name}'{of}", value)
        return values

    def __call__(self, inputs: Any, device: jax.Device | None = None) -> list[np.ndarray]:
        if isinstance(inputs, Mapping):
            odd = [name for name in inputs if not isinstance(name, str)]
            if odd:
                raise TypeError(
                    f"input names must be str, got {listed(odd)}; the graph takes "
                    f"{listed(self.input_names)}"
                )
            missing = [name for name in self.input_names if name not in inputs]
            if missing:
                raise ValueError(
                    f"missing input(s) {listed(missing)}; the graph takes "
                    f"{listed(self.input_names)}"
                )
            if len(inputs) != len(self.input_names):
                self._refuse_unknown(inputs)
            values = [inputs[name] for name in self.input_names]
        else:
            values = list(inputs) if isinstance(inputs, list | tuple) else [inputs]
            if len(values) != len(self.input_names):
                raise ValueError(
                    f"got {len(values)} input(s); the graph takes {len(self.input_names)}: "
                    f"{listed(self.input_names)}"
                )
        named = dict(zip(self.input_names, values, strict=True))
        # Read as shapes, in numpy: int64 stays exact (INT64_MAX as "to the end").
        fixed = {n: np.asarray(named.pop(n)) for n in self.static_inputs}
        feeds = {n: self._feed(n, v) for n, v in named.items()}
        layout, buffers, own = pack(feeds, self._packable)
        if device not in self._device_params:  # on the device once, for every run
            _, host_buffers, host_own = self._host_params()
            params = (
                [jnp.asarray(b) for b in host_buffers],
                {n: jnp.asarray(v) for n, v in host_own.items()},
            )
            if device is not None:
                params = jax.device_put(params, device)
            self._device_params[device] = params
        p_buffers, p_own = self._device_params[device]
        # The feeds only (a put of every initializer took most of a run), and not to the
        # device a jitted call puts them on anyway (the put cost a third of a small run).
        if device is not None and not _is_default(device):
            buffers, own = jax.device_put((buffers, own), device)
        try:
            constants = self._constants(device)
            arguments = (buffers, own, p_buffers, {**p_own, **constants})
            compiled, out_layout = self._compiled(fixed, layout)
            with paused_gc():  # the first call of a signature traces and lowers
                out_buffers, out_own, checks = compiled(*arguments)
        except jax.errors.JaxRuntimeError as error:
            if "RESOURCE_EXHAUSTED" not in str(error):
                raise
            raise ValueError(
                f"the graph of outputs {listed(list(self.output_names))} does not fit in the "
                f"device's memory ({str(error).splitlines()[0]}); feed smaller inputs, or lower "
                "limits=Limits(tensor_bytes=...) to have the node that grows so large named"
            ) from None
        raise_failed(checks)
        results = cut([np.asarray(b) for b in out_buffers], out_layout[0])
        results.update((name, host_value(value)) for name, value in out_own.items())
        return [
            _declared(name, results[name], dtype, kind)
            for name, dtype, kind in zip(
                self.output_names, self.output_dtypes, self.output_kinds, strict=True
            )
        ]

    def _refuse_unknown(self, inputs: Mapping[str, Any]) -> None:
        """Refuses feeds the graph does not take, instead of silently dropping them."""
        unknown = [name for name in inputs if name not in self._inputs]
        overriding = [name for name in unknown if name in self._initializer_inputs]
        others = [name for name in unknown if name not in self._initializer_inputs]
        reasons = []
        if overriding:
            reasons.append(
                f"input(s) {listed(overriding)} name initializers that are also graph inputs: "
                "onnx_optax runs the graph with the initializers' values and does not let a "
                "feed override them (onnxruntime does); write the value into the model's "
                "initializer instead"
            )
        if others:
            reasons.append(f"unknown input(s) {listed(others)}")
        raise ValueError(f"{'; '.join(reasons)}; the graph takes {listed(self.input_names)}")

    def _feed(self, name: str, value: Any) -> Any:
        """A fed value as the compiled graph takes it (a sequence: a TensorSeq of them),
        a tensor checked against its declared type (:func:`refuse_unlike_declared`)."""
        kind = self.value_types.get(name)
        if kind is not None:
            return feed_value(f"input '{name}'", value, kind, _feed_tensor)
        what = f"input '{name}'"
        declared = self.input_types.get(name)
        if declared is None:
            return _feed_tensor(what, value)
        # The declared type first (a float64 fed for float32 is that, not a want of x64),
        # unless no tensor XLA computes is fed (strings, objects): _feed_tensor says so.
        tensor = value if isinstance(value, jax.Array) else as_array(what, value)
        if np.dtype(tensor.dtype).kind not in "OSU":  # ml_dtypes' (bfloat16, ...) are "V"
            refuse_unlike_declared(what, tensor, declared)
        return _feed_tensor(what, tensor)

    def _host_params(self) -> tuple[Layout, list[np.ndarray], dict[str, np.ndarray]]:
        """The float initializers, checked and packed on the host once (see ``pack``)."""
        if self._packed_params is None:
            checked = {n: host_array(f"initializer '{n}'", v) for n, v in self.params.items()}
            self._packed_params = pack(checked, self._packable)
        return self._packed_params

    def _params_layout(self) -> tuple[Layout, list[jax.ShapeDtypeStruct], dict[str, Any]]:
        """How the initializers are packed, and the shapes of the packed arguments.

        Their values are not checked here (the first call does that, :meth:`_host_params`),
        so that a graph whose initializers JAX cannot hold still prepares.
        """
        if self._params_shapes is None:
            layout, buffers, own = pack(self.params, self._packable)
            self._params_shapes = (
                layout,
                jax.tree.map(_abstract, buffers),
                jax.tree.map(_abstract, own),
            )
        return self._params_shapes

    @property
    def compilations(self) -> int:
        """How many times the graph has been compiled (once per input signature)."""
        return sum(jitted.cache_size() for jitted, _ in self._compilations.values())

    def _compiled(self, fixed: dict[str, np.ndarray], layout: Layout) -> tuple[Any, list[Layout]]:
        """The jitted graph for a packing of the feeds and values of the inputs read as shapes.

        The second item holds the layout of the packed outputs once it has been traced.
        """
        key = (
            layout,
            tuple((n, v.dtype.str, v.shape, v.tobytes()) for n, v in sorted(fixed.items())),
        )
        if key not in self._compilations:
            p_layout = self._params_layout()[0]
            out_layout: list[Layout] = []

            def run(
                buffers: list[Any], own: dict[str, Any], p_buffers: list[Any], p_own: dict[str, Any]
            ) -> tuple[list[Any], dict[str, Any], RunChecks]:
                env: Env = dict(self.static)
                env.update(self._host_constants)
                env.update(unpack(p_layout, p_buffers))
                env.update(p_own)  # with the constants computed in JAX
                env.update(unpack(layout, buffers))
                env.update(own)
                env.update(fixed)
                with collect_run_checks() as checks:
                    values = self._evaluate(env, differentiable=False, steps=self._run_schedule)
                packed, out_buffers, out_own = outputs_of(values, self.output_names)
                out_layout[:] = [packed]
                return out_buffers, out_own, RunChecks.of(checks)

            self._compilations[key] = (SizedJit(run), out_layout)
        return self._compilations[key]


# Call-like primitives whose body a compiled graph runs inline (see flattened).
_INLINED = {"jit": "jaxpr", "pjit": "jaxpr", "custom_jvp_call": "call_jaxpr"}


def _inline(closed: Any, *args: Any, calls: bool = True) -> list[Any]:
    """Binds a jaxpr's equations on the current trace; ``calls``: their bodies inlined.

    Without ``calls`` it is ``jax.core.eval_jaxpr``: every equation bound as it is.
    """
    from jax.extend.core import Literal

    env: dict[Any, Any] = dict(zip(closed.jaxpr.constvars, closed.consts, strict=True))
    env.update(zip(closed.jaxpr.invars, args, strict=True))

    def read(var: Any) -> Any:
        return var.val if isinstance(var, Literal) else env[var]

    for eqn in closed.jaxpr.eqns:
        values = [read(v) for v in eqn.invars]
        body = _INLINED.get(eqn.primitive.name) if calls else None
        if body is not None:
            outs = _inline(eqn.params[body], *values)
        else:  # as jax.core.eval_jaxpr binds it (older JAX returns subfuns apart)
            bound = eqn.primitive.get_bind_params(eqn.params)
            subfuns, params = bound if isinstance(bound, tuple) else ((), bound)
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*subfuns, *values, **params)
            if not eqn.primitive.multiple_results:
                outs = [outs]
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in closed.jaxpr.outvars]


def _is_default(device: jax.Device) -> bool:
    """Whether a jitted call puts host arrays on ``device`` (no default device is set)."""
    return getattr(jax.config, "jax_default_device", None) is None and device == jax.devices()[0]


# XLA options of the graphs compiled here, on the CPU: LLVM's optimization level 1
# instead of the default. Measured on the real exports (tests/real_models.py): the
# first training step's XLA compile took 25% less (PaddleOCR's classifier 12.0 to 9.1 s,
# the CRNN 5.5 to 4.7 s) and the steps and forwards ran as fast (within the noise of
# a few percent); at level 0 the steps ran 2-3x slower. Other JAX code of the process
# keeps its own options.
CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}


def jit_graph(fn: Any, *, flat: bool = True, **kwargs: Any) -> Any:
    """``jax.jit`` of a graph's function (``flattened`` unless ``flat=False``), with
    CPU_COMPILER_OPTIONS where JAX's default backend is the CPU."""
    options = CPU_COMPILER_OPTIONS if jax.default_backend() == "cpu" else None
    return jax.jit(flattened(fn) if flat else fn, compiler_options=options, **kwargs)


# XLA:CPU hands a loop of more than 512 KB read and written to a second thread (its
# "cpu-parallel-task-assigner" pass); in a graph whose values are all small, waking that
# thread costs more than it saves. A graph's run whose largest value (``largest_value``)
# holds at most SMALL_GRAPH_BYTES is therefore compiled without that pass. Measured in
# one process against the pass kept: PaddleOCR's classifier at batch 1 (largest value
# 0.24 MB) took 0.82-0.84x the time, MTCNN onet (0.48 MB) 0.90x, rnet at batch 8 (0.62 MB)
# 0.95x, rnet at batch 1 the same. Larger graphs ran slower without it: magika at batch 1
# (2.5 MB) 1.29x, the CRNN (1.35 MB) 1.05x, the classifier at batch 8 (1.9 MB) 1.05x,
# onet at batch 8 (3.9 MB) 1.12x.
SMALL_GRAPH_BYTES = 1 << 20
SMALL_GRAPH_OPTIONS = {"xla_disable_hlo_passes": "cpu-parallel-task-assigner"}


class SizedJit:
    """A graph's run (``GraphFunction._compiled``'s ``run(buffers, own, p_buffers,
    p_own)``) jitted as ``jit_graph`` does, and on the CPU compiled with
    SMALL_GRAPH_OPTIONS added for each shape of its arguments where none of the values it
    computes exceeds SMALL_GRAPH_BYTES. The choice reads the trace that the compilation
    uses anyway (the two jitted functions share JAX's trace of ``fn``)."""

    def __init__(self, fn: Any) -> None:
        flat = flattened(fn)
        self._default = jit_graph(flat, flat=False)
        self._small = self._default
        if jax.default_backend() == "cpu":
            options = {**CPU_COMPILER_OPTIONS, **SMALL_GRAPH_OPTIONS}
            self._small = jax.jit(flat, compiler_options=options)
        self._chosen: dict[Any, Any] = {}

    def __call__(self, *args: Any) -> Any:
        return self._for(args)(*args)

    def _for(self, args: tuple[Any, ...]) -> Any:
        """The jitted function for these arguments (the packed ones' shapes are fixed: the
        layout that keys this function holds them; the others', ``args[1]``, are not: the
        choice is made once for each of their structures, shapes and dtypes)."""
        if self._small is self._default:
            return self._default
        leaves, tree = jax.tree.flatten(args[1])
        key = (tree, tuple((np.shape(leaf), getattr(leaf, "dtype", None)) for leaf in leaves))
        jitted = self._chosen.get(key)
        if jitted is None:
            jaxpr = self._default.trace(*args).jaxpr
            jitted = self._small if largest_value(jaxpr) <= SMALL_GRAPH_BYTES else self._default
            self._chosen[key] = jitted
        return jitted

    def trace(self, *args: Any) -> Any:
        return self._default.trace(*args)

    def lower(self, *args: Any) -> Any:
        return self._for(args).lower(*args)

    def cache_size(self) -> int:
        """How many compilations its jitted functions hold."""
        jitted = {id(j): j for j in (self._default, self._small)}
        return sum(j._cache_size() for j in jitted.values())


def largest_value(jaxpr: Any) -> int:
    """The bytes of the largest value a (closed) jaxpr computes, its bodies' included (not
    its inputs: a model's weights are read by its products, not by the loops that XLA
    partitions)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)

    def size(var: Any) -> int:
        shape = getattr(var.aval, "shape", None)
        itemsize = getattr(getattr(var.aval, "dtype", None), "itemsize", None)
        return math.prod(shape) * itemsize if shape is not None and itemsize else 0

    largest = 0
    for eqn in jaxpr.eqns:
        largest = max([largest, *map(size, eqn.outvars)])
        for param in eqn.params.values():
            for body in param if isinstance(param, list | tuple) else [param]:
                if hasattr(body, "eqns") or hasattr(getattr(body, "jaxpr", None), "eqns"):
                    largest = max(largest, largest_value(body))
    return largest


def flattened(fn: Any) -> Any:
    """``fn`` traced, then re-emitted with every call inlined, for a compiled graph.

    The op functions call jax.numpy and jax.nn, whose jitted helpers (Relu's
    custom_jvp around a jit, norms, ...) lower to one MLIR function call per
    node; XLA then inlines them one by one, which cost more than the rest of
    its compile for a 20,000-node chain. Nothing differentiates the compiled
    graph itself (Gradient nodes are already transposed inside the trace), so
    the custom derivative rules are not needed there.
    """

    def flat(*args: Any) -> Any:
        with paused_gc():
            closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
            outs = _inline(closed, *jax.tree.leaves(args))
        return jax.tree.unflatten(jax.tree.structure(shape), outs)

    return flat


def _abstract(value: Any) -> Any:
    """A value's shape and the dtype JAX gives it, as a jitted function's trace sees it."""
    if isinstance(value, jax.ShapeDtypeStruct):
        return value
    return jax.ShapeDtypeStruct(np.shape(value), jax.dtypes.canonicalize_dtype(value.dtype))


def node_graph(node: Any) -> Any:
    """A graph of one node, its inputs as graph inputs (for ``run_node``)."""
    from onnx import helper

    inputs = [helper.make_empty_tensor_value_info(n) for n in dict.fromkeys(node.input) if n]
    outputs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
    return helper.make_graph([node], "node", inputs, outputs)
