"""Values at a graph's edge: feeds checked against what the graph declares (and
what JAX holds exactly), outputs given back in their declared types.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import onnx

from onnx_optax._src.onnx_nodes import describe, listed
from onnx_optax._src.onnx_tensors import (
    STRINGS_ADVICE,
    refuse_narrowing,
    tensor_dtype,
)
from onnx_optax._src.ops.sequence import feed_value


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


def refuse_strings(graph: Any, nodes: Sequence[Any]) -> None:
    """Refuses, by node, a string tensor that ``nodes`` read or compute (XLA holds none).

    The types are the declared ones: initializers, graph inputs and outputs, value_info
    (a sequence's or an optional's elements: tensors).
    """

    strings = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.STRING}
    for info in (*graph.input, *graph.output, *graph.value_info):
        if tensor_type(info.type).elem_type == onnx.TensorProto.STRING:  # sequences' too
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


def tensor_type(type_proto: Any) -> Any:
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


def feed_tensor(what: str, value: Any) -> Any:
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


def declared_output(name: str, out: Any, dtype: np.dtype | None, kind: str | None = None) -> Any:
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
        return [declared_output(f"{name}[{i}]", item, dtype) for i, item in enumerate(out)]
    if dtype is None or out is None or out.dtype == dtype:
        return out
    if np.issubdtype(dtype, np.integer) and out.dtype == jax.dtypes.canonicalize_dtype(dtype):
        return out.astype(dtype)
    raise TypeError(
        f"graph output '{name}' is declared {dtype} but the graph computes {out.dtype}; "
        "onnx_optax does not convert outputs (fix the declared type, or enable 64-bit JAX "
        "for double outputs)"
    )


def refuse_unknown(
    inputs: Mapping[str, Any], input_names: Sequence[str], initializer_inputs: Container[str]
) -> None:
    """Refuses feeds the graph does not take, instead of silently dropping them."""
    known = frozenset(input_names)  # membership: a set, not the tuple
    unknown = [name for name in inputs if name not in known]
    overriding = [name for name in unknown if name in initializer_inputs]
    others = [name for name in unknown if name not in initializer_inputs]
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
    raise ValueError(f"{'; '.join(reasons)}; the graph takes {listed(input_names)}")


def feed(
    name: str, value: Any, value_types: Mapping[str, Any], input_types: Mapping[str, Any]
) -> Any:
    """A fed value as the compiled graph takes it (a sequence: a TensorSeq of them),
    a tensor checked against its declared type (:func:`refuse_unlike_declared`)."""
    kind = value_types.get(name)
    if kind is not None:
        return feed_value(f"input '{name}'", value, kind, feed_tensor)
    what = f"input '{name}'"
    declared = input_types.get(name)
    if declared is None:
        return feed_tensor(what, value)
    # The declared type first (a float64 fed for float32 is that, not a want of x64),
    # unless no tensor XLA computes is fed (strings, objects): feed_tensor says so.
    tensor = value if isinstance(value, jax.Array) else as_array(what, value)
    if np.dtype(tensor.dtype).kind not in "OSU":  # ml_dtypes' (bfloat16, ...) are "V"
        refuse_unlike_declared(what, tensor, declared)
    return feed_tensor(what, tensor)


class Declared(NamedTuple):
    """What a graph declares of the values at its edge (see :func:`declared_types`)."""

    value_types: dict[str, Any]  # inputs of sequence or optional type: their TypeProto
    input_types: dict[str, Any]  # tensor inputs: the TypeProto.Tensor each feed must match
    output_dtypes: tuple[np.dtype | None, ...]  # per output: its declared dtype, else None
    output_kinds: tuple[str | None, ...]  # per output: tensor_type, sequence_type, ... or None


def declared_types(graph: Any, inputs: Container[str], output_names: Sequence[str]) -> Declared:
    """The declared types of the graph inputs fed (``inputs``) and of the outputs named."""
    declared = {
        o.name: tensor_type(o.type).elem_type for o in graph.output if tensor_type(o.type).elem_type
    }
    # Graph inputs of sequence or optional type, fed as lists or None (see feed).
    value_types = {
        i.name: i.type
        for i in graph.input
        if i.name in inputs and i.type.WhichOneof("value") in ("sequence_type", "optional_type")
    }
    output_dtypes = tuple(
        tensor_dtype(declared[n], f"graph output '{n}'") if n in declared else None
        for n in output_names
    )
    # Each output's declared kind (tensor_type, sequence_type, ...; None: undeclared).
    kinds = {o.name: o.type.WhichOneof("value") for o in graph.output}
    output_kinds = tuple(kinds.get(n) for n in output_names)
    # Tensor inputs' declared types, which each feed must match (see feed).
    input_types = {
        i.name: i.type.tensor_type
        for i in graph.input
        if i.name in inputs and i.type.WhichOneof("value") == "tensor_type"
    }
    return Declared(value_types, input_types, output_dtypes, output_kinds)
