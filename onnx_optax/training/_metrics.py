"""What a training loop reads from a training model: its loss, R from T, its class scores.

Each reader returns ``(result, "")`` or ``(None, why not)``: a loop reports
what the model lets it compute and says why it leaves the rest out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_optax._src.graph import GraphFunction
from onnx_optax._src.ops import STANDARD_DOMAINS
from onnx_optax.training._combined import CLASS_LOSSES
from onnx_optax.training._model import mutable, opsets, value_info

TRAINING_DOMAIN = "ai.onnx.preview.training"
OPTIMIZERS = ("Adagrad", "Adam", "Momentum")
# Nodes between a class loss and the scores they read that keep the argmax along the classes.
_MONOTONE = ("Identity", "Log", "Exp", "Max", "Min", "Clip", "Cast")


def _standard(node: onnx.NodeProto, *ops: str) -> bool:
    return node.domain in STANDARD_DOMAINS and node.op_type in ops


def _attribute(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return default


def loss_output(model: onnx.ModelProto, reported: Sequence[str]) -> str | None:
    """The reported output that is the loss a Gradient differentiates (or an Identity of it).

    Else the first reported output; None when nothing is reported.
    """
    for info in model.training_info:
        same: set[str] = set()
        for node in info.algorithm.node:
            if node.domain == TRAINING_DOMAIN and node.op_type == "Gradient":
                y = _attribute(node, "y")
                same.add(y.decode(errors="replace") if isinstance(y, bytes) else str(y))
        for node in info.algorithm.node:
            if _standard(node, "Identity") and node.input and node.input[0] in same:
                same.update(node.output)
        for name in reported:
            if name in same:
                return name
    return reported[0] if reported else None


# ----------------------------------------------------------------------------- R from T


def shortest_float(value: Any) -> float:
    """The one element of ``value`` as its dtype's shortest repr reads (0.05, not 0.0500000007)."""
    return float(str(np.asarray(value).reshape(-1)[0]))


class LearningRate(NamedTuple):
    """R as the model computes it from T, and T before the session's first step."""

    rate: Callable[[int], float]  # R of a step that reads this T
    stored: int  # T stored in the model
    counts: bool  # whether a step adds one to T (T is bound); else T stays


def optimizer_of(model: onnx.ModelProto) -> tuple[tuple[int, onnx.NodeProto] | None, str]:
    """The model's one optimizer node (with R and T inputs) and its entry; or None and why not."""
    found = [
        (index, node)
        for index, info in enumerate(model.training_info)
        for node in info.algorithm.node
        if node.domain == TRAINING_DOMAIN and node.op_type in OPTIMIZERS
    ]
    if not found:
        return None, "the model has no Adagrad, Adam or Momentum node"
    if len({(i, tuple(n.input[:2])) for i, n in found}) > 1:
        return None, "the model has several optimizer nodes"
    if len(found[0][1].input) < 2:
        return None, "its optimizer node has no R and T inputs"
    return found[0], ""


def learning_rate(model: onnx.ModelProto) -> tuple[LearningRate | None, str]:
    """R of the model's optimizer node as a function of its T, or None and why not.

    R is computed as the algorithm graph computes it (a schedule's nodes
    reading T, or a number, times a learning-rate scale if any), from T and
    constants only.
    """
    found, why = optimizer_of(model)
    if found is None:
        return None, why
    index, optimizer = found
    rate_name, count_name = optimizer.input[0], optimizer.input[1]
    main = {i.name: i for i in model.graph.initializer}
    if count_name not in main:
        return None, f"T ('{count_name}') is not an initializer"
    count = numpy_helper.to_array(main[count_name])
    if count.size != 1:
        return None, f"T ('{count_name}') is not a scalar"
    function, why = rate_function(model, index, rate_name, count_name)
    if function is None:
        return None, why
    rate = function
    counts = count_name in mutable(model)
    return LearningRate(lambda t: shortest_float(rate(t)), int(count.reshape(-1)[0]), counts), ""


def rate_function(
    model: onnx.ModelProto, index: int, rate_name: str, count_name: str
) -> tuple[Callable[[int], np.ndarray] | None, str]:
    """Tensor ``rate_name`` of entry ``index``'s algorithm as a function of T, or None and why.

    Computed as the algorithm computes it, from T (the initializer
    ``count_name``, whose type alone is read: a session's model holds no data
    for it) and constants: the algorithm's initializers and the graph's that no
    binding writes.
    """
    algorithm = model.training_info[index].algorithm
    main = {i.name: i for i in model.graph.initializer}
    if count_name not in main:
        return None, f"T ('{count_name}') is not an initializer"
    bound = set(mutable(model))
    constants = {i.name: i for i in algorithm.initializer}
    constants.update({n: i for n, i in main.items() if n not in bound})
    producer = {name: node for node in algorithm.node for name in node.output if name}
    needed: dict[int, onnx.NodeProto] = {}
    read: dict[str, onnx.TensorProto] = {}
    todo, seen = [rate_name], set()
    while todo:
        name = todo.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        if name in producer:
            node = producer[name]
            if any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                for a in node.attribute
            ):
                return None, f"R ('{rate_name}') is computed by a node with subgraphs"
            needed[id(node)] = node
            todo.extend(node.input)
        elif name == count_name:  # the function's argument, even where no binding writes T
            continue
        elif name in constants:
            read[name] = constants[name]
        else:
            return None, f"R ('{rate_name}') depends on '{name}', which is neither T nor a constant"
    if rate_name in read and not needed:  # a number
        value = numpy_helper.to_array(read[rate_name])
        return lambda t: value, ""
    count_type = main[count_name].data_type
    graph = helper.make_graph(
        [n for n in algorithm.node if id(n) in needed],
        "learning_rate",
        [value_info(count_name, count_type, [])],
        [],
        initializer=list(read.values()),
    )
    try:
        function = GraphFunction(graph, outputs=[rate_name], opsets=opsets(model))
    except (TypeError, ValueError, NotImplementedError) as error:
        return None, f"R cannot be computed alone: {error}"
    dtype = helper.tensor_dtype_to_np_dtype(count_type)

    def rate(t: int) -> np.ndarray:
        (value,) = function({count_name: np.asarray(t, dtype)})
        return np.asarray(value)

    return rate, ""


# ----------------------------------------------------------------------------- class scores


class Scores(NamedTuple):
    """Where a class loss's scores come from in the inference graph, and its labels."""

    output: str  # a value of the inference graph (Session.run reads it)
    transposes: tuple[tuple[int, ...] | None, ...]  # from the loss back to output; None: reverse
    target: str  # the feed holding the labels
    casts: tuple[np.dtype, ...]  # integer Casts between the feed and the loss, in order
    ignore_index: int | None


def class_scores(model: onnx.ModelProto) -> tuple[Scores | None, str]:
    """The inference-graph value whose argmax along its class axis a class loss compares.

    Followed back from the loss (``SoftmaxCrossEntropyLoss`` or
    ``NegativeLogLikelihoodLoss``) through nodes that keep the argmax (Log,
    a clip, Transpose, ...). None and why for a model without one.
    """
    for info in model.training_info:
        algorithm = info.algorithm
        producer = {name: node for node in algorithm.node for name in node.output if name}
        inputs = {i.name for i in algorithm.input}
        fixed = {i.name for i in algorithm.initializer} | {
            n.output[0] for n in algorithm.node if _standard(n, "Constant") and n.output
        }
        for node in algorithm.node:
            if not _standard(node, *CLASS_LOSSES) or len(node.input) < 2:
                continue
            labels, casts = node.input[1], list[np.dtype]()
            while labels in producer and _standard(producer[labels], "Identity", "Cast"):
                source = producer[labels]
                if source.op_type == "Cast":
                    dtype = np.dtype(
                        helper.tensor_dtype_to_np_dtype(int(_attribute(source, "to", 0)))
                    )
                    if dtype.kind not in "iu":
                        break
                    casts.insert(0, dtype)
                labels = source.input[0]
            if labels not in inputs:
                return None, f"the labels of the class loss ('{node.input[1]}') are not a feed"
            scores, transposes = node.input[0], []
            while scores in producer:
                source = producer[scores]
                if not _standard(source, *_MONOTONE, "Transpose") or not source.input:
                    return None, f"the scores of the class loss are computed by {source.op_type}"
                if any(n and n not in fixed for n in source.input[1:]):
                    return None, f"the scores of the class loss are computed by {source.op_type}"
                if source.op_type == "Transpose":
                    perm = _attribute(source, "perm")
                    transposes.append(None if perm is None else tuple(int(p) for p in perm))
                scores = source.input[0]
            ignore = _attribute(node, "ignore_index")
            return Scores(
                scores,
                tuple(transposes),
                labels,
                tuple(casts),
                None if ignore is None else int(ignore),
            ), ""
    return None, "the loss is not a class loss (SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss)"


def correct(scores: Scores, values: np.ndarray, labels: np.ndarray) -> tuple[int, int]:
    """How many labels the argmax of ``values`` (the scores' output) matches, of how many.

    Labels equal to the loss's ``ignore_index`` are not counted. Raises
    ValueError when the shapes do not fit.
    """
    values = np.asarray(values)
    rank = values.ndim
    where = list(range(rank))  # axis j of the loss's scores is axis where[j] of values
    for perm in scores.transposes:
        order = list(reversed(range(rank))) if perm is None else list(perm)
        if sorted(order) != list(range(rank)):
            raise ValueError(f"a Transpose's perm {order} does not fit scores of rank {rank}")
        where = [order[p] for p in where]
    if rank < 2:
        raise ValueError(f"the scores '{scores.output}' have rank {rank}; a class loss needs 2")
    predicted = np.argmax(values, axis=where[1])
    rest = [a for a in range(rank) if a != where[1]]
    predicted = np.transpose(predicted, [rest.index(a) for a in [where[0], *where[2:]]])
    labels = np.asarray(labels)
    for dtype in scores.casts:
        labels = labels.astype(dtype)
    if labels.shape != predicted.shape:
        raise ValueError(
            f"the labels have shape {list(labels.shape)} and the argmax of the scores "
            f"'{scores.output}' {list(predicted.shape)}"
        )
    counted = np.ones(labels.shape, bool)
    if scores.ignore_index is not None:
        counted = labels != scores.ignore_index
    return int(np.sum((predicted == labels) & counted)), int(np.sum(counted))
