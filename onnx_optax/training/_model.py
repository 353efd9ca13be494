"""A training model's parts: loading, fresh names, declared types, what the bindings write."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import onnx
from onnx import helper

from onnx_optax._src.load import load_model
from onnx_optax._src.onnx_tensors import read_tensor


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


def as_model(model: Any) -> onnx.ModelProto:
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
    dims = [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in kind.shape.dim
    ]
    return kind.elem_type, dims


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
