"""The plan: which tensors of a model ``attach`` trains, and why the others stay as stored.

A *candidate* is a float initializer or a float ``Constant`` node of the
inference graph (integer ones are listed too, as never trained). Each gets one
*kind*, decided from how the graph reads it, its values and whether the loss's
output depends on it:

``weight``
  trains: read in a weight position (Conv/ConvTranspose weight and bias, a
  Gemm or MatMul operand, PRelu's slope, a normalization's scale and bias,
  an embedding table read by Gather, an Add right after a MatMul, Gemm or
  Conv: its bias), or read as data with more than one element (a broadcast
  Add/Mul parameter such as a folded BatchNormalization scale).
``exporter constant``
  one element, read as data outside any weight position: GELU's 0.5, an
  epsilon added before a square root, a 1/512 reciprocal.
``hyperparameter``
  read where ONNX takes a setting, not a parameter: a Pow exponent, Clip's
  bounds, either side of a comparison, Max/Min operands, Where's values, a
  Div's divisor, Dropout's ratio, Pad's value, Mod's divisor.
``preprocessing``
  an Add/Sub/Mul/Div operand applied to a graph input directly (input
  normalization an exporter folded into the graph).
``non-finite``
  holds an infinity or a NaN (an attention mask's -inf).
``statistic``
  BatchNormalization's running mean or variance.
``shape``
  read only where the op registry reads shapes (``Op.static``).
``integer``
  not a float tensor.
``unreached``
  the loss's output does not depend on it (another head, an unused tensor).

Uses are followed through ops that pass a value on (Identity, Cast, CastLike,
Reshape, Squeeze, Unsqueeze, Flatten, Transpose, Expand: input 0). A tensor
with several uses is a weight if one of them is a weight position; otherwise the
first kind above that any use gives. Only weights train by default; ``frozen=``
removes some, ``trainable=`` names exactly which (any float candidate but a
statistic or a shape: naming a constant trains it, and :func:`check` says so).

``Constant`` nodes that train are *lifted*: ``attach`` removes the node and
stores its value as an initializer of the same name, so the inference graph
computes the same values and the weight can be bound and written back.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_optax._src.onnx_nodes import LISTED, describe, listed, shown
from onnx_optax._src.onnx_tensors import read_tensor
from onnx_optax.training._kinds import (
    NEVER,
    WEIGHT,
    UseGraph,
    constant_value,
    kind_of,
    standard_op,
    stored_names,
)
from onnx_optax.training._model import as_model

# ai.onnx.ml ops that keep their weights in attributes, which no gradient reaches.
ATTRIBUTE_WEIGHTS = {
    "LinearClassifier": ("coefficients", "intercepts"),
    "LinearRegressor": ("coefficients", "intercepts"),
    "SVMClassifier": ("coefficients", "support_vectors", "rho"),
    "SVMRegressor": ("coefficients", "support_vectors", "rho"),
    "TreeEnsembleClassifier": ("nodes_values", "class_weights"),
    "TreeEnsembleRegressor": ("nodes_values", "target_weights"),
    "TreeEnsemble": ("nodes_splits", "leaf_weights"),
}


class Tensor(NamedTuple):
    """One candidate of a :class:`Plan`: a tensor the inference graph stores."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    source: str  # "initializer", or "Constant node '<name>'" (lifted when it trains)
    kind: str  # one of KINDS
    trains: bool
    reason: str  # why, in words


@dataclasses.dataclass(frozen=True)
class Plan:
    """What ``attach`` trains in a model, and why every other stored tensor stays.

    ``str(plan)`` is a table, one line a tensor (``onnx-optax attach --list``).
    """

    output: str
    tensors: tuple[Tensor, ...]
    notes: tuple[str, ...] = ()

    @property
    def trained(self) -> list[str]:
        """The names of the tensors that train, in the graph's order."""
        return [t.name for t in self.tensors if t.trains]

    @property
    def lifted(self) -> list[str]:
        """The trained tensors held in Constant nodes (attach makes them initializers)."""
        return [t.name for t in self.tensors if t.trains and t.source != "initializer"]

    def __str__(self) -> str:
        trained = [t for t in self.tensors if t.trains]
        size = sum(int(np.prod(t.shape)) for t in trained)
        lines = [
            f"loss output: {self.output}; {len(trained)} of {len(self.tensors)} tensors train "
            f"({size:,} values)"
        ]
        rows = [
            (
                "yes" if t.trains else "no",
                t.name,
                f"{t.dtype}{list(t.shape)}",
                "Constant" if t.source != "initializer" else "init",
                t.reason,
            )
            for t in self.tensors
        ]
        header = ("trains", "tensor", "type", "from", "why")
        widths = [min(max(len(r[i]) for r in [header, *rows]), 48) for i in range(4)]
        for row in [header, *rows]:
            cells = [cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)]
            lines.append("  ".join([*cells, row[4]]).rstrip())
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


def _names(argument: str, names: Sequence[str], known: Mapping[str, Any]) -> list[str]:
    if isinstance(names, str | bytes) or not isinstance(names, Sequence):
        raise TypeError(
            f"{argument}= takes a list of tensor names, got {type(names).__name__} "
            f"{names!r}" + (f"; write [{names!r}]" if isinstance(names, str) else "")
        )
    names = list(names)
    twice = sorted(n for n, k in Counter(names).items() if k > 1)
    if twice:
        raise ValueError(f"{argument}= names {listed(twice)} more than once")
    unknown = [n for n in names if n not in known]
    if unknown:
        candidates = list(known)
        raise ValueError(
            f"{argument} {listed(unknown)} are not initializers or Constant nodes of the "
            f"model's graph; its candidates are {candidates[:20]}"
            + (" ..." if len(candidates) > 20 else "")
        )
    return names


def attribute_weights(graph: onnx.GraphProto) -> list[str]:
    """A note for each ai.onnx.ml node that keeps its weights in attributes."""
    notes = []
    for node in graph.node:
        if node.domain == "ai.onnx.ml" and node.op_type in ATTRIBUTE_WEIGHTS:
            held = [a.name for a in node.attribute if a.name in ATTRIBUTE_WEIGHTS[node.op_type]]
            notes.append(
                f"{describe(node)} keeps its weights in the attributes {held}, which no "
                "gradient reaches: attach trains tensors only (initializers and Constant "
                "nodes). Retrain it in scikit-learn, or export the model as standard ops "
                "(a network such as MLPClassifier exports MatMul and Add with initializers)"
            )
    return notes


def make_plan(
    model: onnx.ModelProto,
    output: str,
    trainable: Sequence[str] | None = None,
    frozen: Sequence[str] | None = None,
    lift_constants: bool = True,
) -> Plan:
    """The plan of an already loaded model, ``output`` checked by the caller."""
    if trainable is not None and frozen is not None:
        raise ValueError(
            "pass trainable= (exactly these) or frozen= (every weight but these), not both"
        )
    values, kinds = _classified(model.graph, output)
    constants = {n for n, (_, source) in values.items() if source != "initializer"}
    candidates = {n: v for n, v in values.items() if lift_constants or n not in constants}
    trains = _trains(trainable, frozen, candidates, kinds)
    tensors = []
    for name, (value, source) in values.items():
        kind, why = kinds[name]
        unlifted = name in constants and not lift_constants
        reason = _reason(name, kind, why, source, trains, trainable, frozen, unlifted)
        if name in constants and kind not in (WEIGHT,) and name not in trains:
            reason += f" (stays in {source})"
        tensors.append(
            Tensor(name, tuple(value.shape), str(value.dtype), source, kind, name in trains, reason)
        )
    notes = attribute_weights(model.graph)
    if not trains:
        raise ValueError(
            "nothing to train: the model has no float initializer or Constant node that is a "
            "weight the output reaches"
            + (
                f" ({', '.join(f'{t.name!r} is {t.reason}' for t in tensors[:10])})"
                if tensors
                else ""
            )
            + "".join(f". {note}" for note in notes)
        )
    return Plan(output, tuple(tensors), tuple(notes))


def _classified(
    main: onnx.GraphProto, output: str
) -> tuple[dict[str, tuple[np.ndarray, str]], dict[str, tuple[str, str]]]:
    """Each candidate (a broadcast view of its shape and dtype, its source) and its kind."""
    stored = {i.name for i in main.initializer}
    graph = UseGraph(
        [n for n in main.node if standard_op(n) is not None],
        frozenset(i.name for i in main.input if i.name not in stored),
        frozenset(o.name for o in main.output),
        stored_names(main),
    )
    reached = graph.reached(output)
    # Each tensor is read, classified and let go: its entry keeps its shape and dtype only
    # (a broadcast view of one element), so a model's weights are never all read at once.
    values: dict[str, tuple[np.ndarray, str]] = {}
    kinds: dict[str, tuple[str, str]] = {}

    def classify(name: str, value: np.ndarray, source: str) -> None:
        kind, why = kind_of(graph, name, value)
        if kind not in (*NEVER, "unreached") and name not in reached:
            kind, why = "unreached", f"the output '{output}' does not depend on it ({why})"
        kinds[name] = (kind, why)
        values[name] = (np.broadcast_to(np.zeros((), value.dtype), value.shape), source)

    for init in main.initializer:
        classify(init.name, read_tensor(init, "graph initializer"), "initializer")
    for node in main.node:
        value = constant_value(node)
        if value is not None and node.output[0] not in values:
            label = f"'{node.name}'" if node.name else f"'{node.output[0]}'"
            classify(node.output[0], value, f"Constant node {label}")
    return values, kinds


def _trains(
    trainable: Sequence[str] | None,
    frozen: Sequence[str] | None,
    candidates: Mapping[str, Any],
    kinds: Mapping[str, tuple[str, str]],
) -> set[str]:
    """The names that train: ``trainable`` exactly, the weights but ``frozen``, or every weight."""
    weights = [n for n in candidates if kinds[n][0] == WEIGHT]
    if trainable is not None:
        chosen = _names("trainable", trainable, candidates)
        bad = [f"'{n}' is {kinds[n][1]}" for n in chosen if kinds[n][0] in NEVER]
        if bad:
            more = f"; and {len(bad) - LISTED:,} more" if len(bad) > LISTED else ""
            raise ValueError(
                f"trainable names tensors that are not weights: {'; '.join(bad[:LISTED])}"
                f"{more}. "
                "A gradient step would corrupt them; leave them out"
            )
        if not chosen:
            raise ValueError("nothing to train: trainable= is empty")
        return set(chosen)
    if frozen is not None:
        kept = set(_names("frozen", frozen, candidates))
        trains = {n for n in weights if n not in kept}
        if not trains:
            raise ValueError(
                f"nothing to train: frozen= freezes every weight of the model ({weights})"
            )
        return trains
    return set(weights)


def _reason(
    name: str,
    kind: str,
    why: str,
    source: str,
    trains: set[str],
    trainable: Sequence[str] | None,
    frozen: Sequence[str] | None,
    unlifted: bool,
) -> str:
    """Why the tensor ``name`` trains or stays, in words (``unlifted``: a Constant kept)."""
    if name in trains:
        reason = why if kind == WEIGHT else f"named in trainable= ({kind}: {why})"
        if source != "initializer":
            reason += f"; lifted from {source}"
        return reason
    if trainable is not None and kind == WEIGHT:
        return "not named in trainable="
    if frozen is not None and kind == WEIGHT and name in frozen:
        return "frozen by the user (frozen=)"
    if unlifted and kind == WEIGHT:
        return f"stays in {source}: lift_constants=False"
    if kind == WEIGHT:
        return why
    return f"{kind}: {why}"


def lift(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """``model`` with the Constant nodes producing ``names`` stored as initializers instead."""
    names = set(names)
    if not names:
        return model
    result = onnx.ModelProto()
    result.CopyFrom(model)
    kept = []
    for node in result.graph.node:
        if node.output and node.output[0] in names and constant_value(node) is not None:
            value = constant_value(node)
            assert value is not None
            result.graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
        else:
            kept.append(node)
    del result.graph.node[:]
    result.graph.node.extend(kept)
    return result


def plan(
    model: onnx.ModelProto | bytes | str | os.PathLike[str],
    *,
    output: str | None = None,
    trainable: Sequence[str] | None = None,
    frozen: Sequence[str] | None = None,
    lift_constants: bool = True,
) -> Plan:
    """Every tensor a model stores, whether :func:`attach` trains it, and why.

    Takes ``attach``'s arguments of the same names and applies the same rule
    (see :mod:`onnx_optax.training` and docs/fine-tuning.md, "Fine-tuning a
    downloaded model"): by default the weights the loss's output reaches train;
    exporter constants (one element read as data), hyperparameters (a Pow
    exponent, Clip's bounds, comparison operands, ...), input preprocessing,
    non-finite tensors, BatchNormalization's running statistics, shapes and
    integer tensors stay as stored. Float ``Constant`` nodes that train are
    lifted into initializers (``lift_constants=False``: they stay Constants
    and do not train).

    Args:
      model: an inference model, its bytes or its path.
      output: the graph output the loss reads (required when there are several).
      trainable: as for :func:`attach`.
      frozen: as for :func:`attach`.
      lift_constants: as for :func:`attach`.

    Returns:
      A :class:`Plan`; ``print(plan)`` shows the table.

    Example:
      >>> import numpy as np
      >>> from onnx import TensorProto, helper, numpy_helper
      >>> from onnx_optax import training
      >>> inits = [numpy_helper.from_array(np.ones((3, 2), np.float32), "w"),
      ...          numpy_helper.from_array(np.asarray(0.5, np.float32), "half")]
      >>> graph = helper.make_graph(
      ...     [helper.make_node("MatMul", ["x", "w"], ["h"]),
      ...      helper.make_node("Mul", ["h", "half"], ["y"])], "g",
      ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
      ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])], inits)
      >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
      >>> training.plan(model).trained
      ['w']
    """
    loaded = as_model(model)
    return make_plan(loaded, loss_output(loaded, output), trainable, frozen, lift_constants)


def loss_output(model: onnx.ModelProto, output: str | None, option: str = "output=") -> str:
    """The graph output the loss reads: ``output``, or the only one.

    ``option`` is how a refusal tells the caller to name the output.
    """
    graph = model.graph
    names = [o.name for o in graph.output]
    if not names:
        raise ValueError("the model's graph has no output for the loss to read")
    if output is None:
        if len(names) == 1:
            return names[0]
        raise ValueError(
            f"the model has {len(names)} outputs ({_outputs_text(graph)}); pass {option} to "
            "say which one the loss reads"
        )
    if output not in names:
        raise ValueError(
            f"output {shown(output)!r} is not a graph output; the outputs are "
            f"{_outputs_text(graph)}"
        )
    return output


def _outputs_text(graph: onnx.GraphProto) -> str:
    """The graph's outputs with their types, the first LISTED of them where there are more."""
    shown_outputs = ", ".join(f"'{o.name}' {_shape_text(o)}" for o in graph.output[:LISTED])
    more = len(graph.output) - LISTED
    return shown_outputs + (f" and {more:,} more" if more > 0 else "")


def _shape_text(value: onnx.ValueInfoProto) -> str:
    kind = value.type.tensor_type
    if not kind.HasField("shape"):
        return "[?]"
    dims = [
        str(d.dim_value) if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or "?")
        for d in kind.shape.dim
    ]
    elem = helper.tensor_dtype_to_np_dtype(kind.elem_type) if kind.elem_type else "?"
    return f"{elem}[{', '.join(dims)}]"
