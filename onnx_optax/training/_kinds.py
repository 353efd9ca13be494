"""The kind of each tensor a graph stores, decided from how the graph reads it.

The kinds (weight, exporter constant, hyperparameter, preprocessing,
non-finite, statistic, shape, integer, unreached) and the rule that picks one
are described in :mod:`onnx_optax.training._plan`, which trains the weights;
:mod:`onnx_optax.training._check` asks the same of a training model's Gradient.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx

from onnx_optax._src.onnx_nodes import describe
from onnx_optax._src.onnx_tensors import read_tensor
from onnx_optax._src.ops import OPS, STANDARD_DOMAINS

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


# ----------------------------------------------------------------------------- the graph's uses


@dataclasses.dataclass
class UseGraph:
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
        todo = [inner for node in self.nodes for inner in inner_nodes(node)]
        while todo:
            inner = todo.pop()
            if standard_op(inner) is None:
                continue
            for position, name in enumerate(inner.input):
                if name:
                    self.consumers.setdefault(name, []).append((inner, position))
            todo += inner_nodes(inner)

    def source(self, name: str) -> tuple[str, onnx.NodeProto | None]:
        """Where ``name``'s value comes from, looking back through pass-through ops."""
        seen = set()
        while name not in seen:
            seen.add(name)
            node = self.producer.get(name)
            if node is None or standard_op(node) not in PASS_THROUGH or not node.input:
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
                if standard_op(node) in PASS_THROUGH and position == 0 and node.output:
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
            if node is None or standard_op(node) not in ELEMENTWISE or len(node.input) != 2:
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
            if node is None or standard_op(node) in ("Shape", "Size"):
                continue
            static = OPS[node.op_type].static if standard_op(node) in OPS else ()
            read = [n for p, n in enumerate(node.input) if p not in static]
            nested = inner_nodes(node)
            while nested:  # what its subgraphs read (their own names find no producer)
                inner = nested.pop()
                read += inner.input
                nested += inner_nodes(inner)
            for name in read:
                if name and name not in found:
                    found.add(name)
                    todo.append(name)
        return found


def inner_nodes(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """The nodes of a node's subgraphs (If's branches, Loop's and Scan's bodies)."""
    graphs = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
    graphs += [g for a in node.attribute for g in a.graphs]
    return [inner for graph in graphs for inner in graph.node]


def standard_op(node: onnx.NodeProto) -> str | None:
    """The op type of a standard node; None for any other domain."""
    return node.op_type if node.domain in STANDARD_DOMAINS else None


def _use(graph: UseGraph, node: onnx.NodeProto | None, position: int) -> tuple[str, str]:
    """The kind a use gives, and the use in words."""
    if node is None:
        return "data", "a graph output"
    op = standard_op(node) or ""
    where = f"input {position} of {describe(node)}"
    if op in STATISTICS and position in STATISTICS[op]:
        return "statistic", f"the {STATISTICS[op][position]} (input {position}) of {describe(node)}"
    if op in OPS and position in OPS[op].static:
        return "shape", f"read as a shape ({where})"
    if op in WEIGHT_INPUTS and (WEIGHT_INPUTS[op] is None or position in (WEIGHT_INPUTS[op] or ())):
        return WEIGHT, where
    if op == "Add" and len(node.input) == 2:
        _, other = graph.source(node.input[1 - position])
        if other is not None and standard_op(other) in PRODUCES_LINEAR:
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


def kind_of(graph: UseGraph, name: str, value: np.ndarray) -> tuple[str, str]:
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


def constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a standard ``Constant`` node holding a float tensor, else None."""
    if standard_op(node) != "Constant" or len(node.output) != 1:
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


def stored_names(graph: onnx.GraphProto) -> frozenset[str]:
    """The names of the initializers and Constant outputs of ``graph``."""
    constants = {n.output[0] for n in graph.node if standard_op(n) == "Constant" and n.output}
    return frozenset({*(i.name for i in graph.initializer), *constants})


class Kinds:
    """The kinds of a training model's initializers, for the ys of its Gradient nodes.

    The inference graph's nodes decide the uses; ``y`` (a loss the
    ``algorithm`` nodes compute from the inference graph) decides the reach.
    The graphs are indexed once, for any number of Gradient nodes.
    """

    def __init__(self, main: onnx.GraphProto, algorithm: Sequence[onnx.NodeProto]) -> None:
        stored = stored_names(main)
        inputs = frozenset(i.name for i in main.input if i.name not in stored)
        outputs = frozenset(o.name for o in main.output)
        self.graph = UseGraph(
            [n for n in main.node if standard_op(n) is not None], inputs, outputs, stored
        )
        both = [n for n in (*main.node, *algorithm) if standard_op(n) is not None]
        self.both = UseGraph(both, inputs, outputs, stored)

    def __call__(self, values: Mapping[str, np.ndarray], y: str) -> dict[str, tuple[str, str]]:
        """The kind of each of ``values`` (initializers of the inference graph) for ``y``."""
        reached = self.both.reached(y)
        kinds = {}
        for name, value in values.items():
            kind, why = kind_of(self.graph, name, value)
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
