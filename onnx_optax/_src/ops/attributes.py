"""Reading a node's attributes against its ONNX schema, with the defaults for the model's opset.

The graph reads every node's attributes here once (:func:`read_attributes`) and
hands them to the op as :class:`~onnx_optax._src.ops.registry.Node` attributes;
:func:`check_omitted_inputs` refuses an empty input name the schema does not
allow, and :func:`check_input_types` inputs whose types the schema's type
constraints do not allow (what ``onnx.checker`` leaves to ``full_check``).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from onnx_optax._src.onnx_tensors import read_tensor, tensor_dtype, utf8
from onnx_optax._src.ops.registry import Node, domain_of
from onnx_optax._src.ops.values import NoValue, TensorSeq, canonical, is_static


def node_schema(node: Any, opset: int, where: str) -> Any:
    """The node's ``OpSchema`` at ``opset`` (else its newest); "ai.onnx" is the default domain."""
    import onnx

    domain = domain_of(node)
    try:
        return onnx.defs.get_schema(node.op_type, opset, domain)
    except onnx.defs.SchemaError:
        pass
    try:
        return onnx.defs.get_schema(node.op_type, domain)
    except onnx.defs.SchemaError:
        raise NotImplementedError(
            f"{where}: ONNX defines no op {node.op_type} in domain '{domain or 'ai.onnx'}'"
        ) from None


def check_omitted_inputs(node: Any, opset: int, where: str) -> None:
    """Refuses an omitted input (an empty name) where the schema does not mark it optional."""
    import onnx

    formal = list(node_schema(node, opset, where).inputs)
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    for position, name in enumerate(node.input):
        if name:
            continue
        if not formal or formal[min(position, len(formal) - 1)].option != optional:
            raise ValueError(
                f"{where}: input {position} is omitted (an empty name), but {node.op_type} "
                "requires it; only inputs the ONNX schema marks optional may be left out"
            )


def read_attributes(node: Any, opset: int, where: str) -> dict[str, Any]:
    """The node's attributes by name, with the schema's defaults for ``opset`` filled in.

    Each attribute's type is checked against the schema; tensors are read with
    :func:`read_tensor`. An attribute the schema lacks is an error.
    """
    import onnx
    from onnx import helper

    schema = node_schema(node, opset, where)
    values: dict[str, Any] = {}
    for name, spec in schema.attributes.items():
        default = spec.default_value
        values[name] = _attribute_value(default, where) if default.type else None
    names = collections.Counter(attribute.name for attribute in node.attribute)
    repeated = sorted(name for name, count in names.items() if count > 1)
    if repeated:
        raise ValueError(f"{where}: attribute(s) {', '.join(repeated)} given more than once")
    for attribute in node.attribute:
        declared = schema.attributes.get(attribute.name)
        if declared is None:
            raise ValueError(
                f"{where}: unknown attribute '{attribute.name}' ({node.op_type} at opset {opset} "
                f"has {', '.join(schema.attributes) or 'none'})"
            )
        if attribute.ref_attr_name:
            raise ValueError(
                f"{where}: attribute '{attribute.name}' refers to a function attribute"
            )
        if attribute.type != declared.type:
            expected = onnx.AttributeProto.AttributeType.Name(declared.type)
            got = onnx.AttributeProto.AttributeType.Name(attribute.type)
            raise TypeError(f"{where}: attribute '{attribute.name}' must be {expected}, got {got}")
        values[attribute.name] = _attribute_value(attribute, where)
    missing = [
        name
        for name, spec in schema.attributes.items()
        if spec.required and values.get(name) is None
    ]
    if missing:
        raise ValueError(f"{where}: missing required attribute(s) {', '.join(missing)}")
    del helper
    return values


def _attribute_value(attribute: Any, where: str) -> Any:
    import onnx
    from onnx import helper

    kind = attribute.type
    if kind == onnx.AttributeProto.TENSOR:
        return read_tensor(attribute.t, f"{where} attribute '{attribute.name}'")
    if (
        kind == onnx.AttributeProto.GRAPH
    ):  # the graph makes it a callable (graph/steps.py's Subgraph)
        return attribute.g
    if kind == onnx.AttributeProto.GRAPHS:
        return list(attribute.graphs)
    if kind in (onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.TENSORS):
        return attribute  # refused by the op that would read it
    value = helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return utf8(value, f"{where}: attribute '{attribute.name}'")
    if kind == onnx.AttributeProto.STRINGS:
        return [utf8(v, f"{where}: attribute '{attribute.name}'") for v in value]
    if kind in (onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS):
        return list(value)
    return value


# A type a formal input allows: ("tensor", dtype), ("seq", element dtype), or
# ("optional", None) where it allows an empty optional; an optional holding a value
# is that value, so optional(tensor(float)) also allows ("tensor", float32).
_Kind = tuple[str, np.dtype | None]
# One formal input: its type parameter (or literal type), the types it allows (None: no
# type we could check), whether a variadic input binds its values to one type.
_Formal = tuple[str, frozenset[_Kind] | None, bool]


@functools.cache
def _formals(op_type: str, domain: str, opset: int) -> tuple[tuple[_Formal, ...], bool]:
    """The schema's formal inputs at ``opset``, and whether the last one is variadic."""
    import onnx

    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return (), False
    constraints = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    formals: list[_Formal] = []
    for formal in schema.inputs:
        allowed = constraints.get(formal.type_str, [formal.type_str])
        kinds = {k for text in allowed for k in _kinds_of(text)}
        formals.append(
            (formal.type_str, frozenset(kinds) if kinds else None, formal.is_homogeneous)
        )
    variadic = bool(formals) and (
        schema.inputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
    )
    return tuple(formals), variadic


def _kinds_of(text: str) -> list[_Kind]:
    """The kinds of value a schema type string allows: 'optional(seq(tensor(float)))' allows
    an empty optional and a sequence of float32."""
    if text.startswith("optional(") and text.endswith(")"):
        return [("optional", None), *_kinds_of(text[9:-1])]
    kind = "tensor"
    if text.startswith("seq(") and text.endswith(")"):
        kind, text = "seq", text[4:-1]
    dtype = _dtype_of(text)
    return [] if dtype is None else [(kind, dtype)]


def _dtype_of(text: str) -> np.dtype | None:
    """The dtype of a schema type string such as 'tensor(float)', if onnx_optax runs it."""
    import onnx

    if not (text.startswith("tensor(") and text.endswith(")")):
        return None  # maps, sparse tensors
    code = onnx.TensorProto.DataType.DESCRIPTOR.values_by_name.get(text[7:-1].upper())
    if code is None:
        return None
    try:
        return tensor_dtype(code.number, text)
    except (TypeError, ValueError):
        return None  # strings: refused where they are read


@functools.cache
def _held(kinds: frozenset[_Kind], x64: bool) -> frozenset[_Kind]:
    """The types as JAX holds them (without 64-bit JAX, int64 as int32, ...)."""
    del x64  # part of the key: what JAX holds depends on it
    return frozenset((k, None if d is None else canonical(d)) for k, d in kinds)


def _kind_text(kind: _Kind) -> str:
    """How messages write a kind: float32, seq(float32), an empty optional."""
    name, dtype = kind
    if name == "optional":
        return "an empty optional"
    return str(dtype) if name == "tensor" else f"seq({dtype})"


def _kind_of(value: Any) -> tuple[_Kind, bool] | None:
    """A value's kind and whether it is static (a sequence's dtype is as JAX holds it);
    None for a value whose type is not checked (an empty sequence of unknown type)."""
    if isinstance(value, NoValue):
        return ("optional", None), False
    if isinstance(value, TensorSeq):
        return None if value.elem_dtype is None else (("seq", value.elem_dtype), False)
    if not hasattr(value, "dtype"):
        return None
    static = is_static(value)
    return ("tensor", np.dtype(value.dtype) if static else canonical(value.dtype)), static


def check_input_types(node: Node, op_type: str, domain: str, inputs: Sequence[Any]) -> None:
    """Refuses inputs whose types the schema's type constraints do not allow at the node's opset.

    Each input's type (a tensor's dtype, a sequence's element dtype, an empty
    optional) must be one its type parameter allows, and the inputs sharing a type
    parameter must share one type, as onnxruntime checks when it loads a model. A
    static value (numpy) is compared by its own dtype; a traced one as JAX holds it
    (without 64-bit JAX an int64 computes as int32).
    """
    formals, variadic = _formals(op_type, domain, node.opset)
    x64 = bool(jax.config.read("jax_enable_x64"))
    bound: dict[str, tuple[int, Any, bool]] = {}
    for position, value in enumerate(inputs):
        found = None if value is None else _kind_of(value)
        if found is None:
            continue
        if position >= len(formals) and not variadic:
            return  # more inputs than the schema has (or no schema): the checker's to refuse
        param, allowed, homogeneous = formals[min(position, len(formals) - 1)]
        if allowed is None:
            continue
        kind, static = found
        stored = node.input_dtypes[position] if position < len(node.input_dtypes) else None
        if stored is not None and kind[0] == "tensor":  # an initializer: its stored dtype
            kind, static = ("tensor", stored), True
        if kind not in (allowed if static else _held(allowed, x64)):
            tensors_only = all(k == "tensor" for k, _ in allowed)
            if kind[0] == "optional":
                what = "no value (an empty optional)"
            elif tensors_only and kind[0] == "tensor":
                what = f"dtype {kind[1]}"
            else:
                what = f"type {_kind_text(kind)}"
            names = ", ".join(sorted(_kind_text(k) for k in allowed))
            raise TypeError(
                f"{node.where}: input {node.input_name(position)} has {what}; it must be one "
                f"of {names} ({param} of {op_type} at opset {node.opset})"
            )
        if not homogeneous or "(" in param or kind[0] != "tensor":
            continue  # each its own type, a literal type, or not a tensor
        first, other, other_static = bound.setdefault(param, (position, kind[1], static))
        differ = (
            other != kind[1] if static and other_static else canonical(other) != canonical(kind[1])
        )
        if differ:
            raise TypeError(
                f"{node.where}: inputs {node.input_name(first)} and {node.input_name(position)} "
                f"share the type {param} of {op_type}, but are {np.dtype(other)} and "
                f"{np.dtype(kind[1])}; ONNX converts no types implicitly (insert a Cast)"
            )
