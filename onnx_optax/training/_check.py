"""``check``: what the ONNX checker does not validate about ``training_info``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
import onnx
from onnx import helper

from onnx_optax._src.graph import GRADIENT, GraphFunction
from onnx_optax._src.onnx_graph import increment_problem
from onnx_optax._src.onnx_nodes import DOMAIN, attribute_type_error, describe, read_node
from onnx_optax._src.onnx_tensors import tensor_dtype, utf8
from onnx_optax._src.registry import OPERATORS
from onnx_optax.training._combined import Entry, MainGraph
from onnx_optax.training._kinds import NEVER, WEIGHT, Kinds
from onnx_optax.training._model import (
    abstract,
    as_model,
    declared,
    mutable,
    opsets,
    read_initializers,
)


def _binding_problems(
    where: str,
    field: str,
    entries: Sequence[Any],
    initializers: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    graph_label: str,
) -> list[str]:
    problems = []
    seen: set[str] = set()
    for entry in entries:
        label = f"{where}: {field}['{entry.key}'] = '{entry.value}'"
        if entry.key in seen:
            problems.append(f"{label}: '{entry.key}' is bound twice")
        seen.add(entry.key)
        if entry.key not in initializers:
            problems.append(
                f"{label}: '{entry.key}' is not an initializer of the model's graph, so there is "
                "nothing to update"
            )
        if entry.value not in outputs:
            problems.append(
                f"{label}: '{entry.value}' is not an output of the {graph_label} graph (its "
                f"outputs: {sorted(outputs)})"
            )
    return problems


def _shape_problems(
    where: str,
    field: str,
    binding: Mapping[str, str],
    found: Mapping[str, Any],
    initializers: Mapping[str, np.ndarray],
) -> list[str]:
    problems = []
    for key, value in binding.items():
        if key not in initializers or value not in found:
            continue
        want = abstract(initializers[key])
        got = found[value]
        if tuple(got.shape) != tuple(want.shape) or np.dtype(got.dtype) != np.dtype(want.dtype):
            problems.append(
                f"{where}: {field}['{key}'] = '{value}': the value is "
                f"{np.dtype(got.dtype)}{list(got.shape)} but the initializer is "
                f"{initializers[key].dtype}{list(initializers[key].shape)}"
            )
    return problems


class _Model:
    """What every entry's check reads of the model, computed once (not once per entry)."""

    def __init__(self, model: onnx.ModelProto, initializers: Mapping[str, np.ndarray]) -> None:
        main = model.graph
        self.model = model
        self.initializers = initializers
        self.sources = {i.name for i in main.input} | set(initializers)
        self.produced = {n for node in main.node for n in node.output}
        self.state = {n: initializers[n] for n in mutable(model)}
        self.main = MainGraph(model)
        self._kinds: Kinds | None = None

    def kinds(self) -> Kinds:
        """The plan's rule over the inference graph and every algorithm (built once)."""
        if self._kinds is None:
            self._kinds = Kinds(
                self.model.graph,
                [n for info in self.model.training_info for n in info.algorithm.node],
            )
        return self._kinds


def _entry_problems(
    context: _Model, index: int, entries: list[Entry], *, stand_ins: bool = False
) -> list[str]:
    """The problems of one entry; its :class:`Entry`, when it builds, appended to ``entries``.

    ``stand_ins``: an algorithm whose inputs leave a size symbolic is traced on
    stand-in sizes too (:func:`_stand_in_problems`).
    """
    model, initializers = context.model, context.initializers
    info = model.training_info[index]
    where = f"training_info[{index}]"
    problems: list[str] = []
    init_graph = info.initialization
    if len(init_graph.input):
        problems.append(
            f"{where}: the initialization graph has inputs {[i.name for i in init_graph.input]}; "
            "it must have none"
        )
    problems += _binding_problems(
        where,
        "initialization_binding",
        info.initialization_binding,
        initializers,
        [o.name for o in init_graph.output],
        "initialization",
    )
    algorithm = info.algorithm
    outputs = [o.name for o in algorithm.output]
    problems += _binding_problems(
        where, "update_binding", info.update_binding, initializers, outputs, "algorithm"
    )
    binding = {e.key: e.value for e in info.update_binding}
    own = {i.name for i in algorithm.input} | {i.name for i in algorithm.initializer}
    produced = {n for node in algorithm.node for n in node.output}

    def source(name: str) -> bool:
        return name in context.sources or name in own

    for node in algorithm.node:
        if node.domain == DOMAIN and node.op_type == GRADIENT:
            try:
                xs, y = _gradient_names(node)
            except ValueError as error:
                problems.append(f"{where}: {error}")
                continue
            bad = [x for x in xs if not source(x)]
            if bad:
                problems.append(
                    f"{where}: {describe(node)}: xs {bad} are not initializers or inputs"
                )
            if not (source(y) or y in context.produced or y in produced):
                problems.append(f"{where}: {describe(node)}: y '{y}' names no tensor of the graph")
            else:
                problems += _trained_problems(where, node, context, xs, y)
        elif node.domain == DOMAIN and node.op_type in OPERATORS:
            problems += _optimizer_problems(where, node, binding, initializers, algorithm)
    if any(getattr(p, "blocking", True) for p in problems):
        return problems
    state = context.state
    try:
        entry = Entry(model, index, state, initializers, context.main)
    except (TypeError, ValueError, NotImplementedError) as error:
        return [f"{where}: {error}"]
    entries.append(entry)
    return problems + _traced_problems(where, entry, info, binding, context, stand_ins=stand_ins)


def _feed_specs(entry: Entry, size: int | None) -> dict[str, jax.ShapeDtypeStruct] | None:
    """The algorithm's feeds as declared, each symbolic or unknown size set to ``size``;
    ``None`` where a feed declares no type or rank, or (``size`` None) a size is not a number.
    """
    specs = {}
    for value in entry.feeds:
        elem, dims = declared(value)
        if elem == 0 or dims is None:
            return None
        if size is None and not all(isinstance(d, int) for d in dims):
            return None
        shape = tuple(d if isinstance(d, int) else size for d in dims)
        dtype = tensor_dtype(elem, f"input '{value.name}'")
        specs[value.name] = jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(dtype))
    return specs


def _trace(entry: Entry, state: Mapping[str, Any], specs: Mapping[str, Any]) -> Any:
    """The algorithm's outputs, traced on ``specs`` (shapes and dtypes, nothing computed)."""
    return jax.eval_shape(
        lambda s, f: entry.function.apply({**f, **s}, entry.constants, differentiable=False),
        {n: abstract(state[n]) for n in entry.reads},
        specs,
    )


def _declared_outputs(algorithm: onnx.GraphProto) -> dict[str, jax.ShapeDtypeStruct]:
    """The algorithm's outputs whose type and every size are declared."""
    found = {}
    for output in algorithm.output:
        elem, dims = declared(output)
        if elem and dims is not None and all(isinstance(d, int) for d in dims):
            dtype = tensor_dtype(elem, f"output '{output.name}'")
            found[output.name] = jax.ShapeDtypeStruct(dims, jax.dtypes.canonicalize_dtype(dtype))
    return found


def _traced_problems(
    where: str,
    entry: Entry,
    info: onnx.TrainingInfoProto,
    binding: Mapping[str, str],
    context: _Model,
    *,
    stand_ins: bool,
) -> list[str]:
    """What tracing the algorithm and the initialization graph finds.

    With every input's size declared, the algorithm is traced on those sizes and
    its bound outputs' shapes are checked against the initializers'. With a
    symbolic or unknown size, :class:`Session` checks each feed signature before
    its first step, and what the algorithm declares of its bound outputs is
    checked here; ``stand_ins`` (:func:`check`) also traces it on stand-in sizes
    (:func:`_stand_in_problems`).
    """
    model, initializers = context.model, context.initializers
    specs = _feed_specs(entry, None)
    problems: list[str] = []
    if specs is None:
        if stand_ins:
            problems += _stand_in_problems(where, entry, context.state)
        found: Mapping[str, Any] = _declared_outputs(info.algorithm)
    else:
        try:
            values = _trace(entry, context.state, specs)
        except (TypeError, ValueError, NotImplementedError) as error:
            return [f"{where}: the algorithm does not run on its declared inputs: {error}"]
        found = dict(zip(entry.outputs, values, strict=True))
    problems += _shape_problems(where, "update_binding", binding, found, initializers)
    if specs is None and not stand_ins:
        return problems
    return problems + _initialization_problems(where, info, model, initializers)


# Sizes a symbolic or unknown input size stands for when check() traces an algorithm
# whose inputs do not declare every size: one a batch of 1 needs, one most sequences and
# feature maps pass, one a full-size image needs (every symbolic size set to each in turn).
STAND_IN_SIZES = (32, 1, 224)


def _stand_in_problems(where: str, entry: Entry, state: Mapping[str, Any]) -> list[str]:
    """The algorithm traced with every symbolic or unknown size set to each stand-in.

    One stand-in that traces is enough: the step may run at the sizes it is fed.
    An error raised alike at every stand-in does not depend on the sizes (an
    attribute the op refuses, say) and blocks, as the first step would raise it;
    errors that differ are a warning, naming the first.
    """
    errors: list[str] = []
    for size in STAND_IN_SIZES:
        specs = _feed_specs(entry, size)
        if specs is None:
            return []
        try:
            _trace(entry, state, specs)
        except (TypeError, ValueError, NotImplementedError) as error:
            errors.append(str(error))
        else:
            return []
    sizes = ", ".join(map(str, STAND_IN_SIZES))
    if len(set(errors)) == 1:
        return [
            Problem(
                f"{where}: the algorithm does not run on its declared inputs (every symbolic "
                f"size set to {sizes} in turn, each time): {errors[0]}"
            )
        ]
    return [
        Problem(
            f"{where}: the algorithm did not trace with every symbolic size set to any of "
            f"{sizes}; the step may still run at the sizes it is fed. With "
            f"{STAND_IN_SIZES[0]}: {errors[0]}",
            blocking=False,
        )
    ]


def _initialization_problems(
    where: str, info: onnx.TrainingInfoProto, model: onnx.ModelProto, initializers: Any
) -> list[str]:
    """The initialization graph traced, its bound outputs' shapes against the initializers'."""
    init_graph = info.initialization
    if not (len(init_graph.node) or len(init_graph.output)):
        return []
    try:
        init_fn = GraphFunction(init_graph, opsets=opsets(model), check_shapes=False)
        shapes = jax.eval_shape(lambda: init_fn.apply({}))
    except (TypeError, ValueError, NotImplementedError) as error:
        return [f"{where}: the initialization graph does not run: {error}"]
    init_binding = {e.key: e.value for e in info.initialization_binding}
    found = dict(zip(init_fn.output_names, shapes, strict=True))
    return _shape_problems(where, "initialization_binding", init_binding, found, initializers)


class Problem(str):
    """One finding of :func:`check`: its text, and whether it stops the model from running.

    A *warning* (``blocking`` False) is something the model runs with but
    probably should not: an exporter constant or a hyperparameter trained, a
    weight the loss does not depend on. :class:`Session` refuses a model only
    for blocking problems.
    """

    blocking: bool

    def __new__(cls, text: str, *, blocking: bool = True) -> Problem:
        problem = super().__new__(cls, text)
        problem.blocking = blocking
        return problem


def _trained_problems(
    where: str, node: onnx.NodeProto, context: _Model, xs: Sequence[str], y: str
) -> list[str]:
    """Gradient ``xs`` that :func:`plan`'s rule does not call weights, each named with why.

    Statistics, shapes and integers are blocking (an optimizer would corrupt
    them); constants, hyperparameters and weights ``y`` does not reach are
    warnings.
    """
    initializers = context.initializers
    stored = [x for x in xs if x in initializers]
    if not stored:
        return []
    kinds = context.kinds()({x: initializers[x] for x in stored}, y)
    problems: list[str] = []
    for x in stored:
        kind, why = kinds[x]
        if kind == WEIGHT:
            continue
        if kind in NEVER:
            problems.append(
                Problem(
                    f"{where}: {describe(node)}: xs '{x}' is {why}, not a weight; an optimizer "
                    "would move it by its gradient: leave it out of xs (attach's default does)"
                )
            )
        else:
            problems.append(
                Problem(
                    f"{where}: {describe(node)}: xs '{x}' trains, but it is a {kind} ({why}); "
                    "attach's default leaves it as stored",
                    blocking=False,
                )
            )
    return problems


def _gradient_names(node: onnx.NodeProto) -> tuple[list[str], str]:
    """A Gradient node's ``xs`` and ``y``, each of its declared type (STRINGS, STRING)."""
    kinds = {"xs": onnx.AttributeProto.STRINGS, "y": onnx.AttributeProto.STRING}
    found: dict[str, Any] = {}
    for attribute in node.attribute:
        kind = kinds.get(attribute.name)
        if kind is None:
            continue
        wrong = attribute_type_error(node, attribute, kind)
        if wrong:
            raise ValueError(wrong)
        value = helper.get_attribute_value(attribute)
        what = f"{describe(node)}: attribute '{attribute.name}'"
        found[attribute.name] = (
            [utf8(v, what) for v in value]
            if kind == onnx.AttributeProto.STRINGS
            else utf8(value, what)
        )
    return found.get("xs", []), found.get("y", "")


def unskipped(algorithm: onnx.GraphProto, binding: Mapping[str, str]) -> dict[str, str]:
    """``binding`` with each ``Where(ok, new, key)`` bound to ``key`` read as ``new``.

    A step that may be skipped (``attach(loss_scale=)`` on non-finite gradients)
    binds each initializer to such a Where: the optimizer's output when ``ok``,
    else the value it had. The optimizer's rules are checked on ``new``.
    """
    producer = {o: n for n in algorithm.node for o in n.output}
    found = {}
    for key, value in binding.items():
        node = producer.get(value)
        if node is not None and node.op_type == "Where" and list(node.input[2:]) == [key]:
            value = node.input[1]
        found[key] = value
    return found


def _optimizer_problems(
    where: str,
    proto: onnx.NodeProto,
    binding: Mapping[str, str],
    initializers: Mapping[str, np.ndarray],
    algorithm: onnx.GraphProto,
) -> list[str]:
    try:
        node = read_node(proto)
    except (TypeError, ValueError, NotImplementedError) as error:
        return [f"{where}: {error}"]
    binding = unskipped(algorithm, binding)
    problems = []
    for group in ("X", *node.state_groups):
        label = "new value" if group == "X" else f"new {group}"
        for x, stored, produced in zip(
            node.group("X"), node.group(group), node.output_group(group), strict=True
        ):
            if stored in initializers and binding.get(stored) != produced:
                found = binding.get(stored)
                problems.append(
                    f"{where}: update_binding['{stored}'] should be '{produced}' (the "
                    f"{node.description}'s {label} of '{x}'), but it is "
                    + ("missing" if found is None else f"'{found}'")
                )
    T = node.inputs[1]
    if T in initializers:
        output = binding.get(T)
        T_stored = initializers[T]
        if T_stored.shape != () or T_stored.dtype != np.int64:
            problems.append(
                f"{where}: T ('{T}') of {node.description} is stored as a "
                f"{T_stored.dtype}{list(T_stored.shape)} initializer; it must be an int64 scalar"
            )
        elif output is None:
            problems.append(
                f"{where}: T ('{T}') of {node.description} is stored as an initializer but "
                "update_binding does not update it: bind it to T + 1"
            )
        else:
            T_now = int(T_stored)
            constants = {n: v for n, v in initializers.items() if n not in binding}
            try:
                problem = increment_problem(algorithm, T, T_now, output, constants)
            except (TypeError, ValueError) as error:
                problem = str(error)
            if problem:
                problems.append(
                    f"{where}: update_binding['{T}'] = '{output}' is not T + 1 (T of "
                    f"{node.description}): {problem}"
                )
    return problems


def check(model: onnx.ModelProto | bytes | str | os.PathLike[str]) -> list[Problem]:
    """What would stop the training_info from running, or looks wrong; ``[]`` when sound.

    Checks what the ONNX checker does not: each binding's key is an
    initializer bound once, its value an output of the matching graph with
    the initializer's shape and dtype; initialization graphs have no inputs;
    Gradient ``xs`` are initializers or inputs, none of them a running
    statistic, a shape or an integer tensor, and ``y`` names a tensor; each
    optimizer node's parameters and state stored as initializers are bound to
    its outputs and a stored T (an int64 scalar) to T + 1; the algorithm traces
    as the first step would, so every error the step raises while tracing is
    found here: on the declared sizes, or, where an input leaves a size symbolic
    or unknown, on stand-in sizes (each such size set to 32, 1 and 224 in turn;
    an error raised at every one alike blocks, while errors that differ by size
    are a warning: the step may run at the sizes it is fed).
    Warnings (``problem.blocking`` False): ``xs`` holding what :func:`plan`
    does not call a weight (an exporter constant, a hyperparameter, input
    preprocessing, a non-finite tensor) or a weight ``y`` does not depend on.
    Each message names the entry and the node or binding.
    """
    return checked_entries(as_model(model), stand_ins=True).problems


class Checked(NamedTuple):
    """What :func:`check` found, and what it built on the way (for :class:`Session`)."""

    problems: list[Problem]
    entries: list[Entry]  # one per training_info entry when nothing blocks, else partial
    initializers: dict[str, np.ndarray]  # the main graph's, read once


def checked_entries(model: onnx.ModelProto, *, stand_ins: bool = False) -> Checked:
    """:func:`check` of a loaded model, with the entries it built and the initializers read.

    ``stand_ins`` (what :func:`check` asks): trace algorithms whose inputs leave a size
    symbolic on stand-in sizes too; :class:`Session` checks each feed signature before its
    first step instead.

    Linear in the model: what every entry reads of the main graph is indexed once.
    """
    if not model.training_info:
        return Checked(
            [Problem("the model has no training_info: there is no training algorithm")], [], {}
        )
    try:
        initializers = read_initializers(model)
    except (TypeError, ValueError) as error:
        return Checked([Problem(str(error))], [], {})
    context = _Model(model, initializers)
    problems: list[str] = []
    entries: list[Entry] = []
    for index in range(len(model.training_info)):
        problems += _entry_problems(context, index, entries, stand_ins=stand_ins)
    return Checked(
        [p if isinstance(p, Problem) else Problem(p) for p in problems], entries, initializers
    )
