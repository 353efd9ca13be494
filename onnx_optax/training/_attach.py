"""``attach``: an inference model plus a loss and an optimizer as a training model."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
import onnx
from onnx import helper, numpy_helper

import onnx_optax.training._loss_scale as loss_scaling
from onnx_optax._src.driver import Transformation
from onnx_optax._src.graph import GRADIENT
from onnx_optax._src.onnx_nodes import (
    DOMAIN,
    OPSET_VERSION,
    attribute_values,
    common_dtype,
    make_node,
)
from onnx_optax._src.onnx_tensors import tensor_dtype
from onnx_optax._src.packed import PackedTree
from onnx_optax._src.registry import operator_of
from onnx_optax.training._clipping import clip_by_global_norm_nodes
from onnx_optax.training._compute import master_weights, to_bfloat16
from onnx_optax.training._dropout import train_dropout
from onnx_optax.training._losses import (
    CLASS_LOSS_OPSET,
    CLASS_LOSSES,
    LOSS_OUTPUT,
    loss_nodes,
    softmax_logits,
)
from onnx_optax.training._model import (
    Names,
    as_model,
    copy_model,
    declared,
    value_info,
    with_opset,
)
from onnx_optax.training._plan import Plan, lift, loss_output, make_plan
from onnx_optax.training.schedules import learning_rate_nodes


def _state(
    optimizer: Transformation,
    params: dict[str, jax.ShapeDtypeStruct],
    name: str,
    field: str,
) -> np.ndarray:
    """The initial ``field`` (V, H, ...) of the trained tensor ``name``, as ``init`` makes it."""
    tree = getattr(optimizer.init({name: params[name]}), field)
    if isinstance(tree, PackedTree):
        tree = tree.unpack()
    return np.asarray(tree[name])


def attach(
    model: onnx.ModelProto | bytes | str | os.PathLike[str],
    *,
    loss: str | onnx.GraphProto = "softmax_cross_entropy",
    target: str | None = None,
    output: str | None = None,
    optimizer: Transformation,
    trainable: Sequence[str] | None = None,
    frozen: Sequence[str] | None = None,
    clip_global_norm: float | None = None,
    class_axis: int | None = None,
    lift_constants: bool = True,
    master_dtype: str | np.dtype | type | None = None,
    dropout: bool = False,
    loss_scale: float | None = None,
    loss_scale_period: int = 2000,
    compute_dtype: str | np.dtype | type | None = None,
) -> onnx.ModelProto:
    """An inference model made trainable: its graph computing the same, plus ``training_info``.

    The algorithm computes the loss of ``output`` against the new input
    ``target``, its ``Gradient`` with respect to the trained tensors, one
    optimizer step and ``T + 1``; ``update_binding`` writes the new
    parameters, the optimizer state (stored as initializers, as the
    transformation's ``init`` makes it) and T back. Its loss output is ``loss``.

    R is the learning rate (a number, or a schedule's value at T) times
    ``R.scale``, an initializer holding 1 that no binding writes:
    :attr:`Session.learning_rate_scale` and :meth:`Session.set_learning_rate`
    change it between steps, and the saved model keeps it.

    What trains is :func:`plan`'s rule, written once for ``attach``,
    ``check`` and ``onnx-optax attach --list``: the weights the output
    depends on (initializers and float ``Constant`` nodes in weight
    positions, lifted into initializers of the same name and value, so
    inference computes the same), not exporter constants (one element read as
    data), hyperparameters, input preprocessing, non-finite tensors, running
    statistics, shapes or integers. Call :func:`plan` with the same arguments
    to see the table.

    The step runs the inference graph as it is written. A BatchNormalization
    node in inference mode (``training_mode=0``, the default; every node
    before opset 14 without the statistics outputs) normalizes with its stored
    running mean and variance in training too, as a frozen BN layer does: the
    gradient flows through the normalization with those statistics held
    constant, scale and bias train, and the running statistics, which no
    binding writes, stay bit-identical.

    Args:
      model: the inference model: a ``ModelProto`` (not modified), its bytes or a
        path (read through the one loading layer, external data from its folder).
      loss: ``"softmax_cross_entropy"`` (logits), ``"log_loss"``
        (probabilities, clipped below at 1e-7), ``"nll"`` (log-probabilities):
        each with int64 class targets, one per position (the output without its
        class axis), the mean over the positions; with a float target shaped
        like the output, the mean over every element of ``"mse"`` (p - t)**2,
        ``"l1"`` |p - t| or ``"bce_with_logits"`` (p logits, t in [0, 1])
        max(p, 0) - p*t + log(1 + exp(-|p|)), which is finite for any
        logit; or a ``GraphProto`` with inputs (prediction, target) and one
        scalar output. Class losses need ai.onnx opset 12: an older model's
        opset import is raised to 12 when none of its ops differ between the
        two, else the model is converted with ``onnx.version_converter``;
        either way a :class:`UserWarning` says so.
      target: name of the new graph input holding the targets (default: a
        name the model does not use, ``"target"`` unless taken).
      output: the graph output the loss reads (required when there are several).
      optimizer: a transformation built by onnx_optax (adagrad, adam,
        momentum, nesterov; not a chain) whose learning rate is a number or a
        schedule of :mod:`onnx_optax.training.schedules`, written as ops
        computing R from the stored T (the count the transformation passes).
      trainable: the tensors to train, exactly (initializer names, or the
        output names of float Constant nodes). Running statistics, shapes and
        integer tensors cannot be named; a constant can, and :func:`check`
        then says it trains.
      frozen: the weights not to train, every other one is (instead of
        ``trainable``; not both).
      clip_global_norm: clip the gradients to this global norm before the
        optimizer, as ``optax.clip_by_global_norm`` (a number > 0; None: no
        clipping): with ``norm = sqrt(sum of all squared gradient elements)``,
        each gradient ``g`` becomes ``g / norm * clip_global_norm`` when
        ``norm >= clip_global_norm``.
      class_axis: the axis of ``output`` holding the classes, for class
        losses (default 1: ``[N, C]`` or ``[N, C, d1, ...]``; 2 or -1 for a
        time-major ``[T, N, C]``). An axis whose size is symbolic while another
        is fixed is refused, naming the output and its shape.
      lift_constants: store the float Constant nodes that train as
        initializers (default); False leaves every Constant node as it is and
        untrained.
      master_dtype: ``"float32"`` (or float64) to train 16-bit weights on wider
        master copies: each trained float16/bfloat16 ``W`` becomes the trained
        initializer ``W.master`` of this dtype, read through ``Cast(W.master) ->
        W`` at the start of the graph (the forward pass stays 16-bit); the
        Gradient, the optimizer node and its state are in this dtype.
        :meth:`Session.to_inference_model` folds the Casts back into ``W``.
      dropout: train with the model's Dropout nodes dropping (default False:
        each Dropout node stays as the graph has it, in inference mode unless
        its ``training_mode`` says otherwise, so it is the identity in the
        step too). True points every Dropout node's ``training_mode`` (opset 12
        or later) at one new bool initializer ``dropout.training_mode`` holding
        True; the step then draws masks, which needs ``Session(model, seed=)``.
        :meth:`Session.run` and :meth:`Session.to_inference_model` read it as
        False, so inference is what the exported model computed.
      loss_scale: dynamic loss scaling, starting at this scale ``S`` (a number in
        [1, 2**24], such as 2**15; None: none), for float16 gradients that
        would underflow. The Gradient is taken of ``Cast(loss, float32) * S``,
        each gradient unscaled as ``Cast(g, float32) / S`` (then cast to the
        parameters' dtype; use ``master_dtype="float32"`` to keep it float32).
        A step whose unscaled gradients are not all finite is skipped: the
        parameters, the optimizer state and T keep their values, and ``S``
        halves (not below 1); after ``loss_scale_period`` good steps in a row
        ``S`` doubles (not above 2**24). ``S`` and the count of good steps are
        the float32 and int64 initializers ``loss_scale`` and
        ``loss_scale.good_steps``, bound by the step, so :meth:`Session.save`
        keeps them. The reported loss is the unscaled one.
      loss_scale_period: the good steps in a row after which ``S`` doubles
        (default 2000).
      compute_dtype: ``"bfloat16"`` to train a float32 model computing in
        bfloat16 on float32 master weights (None: as the model is). The
        inference graph is rewritten to bfloat16 (each float32 input cast to
        bfloat16 as it begins and each float32 output back to float32 as it
        ends, so the loss is float32; stored values rounded to nearest even;
        ``Cast`` to float32 now to bfloat16); each trained weight keeps its
        float32 value as ``W.master`` read through ``Cast(W.master) -> W``, and
        the Gradient and the optimizer run on the masters in float32. Not with
        ``master_dtype``; a subgraph or a node making float32 by its ``dtype``
        attribute is refused by name. The trained model's inference graph
        computes in bfloat16 (:meth:`Session.to_inference_model` too).

    Returns:
      A new ``ModelProto`` that passes ``onnx.checker.check_model(full_check=True)``
      and :func:`check`.
    """
    given = model
    model = as_model(model)  # the one loading layer: limits, names, external data
    operator = operator_of(optimizer)
    model, output, elem, shape, chosen_plan = _planned(
        model, loss, output, trainable, frozen, lift_constants
    )
    model = lift(model, chosen_plan.lifted)
    names, target = _reserved_names(model.graph, target)
    model, chosen = _precision(
        model, given, chosen_plan.trained, names, master_dtype, compute_dtype, dropout
    )
    params, dtype = _abstract_params(model.graph, chosen)
    loss_step = _loss(model, loss, output, elem, shape, target, names, class_axis)
    loss_step.scaled(loss_scale, loss_scale_period, names)
    nodes, grads, ok = _gradient(chosen, loss_step, names, dtype, clip_global_norm)
    step = _optimizer(optimizer, operator, chosen, grads, names, dtype)
    nodes += step.nodes
    stored, state_values = _stored_state(optimizer, operator, params, chosen, step, dtype)
    binding, algorithm_outputs = _bindings(operator, params, chosen, step, elem, dtype)
    if ok:  # skipped unless every gradient is finite; S and its count updated
        binding, scaling = _skipped(ok, loss_step, binding, algorithm_outputs, names)
        nodes += scaling
        stored += loss_step.stored
    algorithm = helper.make_graph(
        [*loss_step.nodes, *nodes],
        "training_step",
        [loss_step.target_info],
        algorithm_outputs,
        initializer=[*loss_step.inits, *step.inits],
    )
    return _assembled(model, given, stored, state_values, algorithm, binding)


# -- plan: the output the loss reads, the tensors that train


def _planned(
    model: onnx.ModelProto,
    loss: str | onnx.GraphProto,
    output: str | None,
    trainable: Sequence[str] | None,
    frozen: Sequence[str] | None,
    lift_constants: bool,
) -> tuple[onnx.ModelProto, str, int, Any, Plan]:
    """The loss's float output (its elem type and shape) and :func:`plan`'s table."""
    if model.training_info:
        raise ValueError("the model already has training_info; attach takes an inference model")
    output = loss_output(model, output)
    outputs = {o.name: o for o in model.graph.output}
    elem, shape = declared(outputs[output])
    if elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
        raise ValueError(f"output {output!r} is not a float tensor; the loss reads a float output")
    if isinstance(loss, str) and loss in CLASS_LOSSES:
        model = with_opset(model, CLASS_LOSS_OPSET)
    return model, output, elem, shape, make_plan(model, output, trainable, frozen, lift_constants)


# -- lift: names for what attach adds, the trained tensors' precision


def _reserved_names(graph: onnx.GraphProto, target: str | None) -> tuple[Names, str]:
    """Fresh names for the graph, with the target's and the loss output's taken."""
    names = Names(graph)
    if target is None:
        target = names("target")
    elif target in names.taken:
        raise ValueError(
            f"target {target!r} is already a tensor name of the model; pass another target="
        )
    names.taken.add(target)
    if LOSS_OUTPUT in names.taken:
        raise ValueError(f"the model already has a tensor named {LOSS_OUTPUT!r}, the loss output")
    names.taken.add(LOSS_OUTPUT)
    return names, target


def _precision(
    model: onnx.ModelProto,
    given: Any,
    chosen: list[str],
    names: Names,
    master_dtype: Any,
    compute_dtype: Any,
    dropout: bool,
) -> tuple[onnx.ModelProto, list[str]]:
    """Master weights, bfloat16 compute and training Dropout, in a copy of a given proto.

    Returns the model and the names of the tensors the Gradient differentiates.
    """
    if compute_dtype is not None:
        try:
            wanted = np.dtype(compute_dtype)
        except TypeError:
            wanted = None
        if wanted != np.dtype(jax.numpy.bfloat16):
            raise ValueError(f"compute_dtype must be 'bfloat16'; got {compute_dtype!r}")
        if master_dtype is not None:
            raise ValueError(
                "compute_dtype keeps float32 master weights already; leave master_dtype out"
            )
    if (master_dtype is not None or dropout or compute_dtype is not None) and model is given:
        model = copy_model(model)  # the caller's proto: rewritten in a copy
    if master_dtype is not None:
        chosen = master_weights(model.graph, chosen, master_dtype, names)
    if compute_dtype is not None:
        chosen = to_bfloat16(model, chosen, names)
    if not isinstance(dropout, bool):
        raise TypeError(f"dropout must be True or False; got {dropout!r}")
    if dropout:
        train_dropout(model, names)
    return model, chosen


def _abstract_params(
    graph: onnx.GraphProto, chosen: list[str]
) -> tuple[dict[str, jax.ShapeDtypeStruct], np.dtype]:
    """The trained tensors' shapes and dtypes, and their one dtype."""
    values = {i.name: i for i in graph.initializer}
    # Shapes and dtypes only (make_plan has read and checked every value): the weights of a
    # model above 2 GiB are not copied here, and the state is made one tensor at a time.
    params = {
        n: jax.ShapeDtypeStruct(
            tuple(values[n].dims), tensor_dtype(values[n].data_type, "graph initializer")
        )
        for n in chosen
    }
    return params, common_dtype(list(params.values()))


# -- loss: the loss of the output against the target, scaled when asked


@dataclasses.dataclass
class _Loss:
    """The loss nodes, and what the Gradient differentiates (the loss, or it scaled)."""

    nodes: list[onnx.NodeProto]
    inits: list[onnx.TensorProto]
    target_info: onnx.ValueInfoProto
    value: str  # the loss
    differentiated: str = ""  # the loss, or Cast(loss, float32) * S
    scale_name: str = ""  # S, with loss scaling
    initial: float = 0.0
    period: int = 0
    stored: list[onnx.TensorProto] = dataclasses.field(default_factory=list)

    def scaled(self, loss_scale: float | None, period: int, names: Names) -> None:
        """With ``loss_scale``: the Gradient differentiates the loss times S."""
        self.differentiated = self.value
        if loss_scale is not None:
            self.initial, self.period = loss_scaling.check_options(loss_scale, period)
            scaling_nodes, self.differentiated, self.scale_name = loss_scaling.scaled_loss(
                self.value, names
            )
            self.nodes += scaling_nodes


def _loss(
    model: onnx.ModelProto,
    loss: str | onnx.GraphProto,
    output: str,
    elem: int,
    shape: Any,
    target: str,
    names: Names,
    class_axis: int | None,
) -> _Loss:
    """The loss of ``output`` against ``target``, reported as ``LOSS_OUTPUT``."""
    graph = model.graph
    opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    rank = None if shape is None else len(shape)
    logits = softmax_logits(graph, output, rank, class_axis, opset) if loss == "log_loss" else None
    nodes, inits, target_info, value = loss_nodes(
        loss, output, elem, shape, target, names, class_axis, logits
    )
    nodes.append(helper.make_node("Identity", [value], [LOSS_OUTPUT]))
    return _Loss(nodes, inits, target_info, value)


# -- gradient: the Gradient node, unscaled and clipped


def _gradient(
    chosen: list[str],
    loss: _Loss,
    names: Names,
    dtype: np.dtype,
    clip_global_norm: float | None,
) -> tuple[list[onnx.NodeProto], list[str], str]:
    """The Gradient node and what unscales and clips it: nodes, gradients, ``ok``.

    ``ok`` names the bool telling that every gradient is finite (loss scaling), else "".
    """
    grads = [names(f"{n}.grad") for n in chosen]
    nodes = [
        helper.make_node(
            GRADIENT,
            chosen,
            grads,
            domain=DOMAIN,
            xs=chosen,
            y=loss.differentiated,
            name="gradient",
        )
    ]
    ok = ""
    if loss.scale_name:
        unscaling, grads, ok = loss_scaling.unscaled(grads, loss.scale_name, dtype, names)
        nodes += unscaling
    clipping, grads = clip_by_global_norm_nodes(grads, clip_global_norm, names, dtype)
    nodes += clipping
    return nodes, grads, ok


# -- optimizer: the optimizer node, R and T + 1


class _Step(NamedTuple):
    """The optimizer node with what computes R and T + 1, and their names."""

    nodes: list[onnx.NodeProto]
    inits: list[onnx.TensorProto]
    rename: dict[str, str]  # the node's placeholder names -> fresh ones
    T: str
    T_next: str
    scale: str  # R.scale


def _optimizer(
    optimizer: Transformation,
    operator: Any,
    chosen: list[str],
    grads: list[str],
    names: Names,
    dtype: np.dtype,
) -> _Step:
    """The optimizer node of the trained tensors, R at T, and T + 1."""
    # The node with placeholder names, renamed to fresh ones.
    placeholders = [f"p{i}" for i in range(len(chosen))]
    node = make_node(
        operator.op_type,
        attribute_values(optimizer),
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
    # R = (the number, or the schedule's value at T) * a stored scale of 1, which a
    # running Session may change (Session.learning_rate_scale) without losing V, H and T.
    unscaled, scale = names("R.unscaled"), names("R.scale")
    rate_nodes, rate_inits = learning_rate_nodes(optimizer.learning_rate, T, unscaled, names, dtype)
    rate_nodes.append(helper.make_node("Mul", [unscaled, scale], [R], name=names("R.scaled")))
    nodes = [*rate_nodes, node]
    one, T_next = names("T.one"), names("T.next")
    nodes.append(helper.make_node("Add", [T, one], [T_next]))
    inits = [*rate_inits, numpy_helper.from_array(np.asarray(1, np.int64), one)]
    return _Step(nodes, inits, rename, T, T_next, scale)


def _stored_state(
    optimizer: Transformation,
    operator: Any,
    params: dict[str, jax.ShapeDtypeStruct],
    chosen: list[str],
    step: _Step,
    dtype: np.dtype,
) -> tuple[list[onnx.TensorProto], list[tuple[str, Callable[[], np.ndarray]]]]:
    """T and R.scale as initializers, and how to make each state tensor when stored."""
    abstract_state = jax.eval_shape(optimizer.init, params)
    kept = {
        np.dtype(leaf.dtype)
        for field in operator.fields
        for leaf in jax.tree.leaves(getattr(abstract_state, field))
    }
    if kept - {dtype}:
        # The ONNX optimizer nodes type X, G and the state alike (T3): a state in another
        # dtype is no valid model, and casting it silently would not be what was asked.
        raise ValueError(
            f"the optimizer keeps its state in {sorted(str(d) for d in kept)} but the trained "
            f"tensors are {dtype}: the ONNX {operator.op_type} node holds the state in the "
            "parameters' dtype; for float32 state of 16-bit weights pass "
            "master_dtype='float32' (float32 master weights), or build the optimizer without "
            "accumulator_dtype"
        )
    stored = [
        numpy_helper.from_array(np.asarray(optimizer.initial_count, np.int64), step.T),
        numpy_helper.from_array(np.asarray(1, dtype), step.scale),
    ]
    # The state of each tensor alone (init fills each leaf alike, packed or not), each
    # array freed once in the model: a copy of all of them would be 2x the weights (Adam).
    state_values: list[tuple[str, Callable[[], np.ndarray]]] = []
    for field in operator.fields:
        for i, n in enumerate(chosen):
            state_values.append(
                (
                    step.rename[f"p{i}.{field}"],
                    functools.partial(_state, optimizer, params, n, field),
                )
            )
    return stored, state_values


# -- bindings: what each step writes back, the training model


def _bindings(
    operator: Any,
    params: dict[str, jax.ShapeDtypeStruct],
    chosen: list[str],
    step: _Step,
    elem: int,
    dtype: np.dtype,
) -> tuple[dict[str, str], list[onnx.ValueInfoProto]]:
    """``update_binding`` (parameters, state, T) and the algorithm's outputs."""
    p_elem = int(helper.np_dtype_to_tensor_dtype(dtype))
    rename = step.rename
    binding = {}
    algorithm_outputs = [value_info(LOSS_OUTPUT, elem, [])]
    for group_in, group_out in [("", ".new")] + [(f".{f}", f".{f}.new") for f in operator.fields]:
        for i, n in enumerate(chosen):
            key = n if not group_in else rename[f"p{i}{group_in}"]
            out = rename[f"p{i}{group_out}"]
            binding[key] = out
            algorithm_outputs.append(value_info(out, p_elem, list(params[n].shape)))
    binding[step.T] = step.T_next
    algorithm_outputs.append(value_info(step.T_next, onnx.TensorProto.INT64, []))
    return binding, algorithm_outputs


def _skipped(
    ok: str,
    loss: _Loss,
    binding: dict[str, str],
    algorithm_outputs: list[onnx.ValueInfoProto],
    names: Names,
) -> tuple[dict[str, str], list[onnx.NodeProto]]:
    """Each binding kept unless ``ok``, and S with its count of good steps updated.

    Renames ``algorithm_outputs`` in place and extends them; ``loss.stored`` gets S's
    initializers. Returns the new binding and the nodes.
    """
    skipping, wrapped = loss_scaling.kept(ok, binding, names)
    renamed = {binding[key]: wrapped[key] for key in binding}  # each output, its Where's
    for output in algorithm_outputs:
        output.name = renamed.get(output.name, output.name)
    binding = wrapped
    scaling = loss_scaling.updated(ok, loss.scale_name, loss.initial, loss.period, names)
    binding.update(scaling.binding)
    algorithm_outputs += scaling.outputs
    loss.stored = list(scaling.initializers)
    return binding, [*skipping, *scaling.nodes]


def _assembled(
    model: onnx.ModelProto,
    given: Any,
    stored: list[onnx.TensorProto],
    state_values: list[tuple[str, Callable[[], np.ndarray]]],
    algorithm: onnx.GraphProto,
    binding: dict[str, str],
) -> onnx.ModelProto:
    """The training model: ``model`` with the stored state and one ``training_info``."""
    if model is given:  # the caller's proto, unchanged by loading and lifting: not ours
        result = copy_model(model)  # a tensor at a time: CopyFrom refuses 2 GiB
    else:  # read from a path or bytes, or copied while loading or lifting: ours to extend
        result = model
    result.graph.initializer.extend(stored)
    for name, make in state_values:
        result.graph.initializer.append(numpy_helper.from_array(make(), name))
    result.ir_version = max(result.ir_version, 7)
    if not any(o.domain == DOMAIN for o in result.opset_import):
        result.opset_import.append(helper.make_opsetid(DOMAIN, OPSET_VERSION))
    result.training_info.append(
        helper.make_training_info(algorithm, list(binding.items()), None, None)
    )
    return result
