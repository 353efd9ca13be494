"""Reading a node's attributes against its ONNX schema, with the defaults for the model's opset.

The graph reads every node's attributes here once (:func:`read_attributes`) and
hands them to the op as :class:`~onnx_optax._src.ops.registry.Node` attributes;
:func:`check_omitted_inputs` refuses an empty input name the schema does not
allow.
"""

from __future__ import annotations

import collections
from typing import Any

from onnx_optax._src.onnx_tensors import read_tensor, utf8
from onnx_optax._src.ops.registry import domain_of


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
    if kind in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        raise ValueError(f"{where}: attribute '{attribute.name}' holds a subgraph (not supported)")
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
