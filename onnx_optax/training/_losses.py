"""The losses ``attach`` writes as ONNX nodes."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_optax.training._model import Names, declared, value_info

LOSSES = ("softmax_cross_entropy", "log_loss", "nll", "mse")
LOSS_OUTPUT = "loss"
# Probabilities are clipped below at this value before the log of log_loss.
LOG_LOSS_EPSILON = 1e-7


def loss_nodes(
    loss: Any,
    prediction: str,
    elem: int,
    shape: list[Any] | None,
    target: str,
    names: Names,
    opset: int,
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], onnx.ValueInfoProto, str]:
    """Nodes computing the mean loss; their initializers, the target's input and the loss name."""
    value = names("onnx_optax.loss")
    batch = [shape[0] if shape and shape[0] is not None else "N"] if shape is not None else None
    if isinstance(loss, onnx.GraphProto):
        if len(loss.input) != 2 or len(loss.output) != 1:
            raise ValueError(
                f"a loss graph takes two inputs (prediction, target) and has one output; "
                f"'{loss.name}' has {len(loss.input)} inputs and {len(loss.output)} outputs"
            )
        rename = {loss.input[0].name: prediction, loss.input[1].name: target}
        rename[loss.output[0].name] = value
        for node in loss.node:
            for name in node.output:
                rename.setdefault(name, names(f"onnx_optax.loss/{name}"))
        inits = []
        for init in loss.initializer:
            copy = onnx.TensorProto()
            copy.CopyFrom(init)
            copy.name = rename.setdefault(init.name, names(f"onnx_optax.loss/{init.name}"))
            inits.append(copy)
        nodes = []
        for node in loss.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [rename.get(n, n) for n in node.input]
            copy.output[:] = [rename[n] for n in node.output]
            nodes.append(copy)
        t_elem, t_shape = declared(loss.input[1])
        return nodes, inits, value_info(target, t_elem, t_shape), value
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; attach knows {', '.join(LOSSES)} or a GraphProto")
    if opset < 13:
        raise ValueError(
            f"the model imports ai.onnx opset {opset}; attach needs 13 or newer for its loss ops "
            "(convert it with onnx.version_converter first)"
        )
    int64 = onnx.TensorProto.INT64
    if loss == "mse":
        diff, square = names("onnx_optax.loss/diff"), names("onnx_optax.loss/square")
        nodes = [
            helper.make_node("Sub", [prediction, target], [diff]),
            helper.make_node("Mul", [diff, diff], [square]),
            helper.make_node("ReduceMean", [square], [value], keepdims=0),
        ]
        return nodes, [], value_info(target, elem, shape), value
    target_info = value_info(target, int64, batch)
    if loss == "softmax_cross_entropy":
        node = helper.make_node("SoftmaxCrossEntropyLoss", [prediction, target], [value])
        return [node], [], target_info, value
    if loss == "nll":
        node = helper.make_node("NegativeLogLikelihoodLoss", [prediction, target], [value])
        return [node], [], target_info, value
    eps = names("onnx_optax.loss/epsilon")
    clipped, log = names("onnx_optax.loss/clipped"), names("onnx_optax.loss/log")
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    nodes = [
        helper.make_node("Max", [prediction, eps], [clipped]),
        helper.make_node("Log", [clipped], [log]),
        helper.make_node("NegativeLogLikelihoodLoss", [log, target], [value]),
    ]
    return (
        nodes,
        [numpy_helper.from_array(np.asarray(LOG_LOSS_EPSILON, dtype), eps)],
        target_info,
        value,
    )
