"""One way in: every ONNX model a user hands to onnx_optax comes through :func:`load_model`.

Models come from strangers. A model given as a path, as bytes or as a
``ModelProto`` is checked against :class:`Limits` before anything large is
allocated, and its external data (in the main graph, in every
``training_info`` graph, in ``Constant`` and other tensor attributes, in
subgraphs and functions) is read only from inside the model's folder: an
absolute location, a ``..`` or a symbolic link that leaves the folder, an
offset or length outside the file or a length that does not match the
tensor's dims is refused with the tensor's name. Bytes and protos have no
folder: their external data is refused unless the caller names one
(``base_dir``). ``onnx.load`` itself leaves ``training_info``'s external data
unloaded and, given no folder, resolves locations against the working
directory; nothing here does either.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import onnx

from onnx_optax._src.onnx_tensors import tensor_dtype


class Limits(NamedTuple):
    """How large a model may be; raise one with ``limits=Limits(nodes=...)``."""

    nodes: int = 200_000  # nodes in all graphs together
    node_inputs: int = 100_000  # inputs of one node (an optimizer node: 3-4 per tensor)
    file_bytes: int = 2**31 - 1  # the serialized model (protobuf's own limit)
    tensor_bytes: int = 16 * 2**30  # declared bytes of all tensors together


DEFAULT_LIMITS = Limits()


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            for sub in attribute.graphs:
                yield from _graphs(sub)


def all_graphs(model: onnx.ModelProto) -> Iterator[onnx.GraphProto]:
    """The main graph, every ``training_info`` graph and their subgraphs."""
    yield from _graphs(model.graph)
    for info in model.training_info:
        yield from _graphs(info.initialization)
        yield from _graphs(info.algorithm)


def _tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    nodes: list[Any] = [n for f in model.functions for n in f.node]
    for graph in all_graphs(model):
        yield from graph.initializer
        nodes.extend(graph.node)
    for node in nodes:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield attribute.t
            yield from attribute.tensors


def _declared_bytes(tensor: onnx.TensorProto) -> int:
    dims = [int(d) for d in tensor.dims]
    if any(d < 0 for d in dims):
        raise ValueError(f"tensor '{tensor.name}' has negative dims {dims}")
    dtype = tensor_dtype(tensor.data_type, f"tensor '{tensor.name}'")
    return math.prod(dims) * dtype.itemsize


def _check_limits(model: onnx.ModelProto, limits: Limits) -> None:
    nodes = 0
    for graph in all_graphs(model):
        nodes += len(graph.node)
        for node in graph.node:
            if len(node.input) > limits.node_inputs:
                raise ValueError(
                    f"node '{node.name}' ({node.op_type}) has {len(node.input)} inputs, more than "
                    f"the limit of {limits.node_inputs}; raise it with "
                    "limits=Limits(node_inputs=...) if the model is yours"
                )
    if nodes > limits.nodes:
        raise ValueError(
            f"the model has {nodes} nodes, more than the limit of {limits.nodes}; raise it "
            "with limits=Limits(nodes=...) if the model is yours"
        )
    declared = sum(_declared_bytes(t) for t in _tensors(model))
    if declared > limits.tensor_bytes:
        raise ValueError(
            f"the model's tensors declare {declared} bytes, more than the limit of "
            f"{limits.tensor_bytes}; raise it with limits=Limits(tensor_bytes=...)"
        )


def _read_external(tensor: onnx.TensorProto, base_dir: Path | None) -> None:
    """Reads one tensor's external data from inside ``base_dir`` into ``raw_data``."""
    entries = {entry.key: entry.value for entry in tensor.external_data}
    location = entries.get("location", "")
    label = f"tensor '{tensor.name}' (external data '{location}')"
    if base_dir is None:
        raise ValueError(
            f"{label}: the model was given as bytes or a proto, so it has no folder to read "
            "external data from; pass base_dir= (the folder the model came from)"
        )
    root = base_dir.resolve()
    if not location or os.path.isabs(location):
        raise ValueError(f"{label}: the location must be a relative path inside the model's folder")
    path = (root / location).resolve()
    if root not in (path, *path.parents):
        raise ValueError(f"{label}: the location leaves the model's folder {str(root)!r}")
    if not path.is_file():
        raise ValueError(f"{label}: no such file in the model's folder")
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
    _check_limits(model, limits)
    external = [t for t in _tensors(model) if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        if model is source:
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            model = copy
            external = [t for t in _tensors(model) if t.data_location == onnx.TensorProto.EXTERNAL]
        folder = None if base_dir is None else Path(base_dir)
        for tensor in external:
            _read_external(tensor, folder)
    return model
