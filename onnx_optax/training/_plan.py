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
from onnx_optax._src.ops import OPS, STANDARD_DOMAINS
from onnx_optax.training._model import as_model

# The kinds, in the order of precedence when uses disagree (a weight use wins).
WEIGHT = "weight"
KINDS = (
    WEIGHT,
    "exporter constant",
    "hyperparameter",
    "preprocessing",
    "non-finite",
    "statistic",
    "shape",
    "integer",
    "unreached",
)
# Kinds never trained, even when named in trainable=: a gradient step would corrupt them.
NEVER = ("statistic", "shape", "integer")

# Ops whose input 0 passes its value on (unchanged, converted or reshaped).
PASS_THROUGH = frozenset(
    ("Identity", "Cast", "CastLike", "Reshape", "Squeeze", "Unsqueeze", "Flatten")
) | frozenset(("Transpose", "Expand"))
# Input positions that hold parameters (None: every position).
WEIGHT_INPUTS: dict[str, tuple[int, ...] | None] = {
    "Conv": (1, 2),
    "ConvTranspose": (1, 2),
    "Gemm": (0, 1, 2),
    "MatMul": (0, 1),
    "Einsum": None,
    "PRelu": (1,),
    "BatchNormalization": (1, 2),
    "InstanceNormalization": (1, 2),
    "LayerNormalization": (1, 2),
    "GroupNormalization": (1, 2),
    "RMSNormalization": (1,),
    "Gather": (0,),
    "LSTM": (1, 2, 3, 7),
    "GRU": (1, 2, 3),
    "RNN": (1, 2, 3),
}
# Ops whose output an Add turns into "x W + b": that Add's other input is a bias.
PRODUCES_LINEAR = frozenset(("MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"))
STATISTICS = {"BatchNormalization": {3: "running mean", 4: "running variance"}}
# Input positions that hold settings, in words (None: every position).
HYPERPARAMETERS: dict[str, tuple[tuple[int, ...] | None, str]] = {
    "Pow": ((1,), "the exponent"),
    "Clip": ((1, 2), "a bound"),
    "Max": (None, "an operand"),
    "Min": (None, "an operand"),
    "Equal": (None, "a side of the comparison"),
    "Less": (None, "a side of the comparison"),
    "LessOrEqual": (None, "a side of the comparison"),
    "Greater": (None, "a side of the comparison"),
    "GreaterOrEqual": (None, "a side of the comparison"),
    "Where": ((1, 2), "a value"),
    "Div": ((1,), "the divisor"),
    "Mod": ((1,), "the divisor"),
    "Dropout": ((1,), "the ratio"),
    "Pad": ((2,), "the padding value"),
}
ELEMENTWISE = frozenset(("Add", "Sub", "Mul", "Div"))
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


# ----------------------------------------------------------------------------- the graph's uses


@dataclasses.dataclass
class _Graph:
    """The consumers and producers of every tensor name of a list of standard nodes."""

    nodes: Sequence[onnx.NodeProto]
    inputs: frozenset[str]  # graph inputs that are fed (not initializers)
    outputs: frozenset[str]
    stored: frozenset[str]  # initializers and Constant outputs
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = dataclasses.field(default_factory=dict)
    producer: dict[str, onnx.NodeProto] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for node in self.nodes:
            for position, name in enumerate(node.input):
                if name:
                    self.consumers.setdefault(name, []).append((node, position))
            for name in node.output:
                self.producer[name] = node
        # A name read inside a subgraph (a Loop body reading W) is used as its reader
        # there uses it; the node holding the subgraph reads it (see reached).
        todo = [inner for node in self.nodes for inner in _inner_nodes(node)]
        while todo:
            inner = todo.pop()
            if _op(inner) is None:
                continue
            for position, name in enumerate(inner.input):
                if name:
                    self.consumers.setdefault(name, []).append((inner, position))
            todo += _inner_nodes(inner)

    def source(self, name: str) -> tuple[str, onnx.NodeProto | None]:
        """Where ``name``'s value comes from, looking back through pass-through ops."""
        seen = set()
        while name not in seen:
            seen.add(name)
            node = self.producer.get(name)
            if node is None or _op(node) not in PASS_THROUGH or not node.input:
                return name, node
            name = node.input[0]
        return name, None

    def uses(self, name: str) -> Iterable[tuple[onnx.NodeProto | None, int]]:
        """Each (node, input position) reading ``name`` after pass-through ops; (None, -1)
        for a graph output.

        A worklist: a chain of pass-through nodes may be long (or, malformed, a cycle).
        """
        todo, seen = [name], {name}
        while todo:
            current = todo.pop()
            if current in self.outputs:
                yield None, -1
            for node, position in self.consumers.get(current, []):
                if _op(node) in PASS_THROUGH and position == 0 and node.output:
                    if node.output[0] not in seen:
                        seen.add(node.output[0])
                        todo.append(node.output[0])
                else:
                    yield node, position

    def preprocessed_input(self, name: str) -> str | None:
        """The graph input ``name`` is computed from by elementwise ops with stored operands.

        ``(x * scale + shift) / std`` of a graph input ``x`` is input
        preprocessing an exporter folded into the graph; None for anything else.
        """
        seen: set[str] = set()
        while name not in seen:
            seen.add(name)
            name, node = self.source(name)
            if name in self.inputs:
                return name
            if node is None or _op(node) not in ELEMENTWISE or len(node.input) != 2:
                return None
            stored = [self.source(n)[0] in self.stored for n in node.input]
            if stored.count(True) != 1:
                return None
            name = node.input[stored.index(False)]
        return None

    def reached(self, output: str) -> set[str]:
        """Every name the value of ``output`` depends on through data (not shapes)."""
        found, todo = {output}, [output]
        while todo:
            node = self.producer.get(todo.pop())
            if node is None or _op(node) in ("Shape", "Size"):
                continue
            static = OPS[node.op_type].static if _op(node) in OPS else ()
            read = [n for p, n in enumerate(node.input) if p not in static]
            inner_nodes = _inner_nodes(node)
            while inner_nodes:  # what its subgraphs read (their own names find no producer)
                inner = inner_nodes.pop()
                read += inner.input
                inner_nodes += _inner_nodes(inner)
            for name in read:
                if name and name not in found:
                    found.add(name)
                    todo.append(name)
        return found


def _inner_nodes(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """The nodes of a node's subgraphs (If's branches, Loop's and Scan's bodies)."""
    graphs = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
    graphs += [g for a in node.attribute for g in a.graphs]
    return [inner for graph in graphs for inner in graph.node]


def _op(node: onnx.NodeProto) -> str | None:
    """The op type of a standard node; None for any other domain."""
    return node.op_type if node.domain in STANDARD_DOMAINS else None


def _use(graph: _Graph, node: onnx.NodeProto | None, position: int) -> tuple[str, str]:
    """The kind a use gives, and the use in words."""
    if node is None:
        return "data", "a graph output"
    op = _op(node) or ""
    where = f"input {position} of {describe(node)}"
    if op in STATISTICS and position in STATISTICS[op]:
        return "statistic", f"the {STATISTICS[op][position]} (input {position}) of {describe(node)}"
    if op in OPS and position in OPS[op].static:
        return "shape", f"read as a shape ({where})"
    if op in WEIGHT_INPUTS and (WEIGHT_INPUTS[op] is None or position in (WEIGHT_INPUTS[op] or ())):
        return WEIGHT, where
    if op == "Add" and len(node.input) == 2:
        _, other = graph.source(node.input[1 - position])
        if other is not None and _op(other) in PRODUCES_LINEAR:
            return WEIGHT, f"the bias of {describe(other)} ({where})"
    if op in HYPERPARAMETERS:
        positions, what = HYPERPARAMETERS[op]
        if positions is None or position in positions:
            return "hyperparameter", f"{what} ({where})"
    if op in ELEMENTWISE and len(node.input) == 2:
        fed = graph.preprocessed_input(node.input[1 - position])
        if fed is not None:
            return "preprocessing", f"applied to the graph input '{fed}' ({where})"
    return "data", where


def _kind(graph: _Graph, name: str, value: np.ndarray) -> tuple[str, str]:
    """The kind of a stored tensor and the reason, from all its uses."""
    if not np.issubdtype(value.dtype, np.floating):
        return "integer", f"of dtype {value.dtype} (not a float)"
    uses = [_use(graph, node, position) for node, position in graph.uses(name)]
    if not uses:
        return "unreached", "read by no node"
    weight = next((why for kind, why in uses if kind == WEIGHT), None)
    data = next((why for kind, why in uses if kind == "data"), None)
    flat = value.reshape(-1)  # checked in parts: a float64 copy of a 1 GiB weight is 2 GiB
    finite = all(
        np.all(np.isfinite(flat[i : i + 2**20].astype(np.float64, copy=False)))
        for i in range(0, flat.size, 2**20)
    )
    if not finite and (weight or data):
        return "non-finite", "holds an infinity or a NaN"
    if weight:
        return WEIGHT, weight
    if data:
        if value.size == 1:
            return "exporter constant", f"one element, read as data ({data})"
        return WEIGHT, f"read as data ({data})"
    for kind in KINDS:  # no weight or data use: the first kind a use gives
        reasons = [why for k, why in uses if k == kind]
        if reasons:
            return kind, " and ".join(dict.fromkeys(reasons))
    raise AssertionError(uses)  # every use has one of the kinds above


# ----------------------------------------------------------------------------- candidates


def constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a standard ``Constant`` node holding a float tensor, else None."""
    if _op(node) != "Constant" or len(node.output) != 1:
        return None
    for attribute in node.attribute:
        if attribute.name == "value" and attribute.type == onnx.AttributeProto.TENSOR:
            if attribute.t.data_type in _FLOAT_TYPES:
                return read_tensor(attribute.t, f"{describe(node)} value")
        elif attribute.name == "value_float" and attribute.type == onnx.AttributeProto.FLOAT:
            return np.asarray(attribute.f, np.float32)
        elif attribute.name == "value_floats" and attribute.type == onnx.AttributeProto.FLOATS:
            return np.asarray(attribute.floats, np.float32)
    return None


_FLOAT_TYPES = frozenset(
    (
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
    )
)


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
    main = model.graph
    stored = {i.name for i in main.initializer}
    graph = _Graph(
        [n for n in main.node if _op(n) is not None],
        frozenset(i.name for i in main.input if i.name not in stored),
        frozenset(o.name for o in main.output),
        _stored(main),
    )
    reached = graph.reached(output)
    # Each tensor is read, classified and let go: its entry keeps its shape and dtype only
    # (a broadcast view of one element), so a model's weights are never all read at once.
    values: dict[str, tuple[np.ndarray, str]] = {}
    kinds: dict[str, tuple[str, str]] = {}

    def classify(name: str, value: np.ndarray, source: str) -> None:
        kind, why = _kind(graph, name, value)
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
    constants = {n for n, (_, source) in values.items() if source != "initializer"}
    candidates = {n: v for n, v in values.items() if lift_constants or n not in constants}
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
        trains = set(chosen)
    elif frozen is not None:
        kept = set(_names("frozen", frozen, candidates))
        trains = {n for n in weights if n not in kept}
        if not trains:
            raise ValueError(
                f"nothing to train: frozen= freezes every weight of the model ({weights})"
            )
    else:
        trains = set(weights)
    tensors = []
    for name, (value, source) in values.items():
        kind, why = kinds[name]
        if name in trains:
            reason = why if kind == WEIGHT else f"named in trainable= ({kind}: {why})"
            if source != "initializer":
                reason += f"; lifted from {source}"
        elif trainable is not None and kind == WEIGHT:
            reason = "not named in trainable="
        elif frozen is not None and kind == WEIGHT and name in frozen:
            reason = "frozen by the user (frozen=)"
        elif name in constants and not lift_constants and kind == WEIGHT:
            reason = f"stays in {source}: lift_constants=False"
        elif kind == WEIGHT:
            reason = why
        else:
            reason = f"{kind}: {why}"
        if name in constants and kind not in (WEIGHT,) and name not in trains:
            reason += f" (stays in {source})"
        tensors.append(
            Tensor(name, tuple(value.shape), str(value.dtype), source, kind, name in trains, reason)
        )
    notes = attribute_weights(main)
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


def _stored(graph: onnx.GraphProto) -> frozenset[str]:
    """The names of the initializers and Constant outputs of ``graph``."""
    constants = {n.output[0] for n in graph.node if _op(n) == "Constant" and n.output}
    return frozenset({*(i.name for i in graph.initializer), *constants})


class Kinds:
    """The kinds of a training model's initializers, for the ys of its Gradient nodes.

    The inference graph's nodes decide the uses; ``y`` (a loss the
    ``algorithm`` nodes compute from the inference graph) decides the reach.
    The graphs are indexed once, for any number of Gradient nodes.
    """

    def __init__(self, main: onnx.GraphProto, algorithm: Sequence[onnx.NodeProto]) -> None:
        stored = _stored(main)
        inputs = frozenset(i.name for i in main.input if i.name not in stored)
        outputs = frozenset(o.name for o in main.output)
        self.graph = _Graph([n for n in main.node if _op(n) is not None], inputs, outputs, stored)
        both = [n for n in (*main.node, *algorithm) if _op(n) is not None]
        self.both = _Graph(both, inputs, outputs, stored)

    def __call__(self, values: Mapping[str, np.ndarray], y: str) -> dict[str, tuple[str, str]]:
        """The kind of each of ``values`` (initializers of the inference graph) for ``y``."""
        reached = self.both.reached(y)
        kinds = {}
        for name, value in values.items():
            kind, why = _kind(self.graph, name, value)
            if kind not in (*NEVER, "unreached") and name not in reached:
                kind, why = "unreached", f"'{y}' does not depend on it"
            kinds[name] = (kind, why)
        return kinds


def kinds_of(
    main: onnx.GraphProto,
    algorithm: Sequence[onnx.NodeProto],
    values: Mapping[str, np.ndarray],
    y: str,
) -> dict[str, tuple[str, str]]:
    """The kind of each of ``values`` (initializers of ``main``) in a training model."""
    return Kinds(main, algorithm)(values, y)


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
