"""onnx_optax to ONNX: a transformation as an optimizer node, a step model, a training model."""

from __future__ import annotations

import collections
import json
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_optax._src import checks
from onnx_optax._src.driver import Transformation
from onnx_optax._src.onnx_nodes import (
    DOMAIN,
    OPSET_VERSION,
    attribute_values,
    common_dtype,
    listed,
    make_node,
    read_node,
)
from onnx_optax._src.packed import PackedTree, path_keys
from onnx_optax._src.registry import operator_of

TREE_METADATA = "onnx_optax.params"
"""The metadata key holding the parameters' key paths (JSON), as :func:`to_model` writes them."""
DEFAULT_OPSET = 21


def leaf_names(params: Any) -> tuple[list[str], list[Any], list[list[str]]]:
    """Leaf names ('/'-joined dict keys), leaves and key paths of a params pytree."""
    named = jax.tree_util.tree_flatten_with_path(params)[0]
    names, leaves, paths = [], [], []
    for path, leaf in named:
        keys = path_keys(path)
        paths.append(keys)
        names.append("/".join(keys) if keys else "x")
        leaves.append(leaf)
    if len(set(names)) != len(names):
        collide = [name for name, count in collections.Counter(names).items() if count > 1]
        raise ValueError(f"parameter names collide after joining keys with '/': {listed(collide)}")
    return names, leaves, paths


def to_node(transformation: Any, names: Sequence[str], *, node_name: str = "") -> onnx.NodeProto:
    """The ONNX node of an onnx_optax transformation, for tensors ``names``.

    Inputs are ``R, T, <name>.., <name>.grad.., <name>.<state>..`` and outputs
    ``<name>.new.., <name>.<state>.new..`` in ONNX order; attribute values are
    stored as float32, the ONNX attribute type.

    Example:
      >>> import onnx_optax
      >>> from onnx_optax import interop
      >>> node = interop.to_node(onnx_optax.nesterov(0.1, alpha=0.9, beta=1.0,
      ...                                              norm_coefficient=0.0), ["w", "b"])
      >>> node.op_type, list(node.input)
      ('Momentum', ['R', 'T', 'w', 'b', 'w.grad', 'b.grad', 'w.v', 'b.v'])
      >>> list(node.output)
      ['w.new', 'b.new', 'w.v.new', 'b.v.new']
    """
    return make_node(
        operator_of(transformation).op_type,
        attribute_values(transformation),
        list(names),
        node_name=node_name,
    )


def _onnx_type(dtype: Any, what: str) -> int:
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"{what} has dtype {dtype}; ONNX optimizers take float or double")
    return int(helper.np_dtype_to_tensor_dtype(dtype))


def opsets() -> list[onnx.OperatorSetIdProto]:
    return [helper.make_opsetid("", DEFAULT_OPSET), helper.make_opsetid(DOMAIN, OPSET_VERSION)]


def step_model(transformation: Any, params: Any) -> onnx.ModelProto:
    """A standalone ``ModelProto`` of one optimizer step.

    Inputs ``R, T, X.., G.., <state>..`` and outputs ``X_new.., <state>_new..`` in
    ONNX order, typed and shaped like ``params`` (arrays or
    ``jax.ShapeDtypeStruct``). It passes ``onnx.checker.check_model`` and runs on
    ``onnx.reference.ReferenceEvaluator`` and :mod:`onnx_optax.backend`.

    Example:
      >>> import numpy as np, onnx_optax
      >>> from onnx_optax import backend, interop
      >>> model = interop.step_model(onnx_optax.adagrad(0.1), {"w": np.zeros(2, np.float32)})
      >>> [i.name for i in model.graph.input]
      ['R', 'T', 'w', 'w.grad', 'w.h']
      >>> zeros, g = np.zeros(2, np.float32), np.array([3.0, -4.0], np.float32)
      >>> w_new, h_new = backend.prepare(model).run([np.float32(0.1), np.int64(0), zeros, g, zeros])
      >>> print(np.round(w_new, 4), h_new)
      [-0.1  0.1] [ 9. 16.]
    """
    names, leaves, _ = leaf_names(params)
    node = to_node(transformation, names)
    elem = _onnx_type(common_dtype(leaves), "params")
    shape = {name: list(leaf.shape) for name, leaf in zip(names, leaves, strict=True)}

    def info(name: str) -> onnx.ValueInfoProto:
        tensor = name.split(".")[0] if name not in shape else name
        return helper.make_tensor_value_info(name, elem, shape[tensor])

    inputs = [
        helper.make_tensor_value_info("R", elem, []),
        helper.make_tensor_value_info("T", onnx.TensorProto.INT64, []),
    ] + [info(n) for n in node.input[2:]]
    outputs = [info(n) for n in node.output]
    graph = helper.make_graph([node], f"{node.op_type.lower()}_step", inputs, outputs)
    model = helper.make_model(graph, opset_imports=opsets(), producer_name="onnx_optax")
    onnx.checker.check_model(model)
    return model


def _learning_rate_value(transformation: Transformation, learning_rate: Any) -> float:
    value = transformation.learning_rate if learning_rate is None else learning_rate
    if callable(value):
        raise TypeError(
            "the transformation's learning rate is a schedule; ONNX stores R as a tensor: "
            "pass learning_rate= (the value to store)"
        )
    number = checks.scalar(value)
    if number is None:
        raise TypeError("the learning rate is traced; pass a concrete learning_rate=")
    return number


def to_model(
    transformation: Any,
    params: Any,
    state: Any,
    *,
    learning_rate: float | None = None,
) -> onnx.ModelProto:
    """Parameters and optimizer state as a ``ModelProto`` with ``training_info``.

    The inference graph stores ``params``, the state (``<name>.v``/``<name>.h``),
    ``T`` (int64, the state's count) and ``R`` as initializers and outputs each
    parameter. ``training_info[0].algorithm`` takes the gradients
    ``<name>.grad`` as inputs and runs the optimizer node and ``T + 1``; its
    ``update_binding`` writes every new value back to its initializer.
    ``from_model(to_model(tx, params, state))`` gives back params, state, T and
    the hyperparameters (as float32) exactly.

    Args:
      transformation: built by :func:`onnx_optax.adagrad`, ``adam``,
        ``momentum`` or ``nesterov``.
      params: a pytree of float32 or float64 arrays (nested dicts name the
        tensors by their keys).
      state: the transformation's state for ``params``.
      learning_rate: R to store (default: the transformation's, unless it is a
        schedule).

    Example:
      >>> import jax.numpy as jnp, onnx_optax
      >>> from onnx_optax import interop
      >>> tx = onnx_optax.momentum(0.1, alpha=0.9, beta=0.1, norm_coefficient=0.0)
      >>> params = {"w": jnp.ones(3)}
      >>> model = interop.to_model(tx, params, tx.init(params))
      >>> [n.op_type for n in model.training_info[0].algorithm.node]
      ['Momentum', 'Constant', 'Add']
    """
    operator = operator_of(transformation)
    if not isinstance(state, operator.state):
        raise TypeError(
            f"state must be the {operator.state.__name__} of this transformation, "
            f"got {type(state).__name__}"
        )
    names, leaves, paths = leaf_names(params)
    dtype = common_dtype(leaves)
    elem = _onnx_type(dtype, "params")
    initializers = [
        numpy_helper.from_array(np.asarray(leaf), name)
        for name, leaf in zip(names, leaves, strict=True)
    ]
    treedef: Any = jax.tree.structure(params)
    for field in operator.fields:
        tree = getattr(state, field)
        if isinstance(tree, PackedTree):
            tree = tree.unpack()
        if jax.tree.structure(tree) != treedef:
            raise ValueError(f"state.{field} is not shaped like params")
        for name, leaf, value in zip(names, leaves, jax.tree.leaves(tree), strict=True):
            if value.shape != leaf.shape or np.dtype(value.dtype) != dtype:
                raise TypeError(
                    f"state.{field} for '{name}' is {value.dtype}{list(value.shape)}; ONNX "
                    f"needs the parameter's type {dtype}{list(leaf.shape)}"
                )
            initializers.append(numpy_helper.from_array(np.asarray(value), f"{name}.{field}"))
    initializers.append(numpy_helper.from_array(np.asarray(int(state.count), np.int64), "T"))
    initializers.append(
        numpy_helper.from_array(
            np.asarray(_learning_rate_value(transformation, learning_rate), dtype), "R"
        )
    )

    graph = helper.make_graph(
        [helper.make_node("Identity", [n], [f"{n}.value"]) for n in names],
        "parameters",
        [],
        [
            helper.make_tensor_value_info(f"{n}.value", elem, list(leaf.shape))
            for n, leaf in zip(names, leaves, strict=True)
        ],
        initializer=initializers,
    )

    node = to_node(transformation, names, node_name=operator.op_type.lower())
    shapes: dict[str, list[int]] = {}  # by name, looked up per output (not a list's index)
    for n, leaf in zip(names, leaves, strict=True):
        shapes.setdefault(n, list(leaf.shape))
    one = helper.make_tensor("one", onnx.TensorProto.INT64, [], [1])
    algorithm = helper.make_graph(
        [
            node,
            helper.make_node("Constant", [], ["T.one"], value=one),
            helper.make_node("Add", ["T", "T.one"], ["T.new"]),
        ],
        "training_step",
        [
            helper.make_tensor_value_info(f"{n}.grad", elem, list(leaf.shape))
            for n, leaf in zip(names, leaves, strict=True)
        ],
        [helper.make_tensor_value_info(out, elem, shapes[out.split(".")[0]]) for out in node.output]
        + [helper.make_tensor_value_info("T.new", onnx.TensorProto.INT64, [])],
    )
    binding = {inp: out for inp, out in zip(stored_inputs(node), node.output, strict=True)}
    binding["T"] = "T.new"
    training = helper.make_training_info(algorithm, list(binding.items()), None, None)
    model = helper.make_model(graph, opset_imports=opsets(), producer_name="onnx_optax")
    model.training_info.append(training)
    helper.set_model_props(model, {TREE_METADATA: json.dumps(paths)})
    onnx.checker.check_model(model)
    return model


def stored_inputs(node: onnx.NodeProto) -> list[str]:
    """The node's X and state inputs, in the order of its outputs."""
    spec = read_node(node)
    return [name for group in ("X", *spec.state_groups) for name in spec.group(group)]
