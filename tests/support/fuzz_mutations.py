"""Mutations of an ONNX model for the fuzzer (``tests/support/fuzz_models.py``).

Each field mutation changes one thing of a parsed ``ModelProto`` in place and
returns what it did, in words; :func:`mutate_bytes` changes the serialized bytes.
Every choice is drawn from hypothesis' ``data``, so a failing example shrinks.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

Item = TypeVar("Item")
Slot = tuple[Any, Callable[[Any], None]]  # a name's current value and how to set it

DATA_TYPES = [*range(0, 27), -1, 99, 2**31 - 1]
DIMS = [0, 1, 2, 3, 4, 12, -1, -(2**63), 2**31, 2**40, 2**62, 2**63 - 1]
VERSIONS = [-1, 0, 1, 6, 7, 12, 13, 21, 22, 23, 99, 10**9, 2**63 - 1]
IR_VERSIONS = [-1, 0, 1, 3, 6, 7, 8, 10, 11, 12, 99, 10**9]
DOMAINS = ["", "ai.onnx", "ai.onnx.preview.training", "ai.onnx.ml", "com.microsoft", "x"]
OPS = ["MatMul", "Add", "Relu", "Identity", "Sub", "Mul", "ReduceMean", "Gradient", "Adagrad",
       "Adam", "Momentum", "Constant", "ConstantOfShape", "Expand", "Range", "Tile", "Reshape",
       "Cast", "Loop", "If", "Scan", "Softmax", "Gemm", "Conv", "Unknown", ""]  # fmt: skip
NAMES = ["", "x", "y", "t", "T", "R", "w1", "w", "T.next", "loss", "a/b", "../x", "é", "x" * 300]
ATTRIBUTES = ["alpha", "beta", "epsilon", "mode", "norm_coefficient", "norm_coefficient_post",
              "decay_factor", "to", "axis", "axes", "keepdims", "xs", "zs", "y", "value", ""]  # fmt: skip
SCALARS = [0, 1, -1, 2**31 - 1, 2**31, 2**63 - 1, -(2**63), 0.5, math.nan, math.inf, 1e30]
SCALAR_DTYPES = [np.int64, np.int32, np.float32, np.float64, np.float16, np.bool_, np.uint8]
TEXTS = ["0", "4", "8", "-4", "64", "x", "1e3", "99999999999999999999", ""]


def graphs(model: onnx.ModelProto) -> list[onnx.GraphProto]:
    """The main graph and every ``training_info`` graph."""
    found = [model.graph]
    for info in model.training_info:
        found += [info.initialization, info.algorithm]
    return found


def nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes of every graph, main graph first."""
    return [node for graph in graphs(model) for node in graph.node]


def _tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    found = [t for graph in graphs(model) for t in graph.initializer]
    for node in nodes(model):
        for attribute in node.attribute:
            if attribute.HasField("t"):
                found.append(attribute.t)
            found.extend(attribute.tensors)
    return found


def _pick(data: st.DataObject, items: list[Item], label: str) -> Item | None:
    if not items:
        return None
    return items[data.draw(st.integers(0, len(items) - 1), label=label)]


def _one(data: st.DataObject, choices: list[Item], label: str) -> Item:
    return data.draw(st.sampled_from(choices), label=label)


def tensor_type(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A tensor's ``data_type`` or ``dims``."""
    tensor = _pick(data, _tensors(model), "tensor")
    if tensor is None:
        return "no tensor"
    if data.draw(st.booleans(), label="dims, not data_type"):
        tensor.ClearField("dims")
        tensor.dims.extend(data.draw(st.lists(st.sampled_from(DIMS), max_size=4), label="dims"))
        return f"tensor {tensor.name!r}: dims = {list(tensor.dims)}"
    tensor.data_type = _one(data, DATA_TYPES, "data_type")
    return f"tensor {tensor.name!r}: data_type = {tensor.data_type}"


def tensor_data(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A tensor's stored values: ``raw_data`` of another length, or a typed field beside it."""
    tensor = _pick(data, _tensors(model), "tensor")
    if tensor is None:
        return "no tensor"
    field = _one(data, ["raw_data", "float_data", "int64_data", "int32_data", "string_data"], "f")
    if field == "raw_data":
        tensor.raw_data = data.draw(st.binary(max_size=40), label="raw_data")
    elif field == "float_data":
        tensor.float_data.extend(data.draw(st.lists(st.floats(width=32), max_size=5)))
    elif field == "int64_data":
        tensor.int64_data.extend(data.draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5)))
    elif field == "int32_data":
        tensor.int32_data.extend(data.draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5)))
    else:
        tensor.string_data.extend(data.draw(st.lists(st.binary(max_size=6), max_size=3)))
    if data.draw(st.booleans(), label="clear raw_data"):
        tensor.ClearField("raw_data")
    return f"tensor {tensor.name!r}: {field} changed -> {tensor}"


def tensor_external(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A tensor's data moved to an external file: inside, outside, absolute, broken."""
    tensor = _pick(data, _tensors(model), "tensor")
    if tensor is None:
        return "no tensor"
    tensor.data_location = TensorProto.EXTERNAL
    if data.draw(st.booleans(), label="clear raw_data"):
        tensor.ClearField("raw_data")
    del tensor.external_data[:]
    entries = [("location", _one(data, locations, "location"))]
    for key in ("offset", "length"):
        if data.draw(st.booleans(), label=key):
            entries.append((key, _one(data, TEXTS, key)))
    if data.draw(st.booleans(), label="odd key"):
        entries.append((_one(data, ["location", "checksum", "", "basepath"], "key"), "../x"))
    for key, value in entries:
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return f"tensor {tensor.name!r}: external data {entries}"


def tensor_value(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A stored scalar (T, R, the 1 of T + 1) replaced by another value, dtype and shape."""
    tensors = _tensors(model)
    tensor = _pick(data, [t for t in tensors if not t.dims] or tensors, "tensor")
    if tensor is None:
        return "no tensor"
    value = _one(data, SCALARS, "value")
    dtype = _one(data, SCALAR_DTYPES, "dtype")
    shape = _one(data, [(), (1,), (2,)], "shape")
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        array: np.ndarray = np.full(shape, np.array(value)).astype(dtype)
    tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
    return f"tensor {tensor.name!r} = {array!r}"


def value_info(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A graph input's or output's declared element type or shape."""
    values = [v for g in graphs(model) for v in (*g.input, *g.output, *g.value_info)]
    value = _pick(data, values, "value")
    if value is None:
        return "no value"
    kind = value.type.tensor_type
    change = _one(data, ["elem_type", "shape", "no type", "sequence"], "change")
    if change == "elem_type":
        kind.elem_type = _one(data, DATA_TYPES, "elem_type")
    elif change == "shape":
        kind.shape.ClearField("dim")
        dims = st.lists(st.sampled_from([*DIMS, "N", "", "M"]), max_size=4)
        for d in data.draw(dims, label="dims"):
            dim = kind.shape.dim.add()
            if isinstance(d, str):
                dim.dim_param = d
            else:
                dim.dim_value = d
    elif change == "no type":
        value.ClearField("type")
    else:
        value.type.sequence_type.elem_type.tensor_type.elem_type = TensorProto.FLOAT
    return f"value {value.name!r}: {change} -> {value.type}"


def _attribute_value(data: st.DataObject) -> Any:
    return data.draw(
        st.one_of(
            st.sampled_from([0, 1, -1, 2**63 - 1, 0.5, -1.0, math.nan, math.inf, 1e30]),
            st.sampled_from(["standard", "nesterov", "", "x", b"\xff\xfe"]),
            st.lists(st.sampled_from([0, -1, 2, 2**40]), min_size=1, max_size=3),
            st.lists(st.sampled_from(["x", "w1", "T", "", "nothing"]), min_size=1, max_size=3),
            st.just(helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 2.0])),
        ),
        label="attribute value",
    )


def attribute(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A node attribute's type or value changed, one added, repeated or removed."""
    node = _pick(data, nodes(model), "node")
    if node is None:
        return "no node"
    change = _one(data, ["type", "value", "add", "repeat", "remove"], "change")
    if change == "add" or not node.attribute:
        name = _one(data, ATTRIBUTES, "name")
        node.attribute.append(helper.make_attribute(name, _attribute_value(data)))
        return f"node {node.name or node.op_type!r}: attribute added -> {node.attribute[-1]}"
    index = data.draw(st.integers(0, len(node.attribute) - 1), label="attribute")
    attr = node.attribute[index]
    if change == "type":
        attr.type = _one(data, list(range(0, 15)), "type")  # protobuf refuses other values
    elif change == "value":
        new = helper.make_attribute(attr.name, _attribute_value(data))
        if data.draw(st.booleans(), label="keep the declared type"):
            new.type = attr.type
        attr.CopyFrom(new)
    elif change == "repeat":
        node.attribute.append(attr)
    else:
        del node.attribute[index]
    return f"node {node.name or node.op_type!r}: attribute {change} -> {list(node.attribute)}"


def _slots(model: onnx.ModelProto) -> list[Slot]:
    """Every place that holds a name: values, initializers, node inputs/outputs, bindings."""
    slots: list[Slot] = []

    def field(owner: Any, name: str) -> None:
        slots.append((getattr(owner, name), functools.partial(setattr, owner, name)))

    for graph in graphs(model):
        for value in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
            field(value, "name")
        for node in graph.node:
            for names in (node.input, node.output):
                for i in range(len(names)):
                    slots.append((names[i], functools.partial(names.__setitem__, i)))
    for info in model.training_info:
        for entry in (*info.update_binding, *info.initialization_binding):
            field(entry, "key")
            field(entry, "value")
    return slots


def rename(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A name changed in one place or everywhere (non-UTF-8 names: see mutate_bytes)."""
    slots = _slots(model)
    slot = _pick(data, slots, "slot")
    if slot is None:
        return "no name"
    old = slot[0]
    new = _one(data, [*NAMES, *sorted({s[0] for s in slots})], "new name")
    everywhere = data.draw(st.booleans(), label="everywhere")
    for value, setter in slots if everywhere else [slot]:
        if value == old:
            setter(new)
    return f"name {old!r} -> {new!r}" + (" everywhere" if everywhere else " once")


def operator(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A node's ``op_type`` or ``domain``."""
    node = _pick(data, nodes(model), "node")
    if node is None:
        return "no node"
    old = (node.domain, node.op_type)
    if data.draw(st.booleans(), label="domain, not op_type"):
        node.domain = _one(data, DOMAINS, "domain")
    else:
        node.op_type = _one(data, OPS, "op_type")
    return f"node {old} -> {(node.domain, node.op_type)}"


def versions(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """The IR version, an opset's version or domain, an opset removed or added."""
    change = _one(data, ["ir_version", "version", "domain", "remove", "add"], "change")
    if change == "ir_version":
        model.ir_version = _one(data, IR_VERSIONS, "ir_version")
        return f"ir_version = {model.ir_version}"
    index = data.draw(st.integers(0, max(0, len(model.opset_import) - 1)), label="opset")
    if change == "add" or not model.opset_import:
        opset = model.opset_import.add()
        opset.domain = _one(data, DOMAINS, "domain")
    else:
        opset = model.opset_import[index]
    if change == "remove":
        del model.opset_import[index]
    elif change == "domain":
        opset.domain = _one(data, DOMAINS, "domain")
    else:
        opset.version = _one(data, VERSIONS, "version")
    return f"{change}: opset_import = {[(o.domain, o.version) for o in model.opset_import]}"


def binding(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A binding's key or value changed, one repeated, removed or added; a training_info repeated."""
    info = _pick(data, list(model.training_info), "training_info")
    if info is None:
        return "no training_info"
    change = _one(data, ["key", "value", "repeat", "remove", "add", "repeat info"], "change")
    if change == "repeat info":
        model.training_info.append(info)
        return "training_info repeated"
    field = _one(data, ["update_binding", "initialization_binding"], "field")
    entries = getattr(info, field)
    names = [*NAMES, *sorted({s[0] for s in _slots(model)})]
    if change == "add" or not entries:
        entry = entries.add()
        entry.key, entry.value = _one(data, names, "key"), _one(data, names, "value")
        return f"{field}: added {entry.key!r} = {entry.value!r}"
    index = data.draw(st.integers(0, len(entries) - 1), label="entry")
    if change == "key":
        entries[index].key = _one(data, names, "key")
    elif change == "value":
        entries[index].value = _one(data, names, "value")
    elif change == "repeat":
        entries.append(entries[index])
    else:
        del entries[index]
    return f"{field}: {change} -> {[(e.key, e.value) for e in entries]}"


def structure(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A node, input, output or initializer removed or repeated; a node's inputs changed."""
    graph = _one(data, graphs(model), "graph")
    part = _one(data, ["node", "input", "output", "initializer", "node input"], "part")
    if part == "node input":
        node = _pick(data, list(graph.node), "node")
        if node is None:
            return "no node"
        if data.draw(st.booleans(), label="add, not remove") or not node.input:
            node.input.append(_one(data, NAMES, "name"))
        else:
            del node.input[-1]
        return f"node {node.op_type}: inputs {list(node.input)}"
    items = getattr(graph, part)
    if not items:
        return f"no {part}"
    index = data.draw(st.integers(0, len(items) - 1), label=part)
    if data.draw(st.booleans(), label="repeat, not remove"):
        items.append(items[index])
        return f"graph {graph.name!r}: {part} {index} repeated"
    del items[index]
    return f"graph {graph.name!r}: {part} {index} removed"


def computed_size(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A node whose output size comes from stored values (a tiny file, a huge tensor), summed."""
    op = _one(data, ["ConstantOfShape", "Range", "Expand", "Tile", "Reshape"], "op")
    big = _one(data, [3, 0, -1, 2**16 + 1, 2**20, 2**31, 2**40, 2**62], "size")
    rank = data.draw(st.integers(1, 3), label="rank")
    shape = numpy_helper.from_array(np.full(rank, big, np.int64), "bomb.shape")
    x = numpy_helper.from_array(np.ones(1 if op == "Expand" else 2, np.float32), "bomb.x")
    if op == "Range":
        limit = _one(data, [1e12, 3e9, math.inf, -math.inf, math.nan, 5.0], "limit")
        delta = _one(data, [1.0, 1e-30, -1.0, 0.0, math.nan], "delta")
        values = [np.array(v, np.float32) for v in (0.0, limit, delta)]
        tensors = [numpy_helper.from_array(v, f"bomb.{i}") for i, v in enumerate(values)]
        inputs = [t.name for t in tensors]
    elif op == "ConstantOfShape":
        tensors, inputs = [shape], [shape.name]
    else:
        tensors, inputs = [x, shape], [x.name, shape.name]
    model.graph.initializer.extend(tensors)
    model.graph.node.extend(
        [
            helper.make_node(op, inputs, ["bomb"]),
            helper.make_node("ReduceSum", ["bomb"], ["bomb.sum"], keepdims=0),
        ]
    )
    model.graph.output.append(helper.make_tensor_value_info("bomb.sum", TensorProto.FLOAT, []))
    return f"{op}{tuple(inputs)} with {[numpy_helper.to_array(t).tolist() for t in tensors]}"


FIELD = [tensor_type, tensor_data, tensor_external, tensor_value, value_info, attribute, rename,
         operator, versions, binding, structure, computed_size]  # fmt: skip


def mutate_bytes(blob: bytes, model: onnx.ModelProto, data: st.DataObject) -> tuple[bytes, str]:
    """Bytes flipped, inserted, deleted or cut off, or a name made invalid UTF-8 in place."""
    change = _one(data, ["flip", "insert", "delete", "truncate", "non-utf8 name"], "byte change")
    if change == "non-utf8 name":
        names = sorted({s[0] for s in _slots(model) if isinstance(s[0], str) and 0 < len(s[0])})
        name = _pick(data, [n.encode() for n in names if len(n.encode()) < 128], "name")
        if name is None:
            return blob, "no name"
        bad = bytes([0xFF]) + name[1:]
        return blob.replace(
            bytes([len(name)]) + name, bytes([len(name)]) + bad
        ), f"{name!r} -> {bad!r}"
    if not blob:
        return blob, "empty"
    at = data.draw(st.integers(0, len(blob) - 1), label="position")
    if change == "flip":
        mask = data.draw(st.integers(1, 255), label="mask")
        return blob[:at] + bytes([blob[at] ^ mask]) + blob[at + 1 :], f"byte {at} ^= {mask}"
    if change == "insert":
        extra = data.draw(st.binary(min_size=1, max_size=8), label="inserted")
        return blob[:at] + extra + blob[at:], f"inserted {extra!r} at {at}"
    if change == "delete":
        size = data.draw(st.integers(1, 8), label="size")
        return blob[:at] + blob[at + size :], f"deleted bytes {at}..{at + size}"
    return blob[:at], f"truncated to {at} bytes"


# ----------------------------------------------------------------------------- op level
# Mutations that reach into the ops (onnx_optax/_src/ops): attribute values, widths,
# subgraphs, nested Gradients, constants of huge shapes, another op on the same inputs,
# another dtype for an op's stored operand.

INTS = [0, -1, -2, 1, 2, 3, 2**31 - 1, 2**31, 2**32 + 1, 2**62, 2**63 - 1, -(2**31), -(2**63)]
WIDTHS = [2, 17, 1023, 1024, 1025, 4096]  # op_width (Limits) is 1024
HUGE = [0, 1, 3, 2**8, 2**16, 2**20, 2**31, 2**33, 2**40, 2**62]
DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8, np.bool_]
TRAINING = "ai.onnx.preview.training"


def _opset(model: onnx.ModelProto, domain: str) -> int:
    domain = "" if domain == "ai.onnx" else domain
    found = [o.version for o in model.opset_import if (o.domain or "") == domain]
    return found[0] if found and 0 < found[0] < 10**4 else 21


def _schema(model: onnx.ModelProto, node: onnx.NodeProto) -> Any:
    """The node's schema at the model's opset (else its newest), or None."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    for args in ((node.op_type, _opset(model, domain), domain), (node.op_type, domain)):
        try:
            return onnx.defs.get_schema(*args)
        except (onnx.defs.SchemaError, TypeError):
            continue
    return None


def _graph_of(model: onnx.ModelProto, data: st.DataObject) -> onnx.GraphProto:
    """A graph with nodes (main or training_info), the main graph if none has."""
    return _pick(data, [g for g in graphs(model) if g.node], "graph") or model.graph


def _node_of(
    model: onnx.ModelProto, data: st.DataObject
) -> tuple[onnx.GraphProto, onnx.NodeProto] | None:
    graph = _graph_of(model, data)
    node = _pick(data, list(graph.node), "node")
    return None if node is None else (graph, node)


def _values(graph: onnx.GraphProto) -> list[str]:
    """Names a node of ``graph`` can read: inputs, initializers, node outputs."""
    names = [v.name for v in graph.input] + [t.name for t in graph.initializer]
    return [*names, *(o for node in graph.node for o in node.output if o)]


def _output(graph: onnx.GraphProto, name: str) -> None:
    """``name`` made a graph output, so it is computed; :func:`_typed` gives it a type."""
    value = graph.output.add()
    value.name = name


def _typed(model: onnx.ModelProto) -> None:
    """Outputs without a type get the one onnx infers, else float of unknown shape.

    The checker refuses an output without an element type and shape, and the
    graph one whose declared element type differs from what it computes.
    """
    inferred: dict[str, onnx.TypeProto] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = onnx.shape_inference.infer_shapes(model).graph
        inferred = {
            v.name: v.type
            for v in (*graph.value_info, *graph.output)
            if v.type.tensor_type.elem_type
        }
    except Exception:  # a model onnx cannot infer: float will do
        pass
    for graph in graphs(model):
        for value in graph.output:
            if not value.HasField("type"):
                if value.name in inferred:
                    value.type.CopyFrom(inferred[value.name])
                else:
                    value.type.tensor_type.elem_type = TensorProto.FLOAT
                    value.type.tensor_type.shape.dim.add().dim_param = "unknown"


def _int_attributes(model: onnx.ModelProto, node: onnx.NodeProto) -> dict[str, str]:
    """The node's int and ints attributes, set or in its schema: name -> "int" or "ints"."""
    schema = _schema(model, node)
    kinds = {onnx.defs.OpSchema.AttrType.INT: "int", onnx.defs.OpSchema.AttrType.INTS: "ints"}
    declared = {} if schema is None else schema.attributes
    found = {n: kinds[s.type] for n, s in declared.items() if s.type in kinds}
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.INT:
            found[attribute.name] = "int"
        elif attribute.type == onnx.AttributeProto.INTS:
            found[attribute.name] = "ints"
    return found


def int_attribute(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """An int or ints attribute (set or a schema default) 0, negative, huge; ints empty, too long."""
    node = _pick(data, [n for n in nodes(model) if _int_attributes(model, n)], "node")
    if node is None:
        return "no node with an int attribute"
    candidates = _int_attributes(model, node)
    name, kind = _one(data, sorted(candidates.items()), "attribute")
    value: Any
    old = [helper.get_attribute_value(a) for a in node.attribute if a.name == name]
    if kind == "int":
        value = _one(data, [v for v in INTS if [v] != old], "value")
    else:
        length = _one(data, [0, 1, 2, 3, 4, 5, 8, 17], "length")
        fill = _one(data, ["same", "each"], "fill")
        if fill == "same":
            value = [_one(data, INTS, "value")] * length
        else:
            value = [_one(data, INTS, "value") for _ in range(length)]
        if [value] == old:  # the attribute as it was: one more value
            value.append(-1)
    for index in reversed(range(len(node.attribute))):
        if node.attribute[index].name == name:
            del node.attribute[index]
    if kind == "ints":  # make_attribute cannot type an empty list
        attribute = helper.make_attribute(name, value, attr_type=onnx.AttributeProto.INTS)
    else:
        attribute = helper.make_attribute(name, value)
    node.attribute.append(attribute)
    return f"node {node.op_type}: {name} = {value}"


def wide_node(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A node with many inputs or outputs, near and over op_width: new, or one widened."""
    graph = _graph_of(model, data)
    width = _one(data, WIDTHS, "width")
    kind = _one(data, ["Concat", "Sum", "Max", "Mean", "Split", "widen inputs", "widen outputs"],
                "kind")  # fmt: skip
    if kind.startswith("widen"):
        node = _pick(data, list(graph.node), "node")
        if node is None:
            return "no node"
        if kind == "widen inputs":
            last = node.input[-1] if node.input else _one(data, _values(graph) or ["x"], "name")
            node.input.extend([last] * max(1, width - len(node.input)))
        else:
            base = node.output[0] if node.output else "wide"
            node.output.extend(
                f"{base}.{i}" for i in range(len(node.output), max(width, len(node.output) + 1))
            )
            _output(graph, node.output[-1])
            _typed(model)
        return f"node {node.op_type}: {len(node.input)} inputs, {len(node.output)} outputs"
    source = _pick(data, _values(graph), "source")
    if source is None:
        return "no value"
    if kind == "Split":
        outputs = [f"wide.{i}" for i in range(width)]
        node = helper.make_node("Split", [source], outputs, axis=0, num_outputs=width)
        _output(graph, outputs[0])
        _output(graph, outputs[-1])
    else:
        extra = {"axis": 0} if kind == "Concat" else {}
        node = helper.make_node(kind, [source] * width, ["wide"], **extra)
        _output(graph, "wide")
    graph.node.append(node)
    _typed(model)
    return f"{kind} of {source!r}, width {width}"


def _subgraph(name: str, nodes: list[onnx.NodeProto], inputs: list[str], outputs: list[str]) -> Any:
    """A body graph; its inputs and outputs float of unknown shape (a Loop's counter int64)."""

    def value(name: str) -> onnx.ValueInfoProto:
        elem = TensorProto.INT64 if name.endswith(".i") else TensorProto.FLOAT
        return helper.make_tensor_value_info(name, elem, None)

    return helper.make_graph(nodes, name, [value(n) for n in inputs], [value(n) for n in outputs])


def nest_subgraph(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A node moved into an If, Loop or Scan body, nested 1-3 deep; or a graph attribute added."""
    found = _node_of(model, data)
    if found is None:
        return "no node"
    graph, node = found
    kind = _one(data, ["If", "Loop", "Scan", "graph attribute"], "kind")
    if kind == "graph attribute":
        copy = onnx.NodeProto.FromString(node.SerializeToString())
        body = _subgraph("body", [copy], [], list(node.output))
        node.attribute.append(helper.make_attribute("body", body))
        return f"node {node.op_type}: a graph attribute 'body'"
    depth = data.draw(st.integers(1, 3), label="depth")
    index = list(graph.node).index(node)
    inner = onnx.NodeProto.FromString(node.SerializeToString())
    outputs = list(node.output)
    for level in range(depth):
        name = f"nest{level}"
        if kind == "If":
            graph.initializer.append(numpy_helper.from_array(np.array(True), f"{name}.cond"))
            body = _subgraph(f"{name}.then", [inner], [], outputs)
            inner = helper.make_node(
                "If", [f"{name}.cond"], outputs, then_branch=body, else_branch=body
            )
        elif kind == "Loop":
            graph.initializer.append(numpy_helper.from_array(np.array(2, np.int64), f"{name}.M"))
            identity = helper.make_node("Identity", [f"{name}.c"], [f"{name}.c_out"])
            body = _subgraph(f"{name}.body", [inner, identity], [f"{name}.i", f"{name}.c"],
                             [f"{name}.c_out", *outputs])  # fmt: skip
            inner = helper.make_node("Loop", [f"{name}.M", ""], outputs, body=body)
        else:
            reads = [i for i in inner.input if i]
            body = _subgraph(f"{name}.body", [inner], reads, outputs)
            inner = helper.make_node(
                "Scan", reads, outputs, body=body, num_scan_inputs=max(1, len(reads))
            )
    del graph.node[index]
    graph.node.insert(index, inner)
    return f"node {node.op_type} inside {depth} {kind}"


def nest_gradient(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A Gradient of a Gradient (1-4 levels) of an existing or new Gradient of a float output."""
    if not any(o.domain == TRAINING for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(TRAINING, 1))
    graph = _graph_of(model, data)
    gradients = [n for n in graph.node if n.op_type == "Gradient"]
    first = _pick(data, gradients, "gradient")
    if first is None:
        floats = [t.name for t in graph.initializer if t.data_type == TensorProto.FLOAT]
        xs = floats[:1] or [t.name for t in model.graph.initializer][:1]
        ys = [o for n in graph.node for o in n.output if o]
        if not xs or not ys:
            return "no tensor to differentiate"
        y = _one(data, ys, "y")
        first = helper.make_node("Gradient", xs, [f"{xs[0]}.g0"], domain=TRAINING, xs=xs, y=y)
        graph.node.append(first)
    xs = [helper.get_attribute_value(a) for a in first.attribute if a.name == "xs"]
    names = [x.decode() if isinstance(x, bytes) else x for x in (xs[0] if xs else [])]
    if not names or not first.output:
        return "a Gradient without xs or outputs"
    levels = data.draw(st.integers(1, 4), label="levels")
    reduce = data.draw(st.booleans(), label="reduce to a scalar")
    previous = first.output[0]
    for level in range(1, levels + 1):
        y = previous
        if reduce:
            y = f"{previous}.sum"
            graph.node.append(helper.make_node("ReduceSum", [previous], [y], keepdims=0))
        outputs = [f"{x}.g{level}" for x in names]
        graph.node.append(
            helper.make_node("Gradient", names, outputs, domain=TRAINING, xs=names, y=y)
        )
        previous = outputs[0]
    _output(graph, previous)
    _typed(model)
    return f"{levels} Gradient(s) of {first.output[0]!r} with respect to {names}"


def _folded(op: str, shape: list[int], data: st.DataObject) -> tuple[list[Any], str]:
    """Nodes computing a constant of ``shape`` by ``op`` while tracing; its name."""
    dims = numpy_helper.from_array(np.array(shape, np.int64), "fold.shape")
    if op == "Constant":  # the shape in a Constant node, the tensor from ConstantOfShape
        return [helper.make_node("Constant", [], ["fold.dims"], value=dims),
                helper.make_node("ConstantOfShape", ["fold.dims"], ["fold"])], "fold"  # fmt: skip
    if op == "ConstantOfShape":
        fill = numpy_helper.from_array(np.ones(1, _one(data, DTYPES, "dtype")), "value")
        return [
            dims,
            helper.make_node("ConstantOfShape", [dims.name], ["fold"], value=fill),
        ], "fold"
    if op == "Expand":
        one = numpy_helper.from_array(np.ones(1, _one(data, DTYPES, "dtype")), "fold.one")
        return [one, dims, helper.make_node("Expand", [one.name, dims.name], ["fold"])], "fold"
    limit = float(math.prod(shape)) if shape else 1.0
    dtype = _one(data, [np.float32, np.int64, np.int32], "dtype")
    with np.errstate(all="ignore"):
        bounds = [np.array(v).astype(dtype) for v in (0, min(limit, 2.0**62), 1)]
    tensors = [numpy_helper.from_array(v, f"fold.{i}") for i, v in enumerate(bounds)]
    return [*tensors, helper.make_node("Range", [t.name for t in tensors], ["fold"])], "fold"


def folded_operand(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A constant of a huge shape (Constant, ConstantOfShape, Expand, Range) fed to an op."""
    graph = _graph_of(model, data)
    op = _one(data, ["Constant", "ConstantOfShape", "Expand", "Range"], "source")
    rank = data.draw(st.integers(1, 3), label="rank")
    shape = [_one(data, HUGE, "dim") for _ in range(rank)]
    made, name = _folded(op, shape, data)
    consumer = _one(data, ["MatMul", "Gather", "Gather indices", "Concat", "Tile", "Pad",
                           "ReduceSum", "ReduceMax", "ReduceMean", "ArgMax", "Transpose"],
                    "consumer")  # fmt: skip
    big = _one(data, HUGE, "operand size")
    other = numpy_helper.from_array(np.array([big] * rank, np.int64), "fold.other")
    extra: list[Any] = [other]
    if consumer == "MatMul":
        use = helper.make_node("MatMul", [name, name], ["fold.out"])
    elif consumer == "Gather":
        use = helper.make_node("Gather", [name, other.name], ["fold.out"], axis=0)
    elif consumer == "Gather indices":
        small = numpy_helper.from_array(np.ones(4, np.float32), "fold.small")
        extra.append(small)
        cast = helper.make_node("Cast", [name], ["fold.index"], to=TensorProto.INT64)
        use = helper.make_node("Gather", [small.name, "fold.index"], ["fold.out"])
        extra.append(cast)
    elif consumer == "Concat":
        use = helper.make_node("Concat", [name, name, name], ["fold.out"], axis=0)
    elif consumer == "Tile":
        use = helper.make_node("Tile", [name, other.name], ["fold.out"])
    elif consumer == "Pad":
        pads = numpy_helper.from_array(np.array([big] * 2 * rank, np.int64), "fold.pads")
        extra = [pads]
        use = helper.make_node("Pad", [name, pads.name], ["fold.out"])
    elif consumer == "Transpose":
        use = helper.make_node("Transpose", [name], ["fold.out"])
    else:
        use = helper.make_node(consumer, [name], ["fold.out"], keepdims=0)
    for item in [*made, *extra]:
        if isinstance(item, onnx.TensorProto):
            graph.initializer.append(item)
        else:
            graph.node.append(item)
    graph.node.append(use)
    _output(graph, "fold.out")
    _typed(model)
    return f"{op} of shape {shape} -> {consumer} (operand {big})"


@functools.cache
def _registered() -> dict[str, list[str]]:
    """The registry's op types by domain ('' for ai.onnx)."""
    from onnx_optax._src.ops import REGISTRY

    return {domain: sorted(table) for domain, table in REGISTRY.items()}


@functools.cache
def _schemas(opset: int, ml_opset: int) -> list[tuple[str, str, Any]]:
    """(domain, op type, schema) of every registered op at the model's opsets."""
    from onnx_optax._src.ops import REGISTRY

    found = []
    for domain, table in sorted(REGISTRY.items()):
        for op in sorted(table):
            try:
                schema = onnx.defs.get_schema(op, opset if not domain else ml_opset, domain)
            except onnx.defs.SchemaError:
                continue
            found.append((domain, op, schema))
    return found


def swap_op(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A node's op type swapped for another registered op that takes as many inputs."""
    found = _node_of(model, data)
    if found is None:
        return "no node"
    node = found[1]
    old = ("" if node.domain == "ai.onnx" else node.domain, node.op_type)
    count = len(node.input)
    fits = [
        (domain, op, schema)
        for domain, op, schema in _schemas(_opset(model, ""), _opset(model, "ai.onnx.ml"))
        if schema.min_input <= count <= schema.max_input and (domain, op) != old
    ]
    if not fits:
        return f"no other op takes {count} inputs"
    domain, node.op_type, schema = _one(data, fits, "op")
    node.domain = domain
    if domain and not any(o.domain == domain for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(domain, 1))
    attributes = _one(data, ["keep", "drop", "known"], "attributes")
    kept = [a for a in node.attribute if attributes == "keep" or
            (attributes == "known" and a.name in schema.attributes)]  # fmt: skip
    del node.attribute[:]
    node.attribute.extend(kept)
    return f"node {old} -> {(domain, node.op_type)}, attributes {attributes}"


def retype_operand(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A stored operand (initializer, Constant value) an op reads cast to int, float or bool."""
    read = {name for node in nodes(model) for name in node.input}
    tensors = [t for t in _tensors(model) if t.name in read or not t.name]
    tensor = _pick(data, tensors or _tensors(model), "tensor")
    if tensor is None:
        return "no tensor"
    try:
        array = numpy_helper.to_array(tensor)
    except Exception:  # a tensor an earlier mutation broke: retype it by its declared type alone
        tensor.data_type = helper.np_dtype_to_tensor_dtype(np.dtype(_one(data, DTYPES, "dtype")))
        return f"tensor {tensor.name!r}: data_type = {tensor.data_type}"
    dtype = _one(data, [d for d in DTYPES if np.dtype(d) != array.dtype], "dtype")
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cast = array.astype(dtype)
    tensor.CopyFrom(numpy_helper.from_array(cast, tensor.name))
    return f"tensor {tensor.name!r}: {array.dtype} -> {cast.dtype}"


OP = [int_attribute, wide_node, nest_subgraph, nest_gradient, folded_operand, swap_op,
      retype_operand]  # fmt: skip
