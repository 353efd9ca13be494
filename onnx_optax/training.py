"""Training an ONNX model from its own ``training_info`` (TrainingInfoProto).

* :func:`attach`: an inference model plus a loss and an onnx_optax optimizer
  as a complete training model (loss, ``Gradient``, optimizer node, ``T + 1``
  and every binding in ``training_info``; the inference graph untouched).
* :func:`check`: everything the ONNX checker does not validate about
  ``training_info`` (bindings, Gradient, optimizer state, T), as messages.
* :class:`Session`: runs the initialization graphs and then algorithm steps,
  each ``training_info`` entry compiled once into one jitted XLA computation
  on the *combined* graph (the inference graph followed by the algorithm), its
  state donated; :meth:`Session.to_model` writes the trained model back.

State (parameters, V, H, T) lives in initializers, so ``Session(session.to_model())``
continues bit-identically.

Example:
  >>> import numpy as np, onnx_optax
  >>> from onnx import TensorProto, helper, numpy_helper
  >>> from onnx_optax import training
  >>> w = numpy_helper.from_array(np.zeros((3, 2), np.float32), "w")
  >>> graph = helper.make_graph(
  ...     [helper.make_node("MatMul", ["x", "w"], ["y"])], "linear",
  ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
  ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])], initializer=[w])
  >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
  >>> trainable = training.attach(model, loss="mse", target="t", optimizer=onnx_optax.adam(0.1))
  >>> training.check(trainable)
  []
  >>> session = training.Session(trainable)
  >>> x, t = np.ones((4, 3), np.float32), np.ones((4, 2), np.float32)
  >>> float(session.step({"x": x, "t": t})["loss"])
  1.0
  >>> print(session.initializers["w"].round(3))
  [[0.1 0.1]
   [0.1 0.1]
   [0.1 0.1]]

Needs the ``onnx`` extra (``pip install "onnx-optax[onnx]"``, from a clone
``pip install ".[onnx]"``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from onnx_optax._src.extras import missing_extra

try:
    import onnx
    from onnx import helper, numpy_helper
except ImportError as _error:
    raise missing_extra("onnx_optax.training", "onnx", _error) from _error

from onnx_optax._src.graph import GRADIENT, GraphFunction, to_jax
from onnx_optax._src.load import load_model
from onnx_optax._src.onnx_graph import count_function
from onnx_optax._src.onnx_nodes import DOMAIN, OPSET_VERSION, describe, make_node, read_node
from onnx_optax._src.onnx_tensors import read_tensor, tensor_dtype
from onnx_optax._src.packed import PackedTree
from onnx_optax._src.registry import OPERATORS, operator_of
from onnx_optax.interop import _attribute_values, _common_dtype, _learning_rate_value

__all__ = ["LOSSES", "Session", "TrainingModelError", "attach", "check", "load"]

LOSSES = ("softmax_cross_entropy", "log_loss", "nll", "mse")
LOSS_OUTPUT = "loss"
# Probabilities are clipped below at this value before the log of log_loss.
LOG_LOSS_EPSILON = 1e-7


class TrainingModelError(ValueError):
    """A model's ``training_info`` cannot run; the message lists every problem found."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


# ----------------------------------------------------------------------------- loading


def load(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Reads a model file through onnx_optax's one loading layer.

    External data is read only from inside the model's folder, and the size
    limits of :class:`onnx_optax.backend.Limits` apply.
    """
    return load_model(path)


def _as_model(model: Any) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto | bytes | str | os.PathLike):
        return load_model(model)
    raise TypeError(f"expected an onnx.ModelProto or a path, got {type(model).__name__}")


# ----------------------------------------------------------------------------- attach


class _Names:
    """Fresh tensor names, unique in the model (generated, never guessed)."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.taken: set[str] = set()
        for values in (graph.input, graph.output, graph.value_info):
            self.taken.update(v.name for v in values)
        self.taken.update(i.name for i in graph.initializer)
        for node in graph.node:
            self.taken.update(node.input)
            self.taken.update(node.output)

    def __call__(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name


def _value_info(name: str, elem: int, shape: Sequence[Any] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def _declared(value: onnx.ValueInfoProto) -> tuple[int, list[Any] | None]:
    kind = value.type.tensor_type
    if not kind.HasField("shape"):
        return kind.elem_type, None
    dims = [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in kind.shape.dim
    ]
    return kind.elem_type, dims


def _loss_nodes(
    loss: Any,
    prediction: str,
    elem: int,
    shape: list[Any] | None,
    target: str,
    names: _Names,
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
        t_elem, t_shape = _declared(loss.input[1])
        return nodes, inits, _value_info(target, t_elem, t_shape), value
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
        return nodes, [], _value_info(target, elem, shape), value
    target_info = _value_info(target, int64, batch)
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


def attach(
    model: onnx.ModelProto,
    *,
    loss: Any = "softmax_cross_entropy",
    target: str = "label",
    output: str | None = None,
    optimizer: Any,
    trainable: Sequence[str] | None = None,
) -> onnx.ModelProto:
    """An inference model made trainable: its graph untouched, plus ``training_info``.

    The algorithm computes the loss of ``output`` against the new input
    ``target``, its ``Gradient`` with respect to the ``trainable``
    initializers, one optimizer step and ``T + 1``; ``update_binding`` writes
    the new parameters, the optimizer state (stored as initializers, as the
    transformation's ``init`` makes it) and T back. Its loss output is ``loss``.

    Args:
      model: the inference ``ModelProto`` (not modified).
      loss: ``"softmax_cross_entropy"`` (logits), ``"log_loss"``
        (probabilities, clipped below at 1e-7), ``"nll"`` (log-probabilities):
        each with int64 class targets, one per row; ``"mse"`` (a target shaped
        like the output, mean over every element); or a ``GraphProto`` with
        inputs (prediction, target) and one scalar output.
      target: name of the new graph input holding the targets.
      output: the graph output the loss reads (default: the first).
      optimizer: a transformation built by onnx_optax (adagrad, adam,
        momentum, nesterov; not a chain) with a constant learning rate.
      trainable: initializer names to train (default: every float initializer).

    Returns:
      A new ``ModelProto`` that passes ``onnx.checker.check_model(full_check=True)``
      and :func:`check`.
    """
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"attach needs an onnx.ModelProto, got {type(model).__name__}")
    operator = operator_of(optimizer)
    if model.training_info:
        raise ValueError("the model already has training_info; attach takes an inference model")
    graph = model.graph
    names = _Names(graph)
    outputs = {o.name: o for o in graph.output}
    if not outputs:
        raise ValueError("the model's graph has no output for the loss to read")
    output = graph.output[0].name if output is None else output
    if output not in outputs:
        raise ValueError(
            f"output {output!r} is not a graph output; the outputs are {list(outputs)}"
        )
    if target in names.taken:
        raise ValueError(
            f"target {target!r} is already a tensor name of the model; pass another target="
        )
    names.taken.add(target)
    if LOSS_OUTPUT in names.taken:
        raise ValueError(f"the model already has a tensor named {LOSS_OUTPUT!r}, the loss output")
    names.taken.add(LOSS_OUTPUT)
    elem, shape = _declared(outputs[output])
    if elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
        raise ValueError(f"output {output!r} is not a float tensor; the loss reads a float output")

    values = {i.name: read_tensor(i, "graph initializer") for i in graph.initializer}
    floats = [n for n, v in values.items() if np.issubdtype(v.dtype, np.floating)]
    chosen = floats if trainable is None else list(trainable)
    unknown = [n for n in chosen if n not in values]
    if unknown:
        raise ValueError(f"trainable {unknown} are not initializers of the model's graph")
    if not chosen:
        raise ValueError("nothing to train: the model has no float initializer")
    params = {n: values[n] for n in chosen}
    dtype = _common_dtype(list(params.values()))
    p_elem = int(helper.np_dtype_to_tensor_dtype(dtype))

    opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    nodes, inits, target_info, value = _loss_nodes(loss, output, elem, shape, target, names, opset)
    nodes.append(helper.make_node("Identity", [value], [LOSS_OUTPUT]))

    grads = [names(f"{n}.grad") for n in chosen]
    nodes.append(
        helper.make_node(
            GRADIENT, chosen, grads, domain=DOMAIN, xs=chosen, y=value, name="gradient"
        )
    )
    # The node with placeholder names, renamed to fresh ones.
    placeholders = [f"p{i}" for i in range(len(chosen))]
    node = make_node(
        operator.op_type,
        _attribute_values(optimizer),
        placeholders,
        node_name=names(operator.op_type.lower()),
    )
    R, T = names("R"), names("T")
    rename = {"R": R, "T": T}
    for p, n, g in zip(placeholders, chosen, grads, strict=True):
        rename[p], rename[f"{p}.grad"] = n, g
        rename[f"{p}.new"] = names(f"{n}.new")
        for field in operator.fields:
            rename[f"{p}.{field}"] = names(f"{n}.{field}")
            rename[f"{p}.{field}.new"] = names(f"{n}.{field}.new")
    node.input[:] = [rename[n] for n in node.input]
    node.output[:] = [rename[n] for n in node.output]
    nodes.append(node)
    one, T_next = names("T.one"), names("T.next")
    nodes.append(helper.make_node("Add", [T, one], [T_next]))

    state = optimizer.init({n: jax.numpy.asarray(v) for n, v in params.items()})
    stored = [numpy_helper.from_array(np.asarray(optimizer.initial_count, np.int64), T)]
    for field in operator.fields:
        tree = getattr(state, field)
        if isinstance(tree, PackedTree):
            tree = tree.unpack()
        for n in chosen:
            stored.append(
                numpy_helper.from_array(
                    np.asarray(tree[n], dtype), rename[f"p{chosen.index(n)}.{field}"]
                )
            )
    learning_rate = _learning_rate_value(optimizer, None)
    inits += [
        numpy_helper.from_array(np.asarray(learning_rate, dtype), R),
        numpy_helper.from_array(np.asarray(1, np.int64), one),
    ]
    binding = {}
    algorithm_outputs = [_value_info(LOSS_OUTPUT, elem, [])]
    for group_in, group_out in [("", ".new")] + [(f".{f}", f".{f}.new") for f in operator.fields]:
        for i, n in enumerate(chosen):
            key = n if not group_in else rename[f"p{i}{group_in}"]
            out = rename[f"p{i}{group_out}"]
            binding[key] = out
            algorithm_outputs.append(_value_info(out, p_elem, list(params[n].shape)))
    binding[T] = T_next
    algorithm_outputs.append(_value_info(T_next, onnx.TensorProto.INT64, []))
    algorithm = helper.make_graph(
        nodes, "training_step", [target_info], algorithm_outputs, initializer=inits
    )

    result = onnx.ModelProto()
    result.CopyFrom(model)
    result.graph.initializer.extend(stored)
    result.ir_version = max(result.ir_version, 7)
    if not any(o.domain == DOMAIN for o in result.opset_import):
        result.opset_import.append(helper.make_opsetid(DOMAIN, OPSET_VERSION))
    result.training_info.append(
        helper.make_training_info(algorithm, list(binding.items()), None, None)
    )
    return result


# ----------------------------------------------------------------------------- the combined graph


def _mutable(model: onnx.ModelProto) -> list[str]:
    """Initializers that some binding writes, in the order of the graph's initializers."""
    keys = {
        entry.key
        for info in model.training_info
        for entry in (*info.update_binding, *info.initialization_binding)
    }
    return [i.name for i in model.graph.initializer if i.name in keys]


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {o.domain: int(o.version) for o in model.opset_import}


class _Entry:
    """One training_info entry as one jitted function of (state, feeds, constants)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        index: int,
        state: Mapping[str, np.ndarray],
        initializers: Mapping[str, np.ndarray],
    ) -> None:
        info = model.training_info[index]
        self.where = f"training_info[{index}]"
        self.binding = {e.key: e.value for e in info.update_binding}
        main = model.graph
        inputs = [i for i in main.input if i.name not in initializers]
        inputs += [
            _value_info(n, int(helper.np_dtype_to_tensor_dtype(v.dtype)), list(v.shape))
            for n, v in state.items()
        ]
        inputs += list(info.algorithm.input)
        constants = [i for i in main.initializer if i.name not in state]
        graph = helper.make_graph(
            [*main.node, *info.algorithm.node],
            f"{main.name}+{info.algorithm.name}",
            inputs,
            list(info.algorithm.output),
            initializer=[*constants, *info.algorithm.initializer],
        )
        self.function = GraphFunction(graph, opsets=_opsets(model))
        if self.function.static_inputs:
            raise ValueError(
                f"{self.where}: inputs {list(self.function.static_inputs)} are read as shapes; "
                "a training step cannot take them as data"
            )
        used = _used(self.function.order)
        self.feeds = [i for i in graph.input if i.name not in state and i.name in used]
        self.outputs = [o.name for o in info.algorithm.output]
        bound = set(self.binding.values())
        self.reported = [n for n in self.outputs if n not in bound]
        self.constants = {
            n: to_jax(f"initializer '{n}'", v) for n, v in self.function.params.items()
        }

        def step(
            state: dict[str, jax.Array], feeds: dict[str, jax.Array], constants: dict[str, Any]
        ) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
            values = dict(
                zip(self.outputs, self.function.apply({**feeds, **state}, constants), strict=True)
            )
            new = {k: values[self.binding[k]] if k in self.binding else v for k, v in state.items()}
            return {n: values[n] for n in self.reported}, new

        self.step = step
        self.jitted = jax.jit(step, donate_argnums=0)


def _used(steps: Sequence[Any]) -> set[str]:
    names: set[str] = set()
    for step in steps:
        names.update(step.inputs)
        names.update(_used(getattr(step, "order", [])))
    return names


def _spec(value: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(np.shape(value), jax.dtypes.canonicalize_dtype(value.dtype))


# ----------------------------------------------------------------------------- check


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
        want = _spec(initializers[key])
        got = found[value]
        if tuple(got.shape) != tuple(want.shape) or np.dtype(got.dtype) != np.dtype(want.dtype):
            problems.append(
                f"{where}: {field}['{key}'] = '{value}': the value is "
                f"{np.dtype(got.dtype)}{list(got.shape)} but the initializer is "
                f"{initializers[key].dtype}{list(initializers[key].shape)}"
            )
    return problems


def _entry_problems(
    model: onnx.ModelProto, index: int, initializers: Mapping[str, np.ndarray]
) -> list[str]:
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
    main = model.graph
    sources = (
        {i.name for i in main.input}
        | set(initializers)
        | {i.name for i in algorithm.input}
        | {i.name for i in algorithm.initializer}
    )
    defined = sources | {n for node in (*main.node, *algorithm.node) for n in node.output}
    for node in algorithm.node:
        if node.domain == DOMAIN and node.op_type == GRADIENT:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            xs = [x.decode() for x in attrs.get("xs", [])]
            y = attrs.get("y", b"").decode()
            bad = [x for x in xs if x not in sources]
            if bad:
                problems.append(
                    f"{where}: {describe(node)}: xs {bad} are not initializers or inputs"
                )
            if y not in defined:
                problems.append(f"{where}: {describe(node)}: y '{y}' names no tensor of the graph")
        elif node.domain == DOMAIN and node.op_type in OPERATORS:
            problems += _optimizer_problems(where, node, binding, initializers, algorithm)
    if problems:
        return problems
    state = {n: initializers[n] for n in _mutable(model)}
    try:
        entry = _Entry(model, index, state, initializers)
    except (TypeError, ValueError, NotImplementedError) as error:
        return [f"{where}: {error}"]
    specs = {}
    for value in entry.feeds:
        elem, dims = _declared(value)
        if elem == 0 or dims is None:
            return problems
        dtype = tensor_dtype(elem, f"input '{value.name}'")
        shape = [d if isinstance(d, int) else 2 for d in dims]
        specs[value.name] = jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(dtype))
    try:
        values = jax.eval_shape(
            lambda s, f: entry.function.apply({**f, **s}, entry.constants),
            {n: _spec(v) for n, v in state.items()},
            specs,
        )
    except (TypeError, ValueError) as error:
        return [f"{where}: the algorithm does not run on its declared inputs: {error}"]
    found = dict(zip(entry.outputs, values, strict=True))
    problems += _shape_problems(where, "update_binding", binding, found, initializers)
    if len(init_graph.node) or len(init_graph.output):
        try:
            init_fn = GraphFunction(init_graph, opsets=_opsets(model))
            shapes = jax.eval_shape(lambda: init_fn.apply({}))
        except (TypeError, ValueError, NotImplementedError) as error:
            return [*problems, f"{where}: the initialization graph does not run: {error}"]
        init_binding = {e.key: e.value for e in info.initialization_binding}
        found = dict(zip(init_fn.output_names, shapes, strict=True))
        problems += _shape_problems(
            where, "initialization_binding", init_binding, found, initializers
        )
    return problems


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
        if output is None:
            problems.append(
                f"{where}: T ('{T}') of {node.description} is stored as an initializer but "
                "update_binding does not update it: bind it to T + 1"
            )
        else:
            T_now = int(np.asarray(initializers[T]))
            try:
                counter = count_function(algorithm, T, T_now, output)
                ok = not counter.input_names and int(np.asarray(counter([])[0])) == T_now + 1
            except (TypeError, ValueError, NotImplementedError):
                ok = False
            if not ok:
                problems.append(
                    f"{where}: update_binding['{T}'] = '{output}' is not T + 1 (T of "
                    f"{node.description})"
                )
    return problems


def _initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: read_tensor(i, "graph initializer") for i in model.graph.initializer}


def check(model: Any) -> list[str]:
    """What would stop ``model``'s ``training_info`` from running; ``[]`` when sound.

    Checks what the ONNX checker does not: each binding's key is an
    initializer bound once, its value an output of the matching graph with
    the initializer's shape and dtype; initialization graphs have no inputs;
    Gradient ``xs`` are initializers or inputs and ``y`` names a tensor; each
    optimizer node's parameters and state stored as initializers are bound to
    its outputs and a stored T to T + 1; the algorithm traces on its
    declared inputs. Each message names the entry and the node or binding.
    """
    model = _as_model(model)
    if not model.training_info:
        return ["the model has no training_info: there is no training algorithm"]
    try:
        initializers = _initializers(model)
    except (TypeError, ValueError) as error:
        return [str(error)]
    problems = []
    for index in range(len(model.training_info)):
        problems += _entry_problems(model, index, initializers)
    return problems


# ----------------------------------------------------------------------------- Session


class Session:
    """Runs a model's ``training_info``: initialization, then algorithm steps.

    Each entry compiles once (per feed signature) into one jitted function
    whose state (the bound initializers) is donated. Construction runs
    :func:`check` and raises :class:`TrainingModelError` listing the problems.
    """

    def __init__(self, model: Any) -> None:
        model = _as_model(model)
        problems = check(model)
        if problems:
            raise TrainingModelError(problems)
        self._model = model
        initializers = _initializers(model)
        names = _mutable(model)
        self._dtypes = {n: initializers[n].dtype for n in names}
        self._order = list(initializers)
        self._fixed = {n: v for n, v in initializers.items() if n not in self._dtypes}
        self._state = {n: to_jax(f"initializer '{n}'", initializers[n]) for n in names}
        self._entries = [
            _Entry(model, index, {n: initializers[n] for n in names}, initializers)
            for index in range(len(model.training_info))
        ]
        self._checked: set[Any] = set()

    @property
    def inputs(self) -> list[str]:
        """The names a step feeds: every entry's algorithm inputs and the graph inputs it reads."""
        return list(dict.fromkeys(v.name for entry in self._entries for v in entry.feeds))

    @property
    def initializers(self) -> dict[str, np.ndarray]:
        """The current value of every initializer of the model's graph, by name.

        Those a binding updates change with each step; the others are as stored.
        """
        current = {
            n: np.asarray(v).astype(self._dtypes[n], copy=False) for n, v in self._state.items()
        }
        return {n: current[n] if n in current else self._fixed[n] for n in self._order}

    def initialize(self) -> None:
        """Runs each entry's initialization graph and applies its ``initialization_binding``."""
        for info in self._model.training_info:
            if not info.initialization_binding:
                continue
            function = GraphFunction(info.initialization, opsets=_opsets(self._model))
            values = dict(zip(function.output_names, function.apply({}), strict=True))
            for entry in info.initialization_binding:
                self._state[entry.key] = jax.numpy.asarray(values[entry.value])

    def _feeds(
        self, entry: _Entry, inputs: Mapping[str, Any], dims: dict[str, Any]
    ) -> dict[str, Any]:
        feeds = {}
        for value in entry.feeds:
            name = value.name
            if name not in inputs:
                raise ValueError(
                    f"{entry.where}: missing feed '{name}'; the step takes "
                    f"{[v.name for v in entry.feeds]}"
                )
            array = inputs[name]
            array = array if isinstance(array, jax.Array) else np.asarray(array)
            elem, shape = _declared(value)
            if elem:
                want = tensor_dtype(elem, f"input '{name}'")
                if np.dtype(array.dtype) not in (want, jax.dtypes.canonicalize_dtype(want)):
                    raise TypeError(
                        f"{entry.where}: feed '{name}' has dtype {array.dtype}; the graph "
                        f"declares {want}"
                    )
            if shape is not None:
                ok = len(shape) == array.ndim
                for d, n in zip(shape, array.shape, strict=False):
                    if isinstance(d, int):
                        ok = ok and d == n
                    elif d is not None:
                        ok = ok and dims.setdefault(d, n) == n
                if not ok:
                    raise ValueError(
                        f"{entry.where}: feed '{name}' has shape {list(array.shape)}; the graph "
                        f"declares {shape}" + (f" with {dims}" if dims else "")
                    )
            feeds[name] = to_jax(f"feed '{name}'", array)
        return feeds

    def step(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """One step of every entry in order; returns the algorithms' unbound outputs.

        Feeds are checked first (names, dtypes, declared shapes), so a step
        that fails leaves :attr:`initializers` unchanged.
        """
        dims: dict[str, Any] = {}
        all_feeds = [self._feeds(entry, inputs, dims) for entry in self._entries]
        for entry, feeds in zip(self._entries, all_feeds, strict=True):
            key = (id(entry), tuple((n, v.shape, str(v.dtype)) for n, v in feeds.items()))
            if key not in self._checked:
                state = {n: _spec(v) for n, v in self._state.items()}
                reported, new = jax.eval_shape(entry.step, state, feeds, entry.constants)
                for n, spec in new.items():
                    if spec.shape != state[n].shape or spec.dtype != state[n].dtype:
                        raise ValueError(
                            f"{entry.where}: update_binding['{n}'] gives {spec.dtype}"
                            f"{list(spec.shape)} for these feeds; the initializer is "
                            f"{state[n].dtype}{list(state[n].shape)}"
                        )
                self._checked.add(key)
        outputs: dict[str, np.ndarray] = {}
        for entry, feeds in zip(self._entries, all_feeds, strict=True):
            reported, self._state = entry.jitted(self._state, feeds, entry.constants)
            outputs.update({n: np.asarray(v) for n, v in reported.items()})
        return outputs

    def run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """The inference graph's ``outputs`` (default: all) with the current initializers.

        Only the nodes those outputs need are compiled (once per call).
        """
        model = self.to_model()
        function = GraphFunction(model.graph, outputs=outputs, opsets=_opsets(model))
        values = function({n: inputs[n] for n in function.input_names if n in inputs})
        return dict(zip(function.output_names, values, strict=True))

    def to_model(self) -> onnx.ModelProto:
        """The model with the same graphs and every bound initializer's current value."""
        model = onnx.ModelProto()
        model.CopyFrom(self._model)
        current = {
            n: np.asarray(v).astype(self._dtypes[n], copy=False) for n, v in self._state.items()
        }
        for init in model.graph.initializer:
            if init.name in current:
                init.CopyFrom(numpy_helper.from_array(current[init.name], init.name))
        return model
