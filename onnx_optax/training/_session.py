"""``Session``: runs a model's ``training_info`` on XLA."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import onnx
from onnx import numpy_helper

from onnx_optax._src.graph import GraphFunction, to_jax
from onnx_optax._src.onnx_tensors import tensor_dtype
from onnx_optax.training._check import check
from onnx_optax.training._combined import Entry
from onnx_optax.training._model import (
    TrainingModelError,
    abstract,
    as_model,
    declared,
    mutable,
    opsets,
    read_initializers,
)


class Session:
    """Runs a model's ``training_info``: initialization, then algorithm steps.

    Each entry compiles once (per feed signature) into one jitted function
    whose state (the bound initializers) is donated. Construction runs
    :func:`check` and raises :class:`TrainingModelError` listing the problems.
    """

    def __init__(self, model: Any) -> None:
        model = as_model(model)
        problems = check(model)
        if problems:
            raise TrainingModelError(problems)
        self._model = model
        initializers = read_initializers(model)
        names = mutable(model)
        self._dtypes = {n: initializers[n].dtype for n in names}
        self._order = list(initializers)
        self._fixed = {n: v for n, v in initializers.items() if n not in self._dtypes}
        self._state = {n: to_jax(f"initializer '{n}'", initializers[n]) for n in names}
        self._entries = [
            Entry(model, index, {n: initializers[n] for n in names}, initializers)
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
            function = GraphFunction(info.initialization, opsets=opsets(self._model))
            values = dict(zip(function.output_names, function.apply({}), strict=True))
            for entry in info.initialization_binding:
                self._state[entry.key] = jax.numpy.asarray(values[entry.value])

    def _feeds(
        self, entry: Entry, inputs: Mapping[str, Any], dims: dict[str, Any]
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
            elem, shape = declared(value)
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
                state = {n: abstract(v) for n, v in self._state.items()}
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
        function = GraphFunction(model.graph, outputs=outputs, opsets=opsets(model))
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
