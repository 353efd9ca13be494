"""Values at a graph's edge: feeds checked against what the graph declares (and
what JAX holds exactly), outputs given back in their declared types.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx

from onnx_optax._src.onnx_nodes import (
    describe,
)
from onnx_optax._src.onnx_tensors import (
    STRINGS_ADVICE,
    refuse_narrowing,
    tensor_dtype,
)


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
