"""The mobile networks' files (``export.py`` wrote them), with seeded random weights."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
NETS = ("mobilenet_v2_1.0_224", "mobilenet_v2_0.5_128", "mobilenet_v3_small_224")


def load(name: str, seed: int = 0) -> onnx.ModelProto:
    """The exported graph, each float initializer without data filled with He-normal
    values (fan in: its elements over its first axis; vectors: 0.01 x normal)."""
    model = onnx.load(os.path.join(HERE, f"{name}.skeleton.onnx"))
    rng = np.random.default_rng(seed)
    for i, tensor in enumerate(model.graph.initializer):
        if tensor.data_type != onnx.TensorProto.FLOAT or tensor.raw_data or tensor.float_data:
            continue
        shape = tuple(tensor.dims)
        if len(shape) >= 2:
            value = rng.standard_normal(shape) * np.sqrt(2.0 * shape[0] / np.prod(shape))
        else:
            value = 0.01 * rng.standard_normal(shape)
        model.graph.initializer[i].CopyFrom(
            numpy_helper.from_array(value.astype(np.float32), tensor.name)
        )
    return model


def image(model: onnx.ModelProto, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A batch of standard-normal images of the model's declared size."""
    (feed,) = model.graph.input[:1]
    shape = [batch] + [d.dim_value for d in feed.type.tensor_type.shape.dim[1:]]
    return {feed.name: np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}
