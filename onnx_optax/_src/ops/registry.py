"""The one registry of ONNX ops: :class:`Op` and :class:`Node`, ``REGISTRY`` and ``find_op``.

A leaf of the ops package: it imports none of its modules (only the limits), so
every family, helper and the graph core can import it.

One registry, keyed by domain and then by op type (not by opset version):
``REGISTRY[""]["Relu"]``, also ``OPS["Relu"]`` (``OPS`` is the ``ai.onnx``
table), is an :class:`Op` whose ``fn(node, *inputs)`` follows the newest opset's
semantics and branches only where a newer opset changed them (``axes`` moving
from an attribute to an input, Softmax's axis, Pad's and Slice's old attribute
forms). Every family module of this package registers its ops here with
``guard.register`` (``register("Scaler", domain="ai.onnx.ml")`` in ``ml``);
importing the package (``onnx_optax._src.ops``) imports them all, so whoever
reads the registry sees every op. ``node`` is a :class:`Node`: the attributes by
name with the schema's defaults for the model's opset of the node's domain, the
opset itself and how errors name the node. Absent optional inputs arrive as ``None``.

Every registered function runs behind one guard (``guard.guarded``): its inputs'
types are matched against the schema's type constraints at the node's opset
(``Pad`` of an int32 tensor with a float ``constant_value`` is refused, never
cast), a host allocation that fails while the graph is traced (a tensor
within the size limit that this machine cannot hold) is a ``ValueError``
naming the node and the limit, as XLA's out-of-memory at run time is, and
numpy's floating-point warnings are silenced, as XLA computes without them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from onnx_optax._src.limits import MAX_TENSOR_BYTES

STANDARD_DOMAINS = ("", "ai.onnx")


@dataclasses.dataclass(frozen=True)
class Node:
    """What an op function knows of its node: attributes (defaults filled), opset, name."""

    attrs: Mapping[str, Any]
    opset: int
    where: str  # how errors name the node
    n_outputs: int
    max_bytes: int = MAX_TENSOR_BYTES  # the largest tensor the node may compute
    inputs: tuple[str, ...] = ()  # the input names, for messages
    outputs: tuple[str, ...] = ()  # the output names (unique in a graph: a random op's key)
    # Per input, the perm of the Transpose node of the same graph that computed it (()
    # for Transpose's default, the reversed axes), else None: an op may read such an
    # input in the Transpose's input's layout at no cost (XLA cancels the two transposes).
    input_perms: tuple[tuple[int, ...] | None, ...] = ()
    # Per input, the dtype it is stored in where it is an initializer of the graph, else
    # None: 32-bit JAX holds a float64 initializer as float32 while tracing, and the type
    # check (attributes.check_input_types) reads the stored one, as onnxruntime does.
    input_dtypes: tuple[np.dtype | None, ...] = ()

    def input_name(self, position: int) -> str:
        """How messages name input ``position``: its name, else its position."""
        name = self.inputs[position] if position < len(self.inputs) else ""
        return repr(name) if name else str(position)

    def __getitem__(self, name: str) -> Any:
        return self.attrs[name]

    def get(self, name: str, default: Any = None) -> Any:
        value = self.attrs.get(name)
        return default if value is None else value


@dataclasses.dataclass(frozen=True)
class Op:
    """One op type: its function, the input positions read at trace time, its checks."""

    fn: Callable[..., Any]
    static: tuple[int, ...] = ()  # inputs that must be known while tracing (shapes, axes)
    # Inputs better known while tracing (Loop's trip count and condition): a graph input
    # there is read as a compile-time value, as a shape is, though a traced one runs too.
    prefer_static: tuple[int, ...] = ()
    # Checks the attributes alone when the graph is prepared (before any input is seen).
    check: Callable[[Node], None] | None = None


# The one registry: domain ('' for ai.onnx) -> op type -> Op.
REGISTRY: dict[str, dict[str, Op]] = {"": {}}
OPS: dict[str, Op] = REGISTRY[""]  # the ai.onnx ops


def domain_of(node: Any) -> str:
    """A node's domain as the registry keys it ('' for ai.onnx, however written)."""
    return "" if node.domain in STANDARD_DOMAINS else node.domain


def find_op(node: Any) -> Op | None:
    """The registered op running ``node`` (by its domain and op type), if any."""
    return REGISTRY.get(domain_of(node), {}).get(node.op_type)
