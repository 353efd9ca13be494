"""ONNX sequences and optionals, XLA-style: lengths and emptiness known while tracing.

- A sequence is a :class:`TensorSeq`: a tuple of tensors (host or JAX values)
  whose length is known while tracing, with its element dtype (kept for an
  empty one). It is a JAX pytree, so a compiled graph takes and returns one, and
  ``lax.cond``, ``lax.scan`` and ``lax.while_loop`` carry one of fixed length.
  An input that would make a length depend on the values fed (SequenceInsert's
  and SequenceErase's position, SplitToSequence's split) must be known while
  tracing; one computed from the values fed is refused naming the node.
- An optional is the value it holds (a tensor or a sequence), or a
  :class:`NoValue`, the empty one (a pytree without leaves), so
  ``OptionalHasElement`` is known while tracing.

The ops: SequenceEmpty, SequenceConstruct, SequenceLength, SequenceAt,
SequenceInsert, SequenceErase, SplitToSequence, ConcatFromSequence,
SequenceMap (its body called once per element, while tracing), Optional,
OptionalHasElement, OptionalGetElement. Gradients do not flow through them: a
Gradient whose path crosses one is refused (see ``graph``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src.onnx_tensors import tensor_dtype
from onnx_optax._src.ops.arrays import check_size, checked_indices, int_list, norm_axis, xp_of
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.subgraphs import (
    check_inputs,
    check_outputs,
    check_signature,
    spend_unrolled,
)
from onnx_optax._src.ops.values import (
    NotStaticError,
    NoValue,
    TensorSeq,
    canonical,
    is_static,
    type_text,
)


def _elem_dtype(type_proto: Any, what: str) -> np.dtype | None:
    """The element dtype of a sequence type (None where it is not declared)."""
    code = type_proto.sequence_type.elem_type.tensor_type.elem_type
    return tensor_dtype(code, what) if code else None


def feed_value(what: str, value: Any, type_proto: Any, tensor: Callable[[str, Any], Any]) -> Any:
    """A fed value of a sequence or optional graph input, as the graph holds it.

    A sequence is fed as a list (or tuple) of tensors, an optional as its value or
    None (empty); ``tensor`` converts each tensor (the graph's checks).
    """
    kind = type_proto.WhichOneof("value")
    if kind == "optional_type":
        if value is None or isinstance(value, NoValue):
            return NoValue(type_text(type_proto.optional_type.elem_type))
        return feed_value(what, value, type_proto.optional_type.elem_type, tensor)
    if kind != "sequence_type":
        return tensor(what, value)
    if isinstance(value, np.ndarray | jax.Array) or not isinstance(value, list | tuple):
        raise TypeError(f"{what} is a sequence: feed a list of tensors, got {type(value).__name__}")
    items = [tensor(f"{what}[{i}]", v) for i, v in enumerate(value)]
    declared = _elem_dtype(type_proto, what)
    dtypes = {canonical(v.dtype) for v in items}
    if declared is not None:
        dtypes.add(canonical(declared))
    if len(dtypes) > 1:
        raise TypeError(
            f"{what}: a sequence holds tensors of one dtype, got {sorted(map(str, dtypes))}"
        )
    return TensorSeq(items, declared if declared is not None else None)


def host_value(value: Any) -> Any:
    """A computed value for the caller: a sequence as a list of numpy arrays, an empty
    optional as None, a tensor as a numpy array."""
    if isinstance(value, TensorSeq):
        return [np.asarray(v) for v in value]
    if isinstance(value, NoValue):
        return None
    return np.asarray(value)


# The op types of this module: a Gradient whose path crosses one is refused.
SEQUENCE_OPS = frozenset(
    (
        "ConcatFromSequence",
        "Optional",
        "OptionalGetElement",
        "OptionalHasElement",
        "SequenceAt",
        "SequenceConstruct",
        "SequenceEmpty",
        "SequenceErase",
        "SequenceInsert",
        "SequenceLength",
        "SequenceMap",
        "SplitToSequence",
    )
)


def _sequence(node: Node, value: Any, what: str = "input_sequence") -> TensorSeq:
    if not isinstance(value, TensorSeq):
        kind = "an empty optional" if isinstance(value, NoValue) else "a tensor"
        raise TypeError(f"{node.where}: its {what} is {kind}; it must be a sequence")
    return value


def _position(node: Node, value: Any, low: int, high: int) -> int:
    """A position known while tracing, in ``[low, high]``, counted from the end when negative."""
    if np.size(value) != 1:
        raise ValueError(
            f"{node.where}: position of shape {list(np.shape(value))} must hold one element"
        )
    position = int(np.asarray(value).reshape(()))
    if not low <= position <= high:
        raise ValueError(f"{node.where}: position {position} is outside [{low}, {high}]")
    return position


# ----------------------------------------------------------------------------- sequences


@register("SequenceEmpty")
def _sequence_empty(node: Node) -> TensorSeq:
    """An empty sequence of ``dtype`` (default float)."""
    return TensorSeq((), tensor_dtype(int(node.get("dtype", 1)), f"{node.where}: dtype"))


@register("SequenceConstruct")
def _sequence_construct(node: Node, *inputs: Any) -> TensorSeq:
    """The sequence ``[inputs[0], ..., inputs[n-1]]``."""
    return TensorSeq(inputs)


@register("SequenceLength")
def _sequence_length(node: Node, seq: Any) -> np.ndarray:
    """``len(seq)``, an int64 scalar known while tracing."""
    return np.array(len(_sequence(node, seq)), np.int64)


@register("SequenceAt", prefer_static=(1,))
def _sequence_at(node: Node, seq: Any, position: Any) -> Any:
    """``seq[position]``, ``position`` in ``[-n, n)``.

    A position known only at run time needs elements of one shape (stacked, then
    indexed; a position outside the range fails after the run); with elements of
    different shapes it must be known while tracing (a Loop of a known trip count
    unrolls for that).
    """
    seq = _sequence(node, seq)
    n = len(seq)
    if is_static(position):
        return seq[_position(node, position, -n, n - 1)]
    if np.size(position) != 1:
        raise ValueError(
            f"{node.where}: position of shape {list(np.shape(position))} must hold one element"
        )
    if not n:
        raise ValueError(f"{node.where}: the sequence is empty: there is no element to take")
    shapes = {np.shape(v) for v in seq}
    if len(shapes) != 1:
        raise NotStaticError(
            f"{node.where}: its position depends on the values fed and the elements have "
            f"different shapes {sorted(map(list, shapes))}; XLA compiles static shapes, so the "
            "position must be known while tracing"
        )
    index = checked_indices(node, jnp.reshape(position, ()), n, "position")
    return jnp.stack([jnp.asarray(v) for v in seq])[index]


@register("SequenceInsert", static=(2,))
def _sequence_insert(node: Node, seq: Any, tensor: Any, position: Any = None) -> TensorSeq:
    """``seq`` with ``tensor`` inserted before ``position`` in ``[-n, n]`` (default: at the end)."""
    seq = _sequence(node, seq)
    n = len(seq)
    if seq.elem_dtype is not None and canonical(tensor.dtype) != seq.elem_dtype:
        raise TypeError(
            f"{node.where}: the tensor is {np.dtype(tensor.dtype)} but the sequence holds "
            f"{seq.elem_dtype}"
        )
    at = n if position is None else _position(node, position, -n, n)
    at = at + n if at < 0 else at
    return TensorSeq((*seq[:at], tensor, *seq[at:]), tensor.dtype)


@register("SequenceErase", static=(1,))
def _sequence_erase(node: Node, seq: Any, position: Any = None) -> TensorSeq:
    """``seq`` without the element at ``position`` (default: the last), in ``[-n, n)``."""
    seq = _sequence(node, seq)
    n = len(seq)
    if not n:
        raise ValueError(f"{node.where}: the sequence is empty: there is no element to erase")
    at = n - 1 if position is None else _position(node, position, -n, n - 1) % n
    return TensorSeq((*seq[:at], *seq[at + 1 :]), seq.elem_dtype)


@register("SplitToSequence", static=(1,))
def _split_to_sequence(node: Node, x: Any, split: Any = None) -> TensorSeq:
    """``x`` cut along ``axis`` into a sequence.

    ``split`` a scalar s: pieces of s (the last one the rest); a 1-D tensor: the
    pieces' lengths, summing to the axis; absent: pieces of 1, the axis kept or
    dropped by ``keepdims``.
    """
    rank = np.ndim(x)
    axis = norm_axis(int(node.get("axis", 0)), rank, node.where)
    dim = int(np.shape(x)[axis])
    if split is None:
        lengths = [1] * dim
    elif np.ndim(split) == 0:
        size = int(np.asarray(split))
        if size <= 0:
            raise ValueError(f"{node.where}: split {size} must be positive")
        lengths = [size] * (dim // size) + ([dim % size] if dim % size else [])
    elif np.ndim(split) == 1:
        lengths = int_list(split)
        if any(n < 0 for n in lengths) or sum(lengths) != dim:
            raise ValueError(
                f"{node.where}: split {lengths} must be lengths of at least 0 summing to {dim}, "
                f"the size of axis {axis}"
            )
    else:
        raise ValueError(f"{node.where}: split must be a scalar or a 1-D tensor")
    pieces = []
    start = 0
    for length in lengths:
        index = [slice(None)] * rank
        index[axis] = slice(start, start + length)
        piece = x[tuple(index)]
        if split is None and not int(node.get("keepdims", 1)):
            piece = xp_of(piece).squeeze(piece, axis)
        pieces.append(piece)
        start += length
    return TensorSeq(pieces, x.dtype)


def _joined(shape: list[int], axis: int, stack: bool) -> list[int]:
    """What must agree between elements joined on ``axis``: all of a stacked one's shape."""
    return shape if stack else [*shape[:axis], -1, *shape[axis + 1 :]]


@register("ConcatFromSequence")
def _concat_from_sequence(node: Node, seq: Any) -> Any:
    """The elements concatenated along ``axis`` (``new_axis``: stacked along a new one)."""
    seq = _sequence(node, seq)
    if not seq:
        raise ValueError(f"{node.where}: the sequence is empty: there is nothing to concatenate")
    stack = bool(int(node.get("new_axis", 0)))
    rank = np.ndim(seq[0])
    axis = norm_axis(int(node["axis"]), rank + stack, node.where)
    shapes = [list(np.shape(v)) for v in seq]
    if any(_joined(a, axis, stack) != _joined(shapes[0], axis, stack) for a in shapes):
        raise ValueError(
            f"{node.where}: elements of shapes {shapes} cannot be joined on axis {axis}"
        )
    total = len(seq) if stack else sum(s[axis] for s in shapes)
    out_shape = [*shapes[0][:axis], total, *shapes[0][axis + stack :]]
    check_size(node, out_shape, seq[0].dtype)
    xp = xp_of(*seq)
    return xp.stack(seq, axis) if stack else xp.concatenate(seq, axis)


def _sequence_map_check(node: Node) -> None:
    """The body takes the node's inputs and gives its outputs (as onnxruntime)."""
    check_signature(node, "body", len(node.inputs), node.n_outputs)


@register("SequenceMap", check=_sequence_map_check)
def _sequence_map(node: Node, seq: Any, *others: Any) -> tuple[TensorSeq, ...]:
    """``body`` applied to each position i of the sequences (tensors given whole), each
    output collected into a sequence.

    The body runs once per element while tracing (the elements may differ in
    shape); those runs count against ``limits=Limits(traced_nodes=...)``.
    """
    body = node["body"]
    inputs = (_sequence(node, seq), *others)
    # what the body is given: a sequence's elements (an empty one of its dtype stands for
    # them; an empty optional where that is not known), a tensor as it is
    check_inputs(
        node,
        "body",
        [
            (NoValue() if v.elem_dtype is None else np.zeros(0, v.elem_dtype))
            if isinstance(v, TensorSeq)
            else v
            for v in inputs
        ],
        shapes=False,  # onnxruntime does not compare the elements' shapes with the body's
    )
    if len(body.input_names) != len(inputs):
        raise ValueError(
            f"{node.where}: its body takes {len(body.input_names)} inputs, given {len(inputs)}"
        )
    lengths = {len(v) for v in inputs if isinstance(v, TensorSeq)}
    if len(lengths) != 1:
        raise ValueError(f"{node.where}: its sequences have different lengths {sorted(lengths)}")
    (n,) = lengths
    refused = spend_unrolled(body, n, nested=True)
    if refused is not None:
        raise ValueError(
            f"{node.where}: running its body of {body.work} nodes on {n} elements while "
            f"tracing is refused ({refused})"
        )
    found: list[list[Any]] = [[] for _ in body.output_names]
    for i in range(n):
        outs = body(*(v[i] if isinstance(v, TensorSeq) else v for v in inputs))
        check_outputs(node, "body", body, outs)
        for kept, out in zip(found, outs, strict=True):
            kept.append(out)
    dtypes = getattr(body, "output_dtypes", (None,) * len(found))
    return tuple(TensorSeq(kept, dtype) for kept, dtype in zip(found, dtypes, strict=True))


# ----------------------------------------------------------------------------- optionals


@register("Optional")
def _optional(node: Node, value: Any = None) -> Any:
    """The optional holding ``value``, or the empty one of ``type`` when it is absent."""
    if value is not None:
        return value
    kind = node.get("type")
    if kind is None:
        raise ValueError(f"{node.where}: without an input, the attribute type is required")
    return NoValue(type_text(kind))


@register("OptionalHasElement")
def _optional_has_element(node: Node, value: Any = None) -> np.ndarray:
    """Whether the optional holds a value (an absent input: false), known while tracing."""
    return np.array(value is not None and not isinstance(value, NoValue))


@register("OptionalGetElement")
def _optional_get_element(node: Node, value: Any) -> Any:
    """The value the optional holds (a tensor or sequence given as it is: itself)."""
    if isinstance(value, NoValue):
        raise ValueError(f"{node.where}: the optional is empty: it holds no element to get")
    return value
