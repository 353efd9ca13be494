"""A training model's parts: loading, fresh names, declared types, what the bindings write,
the names a node reads and a view of a graph's fields."""

from __future__ import annotations

import os
import warnings
from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
import onnx
from onnx import helper, version_converter

from onnx_optax._src.graph import GRADIENT
from onnx_optax._src.graph.load import load_model
from onnx_optax._src.onnx_nodes import DOMAIN, describe
from onnx_optax._src.onnx_tensors import read_tensor, utf8


class TrainingModelError(ValueError):
    """A model's ``training_info`` cannot run; the message lists every problem found."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


# ----------------------------------------------------------------------------- loading


def load(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Reads a model file through onnx_optax's one loading layer.

    External data is read only from inside the model's folder, and the size
    limits of :class:`onnx_optax.backend.Limits` apply.
    """
    return load_model(path)


def as_model(model: object) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto | bytes | str | os.PathLike):
        return load_model(model)
    raise TypeError(f"expected an onnx.ModelProto or a path, got {type(model).__name__}")


class Names:
    """Fresh tensor names, unique in the model (generated, never guessed)."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.taken: set[str] = set()
        for values in (graph.input, graph.output, graph.value_info):
            self.taken.update(v.name for v in values)
        self.taken.update(i.name for i in graph.initializer)
        for node in graph.node:
            self.taken.update(node.input)
            self.taken.update(node.output)

    def __call__(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name


def value_info(name: str, elem: int, shape: Sequence[Any] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def declared(value: onnx.ValueInfoProto) -> tuple[int, list[Any] | None]:
    kind = value.type.tensor_type
    if not kind.HasField("shape"):
        return kind.elem_type, None
    # A negative dim_value (PaddlePaddle writes -1) is an unknown size, as an empty dim is,
    # and so is the dim_param "?" (PaddlePaddle's too), which names no size shared by dims.
    dims = [
        d.dim_value
        if d.HasField("dim_value") and d.dim_value >= 0
        else (d.dim_param if d.dim_param not in ("", "?") else None)
        for d in kind.shape.dim
    ]
    return kind.elem_type, dims


def _standard_ops(graph: onnx.GraphProto) -> set[str]:
    """The ai.onnx op types of a graph and of the graphs its nodes hold (If, Loop, Scan)."""
    found: set[str] = set()
    todo = [graph]
    while todo:
        for node in todo.pop().node:
            if node.domain in ("", "ai.onnx"):
                found.add(node.op_type)
            for attribute in node.attribute:
                todo += [attribute.g] if attribute.HasField("g") else []
                todo += list(attribute.graphs)
    return found


def _since(op: str, version: int) -> int | None:
    try:
        return int(onnx.defs.get_schema(op, version, "").since_version)
    except onnx.defs.SchemaError:
        return None


def with_opset(model: onnx.ModelProto, needed: int) -> onnx.ModelProto:
    """``model`` importing ai.onnx opset ``needed`` or newer, computing the same.

    When every op of the graph has the same definition at the model's opset
    and at ``needed``, only the import is raised; otherwise the model is
    converted with ``onnx.version_converter``. Either way a ``UserWarning``
    says what was done; a model that cannot be converted is refused.
    """
    imports = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    version = int(imports[0].version) if imports else 1
    if version >= needed:
        return model
    changed = sorted(
        op for op in _standard_ops(model.graph) if _since(op, version) != _since(op, needed)
    )
    if not changed:
        result = onnx.ModelProto()
        result.CopyFrom(model)
        for opset in result.opset_import:
            if opset.domain in ("", "ai.onnx"):
                opset.version = needed
        warnings.warn(
            f"the model imports ai.onnx opset {version} and the loss needs {needed}; none of its "
            f"ops changed between the two, so attach raised the import to {needed} (the graph "
            "is unchanged)",
            UserWarning,
            stacklevel=3,
        )
        return result
    try:
        result = version_converter.convert_version(model, needed)
        onnx.checker.check_model(result)
    except Exception as error:  # the converter's failures have no common type
        raise ValueError(
            f"the model imports ai.onnx opset {version} and the loss needs {needed}; its ops "
            f"{changed} differ between the two and onnx.version_converter could not convert it "
            f"({str(error).splitlines()[0] if str(error) else type(error).__name__}); convert it "
            f"to opset {needed} or newer yourself, or choose an elementwise loss (mse, l1, "
            "bce_with_logits), which runs at any opset"
        ) from None
    warnings.warn(
        f"the model imports ai.onnx opset {version} and the loss needs {needed}; its ops "
        f"{changed} differ between the two, so attach converted it with onnx.version_converter",
        UserWarning,
        stacklevel=3,
    )
    return result


def mutable(model: onnx.ModelProto) -> list[str]:
    """Initializers that some binding writes, in the order of the graph's initializers."""
    keys = {
        entry.key
        for info in model.training_info
        for entry in (*info.update_binding, *info.initialization_binding)
    }
    return [i.name for i in model.graph.initializer if i.name in keys]


def opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {o.domain: int(o.version) for o in model.opset_import}


def read_initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: read_tensor(i, "graph initializer") for i in model.graph.initializer}


def abstract(value: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(np.shape(value), jax.dtypes.canonicalize_dtype(value.dtype))


def _copy_fields(source: Any, target: Any, skip: str) -> None:
    """Every set field of the message ``source`` into ``target``, except the field ``skip``."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        # protobuf 7 says is_repeated; older ones only the label
        if getattr(field, "is_repeated", getattr(field, "label", 0) == 3):
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def copy_model(model: onnx.ModelProto, hollow: Collection[str] = ()) -> onnx.ModelProto:
    """A copy of ``model``, its main graph's initializers named in ``hollow`` without data.

    ``CopyFrom`` cannot copy a model above 2 GiB (protobuf's upb copies a
    message by serializing it, and refuses 2 GiB), nor is a copy of data about
    to be replaced worth making: this copies the main graph's initializers one
    at a time (each below 2 GiB), a hollow one as its name, type and dims.
    """
    result = onnx.ModelProto()
    _copy_fields(model, result, "graph")
    _copy_fields(model.graph, result.graph, "initializer")
    for init in model.graph.initializer:
        if init.name in hollow:
            result.graph.initializer.append(
                onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims)
            )
        else:
            result.graph.initializer.add().CopyFrom(init)
    return result


class View(NamedTuple):
    """The fields of a ``GraphProto`` that :class:`GraphFunction` reads, without copying nodes."""

    name: str
    node: Sequence[onnx.NodeProto]
    input: Sequence[onnx.ValueInfoProto]
    output: Sequence[onnx.ValueInfoProto]
    initializer: Sequence[onnx.TensorProto]
    value_info: Sequence[onnx.ValueInfoProto]


def reads(node: onnx.NodeProto) -> list[str]:
    """The names a node reads: its inputs and, for Gradient, its y, xs and zs."""
    names = [n for n in node.input if n]
    if node.op_type == GRADIENT and node.domain == DOMAIN:
        for attribute in node.attribute:
            if attribute.name == "y" and attribute.type == onnx.AttributeProto.STRING:
                names.append(utf8(attribute.s, f"{describe(node)}: attribute 'y'"))
            elif attribute.name in ("xs", "zs"):
                names += [
                    utf8(v, f"{describe(node)}: attribute '{attribute.name}'")
                    for v in attribute.strings
                ]
    return names
