"""``attach``: an inference model plus a loss and an optimizer as a training model."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_optax._src.graph import GRADIENT
from onnx_optax._src.onnx_nodes import DOMAIN, OPSET_VERSION, make_node
from onnx_optax._src.onnx_tensors import read_tensor
from onnx_optax._src.packed import PackedTree
from onnx_optax._src.registry import operator_of
from onnx_optax.interop import _attribute_values, _common_dtype
from onnx_optax.training._clipping import clip_by_global_norm_nodes
from onnx_optax.training._frozen import select
from onnx_optax.training._losses import LOSS_OUTPUT, loss_nodes
from onnx_optax.training._model import Names, as_model, declared, value_info
from onnx_optax.training.schedules import learning_rate_nodes


def attach(
    model: onnx.ModelProto | bytes | str | os.PathLike[str],
    *,
    loss: Any = "softmax_cross_entropy",
    target: str = "label",
    output: str | None = None,
    optimizer: Any,
    trainable: Sequence[str] | None = None,
    frozen: Sequence[str] | None = None,
    clip_global_norm: float | None = None,
) -> onnx.ModelProto:
    """An inference model made trainable: its graph untouched, plus ``training_info``.

    The algorithm computes the loss of ``output`` against the new input
    ``target``, its ``Gradient`` with respect to the ``trainable``
    initializers, one optimizer step and ``T + 1``; ``update_binding`` writes
    the new parameters, the optimizer state (stored as initializers, as the
    transformation's ``init`` makes it) and T back. Its loss output is ``loss``.

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
        each with int64 class targets, one per row, the mean over the rows;
        with a float target shaped like the output, the mean over every
        element (all rows and all output columns) of ``"mse"`` (p - t)**2,
        ``"l1"`` |p - t| or ``"bce_with_logits"`` (p logits, t in [0, 1])
        max(p, 0) - p*t + log(1 + exp(-|p|)), which is finite for any
        logit; or a ``GraphProto`` with inputs (prediction, target) and one
        scalar output.
      target: name of the new graph input holding the targets.
      output: the graph output the loss reads (default: the first).
      optimizer: a transformation built by onnx_optax (adagrad, adam,
        momentum, nesterov; not a chain) whose learning rate is a number or a
        schedule of :mod:`onnx_optax.training.schedules`, written as ops
        computing R from the stored T (the count the transformation passes).
      trainable: the initializers to train, exactly (default: every weight).
        A weight is a float initializer that the inference graph reads as
        data: integer ones, BatchNormalization's running mean and variance
        and those read only as shapes (Reshape's shape, Slice's starts, axes,
        ..., followed through Identity and Cast) are not, and naming one here
        is an error. Those initializers stay as stored.
      frozen: the weights not to train, every other one is (instead of
        ``trainable``; not both).
      clip_global_norm: clip the gradients to this global norm before the
        optimizer, as ``optax.clip_by_global_norm`` (a number > 0; None: no
        clipping): with ``norm = sqrt(sum of all squared gradient elements)``,
        each gradient ``g`` becomes ``g / norm * clip_global_norm`` when
        ``norm >= clip_global_norm``.

    Returns:
      A new ``ModelProto`` that passes ``onnx.checker.check_model(full_check=True)``
      and :func:`check`.
    """
    model = as_model(model)  # the one loading layer: limits, names, external data
    operator = operator_of(optimizer)
    if model.training_info:
        raise ValueError("the model already has training_info; attach takes an inference model")
    graph = model.graph
    names = Names(graph)
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
    elem, shape = declared(outputs[output])
    if elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
        raise ValueError(f"output {output!r} is not a float tensor; the loss reads a float output")

    values = {i.name: read_tensor(i, "graph initializer") for i in graph.initializer}
    chosen = select(graph, values, trainable, frozen)
    params = {n: values[n] for n in chosen}
    dtype = _common_dtype(list(params.values()))
    p_elem = int(helper.np_dtype_to_tensor_dtype(dtype))

    opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    nodes, inits, target_info, value = loss_nodes(loss, output, elem, shape, target, names, opset)
    nodes.append(helper.make_node("Identity", [value], [LOSS_OUTPUT]))

    grads = [names(f"{n}.grad") for n in chosen]
    nodes.append(
        helper.make_node(
            GRADIENT, chosen, grads, domain=DOMAIN, xs=chosen, y=value, name="gradient"
        )
    )
    clipping, grads = clip_by_global_norm_nodes(grads, clip_global_norm, names, dtype)
    nodes += clipping
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
    rate_nodes, rate_inits = learning_rate_nodes(optimizer.learning_rate, T, R, names, dtype)
    nodes += [*rate_nodes, node]
    one, T_next = names("T.one"), names("T.next")
    nodes.append(helper.make_node("Add", [T, one], [T_next]))

    state = optimizer.init({n: jax.numpy.asarray(v) for n, v in params.items()})
    stored = [numpy_helper.from_array(np.asarray(optimizer.initial_count, np.int64), T)]
    for field in operator.fields:
        tree = getattr(state, field)
        if isinstance(tree, PackedTree):
            tree = tree.unpack()
        for i, n in enumerate(chosen):
            stored.append(
                numpy_helper.from_array(np.asarray(tree[n], dtype), rename[f"p{i}.{field}"])
            )
    inits += [*rate_inits, numpy_helper.from_array(np.asarray(1, np.int64), one)]
    binding = {}
    algorithm_outputs = [value_info(LOSS_OUTPUT, elem, [])]
    for group_in, group_out in [("", ".new")] + [(f".{f}", f".{f}.new") for f in operator.fields]:
        for i, n in enumerate(chosen):
            key = n if not group_in else rename[f"p{i}{group_in}"]
            out = rename[f"p{i}{group_out}"]
            binding[key] = out
            algorithm_outputs.append(value_info(out, p_elem, list(params[n].shape)))
    binding[T] = T_next
    algorithm_outputs.append(value_info(T_next, onnx.TensorProto.INT64, []))
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
