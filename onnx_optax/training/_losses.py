"""The losses ``attach`` writes as ONNX nodes."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_optax.training._model import Names, declared, value_info

LOSSES = ("softmax_cross_entropy", "log_loss", "nll", "mse", "l1", "bce_with_logits")
LOSS_OUTPUT = "loss"
# The first ai.onnx opset with SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.
CLASS_LOSS_OPSET = 12
CLASS_LOSSES = ("softmax_cross_entropy", "log_loss", "nll")
# Probabilities are clipped below at this value before the log of log_loss.
LOG_LOSS_EPSILON = 1e-7


def loss_nodes(
    loss: Any,
    prediction: str,
    elem: int,
    shape: list[Any] | None,
    target: str,
    names: Names,
    class_axis: int | None = None,
    logits: str | None = None,
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], onnx.ValueInfoProto, str]:
    """Nodes computing the mean loss; their initializers, the target's input and the loss name.

    ``shape`` is the prediction's declared shape (None: unknown; a dim is an
    int, a name or None). Class losses read the classes on ``class_axis``
    (default 1, as ONNX's SoftmaxCrossEntropyLoss: ``[N, C, d1, ...]``); the
    target holds one int64 class per position, shaped like the prediction
    without that axis. ``logits``: the input of the Softmax that computes the
    prediction along the class axis (see :func:`softmax_logits`), which
    ``log_loss`` then reads instead.
    """
    value = names("onnx_optax.loss")
    if isinstance(loss, onnx.GraphProto):
        return _graph_loss(loss, prediction, target, names, value)
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; attach knows {', '.join(LOSSES)} or a GraphProto")
    if loss in _ELEMENTWISE:
        if class_axis is not None:
            raise ValueError(f"class_axis= is for class losses; {loss!r} compares elementwise")
        nodes = _ELEMENTWISE[loss](prediction, target, names)
        nodes.append(helper.make_node("ReduceMean", [nodes[-1].output[0]], [value], keepdims=0))
        return nodes, [], value_info(target, elem, shape), value
    if loss == "log_loss" and logits is not None:
        # -log(softmax(z)) as the cross-entropy of z: the same value without the clip at
        # LOG_LOSS_EPSILON, whose gradient vanishes on a confident mistake.
        loss, prediction = "softmax_cross_entropy", logits
    nodes, target_shape = _classes_on_axis_1(prediction, shape, class_axis, names)
    scores = nodes[-1].output[0] if nodes else prediction
    target_info = value_info(target, onnx.TensorProto.INT64, target_shape)
    inits = []
    if loss == "softmax_cross_entropy":
        nodes.append(helper.make_node("SoftmaxCrossEntropyLoss", [scores, target], [value]))
    elif loss == "nll":
        nodes.append(helper.make_node("NegativeLogLikelihoodLoss", [scores, target], [value]))
    else:
        eps = names("onnx_optax.loss/epsilon")
        clipped, log = names("onnx_optax.loss/clipped"), names("onnx_optax.loss/log")
        dtype = helper.tensor_dtype_to_np_dtype(elem)
        nodes += [
            helper.make_node("Max", [scores, eps], [clipped]),
            helper.make_node("Log", [clipped], [log]),
            helper.make_node("NegativeLogLikelihoodLoss", [log, target], [value]),
        ]
        inits.append(numpy_helper.from_array(np.asarray(LOG_LOSS_EPSILON, dtype), eps))
    return nodes, inits, target_info, value


def softmax_logits(
    graph: onnx.GraphProto, output: str, rank: int | None, class_axis: int | None, opset: int
) -> str | None:
    """The input of the Softmax computing ``output`` along its class axis, else None.

    Followed back through Identity. Before opset 13 a Softmax normalizes the
    input flattened at ``axis``, which is the class axis alone only when it
    is the last one (or the rank is 2).
    """
    producers = {name: node for node in graph.node for name in node.output}
    node = producers.get(output)
    while node is not None and node.domain in ("", "ai.onnx") and node.op_type == "Identity":
        node = producers.get(node.input[0]) if node.input else None
    if node is None or node.domain not in ("", "ai.onnx") or node.op_type != "Softmax":
        return None
    if rank is None or not node.input:
        return None
    axis = next((int(a.i) for a in node.attribute if a.name == "axis"), -1 if opset >= 13 else 1)
    wanted = (1 if class_axis is None else class_axis) % rank
    if not -rank <= axis < rank or axis % rank != wanted:
        return None
    if opset < 13 and wanted != rank - 1:
        return None
    return str(node.input[0])


def _classes_on_axis_1(
    prediction: str, shape: list[Any] | None, class_axis: int | None, names: Names
) -> tuple[list[onnx.NodeProto], list[Any] | None]:
    """A Transpose bringing the class axis to axis 1 (if needed), and the target's shape.

    Refuses, naming the output and its shape, what a class loss cannot read:
    rank below 2, an axis out of range, a class axis whose size is symbolic
    while another axis has a fixed size (a time-major ``[T, N, C]`` read with
    the default axis 1 would take the batch for the classes).
    """
    if shape is None:  # rank unknown: ONNX's layout, checked when the step runs
        if class_axis not in (None, 1):
            raise ValueError(
                f"output '{prediction}' declares no shape, so class_axis={class_axis} cannot "
                "be applied; declare its shape in the model"
            )
        return [], None
    rank = len(shape)
    shown = "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
    if rank < 2:
        raise ValueError(
            f"output '{prediction}' has shape {shown}; a class loss reads scores of shape "
            "[N, C] or [N, C, d1, ...] (class_axis= says where C is)"
        )
    axis = 1 if class_axis is None else class_axis
    if not -rank <= axis < rank:
        raise ValueError(
            f"class_axis={class_axis} is out of range for output '{prediction}' of shape {shown}"
        )
    axis %= rank
    if not isinstance(shape[axis], int) and any(isinstance(d, int) for d in shape):
        fixed = [a for a, d in enumerate(shape) if isinstance(d, int) and a != 0]
        hint = (
            f"; pass class_axis={fixed[-1]} if axis {fixed[-1]} holds the classes" if fixed else ""
        )
        raise ValueError(
            f"output '{prediction}' has shape {shown}: its axis {axis} ("
            f"{shape[axis] or 'unknown'}) has no fixed size, so it cannot hold the classes of a "
            f"class loss{hint}"
        )
    if isinstance(shape[axis], int) and shape[axis] < 2:
        raise ValueError(
            f"output '{prediction}' has shape {shown}: its axis {axis} holds {shape[axis]} "
            "class(es), and a class loss over fewer than 2 classes learns nothing; pass the "
            "class_axis= that holds the classes, or use bce_with_logits for one logit"
        )
    others = [a for a in range(rank) if a != axis]
    target_shape = [shape[a] for a in others]
    if axis == 1:
        return [], target_shape
    perm = [others[0], axis, *others[1:]]
    moved = names("onnx_optax.loss/classes_on_axis_1")
    return [helper.make_node("Transpose", [prediction], [moved], perm=perm)], target_shape


def _graph_loss(
    loss: onnx.GraphProto, prediction: str, target: str, names: Names, value: str
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], onnx.ValueInfoProto, str]:
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
