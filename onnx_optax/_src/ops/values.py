"""The values every op sees: tensors (static or traced), sequences and optionals.

A tensor is a numpy array while it is known while tracing (:func:`is_static`:
shapes, axes, constants) and a JAX array otherwise; :func:`canonical` is the
dtype JAX holds for one. A sequence is a :class:`TensorSeq`, a tuple of a length
known while tracing with its element dtype; an optional is the value it holds
or :class:`NoValue`, the empty one. Both are JAX pytrees, so a compiled graph
takes and returns them and control flow carries them. :class:`NotStaticError`
is what an op raises when an input it reads while tracing depends on the
values fed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

from onnx_optax._src.onnx_tensors import refuse_narrowing


def is_static(value: Any) -> bool:
    """Whether a value is known while tracing (a numpy array, not a JAX array)."""
    return isinstance(value, np.ndarray | np.generic)


def canonical(dtype: Any) -> np.dtype:
    """The dtype JAX holds for ``dtype`` (int64 -> int32 without 64-bit JAX)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(np.dtype(dtype)))


class NotStaticError(ValueError):
    """An input an op reads while tracing (a shape, axes, Slice's starts) depends on the
    values fed. A Loop of a known trip count catches it to unroll its body, so that the
    iteration number becomes known."""


class TensorSeq(tuple):
    """An ONNX sequence: its tensors (a length known while tracing) and their dtype.

    ``elem_dtype`` is the dtype JAX holds for the elements (None: an empty
    sequence of unknown type).
    """

    elem_dtype: np.dtype | None

    def __new__(cls, items: Iterable[Any], elem_dtype: Any = None) -> TensorSeq:
        seq = super().__new__(cls, items)
        if elem_dtype is None and seq:
            elem_dtype = seq[0].dtype
        seq.elem_dtype = None if elem_dtype is None else canonical(elem_dtype)
        return seq

    def __repr__(self) -> str:
        return f"TensorSeq({list(self)!r}, {self.elem_dtype})"


jax.tree_util.register_pytree_node(
    TensorSeq, lambda s: (tuple(s), s.elem_dtype), lambda dtype, items: TensorSeq(items, dtype)
)


@dataclasses.dataclass(frozen=True)
class NoValue:
    """The empty optional; ``type`` is what it would hold (``'seq(tensor(float))'``), if known."""

    type: str | None = None


jax.tree_util.register_pytree_node(NoValue, lambda v: ((), v.type), lambda t, _: NoValue(t))


def is_sequence_or_optional(value: Any) -> bool:
    """Whether a value is a sequence or an empty optional (no tensor)."""
    return isinstance(value, TensorSeq | NoValue)


def tensors(value: Any) -> tuple[Any, ...]:
    """The tensors a value holds: itself, a sequence's elements, none for an empty optional."""
    if isinstance(value, TensorSeq):
        return tuple(value)
    if value is None or isinstance(value, NoValue):
        return ()
    return (value,)


def type_text(type_proto: Any) -> str | None:
    """A TypeProto as the schemas write types (``'seq(tensor(float))'``); None if unknown."""
    import onnx

    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type" and type_proto.tensor_type.elem_type:
        name = onnx.TensorProto.DataType.Name(type_proto.tensor_type.elem_type)
        return f"tensor({name.lower()})"
    inner = None
    if kind == "sequence_type":
        inner = type_text(type_proto.sequence_type.elem_type)
        return None if inner is None else f"seq({inner})"
    if kind == "optional_type":
        inner = type_text(type_proto.optional_type.elem_type)
        return None if inner is None else f"optional({inner})"
    return None


def refuse_narrowing_in(what: str, value: Any) -> None:
    """``refuse_narrowing`` on each host tensor a value holds."""
    for i, item in enumerate(tensors(value)):
        if is_static(item):
            label = f"{what}[{i}]" if isinstance(value, TensorSeq) else what
            refuse_narrowing(label, item)
