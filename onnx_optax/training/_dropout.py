"""Dropout in training: the switch ``attach(dropout=True)`` writes, and turning it off.

A Dropout node (opset 12 and later) draws a mask when its ``training_mode``
input is true. ``attach(dropout=True)`` points every Dropout node of the
inference graph at one scalar bool initializer holding True (the *switch*),
so the training step drops as the model was trained by its exporter; the
inference paths (:meth:`Session.run`, :meth:`Session.to_inference_model`)
read every switch as False, so inference computes what the exported model
computed. A switch is any scalar bool initializer that only Dropout nodes
read, as their ``training_mode``: an exporter's own (PyTorch's
``training=TrainingMode.TRAINING`` writes a constant True) is one too.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from onnx_optax._src.onnx_nodes import describe
from onnx_optax.training._model import Names

DROPOUT_OPSET = 12
"""The first opset whose Dropout has a ``training_mode`` input."""


def train_dropout(model: onnx.ModelProto, names: Names) -> str | None:
    """Every Dropout node of ``model``'s graph reads a new switch holding True, in place.

    Returns the switch's name; None when the graph has no Dropout node.

    Raises:
      ValueError: a Dropout node of an opset before 12 (no ``training_mode``), or
        one whose ``training_mode`` is computed or fed (not ours to replace).
    """
    nodes = [n for n in model.graph.node if n.op_type == "Dropout" and n.domain in ("", "ai.onnx")]
    if not nodes:
        return None
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    if opset < DROPOUT_OPSET:
        raise ValueError(
            f"dropout=True: {describe(nodes[0])} is of opset {opset}, whose Dropout has no "
            f"training_mode input; convert the model to opset {DROPOUT_OPSET} or later "
            "(onnx.version_converter) first"
        )
    constants = {i.name for i in model.graph.initializer}
    for node in nodes:
        mode = node.input[2] if len(node.input) > 2 else ""
        if mode and mode not in constants:
            raise ValueError(
                f"dropout=True: {describe(node)} reads training_mode from '{mode}', which is "
                "computed or fed, not a stored value attach can replace"
            )
    switch = names("dropout.training_mode")
    for node in nodes:
        while len(node.input) < 3:
            node.input.append("")
        node.input[2] = switch
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(True), switch))
    return switch


def switches(graph: onnx.GraphProto) -> list[str]:
    """The scalar bool initializers that only Dropout nodes read, as their ``training_mode``."""
    found = [
        i.name for i in graph.initializer if i.data_type == onnx.TensorProto.BOOL and not i.dims
    ]
    readers: dict[str, set[tuple[str, int]]] = {n: set() for n in found}
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name in readers:
                readers[name].add((node.op_type, position))
    outputs = {o.name for o in graph.output}
    return [n for n in found if readers[n] == {("Dropout", 2)} and n not in outputs]


def switched_off(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """Each switch of ``graph`` as an initializer holding False (what inference reads)."""
    return {n: numpy_helper.from_array(np.asarray(False), n) for n in switches(graph)}
