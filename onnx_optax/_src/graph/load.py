"""One way in: every ONNX model a user hands to onnx_optax comes through :func:`load_model`.

Models come from strangers. A model given as a path, as bytes or as a
``ModelProto`` is checked against :class:`Limits` before anything large is
allocated; every name and string in it must be UTF-8 (protobuf hands back
bytes otherwise, which would surface as opaque errors far away); an opset of
an onnx domain (ai.onnx, ai.onnx.ml, ai.onnx.preview.training), imported by
the model or one of its functions, must be one the installed onnx defines
(onnxruntime refuses newer ones too). Its external
data (in the main graph, in every ``training_info`` graph, in ``Constant`` and
other tensor attributes, in subgraphs and functions) is read only from inside
the model's folder: an absolute location, a ``..`` or a symbolic link that
leaves the folder, an offset or length outside the file or a length that does
not match the tensor's dims is refused with the tensor's name. Bytes and
protos have no folder: their external data is refused unless the caller names
one (``base_dir``). ``onnx.load`` itself leaves ``training_info``'s external
data unloaded and, given no folder, resolves locations against the working
directory; nothing here does either.

Nothing unused is read: an initializer with external data that no node of any
graph reads, no graph output or input names and no training binding writes is
checked (its location must still lie inside the folder) and then left out of
the loaded model, its file never opened.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import onnx

from onnx_optax._src.limits import DEFAULT_LIMITS, Limits
from onnx_optax._src.onnx_nodes import DOMAIN as TRAINING_DOMAIN
from onnx_optax._src.onnx_tensors import raw_byte_count, tensor_dtype, utf8

_ELEMENT_TYPES = frozenset(onnx.TensorProto.DataType.values())  # 0: not declared


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    todo = [graph]
    while todo:  # a stack, not recursion: subgraphs may nest deeply
        graph = todo.pop()
        yield graph
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    todo.append(attribute.g)
                todo.extend(attribute.graphs)


def all_graphs(model: onnx.ModelProto) -> Iterator[onnx.GraphProto]:
    """The main graph, every ``training_info`` graph and their subgraphs."""
    yield from _graphs(model.graph)
    for info in model.training_info:
        yield from _graphs(info.initialization)
        yield from _graphs(info.algorithm)


def _attribute_tensors(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.TensorProto]:
    for node in nodes:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield attribute.t
            yield from attribute.tensors


def _initializers(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)


def _tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    for graph in all_graphs(model):
        yield from _initializers(graph)
        yield from _attribute_tensors(graph.node)
    for function in model.functions:
        yield from _attribute_tensors(function.node)


def _declared_bytes(tensor: onnx.TensorProto) -> int:
    dims = tensor.dims
    if dims and min(dims) < 0:
        raise ValueError(f"tensor '{tensor.name}' has negative dims {list(dims)}")
    if tensor.data_type == onnx.TensorProto.STRING:  # refused where it is read, if it is
        return sum(len(s) for s in tensor.string_data)
    dtype = tensor_dtype(tensor.data_type, f"tensor '{tensor.name}'")
    return raw_byte_count(tensor.data_type, math.prod(dims), dtype)


# ----------------------------------------------------------------------------- names


def _text(where: str, what: str, values: Iterable[Any]) -> None:
    """Refuses a string field that protobuf handed back as bytes (it is not UTF-8)."""
    values = list(values)
    if bytes in map(type, values):
        utf8(next(v for v in values if isinstance(v, bytes)), f"{where}: {what}")


def check_node_text(node: onnx.NodeProto, where: str) -> None:
    """Refuses a node whose names or string attributes are not UTF-8."""
    _text(where, "a name, op type or domain", (node.name, node.op_type, node.domain, node.overload))
    where = f"{where} ({node.domain or 'ai.onnx'}.{node.op_type} '{node.name}')"
    _text(where, "an input name", node.input)
    _text(where, "an output name", node.output)
    for attribute in node.attribute:
        _text(
            where, "an attribute name", (attribute.name, attribute.ref_attr_name, attribute.t.name)
        )
        if attribute.type == onnx.AttributeProto.STRING:
            utf8(attribute.s, f"{where}: attribute '{attribute.name}'")
        for value in attribute.strings:
            utf8(value, f"{where}: attribute '{attribute.name}'")


def check_node_width(node: onnx.NodeProto, where: str, limits: Limits = DEFAULT_LIMITS) -> None:
    """Refuses a node with more inputs or outputs than the limits allow (before anything runs)."""
    inputs, outputs = len(node.input), len(node.output)
    width = max(inputs, outputs)
    if inputs > limits.node_inputs:
        limit, name = limits.node_inputs, "node_inputs"
    elif width > limits.op_width and node.domain != TRAINING_DOMAIN:
        limit, name = limits.op_width, "op_width"
    else:
        return
    raise ValueError(
        f"{where} ({node.op_type} '{node.name}') has {inputs} inputs and {outputs} outputs, "
        f"more than the limit of {limit}; raise it with limits=Limits({name}=...) if the model "
        "is yours"
    )


def _check_graph(graph: onnx.GraphProto, limits: Limits) -> None:
    where = "a graph" if isinstance(graph.name, bytes) else f"graph '{graph.name}'"
    _text(where, "its name", [graph.name])
    for kind, values in (("input", graph.input), ("output", graph.output)):
        for value in values:
            _text(where, f"a graph {kind} name", [value.name])
            elem = value.type.tensor_type.elem_type
            if elem not in _ELEMENT_TYPES:
                raise ValueError(
                    f"{where}: graph {kind} '{value.name}' declares an unknown ONNX element "
                    f"type {elem}"
                )
    _text(where, "a value_info name", [v.name for v in graph.value_info])
    names = [tensor.name for tensor in _initializers(graph)]
    _text(where, "an initializer name", names)
    if len(set(names)) != len(names):  # SSA: one tensor per name (onnxruntime refuses it)
        seen: set[str] = set()
        twice = next(n for n in names if n in seen or seen.add(n))  # type: ignore[func-returns-value]
        raise ValueError(f"{where}: the initializer '{twice}' is defined twice")
    for index, node in enumerate(graph.node):
        check_node_width(node, f"{where} node {index}", limits)
        check_node_text(node, f"{where} node {index}")


def _too_many_nodes(count: int, limits: Limits) -> ValueError:
    return ValueError(
        f"the model has {count} nodes, more than the limit of {limits.nodes}; raise it "
        "with limits=Limits(nodes=...) if the model is yours"
    )


@functools.cache
def _newest_opsets() -> dict[str, int]:
    """The newest version the installed onnx defines of each of its domains ('' for ai.onnx)."""
    newest = {"": onnx.defs.onnx_opset_version(), "ai.onnx.ml": onnx.defs.onnx_ml_opset_version()}
    for schema in onnx.defs.get_all_schemas_with_history():
        newest[schema.domain] = max(newest.get(schema.domain, 0), schema.since_version)
    return newest


def _check_opsets(where: str, opsets: Iterable[onnx.OperatorSetIdProto]) -> None:
    """Refuses an import of an onnx domain at a version the installed onnx does not define
    (onnxruntime refuses it too); custom domains are not judged here."""
    newest = _newest_opsets()
    for opset in opsets:
        domain = "" if opset.domain == "ai.onnx" else opset.domain
        if domain in newest and opset.version > newest[domain]:
            top, installed = newest[domain], f"the installed onnx {onnx.__version__}"
            defined = (
                f"only version 1 exists in {installed}"
                if top == 1
                else f"{installed} defines versions 1 to {top}"
            )
            raise ValueError(
                f"{where} imports '{opset.domain or 'ai.onnx'}' opset {opset.version}; {defined}"
            )


def _check_model(model: onnx.ModelProto, limits: Limits) -> None:
    """Limits first (the top-level graphs are counted before anything is walked), then text."""
    top = len(model.graph.node) + sum(
        len(info.initialization.node) + len(info.algorithm.node) for info in model.training_info
    )
    if top > limits.nodes:
        raise _too_many_nodes(top, limits)
    nodes = 0
    for graph in all_graphs(model):
        nodes += len(graph.node)
        if nodes > limits.nodes:
            raise _too_many_nodes(nodes, limits)
        _check_graph(graph, limits)
    for function in model.functions:
        where = f"function '{function.name}'"
        _text("a function", "its name or domain", (function.name, function.domain))
        _text(where, "an input or output name", [*function.input, *function.output])
        for index, node in enumerate(function.node):
            check_node_text(node, f"{where} node {index}")
    _text("the model", "an opset domain", [o.domain for o in model.opset_import])
    _check_opsets("the model", model.opset_import)
    for function in model.functions:
        _check_opsets(f"function '{function.name}'", function.opset_import)
    _text(
        "the model",
        "a metadata key or value",
        [v for p in model.metadata_props for v in (p.key, p.value)],
    )
    for index, info in enumerate(model.training_info):
        for binding in (info.initialization_binding, info.update_binding):
            _text(
                f"training_info[{index}]",
                "a binding",
                [v for e in binding for v in (e.key, e.value)],
            )
    declared = sum(_declared_bytes(t) for t in _tensors(model))
    if declared > limits.tensor_bytes:
        raise ValueError(
            f"the model's tensors declare {declared} bytes, more than the limit of "
            f"{limits.tensor_bytes}; raise it with limits=Limits(tensor_bytes=...)"
        )


# ----------------------------------------------------------------------------- external data


def _used_names(model: onnx.ModelProto) -> set[str]:
    """Every name a node reads, a graph takes or gives, or a training binding names."""
    names: set[str] = set()
    for graph in all_graphs(model):
        for node in graph.node:
            names.update(node.input)
        names.update(v.name for v in graph.input)
        names.update(v.name for v in graph.output)
    for info in model.training_info:
        for entry in (*info.initialization_binding, *info.update_binding):
            names.update((entry.key, entry.value))
    return names


def _external_path(tensor: onnx.TensorProto, base_dir: Path | None) -> tuple[Path, str]:
    """The file of a tensor's external data, checked to lie inside ``base_dir``; its label."""
    entries = {entry.key: entry.value for entry in tensor.external_data}
    location = entries.get("location", "")
    label = f"tensor '{tensor.name}' (external data '{location}')"
    _text(
        label, "an external data entry", [v for e in tensor.external_data for v in (e.key, e.value)]
    )
    if base_dir is None:
        raise ValueError(
            f"{label}: the model was given as bytes or a proto, so it has no folder to read "
            "external data from; pass base_dir= (the folder the model came from)"
        )
    root = base_dir.resolve()
    if "\x00" in location:
        raise ValueError(f"{label}: the location contains a NUL character; it is no file name")
    if not location or os.path.isabs(location):
        raise ValueError(f"{label}: the location must be a relative path inside the model's folder")
    path = (root / location).resolve()
    if root not in (path, *path.parents):
        raise ValueError(f"{label}: the location leaves the model's folder {str(root)!r}")
    return path, label


def _read_external(tensor: onnx.TensorProto, path: Path, label: str) -> None:
    """Reads one tensor's external data (its path checked) into ``raw_data``."""
    if not path.is_file():
        raise ValueError(f"{label}: no such file in the model's folder")
    entries = {entry.key: entry.value for entry in tensor.external_data}
    expected = _declared_bytes(tensor)
    try:
        offset = int(entries.get("offset", 0))
        length = int(entries.get("length", expected))
    except ValueError:
        raise ValueError(f"{label}: offset and length must be integers") from None
    if length != expected:
        raise ValueError(f"{label}: length {length} does not match its dims ({expected} bytes)")
    size = path.stat().st_size
    if offset < 0 or offset + length > size:
        raise ValueError(
            f"{label}: bytes {offset}..{offset + length} lie outside the file ({size} bytes); "
            "it is truncated or the offset is wrong"
        )
    with path.open("rb") as file:
        file.seek(offset)
        tensor.raw_data = file.read(length)
    tensor.data_location = onnx.TensorProto.DEFAULT
    del tensor.external_data[:]


def _is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _resolve_external(model: onnx.ModelProto, base_dir: Path | None) -> None:
    """Checks every external reference; reads the used ones, leaves the unused out."""
    used = _used_names(model)
    for graph in all_graphs(model):
        unused = [t for t in graph.initializer if _is_external(t) and t.name not in used]
        for tensor in unused:
            _external_path(tensor, base_dir)
        if unused:  # move them to the end (a stable sort), then cut them off
            graph.initializer.sort(key=lambda t: _is_external(t) and t.name not in used)
            del graph.initializer[len(graph.initializer) - len(unused) :]
    for tensor in _tensors(model):
        if _is_external(tensor):
            _read_external(tensor, *_external_path(tensor, base_dir))


def load_model(
    source: Any, *, base_dir: str | os.PathLike[str] | None = None, limits: Limits = DEFAULT_LIMITS
) -> onnx.ModelProto:
    """A model from a path, bytes or a ``ModelProto``, checked and with its external data read.

    A path's folder is its ``base_dir``. The caller's proto is never changed: a
    proto with external data is copied before the data is read into it.
    """
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"no ONNX model at {str(path)!r}")
        if path.stat().st_size > limits.file_bytes:
            raise ValueError(
                f"{str(path)!r} has {path.stat().st_size} bytes, more than the limit of "
                f"{limits.file_bytes}; raise it with limits=Limits(file_bytes=...)"
            )
        base_dir = path.parent if base_dir is None else base_dir
        source = path.read_bytes()
    if isinstance(source, bytes | bytearray | memoryview):
        if len(source) > limits.file_bytes:
            raise ValueError(f"the model has {len(source)} bytes, more than {limits.file_bytes}")
        model = onnx.ModelProto()
        try:
            model.ParseFromString(bytes(source))
        except Exception as error:  # protobuf's DecodeError and friends
            raise ValueError(f"not an ONNX model: {error}") from None
    elif isinstance(source, onnx.ModelProto):
        model = source
    else:
        raise TypeError(
            f"expected an onnx.ModelProto, bytes or a path, got {type(source).__name__}"
        )
    _check_model(model, limits)
    if any(_is_external(t) for t in _tensors(model)):
        if model is source:
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            model = copy
        _resolve_external(model, None if base_dir is None else Path(base_dir))
    return model
