"""Reading and writing ONNX optimizer nodes (needs the ``onnx`` package).

The operators' own descriptions (``registry.OPERATORS``) say what a node of each
holds: its variadic input groups, attributes and the op that runs it. The
backend, the importer and the exporter all go through :func:`read_node`, which
checks a ``NodeProto`` against that description and the ONNX schema (defaults,
required attributes, attribute types, input and output counts).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import onnx
from onnx import helper

from onnx_optax._src import checks
from onnx_optax._src.checks import check_choice
from onnx_optax._src.driver import Operator
from onnx_optax._src.onnx_tensors import utf8
from onnx_optax._src.registry import OPERATORS, operator_of

DOMAIN = "ai.onnx.preview.training"
OPSET_VERSION = 1


class UnsupportedOperatorError(NotImplementedError):
    """An ONNX node that onnx_optax cannot run or import."""


def unsupported(node: onnx.NodeProto, runs: str) -> UnsupportedOperatorError:
    """The error for a node of an op onnx_optax does not run; ``runs`` says what it does."""
    return UnsupportedOperatorError(
        f"{describe(node)}: unsupported op {node.op_type} in domain "
        f"'{node.domain or 'ai.onnx'}'; onnx_optax {runs}"
    )


# How many names an error lists, and how many characters of one name it shows: a
# message stays short whatever the model holds (a million inputs, a megabyte name).
LISTED = 5
SHOWN_CHARS = 200


def shown(name: str) -> str:
    """A name as a message shows it: cut to SHOWN_CHARS characters, its length said."""
    if len(name) <= SHOWN_CHARS:
        return name
    return f"{name[:SHOWN_CHARS]}... ({len(name):,} characters)"


def listed(names: Sequence[Any], first: int = LISTED) -> str:
    """``names`` as an error shows them: all of a few (as their repr), else how many
    and the first ``first`` (a list or a tuple: its own brackets when all are shown)."""
    if len(names) <= first:
        return repr(names)
    return f"{len(names):,} names, the first {first}: {list(names[:first])!r}"


def describe(node: onnx.NodeProto) -> str:
    """How errors name a node: its name (if any), op type and domain."""
    name = f"'{shown(node.name)}' " if node.name else ""
    domain = node.domain or "ai.onnx"
    return f"node {name}({shown(domain)}.{shown(node.op_type)})"


def schema_defaults(op_type: str) -> dict[str, Any]:
    """The attribute defaults of the ONNX schema (float32 values, as Python floats)."""
    schema = onnx.defs.get_schema(op_type, OPSET_VERSION, DOMAIN)
    return {
        name: helper.get_attribute_value(attribute.default_value)
        for name, attribute in schema.attributes.items()
        if attribute.default_value.type
    }


def attribute_type_error(node: onnx.NodeProto, attribute: onnx.AttributeProto, kind: int) -> str:
    """Why ``attribute`` of ``node`` is not of the declared type ``kind``; "" when it is."""
    if attribute.type == kind:
        return ""
    return (
        f"{describe(node)}: attribute '{attribute.name}' must be of type "
        f"{onnx.AttributeProto.AttributeType.Name(kind)}, got "
        f"{onnx.AttributeProto.AttributeType.Name(attribute.type)}"
    )


def attribute_values(transformation: Any) -> dict[str, Any]:
    """The ONNX attributes of a transformation: strings as they are, numbers as float32."""
    operator_of(transformation)
    values: dict[str, Any] = {}
    for name, value in transformation.hyperparameters._asdict().items():
        if isinstance(value, str):
            values[name] = value
            continue
        number = checks.scalar(value)
        if number is None:
            raise TypeError(f"attribute {name} is traced; ONNX attributes are constants")
        values[name] = float(np.float32(number))
    return values


def common_dtype(leaves: Sequence[Any]) -> np.dtype:
    """The one dtype of the tensors an optimizer node updates (ONNX types them alike)."""
    dtypes = {np.dtype(leaf.dtype) for leaf in leaves}
    if len(dtypes) != 1:
        raise TypeError(
            "ONNX optimizer tensors share one type, but the parameters have "
            f"{sorted(map(str, dtypes))}"
        )
    return dtypes.pop()


@dataclasses.dataclass(frozen=True)
class OptimizerNode:
    """A checked optimizer node: its operator, complete attributes and tensor names."""

    operator: Operator  # the operator's own description (registry.OPERATORS)
    attributes: Mapping[str, Any]  # every attribute, schema defaults filled in
    inputs: tuple[str, ...]  # R, T, then the variadic tensors in ONNX order
    outputs: tuple[str, ...]
    name: str
    description: str  # how errors name the node, as describe() does

    @property
    def state_groups(self) -> tuple[str, ...]:
        """The letters of the operator's state inputs, e.g. ``("V", "H")``."""
        return self.operator.groups[2:]

    @property
    def n_tensors(self) -> int:
        return (len(self.inputs) - 2) // len(self.operator.groups)

    def group(self, group: str) -> tuple[str, ...]:
        """The input names of one variadic group, e.g. ``group("X")``."""
        n, k = self.n_tensors, self.operator.groups.index(group)
        return self.inputs[2 + k * n : 2 + (k + 1) * n]

    def output_group(self, group: str) -> tuple[str, ...]:
        """The output names of X_new or of a state group's new values."""
        n = self.n_tensors
        k = 0 if group == "X" else 1 + self.state_groups.index(group)
        return self.outputs[k * n : (k + 1) * n]

    def run(self, R: Any, T: Any, *tensors: Any) -> tuple[jax.Array, ...]:
        """Runs the node's op on its inputs, in ONNX order."""
        return self.operator.op(R, T, *tensors, **self.attributes)


def read_node(node: onnx.NodeProto) -> OptimizerNode:
    """Checks an optimizer ``NodeProto`` and reads it; raises a clear error if it is not one."""
    if not isinstance(node, onnx.NodeProto):
        raise TypeError(f"expected an onnx.NodeProto, got {type(node).__name__}")
    where = describe(node)
    if node.domain != DOMAIN or node.op_type not in OPERATORS:
        raise unsupported(node, f"implements Adagrad, Adam and Momentum of '{DOMAIN}'")
    operator = OPERATORS[node.op_type]
    names = operator.attributes._fields
    attributes = schema_defaults(node.op_type)
    given = collections.Counter(attribute.name for attribute in node.attribute)
    repeated = sorted(name for name, count in given.items() if count > 1)
    if repeated:
        raise ValueError(f"{where}: attribute(s) {', '.join(repeated)} given more than once")
    for attribute in node.attribute:
        name = attribute.name
        if name not in names:
            raise ValueError(
                f"{where}: unknown attribute '{name}'; {node.op_type} has {', '.join(names)}"
            )
        expected = (
            onnx.AttributeProto.STRING if name in operator.choices else onnx.AttributeProto.FLOAT
        )
        wrong = attribute_type_error(node, attribute, expected)
        if wrong:
            raise TypeError(wrong)
        value = helper.get_attribute_value(attribute)
        attributes[name] = (
            utf8(value, f"{where}: attribute '{name}'") if isinstance(value, bytes) else value
        )
    missing = [name for name in names if name not in attributes]
    if missing:
        raise ValueError(
            f"{where}: missing required attribute(s) {', '.join(missing)} (the ONNX schema of "
            f"{node.op_type} has no default for them)"
        )
    for name, choices in operator.choices.items():
        check_choice(where, f"attribute {name}", attributes[name], choices)
    k = len(operator.groups)
    n_inputs = len(node.input)
    if n_inputs < 2 + k or (n_inputs - 2) % k:
        raise ValueError(
            f"{where}: has {n_inputs} inputs; {node.op_type} takes R, T and {k}*n tensors "
            f"({', '.join(operator.groups)} for each of n >= 1 tensors)"
        )
    n = (n_inputs - 2) // k
    expected_outputs = n * (k - 1)
    if len(node.output) != expected_outputs:
        raise ValueError(
            f"{where}: has {len(node.output)} outputs; with {n} optimized tensor(s) "
            f"{node.op_type} produces {expected_outputs} "
            f"({', '.join(g + '_new' for g in ('X', *operator.groups[2:]))} for each)"
        )
    if any(not name for name in [*node.input, *node.output]):
        raise ValueError(f"{where}: an input or output name is empty; none is optional")
    return OptimizerNode(
        operator=operator,
        attributes=attributes,
        inputs=tuple(node.input),
        outputs=tuple(node.output),
        name=node.name,
        description=where,
    )


def make_node(
    op_type: str,
    attributes: Mapping[str, Any],
    names: list[str],
    *,
    node_name: str = "",
) -> onnx.NodeProto:
    """An optimizer ``NodeProto`` for tensors ``names`` with conventional I/O names.

    Inputs are ``R``, ``T``, then ``<name>`` (X), ``<name>.grad`` (G) and
    ``<name>.<field>`` (the state field, e.g. ``w.v``); outputs ``<name>.new``
    and ``<name>.<field>.new``, all in ONNX order.
    """
    operator = OPERATORS[op_type]
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"tensor names must be distinct and non-empty, got {listed(list(names))}")
    inputs = ["R", "T", *names, *(f"{n}.grad" for n in names)]
    inputs += [f"{n}.{field}" for field in operator.fields for n in names]
    outputs = [f"{n}.new" for n in names]
    outputs += [f"{n}.{field}.new" for field in operator.fields for n in names]
    clashes = {"R", "T"} & set(names)
    if clashes:
        raise ValueError(f"tensor names {sorted(clashes)} clash with the inputs R and T")
    return helper.make_node(
        op_type,
        inputs,
        outputs,
        name=node_name or op_type.lower(),
        domain=DOMAIN,
        **dict(attributes),
    )
