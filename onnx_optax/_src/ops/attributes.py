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

import numpy as np

from onnx_optax._src.onnx_tensors import read_tensor, tensor_dtype, utf8
from onnx_optax._src.ops.arrays import _canonical, is_static
from onnx_optax._src.ops.registry import Node, domain_of


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
    if kind == onnx.AttributeProto.GRAPH:  # the graph makes it a callable (graph.Subgraph)
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


# One formal input: its type parameter (or literal type), the dtypes it allows (None:
# no tensor type we could check), whether a variadic input binds its values to one type.
_Formal = tuple[str, frozenset[np.dtype] | None, bool]


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
        dtypes = {d for d in map(_dtype_of, allowed) if d is not None}
        formals.append(
            (formal.type_str, frozenset(dtypes) if dtypes else None, formal.is_homogeneous)
        )
    variadic = bool(formals) and (
        schema.inputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
    )
    return tuple(formals), variadic


def _dtype_of(text: str) -> np.dtype | None:
    """The dtype of a schema type string such as 'tensor(float)', if onnx_optax runs it."""
    import onnx

    if not (text.startswith("tensor(") and text.endswith(")")):
        return None  # sequences, maps, optionals
    code = onnx.TensorProto.DataType.DESCRIPTOR.values_by_name.get(text[7:-1].upper())
    if code is None:
        return None
    try:
        return tensor_dtype(code.number, text)
    except (TypeError, ValueError):
        return None  # strings: refused where they are read


@functools.cache
def _held(dtypes: frozenset[np.dtype], x64: bool) -> frozenset[np.dtype]:
    """The dtypes as JAX holds them (without 64-bit JAX, int64 as int32, ...)."""
    del x64  # part of the key: what JAX holds depends on it
    return frozenset(_canonical(d) for d in dtypes)


def check_input_types(node: Node, op_type: str, domain: str, inputs: Sequence[Any]) -> None:
    """Refuses inputs whose dtypes the schema's type constraints do not allow at the node's opset.

    Each input's dtype must be one its type parameter allows, and the inputs
    sharing a type parameter must share one dtype, as onnxruntime checks when
    it loads a model. A static value (numpy) is compared by its own dtype; a
    traced one as JAX holds it (without 64-bit JAX an int64 computes as int32).
    """
    import jax

    formals, variadic = _formals(op_type, domain, node.opset)
    x64 = bool(jax.config.read("jax_enable_x64"))
    bound: dict[str, tuple[int, Any]] = {}
    for position, value in enumerate(inputs):
        if value is None or not hasattr(value, "dtype"):
            continue
        if position >= len(formals) and not variadic:
            return  # more inputs than the schema has (or no schema): the checker's to refuse
        param, allowed, homogeneous = formals[min(position, len(formals) - 1)]
        if allowed is None:
            continue
        static = is_static(value)
        dtype = np.dtype(value.dtype) if static else _canonical(value.dtype)
        if dtype not in (allowed if static else _held(allowed, x64)):
            names = ", ".join(sorted(str(d) for d in allowed))
            raise TypeError(
                f"{node.where}: input {node.input_name(position)} has dtype "
                f"{np.dtype(value.dtype)}; it must be one of {names} ({param} of {op_type} at "
                f"opset {node.opset})"
            )
        if not homogeneous or "(" in param:  # each its own type, or a literal type
            continue
        first, other = bound.setdefault(param, (position, value))
        differ = (
            np.dtype(other.dtype) != np.dtype(value.dtype)
            if static and is_static(other)
            else _canonical(other.dtype) != _canonical(value.dtype)
        )
        if differ:
            raise TypeError(
                f"{node.where}: inputs {node.input_name(first)} and {node.input_name(position)} "
                f"share the type {param} of {op_type}, but are {np.dtype(other.dtype)} and "
                f"{np.dtype(value.dtype)}; ONNX converts no types implicitly (insert a Cast)"
            )
