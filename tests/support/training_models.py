"""Helpers shared by the tests split out of tests/test_hostile_training.py (issue 34)."""

from __future__ import annotations

import numpy as np
import pytest

import onnx_optax

onnx = pytest.importorskip("onnx")
from onnx_optax import interop, training  # noqa: E402
from tests.training.test_training import mlp  # noqa: E402


def _attached() -> onnx.ModelProto:
    return training.attach(mlp(), loss="mse", target="t", optimizer=onnx_optax.adam(0.1))


def _gradient(model: onnx.ModelProto) -> onnx.NodeProto:
    (node,) = [n for n in model.training_info[0].algorithm.node if n.op_type == "Gradient"]
    return node


def _set_attribute(node: onnx.NodeProto, attribute: onnx.AttributeProto) -> None:
    kept = [a for a in node.attribute if a.name != attribute.name]
    del node.attribute[:]
    node.attribute.extend([*kept, attribute])


def _adagrad_model() -> onnx.ModelProto:
    tx = onnx_optax.adagrad(0.1)
    params = {"w": np.ones(3, np.float32)}
    return interop.to_model(tx, params, tx.init(params))


def _set_initializer(model: onnx.ModelProto, tensor: onnx.TensorProto) -> None:
    (found,) = [i for i in model.graph.initializer if i.name == tensor.name]
    found.CopyFrom(tensor)
