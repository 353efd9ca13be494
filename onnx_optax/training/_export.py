"""What leaves a session: a model file (with external data above 2 GiB), the inference model."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import BinaryIO

import numpy as np
import onnx
from onnx import numpy_helper

from onnx_optax._src.graph.load import all_graphs
from onnx_optax._src.onnx_nodes import DOMAIN
from onnx_optax._src.onnx_tensors import read_tensor, tensor_dtype
from onnx_optax._src.write import check_destination, write_files

# ----------------------------------------------------------------------------- writing

# protobuf refuses to serialize a message of 2 GiB or more.
PROTOBUF_LIMIT = 2**31 - 1
# When a model is written with external data, tensors of at least this many bytes go there.
EXTERNAL_THRESHOLD = 1024
# Element types whose raw_data is not one whole number of bytes per element (or no raw_data).
_NOT_BYTES = {
    getattr(onnx.TensorProto, name)
    for name in ("UNDEFINED", "STRING", "INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(onnx.TensorProto, name)
}


def _tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor the model holds: initializers and tensor attributes, in every graph."""
    nodes = [n for f in model.functions for n in f.node]
    for graph in all_graphs(model):
        yield from graph.initializer
        nodes.extend(graph.node)
    for node in nodes:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield attribute.t
            yield from attribute.tensors


def _byte_length(tensor: onnx.TensorProto) -> int | None:
    """Bytes of the tensor's data as raw_data, or None for types not stored a byte per element."""
    if tensor.data_type in _NOT_BYTES:
        return None
    return math.prod(tensor.dims) * tensor_dtype(tensor.data_type, tensor.name).itemsize


def _field_bytes(length: int) -> int:
    """Bytes of one length-delimited protobuf field (tag below 16) holding ``length`` bytes."""
    return 1 + max(1, (length.bit_length() + 6) // 7) + length


def serialized_bytes(model: onnx.ModelProto) -> int:
    """How many bytes ``model`` takes as one protobuf, its external data read in.

    Computed from the declared dims of the tensors kept outside, never by
    reading them (within a few bytes a tensor: the lengths of the messages that
    hold it grow too). protobuf cannot measure a message above 2 GiB itself.
    """
    size = model.ByteSize()
    for tensor in _tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            size += _field_bytes(_byte_length(tensor) or 0) - 2  # raw_data for data_location
            size -= sum(_field_bytes(e.ByteSize()) for e in tensor.external_data)
    return size


def _bytes(source: Callable[[], np.ndarray]) -> memoryview:
    """An array fetched now as a tensor's raw_data (little-endian, as ONNX stores)."""
    array = np.asarray(source())
    return (
        np.ascontiguousarray(array, array.dtype.newbyteorder("<")).reshape(-1).view(np.uint8).data
    )


def save_model(
    model: onnx.ModelProto,
    path: str | os.PathLike[str],
    external_data: bool | None,
    arrays: Mapping[str, Callable[[], np.ndarray]],
) -> None:
    """Writes ``model`` (consumed: its tensors are changed) to ``path``.

    ``arrays`` gives the values of the main graph's initializers that hold no
    data in ``model``, each fetched only when it is written. With
    ``external_data`` (None: when the model would exceed protobuf's 2 GiB),
    every tensor of at least ``EXTERNAL_THRESHOLD`` bytes is written to
    ``<file name>.data`` in the same folder, at offsets the ``.onnx`` file records.

    Both files go through :func:`onnx_optax._src.write.write_files`: each is
    written new and renamed into place (the data file first), never through
    a symbolic link, and a failure leaves the previous files as they were.
    """
    path = check_destination(path, "the model")
    location = f"{path.name}.data"
    # What goes to the data file: each tensor and where its bytes come from (an array
    # fetched when written, or the tensor's own raw_data, read when written): nothing is
    # read or copied before it is written, one tensor at a time.
    outside: list[tuple[onnx.TensorProto, Callable[[], np.ndarray] | None]] = []
    for tensor in model.graph.initializer:
        if tensor.name in arrays:
            if (_byte_length(tensor) or 0) >= EXTERNAL_THRESHOLD:
                outside.append((tensor, arrays[tensor.name]))
            else:
                tensor.CopyFrom(numpy_helper.from_array(arrays[tensor.name](), tensor.name))
    for tensor in _tensors(model):
        length = _byte_length(tensor)
        if (
            tensor.name in arrays
            or tensor.data_location == onnx.TensorProto.EXTERNAL
            or (length or 0) < EXTERNAL_THRESHOLD
        ):
            continue
        if not tensor.HasField("raw_data"):
            array = read_tensor(tensor, "model tensor")
            tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
        outside.append((tensor, None))
    lengths = [_byte_length(tensor) or 0 for tensor, _ in outside]
    if external_data is None:
        # The declared bytes first: protobuf (upb) measures a message by serializing it,
        # and refuses to above 2 GiB.
        external_data = sum(lengths) > PROTOBUF_LIMIT or _size(model, arrays) > PROTOBUF_LIMIT
    if not external_data:
        size = _size(model, arrays)
        if size > PROTOBUF_LIMIT:
            raise ValueError(
                f"the model takes {size} bytes, more than protobuf's limit of {PROTOBUF_LIMIT}; "
                "save it with external_data=True (or None, the default)"
            )
        for tensor, source in outside:
            if source is not None:
                tensor.raw_data = bytes(_bytes(source))
        write_files([(path, model.SerializeToString())], what="the model")
        return

    def write_data(file: BinaryIO) -> None:
        for (tensor, source), length in zip(outside, lengths, strict=True):
            written = file.write(_bytes(source) if source is not None else tensor.raw_data)
            if written != length:  # the offsets the model records would be wrong
                raise ValueError(
                    f"tensor '{tensor.name}' gave {written} bytes for external data, "
                    f"its dims declare {length}"
                )

    def write_model(file: BinaryIO) -> None:
        # After the data (each tensor's raw_data was read from the model while written).
        offset = 0
        for (tensor, _), length in zip(outside, lengths, strict=True):
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            del tensor.external_data[:]
            for key, value in (("location", location), ("offset", offset), ("length", length)):
                tensor.external_data.add(key=key, value=str(value))
            offset += length
        file.write(model.SerializeToString())

    # Both new files are written in full (the data first), then renamed (the data first).
    write_files([(path.parent / location, write_data), (path, write_model)], what="the model")


def _size(model: onnx.ModelProto, arrays: Mapping[str, Callable[[], np.ndarray]]) -> int:
    """The serialized bytes of ``model`` with the values of ``arrays`` in their tensors."""
    added = 0
    for tensor in model.graph.initializer:
        if tensor.name in arrays and not tensor.HasField("raw_data"):
            added += _field_bytes(_byte_length(tensor) or 0)
    return serialized_bytes(model) + added


# ----------------------------------------------------------------------------- inference


def _nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """``nodes`` and the nodes of their subgraphs."""
    for node in nodes:
        yield node
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.HasField("g") else []:
                yield from _nodes(sub.node)
            for sub in attribute.graphs:
                yield from _nodes(sub.node)


def strip_training(model: onnx.ModelProto) -> None:
    """Removes ``training_info`` and everything only it used, in place.

    That is: initializers no node, graph input or output of the inference graph
    reads (optimizer state, T, ...), local functions only the training graphs
    call, and opset imports only they needed (the training domain).
    """
    training_domains = {DOMAIN}
    for info in model.training_info:
        training_domains |= {
            n.domain for g in (info.initialization, info.algorithm) for n in _nodes(g.node)
        }
    del model.training_info[:]
    graph = model.graph
    nodes = list(_nodes(graph.node))
    functions = {(f.domain, f.name, getattr(f, "overload", "")): f for f in model.functions}
    called: set[tuple[str, str, str]] = set()
    todo = list(nodes)
    while todo:
        node = todo.pop()
        key = (node.domain, node.op_type, getattr(node, "overload", ""))
        if key in functions and key not in called:
            called.add(key)
            todo.extend(_nodes(functions[key].node))
    for index in reversed(range(len(model.functions))):
        f = model.functions[index]
        if (f.domain, f.name, getattr(f, "overload", "")) not in called:
            del model.functions[index]
    read = {name for node in nodes for name in (*node.input, *node.output)}
    read |= {v.name for v in (*graph.input, *graph.output)}
    for index in reversed(range(len(graph.initializer))):
        if graph.initializer[index].name not in read:
            del graph.initializer[index]
    for index in reversed(range(len(graph.value_info))):
        if graph.value_info[index].name not in read:
            del graph.value_info[index]
    used = {n.domain for n in nodes} | {n.domain for f in model.functions for n in _nodes(f.node)}
    used |= {f.domain for f in model.functions}
    for index in reversed(range(len(model.opset_import))):
        domain = model.opset_import[index].domain
        if domain in training_domains - used - {"", "ai.onnx"}:
            del model.opset_import[index]


def fold_casts(model: onnx.ModelProto, trained: Collection[str]) -> None:
    """Each ``Cast`` of a trained initializer that nothing else reads, computed once, in place.

    A master weight (``attach(master_dtype=...)``) is a wider initializer the
    inference graph reads through a Cast to the weight's own dtype: the
    inference model gets the cast value under the Cast's output name, the
    weight's original name, and neither the wider copy nor the Cast.
    """
    graph = model.graph
    readers: dict[str, int] = {}
    for node in _nodes(graph.node):
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    for value in graph.output:
        readers[value.name] = readers.get(value.name, 0) + 1
    position = {init.name: i for i, init in enumerate(graph.initializer)}
    kept = []
    for node in graph.node:
        source = node.input[0] if len(node.input) == 1 else ""
        if (
            node.op_type == "Cast"
            and node.domain in ("", "ai.onnx")
            and source in trained
            and source in position
            and readers.get(source) == 1
        ):
            to = next(a.i for a in node.attribute if a.name == "to")
            init = graph.initializer[position[source]]
            value = read_tensor(init, "graph initializer").astype(tensor_dtype(to, node.name))
            init.CopyFrom(numpy_helper.from_array(value, node.output[0]))
        else:
            kept.append(node)
    if len(kept) < len(graph.node):
        del graph.node[:]
        graph.node.extend(kept)
