"""A training model's graphs as functions of the bound initializers, for jit.

:class:`Entry`: one ``training_info`` entry on the inference graph;
:class:`Inference`: the inference graph alone, for some of its outputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import onnx
from onnx import helper

from onnx_optax._src.graph import GraphFunction, to_jax
from onnx_optax._src.onnx_tensors import tensor_dtype
from onnx_optax.training._model import declared, opsets, value_info


class Entry:
    """One training_info entry as one function of (state, feeds, constants), for jit."""

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
            value_info(n, int(helper.np_dtype_to_tensor_dtype(v.dtype)), list(v.shape))
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
        self.function = GraphFunction(graph, opsets=opsets(model))
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

        def evaluate(
            state: dict[str, jax.Array], feeds: dict[str, jax.Array], constants: dict[str, Any]
        ) -> dict[str, jax.Array]:
            return step(state, feeds, constants)[0]

        self.step = step
        self.evaluate = evaluate  # the unbound outputs alone: XLA drops the update

    def check_feeds(self, inputs: Mapping[str, Any], dims: dict[str, Any]) -> dict[str, Any]:
        """The feeds of a step, checked (see :func:`check_feeds`), as JAX arrays."""
        feeds = check_feeds(self.where, "the step", self.feeds, inputs, dims)
        return {name: to_jax(f"feed '{name}'", array) for name, array in feeds.items()}


class Inference:
    """The inference graph's ``outputs`` as one function of its feeds and the bound initializers.

    The bound initializers (``bound``: name to stored dtype) are inputs of the
    function, not constants, so a step that changes them needs no new
    compilation; the other initializers are constants. Only the feeds and
    bound initializers the outputs need are inputs.
    """

    def __init__(
        self, model: onnx.ModelProto, bound: Mapping[str, np.dtype], outputs: Sequence[str]
    ) -> None:
        main = model.graph
        initializers = {i.name for i in main.initializer}
        feeds = [i for i in main.input if i.name not in initializers]
        state = [
            value_info(n, int(helper.np_dtype_to_tensor_dtype(dtype)), None)
            for n, dtype in bound.items()
        ]
        constants = [i for i in main.initializer if i.name not in bound]

        def function(inputs: list[onnx.ValueInfoProto]) -> GraphFunction:
            graph = helper.make_graph(
                list(main.node), main.name, inputs, list(main.output), initializer=constants
            )
            return GraphFunction(graph, outputs=outputs, opsets=opsets(model))

        self.function = function(feeds + state)
        used = _used(self.function.order) | set(self.function.output_names)
        if not used.issuperset(self.function.input_names):  # the optimizer state, at least
            feeds = [i for i in feeds if i.name in used]
            state = [i for i in state if i.name in used]
            self.function = function(feeds + state)
        self.feeds = feeds
        self.state = [i.name for i in state]


def check_feeds(
    where: str,
    taker: str,
    values: Sequence[onnx.ValueInfoProto],
    inputs: Mapping[str, Any],
    dims: dict[str, Any],
) -> dict[str, Any]:
    """The feeds ``values`` declares, checked: names, dtypes, declared shapes.

    ``dims`` binds the symbolic dimensions across calls; ``where`` and
    ``taker`` (what takes the feeds) are for the messages. The arrays are
    returned as given (a JAX array) or as numpy arrays.
    """
    feeds = {}
    for value in values:
        name = value.name
        if name not in inputs:
            raise ValueError(
                f"{where}: missing feed '{name}'; {taker} takes {[v.name for v in values]}"
            )
        array = inputs[name]
        array = array if isinstance(array, jax.Array) else np.asarray(array)
        elem, shape = declared(value)
        if elem:
            want = tensor_dtype(elem, f"input '{name}'")
            if np.dtype(array.dtype) not in (want, jax.dtypes.canonicalize_dtype(want)):
                raise TypeError(
                    f"{where}: feed '{name}' has dtype {array.dtype}; the graph declares {want}"
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
                    f"{where}: feed '{name}' has shape {list(array.shape)}; the graph "
                    f"declares {shape}" + (f" with {dims}" if dims else "")
                )
        feeds[name] = array
    return feeds


def _used(steps: Sequence[Any]) -> set[str]:
    names: set[str] = set()
    for step in steps:
        names.update(step.inputs)
        names.update(_used(getattr(step, "order", [])))
    return names
