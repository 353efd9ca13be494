"""ONNX to onnx_optax: an optimizer node as a transformation, a training model's state read."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import optax

from onnx_optax._src import checks
from onnx_optax._src.driver import Transformation
from onnx_optax._src.graph.load import DEFAULT_LIMITS, Limits, load_model
from onnx_optax._src.onnx_graph import (
    SESSION,
    check_bindings,
    check_sources,
    check_versions,
    constant_value,
    increment_problem,
    producers,
    rate_scale,
    training_entry,
)
from onnx_optax._src.onnx_nodes import (
    OptimizerNode,
    describe,
    read_node,
)
from onnx_optax._src.onnx_tensors import read_tensor, tensor_dtype
from onnx_optax._src.registry import OPERATORS
from onnx_optax.interop._to_onnx import TREE_METADATA


def _transformation(
    op_type: str,
    attributes: Mapping[str, Any],
    learning_rate: optax.ScalarOrSchedule,
    initial_count: int | None,
    accumulator_dtype: Any,
) -> Transformation:
    kwargs = dict(attributes)
    if initial_count is not None:
        kwargs["initial_count"] = initial_count
    return OPERATORS[op_type].factory(learning_rate, accumulator_dtype=accumulator_dtype, **kwargs)


def from_node(
    node: onnx.NodeProto,
    learning_rate: optax.ScalarOrSchedule,
    *,
    initial_count: int | None = None,
    accumulator_dtype: Any | None = None,
) -> Transformation:
    """The optax transformation of an ONNX Adagrad, Adam or Momentum node.

    Args:
      node: a ``NodeProto`` of domain ``ai.onnx.preview.training``.
      learning_rate: R (the node takes it as an input, not an attribute).
      initial_count: the T of the first update (default: the transformation's).
      accumulator_dtype: dtype of the state (default: the parameters').

    Returns:
      The transformation, with the node's attributes (float32 values, as ONNX
      stores them) and the schema defaults for those the node omits.

    Raises:
      UnsupportedOperatorError: for a node of another op or domain.
      ValueError: for an unknown or missing attribute, a bad mode, or input and
        output counts that do not fit the operator.

    Example:
      >>> from onnx import helper
      >>> from onnx_optax import interop
      >>> node = helper.make_node("Adagrad", ["R", "T", "X", "G", "H"], ["X2", "H2"],
      ...                         domain="ai.onnx.preview.training", decay_factor=0.1)
      >>> tx = interop.from_node(node, learning_rate=0.01)
      >>> tx.hyperparameters.decay_factor, tx.hyperparameters.epsilon
      (0.10000000149011612, 9.999999974752427e-07)
    """
    spec = read_node(node)
    return _transformation(
        spec.operator.op_type, spec.attributes, learning_rate, initial_count, accumulator_dtype
    )


class ImportedModel(NamedTuple):
    """What :func:`from_model` found in a model."""

    transformation: Transformation  # the optimizer, attributes from the node
    params: Any  # X as stored: read-only numpy arrays (nested dicts if exported by to_model)
    state: Any  # the transformation's state: count = T, V/H as stored (read-only numpy arrays)
    T: int | None  # the stored update count, None if T is a graph input
    R: float | None  # the stored learning rate, None if R is a graph input
    update_binding: dict[str, str]  # initializer -> algorithm output, as checked
    node: OptimizerNode  # the optimizer node, read and checked


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _learning_rate(
    node: OptimizerNode,
    made_by: Mapping[str, onnx.NodeProto],
    stored: Mapping[str, onnx.TensorProto],
    constants: Mapping[str, onnx.TensorProto],
    scale: tuple[str, str] | None = None,
    name: str = "",
) -> float | None:
    """R as stored (an initializer or a Constant node); None when it is fed.

    With ``scale`` (what :func:`rate_scale` found: R is ``Mul(base, scale)``),
    R is the stored base times the stored scale, in R's dtype.
    """
    if scale is not None:
        base, factor = scale
        unscaled = _learning_rate(node, made_by, stored, constants, name=base)
        if unscaled is None:
            return None
        dtype = tensor_dtype(stored[factor].data_type, factor)
        stored_scale = read_tensor(stored[factor], "the model's graph initializer")
        scaled = float(np.asarray(unscaled, dtype) * stored_scale)
        if not math.isfinite(scaled):
            raise ValueError(
                f"{node.description}: R ('{node.inputs[0]}') is {scaled}; a learning rate must "
                "be finite"
            )
        return scaled
    name, where = name or node.inputs[0], node.description
    producer = made_by.get(name)
    if producer is not None:
        if producer.domain not in ("", "ai.onnx") or producer.op_type != "Constant":
            raise ValueError(
                f"{where}: R ('{name}') is computed by {describe(producer)}: a learning rate "
                f"that changes (a schedule) is beyond from_model; {SESSION}"
            )
        value = constant_value(producer)
    elif name in constants:
        value = read_tensor(constants[name], "the training algorithm's initializer")
    elif name in stored:
        value = read_tensor(stored[name], "the model's graph initializer")
    else:
        return None
    if value.dtype not in _FLOATS or value.shape != ():
        raise TypeError(
            f"{where}: R ('{name}') is {value.dtype}{list(value.shape)}; ONNX's R is a float "
            "or double scalar"
        )
    rate = float(value)
    if not math.isfinite(rate):
        raise ValueError(f"{where}: R ('{name}') is {rate}; a learning rate must be finite")
    return rate


def _count(
    node: OptimizerNode,
    made_by: Mapping[str, onnx.NodeProto],
    stored: Mapping[str, onnx.TensorProto],
    constants: Mapping[str, onnx.TensorProto],
    info: onnx.TrainingInfoProto,
    binding: Mapping[str, str],
) -> int | None:
    """T as stored and bound to exactly T + 1; None when it is fed."""
    name, where = node.inputs[1], node.description
    producer = made_by.get(name)
    if producer is not None or name in constants:
        what = "a constant of" if producer is None else f"computed by {describe(producer)} in"
        raise ValueError(
            f"{where}: T ('{name}') is {what} the model: from_model imports a T stored as a graph "
            f"initializer and bound to T + 1, or fed; {SESSION}"
        )
    if name not in stored:
        return None
    value = read_tensor(stored[name], "the model's graph initializer")
    if value.dtype != np.int64 or value.shape != ():
        raise TypeError(
            f"{where}: T ('{name}') is {value.dtype}{list(value.shape)}; ONNX's T is an int64 "
            "scalar"
        )
    T = int(value)
    if T < 0:
        raise ValueError(f"{where}: T ('{name}') is {T}; an update count is never negative")
    if T > checks.INT32_MAX:
        raise ValueError(f"{where}: T = {T} does not fit the int32 count of the transformation")
    output = binding.get(name)
    if output is None:
        raise ValueError(
            f"T ('{name}') is stored as an initializer but update_binding does not update "
            "it: the count would never advance (bind it to T + 1)"
        )
    fixed = {n: t for n, t in stored.items() if n not in binding}
    problem = increment_problem(info.algorithm, name, T, output, fixed)
    if problem:
        raise ValueError(f"update_binding['{name}'] = '{output}' {problem}")
    return T


def _stored_tensors(
    node: OptimizerNode, stored: Mapping[str, onnx.TensorProto]
) -> dict[str, list[np.ndarray]]:
    """X, V and H as read-only arrays: float or double, one type, V and H shaped like X."""
    where = node.description
    tensors: dict[str, list[np.ndarray]] = {}
    for group in ("X", *node.state_groups):
        tensors[group] = []
        for k, name in enumerate(node.group(group)):
            if name not in stored:
                raise ValueError(
                    f"{where}: its {group} input '{name}' is not an initializer of the model's "
                    "graph; the parameters and optimizer state must be stored in the model"
                )
            array = read_tensor(stored[name], "the model's graph initializer")
            first = tensors["X"][0] if tensors["X"] else array
            like = first if group == "X" else tensors["X"][k]
            if array.dtype not in _FLOATS:
                raise TypeError(
                    f"{where}: {group} '{name}' is {array.dtype}; ONNX optimizers take float or "
                    "double tensors"
                )
            if array.dtype != like.dtype or (group != "X" and array.shape != like.shape):
                x = node.group("X")[0 if group == "X" else k]
                raise TypeError(
                    f"{where}: {group} '{name}' is {array.dtype}{list(array.shape)} but X '{x}' "
                    f"is {like.dtype}{list(like.shape)}; ONNX needs one type for all tensors, "
                    "and V and H shaped like their X"
                )
            array.flags.writeable = False
            tensors[group].append(array)
    if tensors["X"][0].dtype == np.float64 and not jax.config.read("jax_enable_x64"):
        raise TypeError(
            f"{where}: the tensors are float64, which needs 64-bit JAX: call "
            "jax.config.update('jax_enable_x64', True) first (they would otherwise be computed "
            "in float32)"
        )
    return tensors


def _tree_paths(model: onnx.ModelProto, names: Sequence[str]) -> list[list[str]] | None:
    """The parameter paths stored by to_model, if they name ``names``; checked to nest."""
    props = {p.key: p.value for p in model.metadata_props}
    if TREE_METADATA not in props:
        return None
    label = f"metadata '{TREE_METADATA}'"
    try:
        paths = json.loads(props[TREE_METADATA])
    except RecursionError:  # a list of lists nests twice; a stranger's may nest 10**5 deep
        raise ValueError(f"{label} nests too deep; remove it to import flat") from None
    except ValueError as error:
        raise ValueError(f"{label} is not JSON ({error}); remove it to import flat") from None
    if not isinstance(paths, list) or not all(
        isinstance(p, list) and all(isinstance(k, str) for k in p) for p in paths
    ):
        raise ValueError(f"{label} must be a list of lists of strings (dict keys)")
    if len(paths) != len(names) or any("/".join(p) != n for p, n in zip(paths, names, strict=True)):
        return None  # not these tensors' paths: flat names
    tree: dict[str, Any] = {}
    for path, name in zip(paths, names, strict=True):
        node = tree
        for depth, key in enumerate(path):
            last = depth == len(path) - 1
            found = node.get(key)
            if found is not None and (last or not isinstance(found, dict)):
                other = found if isinstance(found, str) else _first_leaf(found)
                raise ValueError(
                    f"{label} nests tensors '{name}' ({path}) and '{other}' at the same key "
                    f"{path[: depth + 1]}: one would replace the other; remove the metadata to "
                    "import flat"
                )
            node = node.setdefault(key, name if last else {})
    return paths


def _first_leaf(tree: Mapping[str, Any]) -> str:
    value: Any = tree
    while isinstance(value, Mapping):
        value = next(iter(value.values()))
    return str(value)


def _nest(
    paths: Sequence[Sequence[str]] | None, names: Sequence[str], values: Sequence[Any]
) -> Any:
    if paths is None:
        return dict(zip(names, values, strict=True))
    tree: dict[str, Any] = {}
    for path, value in zip(paths, values, strict=True):
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return tree


def from_model(
    model: onnx.ModelProto | bytes | str | os.PathLike[str],
    *,
    learning_rate: optax.ScalarOrSchedule | None = None,
    initial_count: int | None = None,
    accumulator_dtype: Any | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> ImportedModel:
    """Reads the optimizer, parameters and state of a model with ``training_info``.

    It imports what an optax loop continues exactly, and refuses the rest
    with a ``ValueError`` or ``TypeError`` naming the tensor, node or
    binding; where the model is valid ONNX but beyond this import, the
    message says that :class:`onnx_optax.training.Session` runs it. The
    accepted shape:

    * IR version 7 up to ``onnx.IR_VERSION``; opsets the installed onnx
      defines, ``ai.onnx.preview.training`` at version 1.
    * One ``training_info`` entry without an initialization graph; its
      algorithm holds one Adagrad, Adam or Momentum node, and otherwise only
      ``ai.onnx`` ops and ``Gradient``.
    * The node's inputs are distinct tensors. X, V and H are initializers of
      the model's graph: float or double (double needs 64-bit JAX), one type
      for all, V and H shaped like their X.
    * Each G is fed, or is the output of a ``Gradient`` node with respect to
      its X (fed X itself): nothing in between. The loss (what computes the
      Gradient's ``y``) is not imported: the optax loop brings its own.
      Nodes that no binding depends on (a reported loss) change nothing
      stored and are ignored.
    * R is a finite float or double scalar, stored (an initializer or a
      Constant node) or fed (then pass ``learning_rate=``).
    * T is an int64 scalar initializer in [0, 2**31 - 1] bound to exactly
      T + 1: ``Add(T, 1)``, ``Add(1, T)`` or ``Sub(T, -1)`` of a constant
      int64 scalar (checked in exact integers). Or T is fed (then
      ``initial_count=`` applies).
    * ``update_binding`` binds each X, V and H once to the node's matching
      new value, and a stored T to T + 1: every key an initializer, every
      value an algorithm output, nothing else.
    * The metadata ``onnx_optax.params`` (written by :func:`to_model`) nests
      the parameters when its paths join to the X names; paths that collide
      or are prefixes of one another are refused. Otherwise ``params`` is a
      dict by tensor name.

    Parameters and state come back as read-only numpy arrays, as stored
    (no per-tensor copy to the device: JAX moves them on first use, or all
    at once with ``jax.device_put``).

    Args:
      model: the ``ModelProto``, its bytes or its path.
      learning_rate: R to use (default: R as stored; required if R is an input).
      initial_count: T to start from if T is not stored (default: the
        transformation's default).
      accumulator_dtype: state dtype for the transformation (default: as stored).
      base_dir: the folder to read external data from when ``model`` is bytes or a
        proto (a path's own folder otherwise); nothing outside it is read.
      limits: the loading layer's size limits (:class:`Limits`).

    Returns:
      An :class:`ImportedModel`.

    Example:
      >>> import jax.numpy as jnp, onnx_optax
      >>> from onnx_optax import interop
      >>> tx = onnx_optax.adagrad(0.1, decay_factor=0.5)
      >>> params = {"w": jnp.ones(3)}
      >>> imported = interop.from_model(interop.to_model(tx, params, tx.init(params)))
      >>> imported.T, imported.R, imported.update_binding
      (0, 0.10000000149011612, {'w': 'w.new', 'w.h': 'w.h.new', 'T': 'T.new'})
    """
    if not isinstance(model, onnx.ModelProto | bytes | str | os.PathLike):
        raise TypeError(
            f"from_model needs an onnx.ModelProto, got {type(model).__name__} (the model's "
            "bytes or its path work too)"
        )
    model = load_model(model, base_dir=base_dir, limits=limits)
    info, proto = training_entry(model)
    check_versions(model)
    node = read_node(proto)
    stored = {t.name: t for t in model.graph.initializer}
    constants = {t.name: t for t in info.algorithm.initializer}
    shadowed = sorted(set(constants) & set(stored))
    if shadowed:
        raise ValueError(
            f"the training algorithm's initializers {shadowed[:5]} have the names of graph "
            "initializers: which one a node reads would be ambiguous"
        )
    made_by = producers(model.graph, info.algorithm)
    check_sources(node, made_by, stored, constants)
    tensors = _stored_tensors(node, stored)
    binding = check_bindings(info, node, stored)
    R = _learning_rate(
        node, made_by, stored, constants, rate_scale(model, info.algorithm, node.inputs[0])
    )
    T = _count(node, made_by, stored, constants, info, binding)

    if learning_rate is None:
        if R is None:
            raise ValueError(
                f"{node.description}: R ('{node.inputs[0]}') is a graph input, not stored in "
                "the model; pass learning_rate="
            )
        learning_rate = R
    count = T if T is not None else initial_count
    if count is not None and not 0 <= count <= checks.INT32_MAX:
        raise ValueError(
            f"{node.description}: T = {count} does not fit the int32 count of the transformation"
        )
    transformation = _transformation(
        node.operator.op_type, node.attributes, learning_rate, count, accumulator_dtype
    )
    names = list(node.group("X"))
    paths = _tree_paths(model, names)
    # The state as init() would shape it, from the stored tensors (no zeros made first).
    state = node.operator.state(
        count=jnp.asarray(transformation.initial_count).astype(jnp.int32),
        **{
            field: _nest(paths, names, tensors[letter])
            for letter, field in node.operator.state_inputs
        },
    )
    return ImportedModel(
        transformation=transformation,
        params=_nest(paths, names, tensors["X"]),
        state=state,
        T=T,
        R=R,
        update_binding=binding,
        node=node,
    )
