"""The losses ``attach`` writes as ONNX nodes."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_optax.training._model import Names, declared, value_info

LOSSES = ("softmax_cross_entropy", "log_loss", "nll", "mse", "l1", "bce_with_logits")
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
    if loss in _ELEMENTWISE:
        nodes = _ELEMENTWISE[loss](prediction, target, names)
        nodes.append(helper.make_node("ReduceMean", [nodes[-1].output[0]], [value], keepdims=0))
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


# ---------------------------------------------------------------- elementwise losses
# Each gives the nodes of the per-element loss of (prediction, target), both of
# the output's shape; the last node's output is averaged over every element.


def _mse(p: str, t: str, names: Names) -> list[onnx.NodeProto]:
    diff, square = names("onnx_optax.loss/diff"), names("onnx_optax.loss/square")
    return [
        helper.make_node("Sub", [p, t], [diff]),
        helper.make_node("Mul", [diff, diff], [square]),
    ]


def _l1(p: str, t: str, names: Names) -> list[onnx.NodeProto]:
    diff, absolute = names("onnx_optax.loss/diff"), names("onnx_optax.loss/abs")
    return [
        helper.make_node("Sub", [p, t], [diff]),
        helper.make_node("Abs", [diff], [absolute]),
    ]


def _bce_with_logits(x: str, t: str, names: Names) -> list[onnx.NodeProto]:
    """max(x, 0) - x*t + log(1 + exp(-|x|)): no exp of a positive number, finite for any x."""
    relu, xt, first = (names(f"onnx_optax.loss/{n}") for n in ("relu", "xt", "first"))
    absolute, negative = names("onnx_optax.loss/abs"), names("onnx_optax.loss/neg_abs")
    softplus, each = names("onnx_optax.loss/softplus"), names("onnx_optax.loss/bce")
    return [
        helper.make_node("Relu", [x], [relu]),
        helper.make_node("Mul", [x, t], [xt]),
        helper.make_node("Sub", [relu, xt], [first]),
        helper.make_node("Abs", [x], [absolute]),
        helper.make_node("Neg", [absolute], [negative]),
        helper.make_node("Softplus", [negative], [softplus]),
        helper.make_node("Add", [first, softplus], [each]),
    ]


_ELEMENTWISE = {"mse": _mse, "l1": _l1, "bce_with_logits": _bce_with_logits}
