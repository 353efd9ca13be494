"""Control flow of ai.onnx: If, Loop and Scan, as ``lax.cond``, ``lax.scan`` and ``lax.while_loop``.

Their graph attributes arrive as callables (the graph's ``Subgraph``): called on
the subgraph's formal inputs, one returns its outputs, reading the names of the
enclosing graphs itself. Each body is traced once (:func:`_trace`, a jaxpr), which
fixes its output shapes before the loop or branch is built: XLA needs them equal
across iterations and branches, so a difference is refused naming the node, not
left to JAX's message. The jaxpr is then bound inside the lax primitive, so a
body costs one trace wherever it runs and nesting never multiplies the work.

- ``If``: a condition known while tracing takes its branch (the branches may
  then differ in shape); otherwise ``lax.cond``, whose branches must agree.
- ``Loop``: ``lax.scan`` when the trip count is known while tracing and the
  condition is absent, or a constant true that the body passes through or keeps
  true (differentiable); otherwise ``lax.while_loop`` (forward only), which
  cannot accumulate scan outputs (their length would depend on the values).
- ``Scan`` (opset 9 and later): ``lax.scan`` over the scan inputs, each along its
  axis and direction; scan outputs stacked along theirs.

A body must fit its node, as onnxruntime requires, or the node is refused by
name: If's branches take no input and give the node's outputs, of the types
both declare; Loop's body takes an int64 iteration number, a bool condition and
the carried values and gives one output more than the node; Scan's (and
SequenceMap's) body takes the node's inputs and gives its outputs. Counts are
checked when the graph is prepared; the declared input types (and, for Loop
and Scan, shapes) against the values given, and the declared output types
against those computed, when it is traced.

Run-time checks the ops in a body record (an index out of range) leave the body
as part of its outputs and are collected for the node's graph, so they still
fail after the run naming their node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src.ops.arrays import RunCheck, collect_run_checks, record_run_checks
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.subgraphs import (
    check_inputs,
    check_outputs,
    check_signature,
    dtype_text,
    spend_unrolled,
)
from onnx_optax._src.ops.values import (
    NotStaticError,
    NoValue,
    TensorSeq,
    canonical,
    is_sequence_or_optional,
    is_static,
    refuse_narrowing_in,
    type_text,
)


class _Body(NamedTuple):
    """A subgraph traced once on the avals of its inputs: a jaxpr of (outputs, checks)."""

    closed: Any  # ClosedJaxpr
    tree: Any  # the pytree structure of (outputs, checks)
    outs: tuple[Any, ...]  # the outputs' shapes and dtypes (a sequence's: a TensorSeq of them)
    checks: dict[str, RunCheck]  # the checks' shapes and dtypes, by message

    def __call__(self, *args: Any) -> tuple[list[Any], dict[str, RunCheck]]:
        leaves = jax.tree.leaves(args)
        flat = jax.core.eval_jaxpr(self.closed.jaxpr, self.closed.consts, *leaves)
        outs, checks = jax.tree.unflatten(self.tree, flat)
        return list(outs), checks

    def padded(self, specs: dict[str, RunCheck], *args: Any) -> tuple[list[Any], dict[str, Any]]:
        """Called, with a check that never fails for each of ``specs`` it lacks."""
        outs, checks = self(*args)
        return outs, {m: checks[m] if m in checks else _never(s) for m, s in specs.items()}


def _never(spec: RunCheck) -> RunCheck:
    """A check that does not fail, shaped as ``spec``."""
    return RunCheck(jnp.asarray(False), jnp.zeros((), spec.value.dtype))


def _known(value: Any) -> bool:
    """Whether a value is known while tracing: a host value, or a JAX array that is no
    tracer (an op computed it from host values, as Relu does with jax.numpy)."""
    return is_static(value) or (
        isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer)
    )


def _spec(value: Any) -> Any:
    """A value's shapes and dtypes (a sequence's: a TensorSeq of them; an empty optional:
    itself)."""
    return jax.tree.map(lambda v: jax.ShapeDtypeStruct(np.shape(v), canonical(v.dtype)), value)


def _held(value: Any) -> Any:
    """A value as JAX holds it (each tensor of a sequence too)."""
    return jax.tree.map(lambda v: jnp.asarray(v, canonical(v.dtype)), value)


def _types(value: Any) -> tuple[Any, tuple[tuple[tuple[int, ...], np.dtype], ...]]:
    """A value's structure and its tensors' shapes and dtypes, to compare two."""
    leaves, tree = jax.tree.flatten(value)
    return tree, tuple((tuple(np.shape(v)), np.dtype(v.dtype)) for v in leaves)


def _describe(value: Any) -> str:
    """A value's type in messages: float32[2, 3], a sequence of n, an empty optional."""
    if isinstance(value, TensorSeq):
        return f"a sequence of {len(value)} ({', '.join(_describe(v) for v in value)})"
    if isinstance(value, NoValue):
        return "an empty optional"
    return f"{np.dtype(value.dtype)}{list(np.shape(value))}"


def _trace(node: Node, name: str, body: Any, specs: Sequence[Any]) -> _Body:
    """The subgraph ``name`` traced once on ``specs``; its host outputs become constants."""

    def run(*args: Any) -> tuple[list[Any], dict[str, RunCheck]]:
        with collect_run_checks() as checks:
            outs = body(*args)
        values = []
        for out_name, out in zip(body.output_names, outs, strict=True):
            refuse_narrowing_in(f"{node.where}: {name} output '{out_name}'", out)
            values.append(_held(out))
        return values, dict(checks)

    closed, shape = jax.make_jaxpr(run, return_shape=True)(*specs)
    outs, checks = shape
    check_outputs(node, name, body, outs)
    tree = jax.tree.structure((outs, checks))
    return _Body(closed, tree, tuple(outs), checks)


def _same_types(
    node: Node, what: str, names: Sequence[str], given: Sequence[Any], got: Sequence[Any]
) -> None:
    """Refuses body outputs whose shapes or dtypes differ from what they must equal."""
    for name, a, b in zip(names, given, got, strict=True):
        if _types(a) != _types(b):
            raise ValueError(
                f"{node.where}: {what} '{name}' is {_describe(b)} where {_describe(a)} is "
                "needed; XLA compiles control flow with fixed shapes and dtypes (and sequences "
                "of fixed length)"
            )


def _collect(checks: dict[str, RunCheck]) -> None:
    """Checks stacked by a scan (one per iteration) as one check each."""
    merged = {}
    for message, check in checks.items():
        if check.failed.shape[0] == 0:
            continue
        first = jnp.argmax(check.failed)
        merged[message] = RunCheck(jnp.any(check.failed), check.value[first])
    record_run_checks(merged)


# ----------------------------------------------------------------------------- If


def _if_check(node: Node) -> None:
    """Both branches take no input and give the node's outputs, of the same types."""
    import onnx

    check_signature(node, "then_branch", 0, node.n_outputs)
    check_signature(node, "else_branch", 0, node.n_outputs)
    then_branch, else_branch = node["then_branch"], node["else_branch"]
    if not isinstance(then_branch, onnx.GraphProto) or not isinstance(else_branch, onnx.GraphProto):
        return
    pairs = zip(then_branch.output, else_branch.output, strict=True)
    for position, (a, b) in enumerate(pairs):
        left, right = type_text(a.type), type_text(b.type)
        if left is not None and right is not None and left != right:
            raise ValueError(
                f"{node.where}: output {position} is declared {left} in then_branch "
                f"('{a.name}') but {right} in else_branch ('{b.name}'); the branches must agree"
            )


@register("If", check=_if_check)
def _if(node: Node, cond: Any) -> Any:
    then_branch, else_branch = node["then_branch"], node["else_branch"]
    if np.size(cond) != 1:
        raise ValueError(
            f"{node.where}: cond of shape {list(np.shape(cond))} must hold one element"
        )
    if _known(cond):  # known while tracing: only the branch taken is traced
        taken = bool(np.asarray(cond).reshape(()))
        outs = then_branch() if taken else else_branch()
        check_outputs(
            node,
            "then_branch" if taken else "else_branch",
            node["then_branch" if taken else "else_branch"],
            outs,
        )
        return tuple(outs)
    then_body = _trace(node, "then_branch", then_branch, ())
    else_body = _trace(node, "else_branch", else_branch, ())
    if len(then_body.outs) != len(else_body.outs):
        raise ValueError(
            f"{node.where}: then_branch has {len(then_body.outs)} outputs, else_branch "
            f"{len(else_body.outs)}"
        )
    for position, (a, b) in enumerate(zip(then_body.outs, else_body.outs, strict=True)):
        if _types(a) != _types(b):
            raise ValueError(
                f"{node.where}: output {position} is {_describe(a)} in then_branch "
                f"('{then_branch.output_names[position]}') but {_describe(b)} in "
                f"else_branch ('{else_branch.output_names[position]}'); with a condition known "
                "only at run time, XLA needs both branches to agree (sequences in length, "
                "optionals in emptiness)"
            )
    specs = {**else_body.checks, **then_body.checks}
    outs, checks = lax.cond(
        jnp.reshape(cond, ()),
        lambda: then_body.padded(specs),
        lambda: else_body.padded(specs),
    )
    record_run_checks(checks)
    return tuple(outs)


# ----------------------------------------------------------------------------- Loop


def _constant_true(body: _Body) -> bool:
    """Whether the body's condition output is its condition input or a constant true."""
    jaxpr = body.closed.jaxpr
    var = jaxpr.outvars[0]
    if var is jaxpr.invars[1]:
        return True
    value = getattr(var, "val", None)  # a literal
    if value is None and var in jaxpr.constvars:
        value = body.closed.consts[jaxpr.constvars.index(var)]
    return value is not None and not isinstance(value, jax.core.Tracer) and bool(np.all(value))


def _loop_check(node: Node) -> None:
    """The body takes the iteration number (int64), the condition (bool) and the carried
    values, and gives the condition, the carried values and the node's scan outputs."""
    formal = check_signature(node, "body", len(node.inputs), node.n_outputs + 1)
    for declared, dtype in zip(formal, (np.int64, np.bool_), strict=False):
        if declared.kind not in (None, "tensor_type") or (
            declared.dtype is not None and declared.dtype != dtype
        ):
            raise ValueError(
                f"{node.where}: body input '{declared.name}' is declared {declared.text} but "
                f"is given a tensor of {dtype_text(dtype)}"
            )


def _loop_inputs(node: Node, body: Any, trip_count: Any, cond: Any, n: int) -> int:
    """Refuses a Loop whose inputs do not fit its body or never end; its scan outputs' count."""
    k = len(body.output_names) - 1 - n
    if len(body.input_names) != 2 + n or k < 0:
        raise ValueError(
            f"{node.where}: its body takes {len(body.input_names)} inputs and gives "
            f"{len(body.output_names)} outputs; with {n} loop-carried values it must take "
            f"{2 + n} (iteration number, condition, the values) and give at least {1 + n}"
        )
    if trip_count is None and cond is None:
        raise ValueError(
            f"{node.where}: neither a trip count M nor a condition is given: the loop never ends"
        )
    for what, value in (("M", trip_count), ("cond", cond)):
        if value is not None and np.size(value) != 1:
            raise ValueError(
                f"{node.where}: {what} of shape {list(np.shape(value))} must hold one element"
            )
    return k


def _changed_sequences(
    node: Node, body: Any, traced: _Body, specs: Sequence[Any], n: int, unrollable: bool
) -> bool:
    """Whether a carried sequence or optional changes type between iterations (the loop is
    then unrolled); refused where it cannot be."""
    carried_names = body.output_names[1 : 1 + n]
    changed = [
        (name, a, b)
        for name, a, b in zip(carried_names, specs[2:], traced.outs[1 : 1 + n], strict=True)
        if _types(a) != _types(b)
    ]
    if changed and any(is_sequence_or_optional(v) for _, a, b in changed for v in (a, b)):
        name, a, b = changed[0]
        if not unrollable:
            raise ValueError(
                f"{node.where}: its loop-carried value '{name}' is {_describe(a)} on entry "
                f"but {_describe(b)} after an iteration; a sequence that changes length (or "
                "an optional that changes emptiness) needs the loop unrolled while tracing, "
                "so the trip count M and the condition must be known while tracing"
            )
        return True
    return False


def _loop_outputs(node: Node, body: Any, traced: _Body, specs: Sequence[Any], n: int) -> None:
    """Refuses body outputs a compiled loop cannot carry: a carried value changing shape or
    dtype, a sequence scanned out, a condition that is not one bool."""
    carried_names = body.output_names[1 : 1 + n]
    _same_types(node, "loop-carried output", carried_names, specs[2:], traced.outs[1 : 1 + n])
    if any(map(is_sequence_or_optional, traced.outs[1 + n :])):
        raise ValueError(
            f"{node.where}: a scan output of its body is a sequence or an optional; scan "
            "outputs are tensors, stacked over the iterations"
        )
    if math.prod(traced.outs[0].shape) != 1 or traced.outs[0].dtype != np.dtype(bool):
        raise ValueError(
            f"{node.where}: the body's condition output '{body.output_names[0]}' must be one "
            f"bool, got {traced.outs[0].dtype}{list(traced.outs[0].shape)}"
        )


def _scanned_loop(traced: _Body, trips: int, counter: Any, carried: Any, n: int) -> Any:
    """A Loop of a known trip count and a fixed condition: ``lax.scan`` (differentiable)."""
    true = jnp.asarray(True)

    def step(state: Any, _: Any) -> tuple[Any, Any]:
        i, values = state
        outs, checks = traced(i, true, *values)
        return (i + 1, tuple(outs[1 : 1 + n])), (tuple(outs[1 + n :]), checks)

    start = (jnp.zeros((), counter), carried)
    (_, final), (scanned, checks) = lax.scan(step, start, None, length=trips)
    _collect(checks)
    return (*final, *scanned)


def _while_loop(
    traced: _Body, trip_count: Any, cond: Any, counter: Any, carried: Any, n: int
) -> Any:
    """A Loop whose trip count or condition is known only at run time: ``lax.while_loop``."""
    limit = None if trip_count is None else jnp.reshape(jnp.asarray(trip_count), ()).astype(counter)
    keep = jnp.asarray(True) if cond is None else jnp.reshape(jnp.asarray(cond), ())
    initial_checks = {m: _never(c) for m, c in traced.checks.items()}

    def going(state: Any) -> Any:
        i, keep, _, _ = state
        return keep if limit is None else keep & (i < limit)

    def advance(state: Any) -> Any:
        i, keep, values, seen = state
        outs, checks = traced(i, keep, *values)
        merged = {
            m: RunCheck(s.failed | checks[m].failed, jnp.where(s.failed, s.value, checks[m].value))
            for m, s in seen.items()
        }
        keep = jnp.reshape(outs[0], ()) if cond is not None else keep
        return i + 1, keep, tuple(outs[1 : 1 + n]), merged

    state = (jnp.zeros((), counter), keep, carried, initial_checks)
    _, _, final, checks = lax.while_loop(going, advance, state)
    record_run_checks(checks)
    return tuple(final)


@register("Loop", check=_loop_check, prefer_static=(0, 1))
def _loop(node: Node, trip_count: Any = None, cond: Any = None, *carried: Any) -> Any:
    body = node["body"]
    n = len(carried)
    given_cond = np.zeros((), bool) if cond is None else cond
    check_inputs(node, "body", [np.zeros((), np.int64), given_cond, *carried])
    k = _loop_inputs(node, body, trip_count, cond, n)
    counter = canonical(np.int64)
    carried = tuple(_held(v) for v in carried)
    specs = [
        jax.ShapeDtypeStruct((), counter),
        jax.ShapeDtypeStruct((), np.dtype(bool)),
        *map(_spec, carried),
    ]
    known_trip = trip_count is not None and _known(trip_count)
    if cond is not None and _known(cond) and not bool(np.asarray(cond).reshape(())):
        trip_count, known_trip = np.zeros((), np.int64), True  # not one iteration
    # Sequences and optionals may change type between iterations (a sequence growing):
    # such a loop is unrolled, and so may hold subgraphs (each call traced in turn).
    structured = any(map(is_sequence_or_optional, carried))
    unrollable = known_trip and (cond is None or _known(cond))
    try:
        traced = _trace(node, "body", body, specs)
    except NotStaticError:
        if not unrollable:
            raise
        trips = max(int(np.asarray(trip_count).reshape(())), 0)
        return _unrolled(node, body, trips, carried, k, cond is not None, nested=structured)
    if _changed_sequences(node, body, traced, specs, n, unrollable):
        trips = max(int(np.asarray(trip_count).reshape(())), 0)
        return _unrolled(node, body, trips, carried, k, cond is not None, nested=True)
    _loop_outputs(node, body, traced, specs, n)
    cond_fixed = cond is None or (_known(cond) and _constant_true(traced))
    if known_trip and cond_fixed:
        trips = max(int(np.asarray(trip_count).reshape(())), 0)
        return _scanned_loop(traced, trips, counter, carried, n)
    if k:
        raise ValueError(
            f"{node.where}: its {k} scan output(s) would have a length known only at run time "
            "(the trip count or the condition depends on the values fed); XLA needs it fixed: "
            "make M a constant and the condition constant true"
        )
    return _while_loop(traced, trip_count, cond, counter, carried, n)


def _unrolled(
    node: Node, body: Any, trips: int, carried: Any, k: int, reads_cond: bool, nested: bool
) -> Any:
    """A Loop of a known trip count run iteration by iteration while tracing.

    The iteration number is then a host value, as a body that reads it as a shape needs,
    and a carried sequence may grow. A condition the body computes must be known while
    tracing too. ``nested``: the body may hold subgraphs.
    """
    refused = spend_unrolled(body, trips, nested=nested)
    if refused is not None:
        raise NotStaticError(
            f"{node.where}: its body reads a value computed from the iteration number where "
            f"it must be known while tracing (a shape, Slice's starts, a sequence growing); "
            f"unrolling {trips} iterations of {body.work} nodes is refused ({refused})"
        )
    n = len(carried)
    values: list[Any] = list(carried)
    scanned: list[list[Any]] = [[] for _ in range(k)]
    for i in range(trips):
        outs = body(np.array(i, np.int64), np.array(True), *values)
        check_outputs(node, "body", body, outs)
        for name, out in zip(body.output_names, outs, strict=True):
            refuse_narrowing_in(f"{node.where}: body output '{name}'", out)
        values = list(outs[1 : 1 + n])
        for found, out in zip(scanned, outs[1 + n :], strict=True):
            found.append(out)
        if reads_cond:
            if not _known(outs[0]):
                raise NotStaticError(
                    f"{node.where}: its unrolled body computes its condition "
                    f"'{body.output_names[0]}' from the values fed; it must be known while tracing"
                )
            if not bool(np.asarray(outs[0]).reshape(())):
                break
    if k and not scanned[0]:
        raise ValueError(
            f"{node.where}: an unrolled loop of no iteration has scan outputs of unknown shape"
        )
    names = body.output_names[1 + n :]
    for name, found in zip(names, scanned, strict=True):
        kinds = {(tuple(np.shape(v)), np.dtype(v.dtype)) for v in found}
        if len(kinds) > 1:  # as onnxruntime, which refuses them too
            shapes = sorted(f"{dtype}{list(shape)}" for shape, dtype in kinds)
            raise ValueError(
                f"{node.where}: scan output '{name}' differs between iterations "
                f"({', '.join(shapes)}); its iterations are stacked into one tensor"
            )
    return (*values, *(jnp.stack([jnp.asarray(v) for v in found]) for found in scanned))


# ----------------------------------------------------------------------------- Scan


def _per_input(node: Node, name: str, count: int, default: int) -> list[int]:
    values = node.get(name) or [default] * count
    if len(values) != count:
        raise ValueError(f"{node.where}: {name} has {len(values)} entries for {count} tensors")
    return [int(v) for v in values]


def _scan_axis(node: Node, name: str, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"{node.where}: {name} {axis} is out of range for rank {rank}")
    return axis % rank


def _scan_check(node: Node) -> None:
    """The body takes the node's inputs (opset 8: less sequence_lens), gives its outputs."""
    inputs = len(node.inputs) - (1 if node.opset < 9 else 0)
    check_signature(node, "body", inputs, node.n_outputs)


@register("Scan", check=_scan_check)
def _scan(node: Node, *inputs: Any) -> Any:
    body = node["body"]
    m = int(node["num_scan_inputs"])
    if node.opset < 9:  # a batch axis first, then the sequence axis; sequence_lens first
        lengths, *rest = inputs
        return _batched_scan(node, body, m, lengths, rest)
    n = len(inputs) - m
    k = len(body.output_names) - n
    _fits(node, body, m, len(inputs))
    in_axes = _per_input(node, "scan_input_axes", m, 0)
    in_dirs = _per_input(node, "scan_input_directions", m, 0)
    out_axes = _per_input(node, "scan_output_axes", k, 0)
    out_dirs = _per_input(node, "scan_output_directions", k, 0)
    final, ys, checks = _scan_core(node, body, inputs[:n], inputs[n:], in_axes, in_dirs, out_dirs)
    _collect(checks)
    outputs = [
        jnp.moveaxis(y, 0, _scan_axis(node, "scan_output_axes", axis, y.ndim))
        for y, axis in zip(ys, out_axes, strict=True)
    ]
    return (*final, *outputs)


def _fits(node: Node, body: Any, m: int, given: int) -> None:
    n = given - m
    k = len(body.output_names) - n
    if m < 1 or n < 0 or k < 0 or len(body.input_names) != n + m:
        raise ValueError(
            f"{node.where}: num_scan_inputs {m} with {given} inputs and a body of "
            f"{len(body.input_names)} inputs and {len(body.output_names)} outputs do not fit"
        )


def _batched_scan(node: Node, body: Any, m: int, lengths: Any, inputs: Sequence[Any]) -> Any:
    """Scan of opset 8: each input's axis 0 is a batch, scanned along axis 1 (by vmap)."""
    _fits(node, body, m, len(inputs))
    n = len(inputs) - m
    k = len(body.output_names) - n
    if any(np.ndim(x) < 1 for x in inputs) or len({np.shape(x)[0] for x in inputs}) != 1:
        raise ValueError(f"{node.where}: the inputs must share their batch axis 0")
    if any(np.ndim(x) < 2 for x in inputs[n:]):
        raise ValueError(f"{node.where}: a scan input lacks the sequence axis 1")
    if lengths is not None:
        full = np.shape(inputs[n])[1]
        if not _known(lengths) or np.any(np.asarray(lengths) != full):
            raise NotImplementedError(
                f"{node.where}: sequence_lens shorter than the sequences ({full}) are not "
                "supported; leave the input out"
            )
    directions = _per_input(node, "directions", m, 0)

    def one(*values: Any) -> Any:
        return _scan_core(node, body, values[:n], values[n:], [0] * m, directions, [0] * k)

    final, ys, checks = jax.vmap(one)(*(jnp.asarray(x, canonical(x.dtype)) for x in inputs))
    _collect(
        {msg: RunCheck(c.failed.reshape(-1), c.value.reshape(-1)) for msg, c in checks.items()}
    )
    return (*final, *ys)


def _scan_core(
    node: Node,
    body: Any,
    states: Sequence[Any],
    scanned: Sequence[Any],
    in_axes: Sequence[int],
    in_dirs: Sequence[int],
    out_dirs: Sequence[int],
) -> tuple[tuple[Any, ...], list[Any], dict[str, RunCheck]]:
    """The final states, the scan outputs stacked along axis 0 and the checks per step."""
    if any(d not in (0, 1) for d in (*in_dirs, *out_dirs)):
        raise ValueError(f"{node.where}: scan directions must be 0 (forward) or 1 (reverse)")
    n = len(states)
    states = tuple(jnp.asarray(v, canonical(v.dtype)) for v in states)
    xs = []
    for position, (x, axis, direction) in enumerate(zip(scanned, in_axes, in_dirs, strict=True)):
        x = jnp.asarray(x, canonical(x.dtype))
        if x.ndim == 0:
            raise ValueError(f"{node.where}: scan input {n + position} is a scalar")
        x = jnp.moveaxis(x, _scan_axis(node, "scan_input_axes", axis, x.ndim), 0)
        xs.append(jnp.flip(x, 0) if direction else x)
    lengths = {x.shape[0] for x in xs}
    if len(lengths) != 1:
        raise ValueError(f"{node.where}: the scan inputs have different lengths {sorted(lengths)}")
    check_inputs(node, "body", [*states, *(jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in xs)])
    specs = [*map(_spec, states), *(jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in xs)]
    traced = _trace(node, "body", body, specs)
    _same_types(node, "state output", body.output_names[:n], specs[:n], traced.outs[:n])

    def step(values: Any, sliced: Any) -> tuple[Any, Any]:
        outs, checks = traced(*values, *sliced)
        return tuple(outs[:n]), (tuple(outs[n:]), checks)

    final, (ys, checks) = lax.scan(step, states, tuple(xs))
    ys = [jnp.flip(y, 0) if d else y for y, d in zip(ys, out_dirs, strict=True)]
    return final, ys, checks
