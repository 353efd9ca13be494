"""What the importers read from an ONNX training model without running it.

* :func:`check_versions`: the IR version and opset imports, against what the
  installed onnx and onnx_optax know.
* :func:`training_entry`: the one ``training_info`` entry and optimizer node,
  every algorithm node of a known domain.
* :func:`check_bindings`, :func:`check_sources`: every binding accounted for,
  and where each input of the optimizer node comes from.
* :func:`producers`: which node computes each tensor of a graph.
* :func:`rate_scale`: the stored factor on R that ``attach`` writes (``<R>.scale``).
* :func:`constant_value`: a Constant node's value.
* :func:`increment_problem`: whether a binding of T is exactly ``T + 1``,
  decided from the graph's structure in exact integers (nothing is run, so
  neither 32-bit wrap-around nor a value that equals T + 1 at today's T only,
  such as ``T * 2`` at T = 1, can pass).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Mapping
from typing import Any

import numpy as np

from onnx_optax._src.graph import GRADIENT, latest_opset
from onnx_optax._src.onnx_nodes import DOMAIN, OPSET_VERSION, OptimizerNode, describe, listed
from onnx_optax._src.onnx_tensors import read_tensor
from onnx_optax._src.ops import OPS, STANDARD_DOMAINS, Node, read_attributes

__all__ = [
    "SESSION",
    "TRAINING_IR_VERSION",
    "check_bindings",
    "check_sources",
    "check_versions",
    "constant_value",
    "increment_problem",
    "producers",
    "rate_scale",
    "training_entry",
]

# Float element types a learning-rate scale may have (TensorProto: FLOAT16, FLOAT,
# DOUBLE, BFLOAT16), R's own type.
_FLOAT_TYPES = (10, 1, 11, 16)

TRAINING_IR_VERSION = 7  # the IR version that introduced ModelProto.training_info
# How a refusal of a valid model beyond the importer ends.
SESSION = "onnx_optax.training.Session runs such a model"


def check_versions(model: Any) -> None:
    """Refuses an IR version or opset import the installed onnx or onnx_optax does not know.

    The IR version must be 7 (training_info) up to ``onnx.IR_VERSION``; each
    domain is imported once; ``ai.onnx`` and ``ai.onnx.ml`` at a version the
    installed onnx defines; ``ai.onnx.preview.training`` at version 1, the
    only one there is. Both ``ai.onnx`` and the training domain must be
    imported. Versions of other (custom) domains are not judged here.
    """
    import onnx

    installed = f"the installed onnx {onnx.__version__}"
    ir = int(model.ir_version)
    if ir < TRAINING_IR_VERSION:
        raise ValueError(
            f"the model's IR version is {ir}; training_info needs IR version "
            f"{TRAINING_IR_VERSION} or later"
        )
    if ir > onnx.IR_VERSION:
        raise ValueError(
            f"the model's IR version {ir} is newer than {installed} reads (up to "
            f"{onnx.IR_VERSION}); upgrade onnx if the model is genuine"
        )
    newest = {
        "": int(onnx.defs.onnx_opset_version()),
        "ai.onnx.ml": int(onnx.defs.onnx_ml_opset_version()),
    }
    seen: set[str] = set()
    for opset in model.opset_import:
        domain = "" if opset.domain in STANDARD_DOMAINS else opset.domain
        label, version = opset.domain or "ai.onnx", int(opset.version)
        if domain in seen:
            raise ValueError(f"the model imports an opset of '{label}' more than once")
        seen.add(domain)
        if domain == DOMAIN and version != OPSET_VERSION:
            raise ValueError(
                f"the model imports '{DOMAIN}' opset {version}; only version {OPSET_VERSION} "
                "exists (the one onnx_optax implements)"
            )
        if version < 1:
            raise ValueError(f"the model imports '{label}' opset {version}; versions start at 1")
        if version > newest.get(domain, version):
            raise ValueError(
                f"the model imports '{label}' opset {version}; {installed} defines versions 1 "
                f"to {newest[domain]}"
            )
    for domain in ("", DOMAIN):
        if domain not in seen:
            raise ValueError(
                f"the model imports no opset of '{domain or 'ai.onnx'}'; its training "
                "algorithm needs one"
            )


def producers(*graphs: Any) -> dict[str, Any]:
    """The node computing each tensor name of ``graphs``."""
    return {name: node for graph in graphs for node in graph.node for name in node.output}


def constant_value(node: Any) -> np.ndarray:
    """The value of a Constant node."""
    where = describe(node)
    attrs = read_attributes(node, latest_opset(), where)
    return np.asarray(OPS["Constant"].fn(Node(attrs, latest_opset(), where, 1)))


_ONE = "; T + 1 is an Add of T and a constant int64 scalar 1"


def _constant(
    name: str, algorithm: Any, made_by: Mapping[str, Any], outer: Mapping[str, Any]
) -> Any:
    """A constant's value: a Constant node's, or an initializer's; else None."""
    node = made_by.get(name)
    if node is not None:
        if node.domain in STANDARD_DOMAINS and node.op_type == "Constant":
            return constant_value(node)
        return None
    for tensor in algorithm.initializer:
        if tensor.name == name:
            return read_tensor(tensor, "the training algorithm's initializer")
    value = outer.get(name)
    if value is not None and not isinstance(value, np.ndarray):
        value = read_tensor(value, "the model's graph initializer")
    return value


def increment_problem(
    algorithm: Any, T_name: str, T_now: int, output: str, outer: Mapping[str, Any]
) -> str | None:
    """Why ``output`` of ``algorithm`` is not exactly ``T + 1``; ``None`` when it is.

    Accepted: ``Add(T, 1)``, ``Add(1, T)`` or ``Sub(T, -1)``, the 1 (or -1) a
    constant int64 scalar: a Constant node, an initializer of the algorithm
    or one of ``outer`` (the model's graph initializers that no binding
    writes; arrays or ``TensorProto``). ``T_now`` only makes the message
    concrete. The returned phrase continues ``update_binding['T'] = 'out' ``.
    """
    made_by = producers(algorithm)
    node = made_by.get(output)
    if node is None:
        return f"is computed by no node of the training algorithm{_ONE}"
    if node.domain not in STANDARD_DOMAINS or node.op_type not in ("Add", "Sub"):
        return f"is computed by {describe(node)}{_ONE}"
    inputs = list(node.input)
    if len(inputs) != 2 or inputs.count(T_name) != 1:
        return f"is {describe(node)} of {inputs}{_ONE}"
    other = inputs[1 - inputs.index(T_name)]
    c = _constant(other, algorithm, made_by, outer)
    if c is None:
        return f"is {describe(node)} of T and '{other}', which is not a constant{_ONE}"
    if c.dtype != np.int64 or c.shape != ():
        return f"is {describe(node)} of T and '{other}', a {c.dtype}{list(c.shape)} tensor{_ONE}"
    step = int(c)
    if node.op_type == "Add":
        sign, offset, formula = 1, step, f"T + {step}"
    elif inputs[0] == T_name:
        sign, offset, formula = 1, -step, f"T - {step}"
    else:
        sign, offset, formula = -1, step, f"{step} - T"
    if (sign, offset) != (1, 1):
        value = sign * T_now + offset
        return f"is {formula}, which computes {value} from T = {T_now}; it must be T + 1"
    return None


def rate_scale(model: Any, algorithm: Any, rate: str) -> tuple[str, str] | None:
    """``(base, scale)`` when R (``rate``, of ``algorithm``) is ``Mul(base, scale)`` and
    ``scale`` is a learning-rate scale; else None.

    A scale is a float scalar initializer of the model's graph that no binding
    writes and that nothing but this ``Mul`` reads (no node of the inference
    graph or of any ``training_info`` graph, no graph output), so changing its
    value multiplies R and changes nothing else. ``attach`` writes one, named
    ``<R>.scale`` and holding 1; ``Session.learning_rate_scale`` sets it.
    """
    if not rate:
        return None
    producer = next((n for n in algorithm.node if rate in n.output), None)
    if producer is None or producer.domain not in STANDARD_DOMAINS:
        return None
    if producer.op_type != "Mul" or len(producer.input) != 2 or list(producer.output) != [rate]:
        return None
    stored = {i.name: i for i in model.graph.initializer}
    bound = {
        e.key
        for info in model.training_info
        for e in (*info.update_binding, *info.initialization_binding)
    }
    for base, scale in (tuple(producer.input), tuple(reversed(producer.input))):
        tensor = stored.get(scale)
        if base == scale or tensor is None or scale in bound:
            continue
        if tensor.data_type not in _FLOAT_TYPES or list(tensor.dims) != []:
            continue
        readers = [n for n in model.graph.node if scale in _read_names(n)]
        for info in model.training_info:
            graphs = (info.initialization, info.algorithm)
            readers += [n for g in graphs for n in g.node if scale in _read_names(n)]
            readers += [o for g in graphs for o in g.output if o.name == scale]
        readers += [o for o in model.graph.output if o.name == scale]
        if len(readers) == 1 and readers[0] is producer:
            return base, scale
    return None


def _read_names(node: Any) -> set[str]:
    """The names a node reads: its inputs, and those its subgraphs read from outside."""
    names = set(node.input)
    for attribute in node.attribute:
        for graph in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
            for inner in graph.node:
                names |= _read_names(inner)
    return names


def training_entry(model: Any) -> tuple[Any, Any]:
    """The ``training_info`` entry and its optimizer node, for an import.

    The model must have one entry, without an initialization graph, whose
    algorithm holds one Adagrad, Adam or Momentum node and otherwise only
    ``ai.onnx`` ops (known to the installed onnx) and ``Gradient``.
    """
    import onnx

    if not model.training_info:
        raise ValueError("the model has no training_info: there is no training algorithm")
    found = [
        (info, node)
        for info in model.training_info
        for node in info.algorithm.node
        if node.domain == DOMAIN and node.op_type != GRADIENT
    ]
    if len(found) != 1:
        raise ValueError(
            f"the model's training_info holds {len(found)} nodes of '{DOMAIN}' other "
            "than Gradient; from_model reads exactly one optimizer node"
        )
    if len(model.training_info) > 1:
        raise ValueError(
            f"the model has {len(model.training_info)} training_info entries; from_model "
            f"reads a model with one, its optimizer's ({SESSION}: every entry, in order)"
        )
    info = found[0][0]
    if len(info.initialization.node) or len(info.initialization_binding):
        raise ValueError(
            "training_info[0] has an initialization graph, which from_model does not run "
            f"(it would replace stored values); {SESSION}"
        )
    for node in info.algorithm.node:
        if node.domain in STANDARD_DOMAINS:
            if not onnx.defs.has(node.op_type):
                raise ValueError(
                    f"training algorithm: {describe(node)}: no such op in ai.onnx (the "
                    f"installed onnx {onnx.__version__} does not define it)"
                )
        elif node.domain != DOMAIN:
            raise ValueError(
                f"training algorithm: {describe(node)}: from_model reads algorithms of ai.onnx "
                f"ops, Gradient and one optimizer node; onnx_optax runs no op of domain "
                f"'{node.domain}'"
            )
    return found[0]


def check_bindings(info: Any, node: OptimizerNode, stored: Container[str]) -> dict[str, str]:
    """``update_binding`` as a dict, each entry accounted for.

    Each key is an initializer (``stored``) bound once to an algorithm
    output; each X, V and H is bound to the node's matching new value; the
    only other key allowed is T (whose ``T + 1`` the caller checks).
    """
    algorithm_outputs = {o.name for o in info.algorithm.output}
    binding: dict[str, str] = {}
    for entry in info.update_binding:
        key, value = entry.key, entry.value
        if key in binding:
            raise ValueError(
                f"update_binding binds '{key}' twice (to '{binding[key]}' and '{value}')"
            )
        binding[key] = value
        if key not in stored:
            raise ValueError(
                f"update_binding['{key}'] = '{value}': '{key}' is not an initializer of the "
                "model's graph, so there is nothing to update"
            )
        if value not in algorithm_outputs:
            raise ValueError(
                f"update_binding['{key}'] = '{value}': '{value}' is not an output of the "
                f"training algorithm (its outputs: {sorted(algorithm_outputs)[:20]})"
            )
    expected = {node.inputs[1]}
    for group in ("X", *node.state_groups):
        label = "new value" if group == "X" else f"new {group}"
        for x, key, produced in zip(
            node.group("X"), node.group(group), node.output_group(group), strict=True
        ):
            expected.add(key)
            if produced not in algorithm_outputs:
                raise ValueError(
                    f"{node.description}: its output '{produced}' ({label} of "
                    f"'{x}') is not an output of the training algorithm, so it cannot be bound"
                )
            if binding.get(key) != produced:
                found = binding.get(key)
                raise ValueError(
                    f"update_binding['{key}'] should be '{produced}' (the "
                    f"{node.operator.op_type} node's {label} of '{x}'), but it is "
                    + ("missing" if found is None else f"'{found}'")
                )
    for key, value in binding.items():
        if key not in expected:
            raise ValueError(
                f"update_binding['{key}'] = '{value}' writes '{key}', which is none of the "
                f"optimizer's X, V, H or T: from_model cannot represent it; {SESSION}"
            )
    return binding


def _gradient_xs(node: Any) -> list[str]:
    """A Gradient node's ``xs`` attribute."""
    return [x.decode() for a in node.attribute if a.name == "xs" for x in a.strings]


def check_sources(
    node: OptimizerNode,
    made_by: Mapping[str, Any],
    stored: Container[str],
    constants: Container[str],
) -> None:
    """Where the optimizer's inputs come from, for an import.

    The inputs are distinct tensors; X, V and H are computed by no node
    (initializers, which the caller reads); each G is fed or is the output
    of a ``Gradient`` node with respect to that X, fed X itself.
    ``made_by`` maps tensor names to the nodes computing them (main graph and
    algorithm), ``stored`` and ``constants`` name the main graph's and the
    algorithm's initializers.
    """
    where = node.description
    repeated = sorted(name for name, n in Counter(node.inputs).items() if n > 1)
    if repeated:
        raise ValueError(
            f"{where}: names {listed(repeated)} more than once among its inputs; R, T and each "
            "X, G, V, H must be tensors of their own"
        )
    if len(set(node.outputs)) != len(node.outputs):
        raise ValueError(f"{where}: two of its outputs have the same name")
    for group in ("X", *node.state_groups):
        for name in node.group(group):
            if name in made_by:
                raise ValueError(
                    f"{where}: its {group} input '{name}' is computed by "
                    f"{describe(made_by[name])}; the parameters and optimizer state must be "
                    "initializers of the model's graph"
                )
    gradients: dict[int, tuple[list[str], dict[str, int]]] = {}
    for x, g in zip(node.group("X"), node.group("G"), strict=True):
        producer = made_by.get(g)
        label = f"{where}: its G input '{g}' (the gradient of '{x}')"
        if producer is None:
            if g in stored or g in constants:
                raise ValueError(
                    f"{label} is a stored tensor; from_model imports a G that is fed or "
                    "computed by Gradient"
                )
            continue
        if producer.domain != DOMAIN or producer.op_type != GRADIENT:
            raise ValueError(
                f"{label} is computed by {describe(producer)}; from_model imports the "
                "optimizer alone, with G fed or output by Gradient with respect to X, nothing "
                f"in between; {SESSION}"
            )
        if id(producer) not in gradients:
            gradients[id(producer)] = (
                _gradient_xs(producer),
                {name: k for k, name in enumerate(producer.output)},
            )
        xs, position = gradients[id(producer)]
        k = position[g]
        x_k = xs[k] if k < len(xs) else None
        fed = producer.input[k] if k < len(producer.input) else None
        if x_k != x or fed != x:
            raise ValueError(
                f"{label} is output {k} of {describe(producer)}, its gradient with respect to "
                f"xs[{k}] = {x_k!r} fed {fed!r}, not with respect to '{x}'"
            )
