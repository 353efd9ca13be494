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
with ones: the outputs are the gradients of ``sum(y)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src.graph_packing import (
    Layout,
    Part,
    contiguous,
    cut,
    materialize,
    outputs_of,
    pack,
    unpack,
)
from onnx_optax._src.onnx_nodes import (
    DOMAIN,
    OPERATORS,
    OptimizerNode,
    UnsupportedOperatorError,
    describe,
    read_node,
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
    MAX_TENSOR_BYTES,
    ML_DOMAIN,
    REGISTRY,
    STANDARD_DOMAINS,
    Node,
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

GRADIENT = "Gradient"
# Integer initializers up to this size are kept as trace-time constants (shapes, axes).
STATIC_INITIALIZER_LIMIT = 1 << 12

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


def host_array(what: str, value: Any) -> np.ndarray:
    """A host value (a feed, an initializer) as a numpy array that JAX holds exactly."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{what} is not a tensor ({type(value).__name__}): {error}") from None
    refuse_narrowing(what, array)
    return array


def to_jax(what: str, value: Any) -> jax.Array:
    """A host value as a JAX array, refusing what JAX cannot hold or would silently narrow."""
    if isinstance(value, jax.Array):
        return value
    return jnp.asarray(host_array(what, value))


def _wrap(where: str, error: Exception) -> Exception:
    message = str(error)
    if not message.startswith("node "):
        message = f"{where}: {message}"
    return type(error)(message) if isinstance(error, TypeError | ValueError) else error


class _Step:
    """One checked node and how to run it on an environment of values."""

    def __init__(self, graph: GraphFunction, node: Any) -> None:
        self.node = node
        self.where = describe(node)
        self.inputs = tuple(node.input)
        self.outputs = tuple(node.output)

    def run(self, env: Env) -> None:
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
        )
        if op.check is not None:
            try:
                op.check(self.info)
            except (TypeError, ValueError) as error:
                raise _wrap(self.where, error) from None

    def run(self, env: Env) -> None:
        args = [materialize(env[name]) if name else None for name in self.inputs]
        for position in self.op.static:
            if (
                position < len(args)
                and args[position] is not None
                and not is_static(args[position])
            ):
                raise ValueError(
                    f"{self.where}: input '{self.inputs[position]}' must be known when the graph "
                    "is compiled (a constant, an initializer or computed from shapes); it depends "
                    "on the values fed"
                )
        traced = not all(a is None or is_static(a) for a in args)
        if traced:
            self._refuse_narrowing(args)
        try:
            results = self.op.fn(self.info, *args)
        except (TypeError, ValueError) as error:
            raise _wrap(self.where, error) from None
        if not isinstance(results, tuple):
            results = (results,)
        for name, value in zip(self.outputs, results, strict=False):
            if value is not None:  # before XLA sees the shape or a later op reads it
                check_size(self.info, np.shape(value), value.dtype, f"output '{name}'")
        if not traced and not all(r is None or is_static(r) for r in results):
            self._refuse_narrowing(args)  # the op computed host values in JAX
        for name, value in zip(self.outputs, results, strict=False):
            if name:
                env[name] = value

    def _refuse_narrowing(self, args: Sequence[Any]) -> None:
        """Checks the host values an op reads as data, which become JAX arrays."""
        for position, value in enumerate(args):
            if position not in self.op.static and value is not None and is_static(value):
                refuse_narrowing(f"{self.where}: input '{self.inputs[position]}'", value)


class _OptimizerStep(_Step):
    def __init__(self, graph: GraphFunction, node: Any) -> None:
        super().__init__(graph, node)
        self.optimizer: OptimizerNode = read_node(node)

    def run(self, env: Env) -> None:
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
                f"{self.where}: has {len(self.inputs)} inputs, but xs {list(self.xs)} and zs "
                f"{list(self.zs)} name {len(self.xs) + len(self.zs)}; the inputs are the values "
                "of xs then zs"
            )
        if len(self.outputs) > len(self.xs):
            raise ValueError(
                f"{self.where}: has {len(self.outputs)} outputs but only {len(self.xs)} xs"
            )
        if set(self.xs) & set(self.zs) or len(set(self.xs)) != len(self.xs):
            raise ValueError(f"{self.where}: xs {list(self.xs)} and zs {list(self.zs)} overlap")
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

    def run(self, env: Env) -> None:
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

        def f(*xs: jax.Array) -> tuple[jax.Array, dict[str, Any]]:
            local = dict(base)
            local.update(zip(self.xs, xs, strict=True))
            local.update(zip(self.zs, zs_values, strict=True))
            with collect_run_checks() as checks:  # returned as aux: no tracer leaks out
                for step in self.order:
                    step.run(local)
            y = to_jax(f"{self.where}: y '{self.y}'", materialize(local[self.y]))
            if not jnp.issubdtype(y.dtype, jnp.inexact):
                raise TypeError(f"{self.where}: y '{self.y}' has dtype {y.dtype}; it must be float")
            return y, checks

        y, pullback, checks = jax.vjp(f, *xs_values, has_aux=True)
        record_run_checks(checks)
        grads = pullback(jnp.ones_like(y))
        for name, grad in zip(self.outputs, grads, strict=False):
            if name:
                env[name] = grad


def _gradient_names(node: Any) -> tuple[str, set[str]]:
    """A Gradient node's y and the names its differentiation stops at (xs and zs)."""
    from onnx import helper

    def text(value: Any) -> str:
        return utf8(value, f"{describe(node)}: a name") if isinstance(value, bytes) else str(value)

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    stop = {text(v) for k in ("xs", "zs") for v in attrs.get(k, [])}
    return text(attrs.get("y", b"")), stop


def _make_step(graph: GraphFunction, node: Any) -> _Step:
    if find_op(node) is not None:
        return _StandardStep(graph, node)
    if node.op_type == GRADIENT:
        return _GradientStep(graph, node)
    return _OptimizerStep(graph, node)


def unsupported_error(nodes: Sequence[Any], opsets: Mapping[str, int]) -> UnsupportedOperatorError:
    """One error listing every unsupported (domain, op, opset) among ``nodes``."""
    found = sorted(
        {
            (node.domain or "ai.onnx", node.op_type, opsets.get(domain_of(node), 0))
            for node in nodes
            if not is_supported(node)
        }
    )
    first = next(node for node in nodes if not is_supported(node))
    listed = ", ".join(f"{d}.{op} (opset {v})" for d, op, v in found)
    advice = "".join(f" {ADVICE[op]}." for d, op, _ in found if d == ML_DOMAIN and op in ADVICE)
    runs = ", ".join(f"{len(table)} ops of {d or 'ai.onnx'}" for d, table in REGISTRY.items())
    return UnsupportedOperatorError(
        f"{describe(first)}: unsupported op {first.op_type} in domain "
        f"'{first.domain or 'ai.onnx'}'; the graph needs {len(found)} unsupported op(s): {listed}."
        f"{advice} onnx_optax runs {runs} (see docs/onnx-ops.md), and Adagrad, Adam, "
        f"Momentum and Gradient of '{DOMAIN}'"
    )


def _refuse_strings(graph: Any, nodes: Sequence[Any]) -> None:
    """Refuses, by node, a string tensor that ``nodes`` read or compute (XLA holds none).

    The types are the declared ones: initializers, graph inputs and outputs, value_info.
    """
    import onnx

    strings = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.STRING}
    for info in (*graph.input, *graph.output, *graph.value_info):
        if info.type.tensor_type.elem_type == onnx.TensorProto.STRING:
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


def _declared(name: str, out: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    """An output in its declared type: never converted, except back to a 64-bit integer.

    32-bit JAX computes int64 as int32 (values beyond int32 are refused on the way
    in), so such an output is widened back losslessly. Any other difference
    between the declared and the computed type is an error naming the output,
    rather than a silent conversion (an X_new declared INT8 would round).
    """
    if dtype is None or out.dtype == dtype:
        return out
    if np.issubdtype(dtype, np.integer) and out.dtype == jax.dtypes.canonicalize_dtype(dtype):
        return out.astype(dtype)
    raise TypeError(
        f"graph output '{name}' is declared {dtype} but the graph computes {out.dtype}; "
        "onnx_optax does not convert outputs (fix the declared type, or enable 64-bit JAX "
        "for double outputs)"
    )


class GraphFunction:
    """An ONNX graph as one jitted function of its graph inputs (initializers excluded).

    ``outer_values`` are values the graph reads from outside (a training
    algorithm reads the main graph's initializers); ``opsets`` maps a domain
    ('' for ai.onnx) to the model's opset version (default: the newest);
    ``max_bytes`` bounds every tensor a standard node computes (``Limits.tensor_bytes``).
    """

    def __init__(
        self,
        graph: Any,
        *,
        outer_values: Mapping[str, Any] | None = None,
        outputs: Sequence[str] | None = None,
        opsets: Mapping[str, int] | None = None,
        max_bytes: int = MAX_TENSOR_BYTES,
    ) -> None:
        self.max_bytes = max_bytes
        self.opsets = {
            ("" if k in STANDARD_DOMAINS else k): int(v) for k, v in (opsets or {}).items()
        }
        outer = {name: np.asarray(v) for name, v in (outer_values or {}).items()}
        initializers = {init.name: init for init in graph.initializer}
        self.input_names = tuple(
            i.name for i in graph.input if i.name not in outer and i.name not in initializers
        )
        self.output_names = tuple(outputs or (o.name for o in graph.output))
        self._available = {*self.input_names, *outer, *initializers}
        self._nodes = list(graph.node)
        self._producer: dict[str, int] = {}
        for index, node in enumerate(self._nodes):
            for name in node.output:
                if not name:
                    continue
                if name in self._producer or name in self._available:
                    raise ValueError(f"{describe(node)}: output '{name}' is already defined")
                self._producer[name] = index
        self._steps: dict[int, _Step] = {}
        self._deps_memo: dict[int, tuple[str, ...]] = {}
        needed = self._needed(self.output_names)
        if any(not is_supported(self._nodes[i]) for i in needed):
            raise unsupported_error(self._nodes, self.opsets)
        _refuse_strings(graph, [self._nodes[i] for i in sorted(needed)])
        declared = {
            o.name: o.type.tensor_type.elem_type
            for o in graph.output
            if o.type.HasField("tensor_type") and o.type.tensor_type.elem_type
        }
        self.output_dtypes = tuple(
            tensor_dtype(declared[n], f"graph output '{n}'") if n in declared else None
            for n in self.output_names
        )
        for index in sorted(needed):
            self._step(index)
        self.order = [self._steps[i] for i in self._topological(self.output_names, set())]
        # Only the initializers the outputs need are read: an unused one may be huge.
        read = {*self.output_names, *(name for i in needed for name in self._deps(i))}
        values = dict(outer)
        for name, init in initializers.items():
            if name in read:
                values[name] = read_tensor(init, f"graph '{graph.name}' initializer")
        # Small integer tensors are shape data: kept on the host, known while tracing.
        self.static = {
            name: v
            for name, v in values.items()
            if (np.issubdtype(v.dtype, np.integer) or v.dtype == bool)
            and v.size <= STATIC_INITIALIZER_LIMIT
        }
        # The rest is data, passed to the compiled graph (checked on the first run).
        self.params = {name: v for name, v in values.items() if name not in self.static}
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
        self._packed_params: tuple[Layout, list[jax.Array], dict[str, Any]] | None = None
        # Graph inputs read as shapes or axes are compile-time values: one compilation each.
        read_as_shapes = {
            step.inputs[p]
            for step in self._steps.values()
            if isinstance(step, _StandardStep)
            for p in step.op.static
            if p < len(step.inputs)
        }
        self.static_inputs = tuple(n for n in self.input_names if n in read_as_shapes)
        if not self.static_inputs:
            self._check_shapes(graph)
        self._compilations: dict[Any, tuple[Any, list[Layout]]] = {}

    # -- structure

    def defines(self, name: str) -> bool:
        return name in self._available or name in self._producer

    def _step(self, index: int) -> _Step:
        if index not in self._steps:
            step = _make_step(self, self._nodes[index])
            self._steps[index] = step
            if isinstance(step, _GradientStep):
                stop = set(step.xs) | set(step.zs)
                step.order = [self._step(i) for i in self._topological([step.y], stop, index)]
        return self._steps[index]

    def _deps(self, index: int) -> tuple[str, ...]:
        """The names a node reads: its inputs, and for Gradient what computing y reads."""
        if index in self._deps_memo:
            return self._deps_memo[index]
        node = self._nodes[index]
        deps = [name for name in node.input if name]
        if domain_of(node) == DOMAIN and node.op_type == GRADIENT:
            self._deps_memo[index] = tuple(deps)  # guards against y depending on itself
            y, stop = _gradient_names(node)
            reached = self._reach([y] if y else [], stop, index)
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
        """The nodes computing ``names`` (not past ``stop``) in an order that runs.

        A depth-first walk with its own stack: a chain of many nodes needs no
        Python recursion.
        """
        order: list[int] = []
        state: dict[int, int] = {}  # 1: on the current path, 2: done

        def enter(name: str, reader: int | None) -> int | None:
            """The producer of ``name`` if it is still to visit; checks the edge."""
            if name in stop or name in self._available:
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
            if index == owner or state.get(index) == 1:
                raise ValueError(
                    f"{describe(self._nodes[index])}: the graph has a cycle through it"
                )
            if state.get(index) == 2:
                return None
            state[index] = 1
            return index

        for name in names:
            root = enter(name, None)
            stack = [] if root is None else [(root, iter(self._deps(root)))]
            while stack:
                index, deps = stack[-1]
                for dep in deps:
                    child = enter(dep, index)
                    if child is not None:
                        stack.append((child, iter(self._deps(child))))
                        break
                else:
                    stack.pop()
                    state[index] = 2
                    order.append(index)
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
            specs[name] = jax.ShapeDtypeStruct(dims, jax.dtypes.canonicalize_dtype(dtype))
        try:
            jax.eval_shape(self.apply, specs, self.params)
        except (TypeError, ValueError) as error:
            # Optimizer nodes check their arguments when they run (declared shapes of
            # optimizer inputs are not binding); everything else fails here.
            if not getattr(error, "optimizer_node", False):
                raise

    # -- running

    def apply(
        self, inputs: Mapping[str, Any], params: Mapping[str, Any] | None = None
    ) -> tuple[Any, ...]:
        """The graph's outputs from its inputs (a pure function: jit it, differentiate it).

        ``params`` replaces float initializers by name (default: the model's values).
        Conditions only known at run time (an index read from a feed) are checked
        when the values are known (run eagerly), else dropped: :meth:`apply_checked`
        returns them.
        """
        return self.apply_checked(inputs, params)[0]

    def apply_checked(
        self, inputs: Mapping[str, Any], params: Mapping[str, Any] | None = None
    ) -> tuple[tuple[Any, ...], RunChecks]:
        """:meth:`apply`, and the run-time checks of its ops; after the run,
        :func:`raise_failed` raises the first that failed, naming its node."""
        env: Env = dict(self.static)
        env.update(self.params)
        env.update(params or {})
        env.update(inputs)
        with collect_run_checks() as checks:
            outputs = tuple(materialize(value) for value in self._evaluate(env))
        return outputs, RunChecks.of(checks)

    def _evaluate(self, env: Env) -> tuple[Any, ...]:
        """Runs the nodes on ``env``; the outputs, Parts of packed buffers left as they are."""
        # ONNX broadcasts numpy-style (multidirectional): rank promotion is the
        # semantics here, whatever the caller's jax_numpy_rank_promotion says.
        with jax.numpy_rank_promotion("allow"):
            for step in self.order:
                step.run(env)
        outputs = tuple(env[name] for name in self.output_names)
        for name, value in zip(self.output_names, outputs, strict=True):
            if is_static(value):  # computed while tracing: it becomes a JAX array here
                index = self._producer.get(name)
                of = "" if index is None else f" of {describe(self._nodes[index])}"
                refuse_narrowing(f"graph output '{name}'{of}", value)
        return outputs

    def __call__(self, inputs: Any, device: jax.Device | None = None) -> list[np.ndarray]:
        if isinstance(inputs, Mapping):
            odd = [name for name in inputs if not isinstance(name, str)]
            if odd:
                raise TypeError(
                    f"input names must be str, got {odd[:3]!r}; the graph takes {self.input_names}"
                )
            missing = [name for name in self.input_names if name not in inputs]
            if missing:
                raise ValueError(f"missing input(s) {missing}; the graph takes {self.input_names}")
            values = [inputs[name] for name in self.input_names]
        else:
            values = list(inputs) if isinstance(inputs, list | tuple) else [inputs]
            if len(values) != len(self.input_names):
                raise ValueError(
                    f"got {len(values)} input(s); the graph takes {len(self.input_names)}: "
                    f"{self.input_names}"
                )
        named = dict(zip(self.input_names, values, strict=True))
        # Read as shapes, in numpy: int64 stays exact (INT64_MAX as "to the end").
        fixed = {n: np.asarray(named.pop(n)) for n in self.static_inputs}
        feeds = {
            n: v if isinstance(v, jax.Array) else host_array(f"input '{n}'", v)
            for n, v in named.items()
        }
        layout, buffers, own = pack(feeds, self._packable)
        if self._packed_params is None:  # on the device once, for every run
            checked = {n: host_array(f"initializer '{n}'", v) for n, v in self.params.items()}
            p_layout, host_buffers, host_own = pack(checked, self._packable)
            self._packed_params = (
                p_layout,
                [jnp.asarray(b) for b in host_buffers],
                {n: jnp.asarray(v) for n, v in host_own.items()},
            )
        _, p_buffers, p_own = self._packed_params
        arguments = (buffers, own, p_buffers, p_own)
        if device is not None:
            arguments = jax.device_put(arguments, device)
        compiled, out_layout = self._compiled(fixed, layout)
        try:
            out_buffers, out_own, checks = compiled(*arguments)
        except jax.errors.JaxRuntimeError as error:
            if "RESOURCE_EXHAUSTED" not in str(error):
                raise
            raise ValueError(
                f"the graph of outputs {list(self.output_names)} does not fit in the device's "
                f"memory ({str(error).splitlines()[0]}); feed smaller inputs, or lower "
                "limits=Limits(tensor_bytes=...) to have the node that grows so large named"
            ) from None
        raise_failed(checks)
        results = cut([np.asarray(b) for b in out_buffers], out_layout[0])
        results.update((name, np.asarray(value)) for name, value in out_own.items())
        return [
            _declared(name, results[name], dtype)
            for name, dtype in zip(self.output_names, self.output_dtypes, strict=True)
        ]

    @property
    def compilations(self) -> int:
        """How many times the graph has been compiled (once per input signature)."""
        return sum(jitted._cache_size() for jitted, _ in self._compilations.values())

    def _compiled(self, fixed: dict[str, np.ndarray], layout: Layout) -> tuple[Any, list[Layout]]:
        """The jitted graph for a packing of the feeds and values of the inputs read as shapes.

        The second item holds the layout of the packed outputs once it has been traced.
        """
        key = (
            layout,
            tuple((n, v.dtype.str, v.shape, v.tobytes()) for n, v in sorted(fixed.items())),
        )
        if key not in self._compilations:
            assert self._packed_params is not None
            p_layout = self._packed_params[0]
            out_layout: list[Layout] = []

            def run(
                buffers: list[Any], own: dict[str, Any], p_buffers: list[Any], p_own: dict[str, Any]
            ) -> tuple[list[Any], dict[str, Any], RunChecks]:
                env: Env = dict(self.static)
                env.update(unpack(p_layout, p_buffers))
                env.update(p_own)
                env.update(unpack(layout, buffers))
                env.update(own)
                env.update(fixed)
                with collect_run_checks() as checks:
                    values = self._evaluate(env)
                packed, out_buffers, out_own = outputs_of(values, self.output_names)
                out_layout[:] = [packed]
                return out_buffers, out_own, RunChecks.of(checks)

            self._compilations[key] = (jax.jit(run), out_layout)
        return self._compilations[key]


def node_graph(node: Any) -> Any:
    """A graph of one node, its inputs as graph inputs (for ``run_node``)."""
    from onnx import helper

    inputs = [helper.make_empty_tensor_value_info(n) for n in dict.fromkeys(node.input) if n]
    outputs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
    return helper.make_graph([node], "node", inputs, outputs)
