"""What the ops that call subgraphs share: a body's declared signature checked against
its node and the values it is given or computes, and the budget of unrolled calls.

If, Loop and Scan (``control_flow``) and SequenceMap (``sequence``) check here
that a body takes and gives as many values as its node needs
(:func:`check_signature`, when the graph is prepared), that the values given
have the kinds, element types and ranks it declares (:func:`check_inputs`) and
that what it computes has the element types it declares (:func:`check_outputs`),
as onnxruntime does. A body called once per iteration or element while tracing
spends node runs from one budget per traced graph (:func:`unroll_budget`,
:func:`spend_unrolled`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from onnx_optax._src.onnx_tensors import tensor_dtype
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import (
    NoValue,
    TensorSeq,
    canonical,
    is_sequence_or_optional,
    type_text,
)

# Where a check leaves, in its node's attributes, the types its subgraphs declare for
# their inputs (read once more when the node runs, on the values it is given).
_FORMAL = "onnx_optax:formal_inputs"


class _Formal(NamedTuple):
    """A subgraph input as declared: its name, its kind and dtype (None: not declared)."""

    name: str
    kind: str | None  # tensor_type, sequence_type, optional_type
    dtype: np.dtype | None
    text: str | None  # as the schemas write it: tensor(float)
    dims: tuple[int | None, ...] | None = None  # a tensor's declared shape (None: a dim param)


def _formal_inputs(graph: Any) -> list[Any]:
    """A subgraph's inputs, less those that name its initializers (defaults, not inputs)."""
    initializers = {t.name for t in graph.initializer}
    return [value for value in graph.input if value.name not in initializers]


def _formal(graph: Any) -> tuple[_Formal, ...]:
    found = []
    for value in _formal_inputs(graph):
        kind = value.type.WhichOneof("value")
        inner = value.type
        while inner.WhichOneof("value") in ("sequence_type", "optional_type"):
            inner = getattr(inner, inner.WhichOneof("value")).elem_type
        code = inner.tensor_type.elem_type if inner.WhichOneof("value") == "tensor_type" else 0
        try:
            dtype = tensor_dtype(code, "") if code else None
        except ValueError:  # a type XLA cannot hold: refused where it is read, if it is
            dtype = None
        dims = None
        if kind == "tensor_type" and value.type.tensor_type.HasField("shape"):
            dims = tuple(
                d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None
                for d in value.type.tensor_type.shape.dim
            )
        found.append(_Formal(value.name, kind, dtype, type_text(value.type), dims))
    return tuple(found)


def check_signature(node: Node, name: str, inputs: int, outputs: int) -> tuple[_Formal, ...]:
    """Refuses subgraph ``name`` unless it takes ``inputs`` inputs and gives ``outputs``
    outputs (as onnxruntime); keeps its declared inputs for :func:`check_inputs`."""
    import onnx

    graph = node[name]
    if not isinstance(graph, onnx.GraphProto):
        return ()
    taken = len(_formal_inputs(graph))
    if taken != inputs:
        raise ValueError(
            f"{node.where}: {name} takes {taken} inputs; it must take "
            + (f"{inputs}" if inputs else "none")
        )
    if len(graph.output) != outputs:
        raise ValueError(
            f"{node.where}: {name} gives {len(graph.output)} outputs but the node has "
            f"{node.n_outputs}, so it must give {outputs}"
        )
    formal = _formal(graph)
    if isinstance(node.attrs, dict):
        node.attrs.setdefault(_FORMAL, {})[name] = formal
    return formal


def check_outputs(node: Node, name: str, body: Any, outs: Sequence[Any]) -> None:
    """Refuses subgraph outputs of another element type than the subgraph declares (as
    onnxruntime's type inference does)."""
    declared = getattr(body, "output_dtypes", ())
    for out_name, dtype, value in zip(body.output_names, declared, outs, strict=False):
        if dtype is None or isinstance(value, NoValue):
            continue
        got = value.elem_dtype if isinstance(value, TensorSeq) else np.dtype(value.dtype)
        if got is not None and canonical(got) != canonical(dtype):
            raise ValueError(
                f"{node.where}: {name} output '{out_name}' is declared {dtype_text(dtype)} "
                f"but computes {dtype_text(got)}"
            )


def dtype_text(dtype: Any) -> str:
    from onnx import TensorProto, helper

    return TensorProto.DataType.Name(helper.np_dtype_to_tensor_dtype(np.dtype(dtype))).lower()


def check_inputs(
    node: Node, name: str, values: Sequence[Any], first: int = 0, *, shapes: bool = True
) -> None:
    """Refuses values given to subgraph ``name`` (its inputs from ``first`` on) of another
    element type, kind or (``shapes``) rank than the subgraph declares, as onnxruntime
    does (its shape inference merges the two)."""
    formal = node.attrs.get(_FORMAL, {}).get(name, ())
    for declared, value in zip(formal[first:], values, strict=False):
        if shapes and declared.dims is not None and not is_sequence_or_optional(value):
            # The rank only: a body declaring the sizes it was exported with (a batch of 1)
            # runs in onnxruntime on others, with a warning, where they are not known
            # while it loads the model.
            shape = tuple(value.shape)
            if len(shape) != len(declared.dims):
                dims = ", ".join("?" if d is None else str(d) for d in declared.dims)
                raise ValueError(
                    f"{node.where}: {name} input '{declared.name}' is declared of shape "
                    f"[{dims}] but is given {list(shape)}"
                )
        if isinstance(value, TensorSeq):
            kind, dtype = "sequence_type", value.elem_dtype
        elif isinstance(value, NoValue):
            kind, dtype = "optional_type", None
        else:
            kind, dtype = "tensor_type", np.dtype(value.dtype)
        plain = {declared.kind, kind} <= {"tensor_type", "sequence_type"}
        wrong_kind = plain and declared.kind != kind
        wrong_type = (
            declared.dtype is not None
            and dtype is not None
            and canonical(declared.dtype) != canonical(dtype)
        )
        if wrong_kind or wrong_type:
            given = "a sequence" if kind == "sequence_type" else "a tensor"
            given += "" if dtype is None else f" of {dtype_text(dtype)}"
            raise ValueError(
                f"{node.where}: {name} input '{declared.name}' is declared {declared.text} "
                f"but is given {given}"
            )


# A Loop body that reads its iteration number as a shape (Slice's starts) is unrolled,
# up to this many iterations and Limits.traced_nodes node runs, if it nests no subgraph.
UNROLL_LIMIT = 4096
# The node runs unrolled bodies may still add to the trace of a graph (its limit less its
# counted work, where each body counts once); None: each unrolling bounded by the limit.
_UNROLL_BUDGET: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "onnx_optax_unroll_budget", default=None
)


@contextlib.contextmanager
def unroll_budget(node_runs: int) -> Iterator[None]:
    """Bounds the extra node runs of every Loop unrolled while tracing one graph."""
    token = _UNROLL_BUDGET.set([node_runs])
    try:
        yield
    finally:
        _UNROLL_BUDGET.reset(token)


def spend_unrolled(body: Any, calls: int, *, nested: bool = False) -> str | None:
    """Takes the node runs of ``calls`` calls of ``body`` (one is counted already) from the
    trace's budget; why it cannot (the limits it would pass), else None.

    ``nested``: the body may hold subgraphs (each call traces them once more).
    """
    budget = _UNROLL_BUDGET.get()
    left = body.max_work if budget is None else budget[0]
    extra = max(calls - 1, 0) * body.work  # the body counted once already
    if (body.nested and not nested) or calls > UNROLL_LIMIT or extra > left:
        return (
            f"at most {UNROLL_LIMIT} calls, {left} more node runs within "
            f"limits=Limits(traced_nodes=...)" + ("" if nested else ", and no subgraph inside")
        )
    if budget is not None:
        budget[0] -= extra
    return None
