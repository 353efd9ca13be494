"""``Session``: runs a model's ``training_info`` on XLA, on one device or split over several."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import onnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from onnx import numpy_helper

from onnx_optax._src.graph import GraphFunction, flattened, paused_gc, to_jax
from onnx_optax._src.load import DEFAULT_LIMITS
from onnx_optax.training._check import checked_entries
from onnx_optax.training._combined import Entry, Inference, check_feeds
from onnx_optax.training._export import save_model, strip_training
from onnx_optax.training._model import (
    TrainingModelError,
    abstract,
    as_model,
    mutable,
    opsets,
)


class Session:
    """Runs a model's ``training_info``: initialization, then algorithm steps.

    Each entry compiles once (per feed signature) into one jitted function
    whose state (the bound initializers) is donated. Construction runs
    :func:`check` and raises :class:`TrainingModelError` listing the problems.

    Args:
      model: an ``onnx.ModelProto`` or the path of a model file; a file's
        external data is read from inside its folder only (see :func:`load`).
      devices: None (JAX's default device) or a list of JAX devices, such as
        ``jax.devices()``. Each feed of rank 1 or more is then split along its
        first axis (the batch) over the devices, and the parameters, optimizer
        state and T are replicated on each; XLA's collectives sum what the
        devices computed, so the numbers are those of one device up to the
        order of summation. A batch must be a multiple of ``len(devices)``.

    Several hosts are JAX's own business: call ``jax.distributed.initialize()``
    in every process first, pass ``jax.devices()`` (the devices of all
    processes), and call :meth:`step` in every process with the same
    arguments, each feed a global ``jax.Array`` built by
    ``jax.make_array_from_process_local_data`` from that process's rows (a
    ``NamedSharding`` over the same devices splitting axis 0). This is how JAX
    runs any jitted function on several hosts; it is not tested here.
    """

    def __init__(self, model: Any, *, devices: Sequence[jax.Device] | None = None) -> None:
        self._replicated: NamedSharding | None = None
        self._split: NamedSharding | None = None
        if devices is not None:
            if not isinstance(devices, list | tuple) or not all(
                isinstance(d, jax.Device) for d in devices
            ):
                raise TypeError(
                    f"devices must be a list of JAX devices, such as jax.devices(); got {devices!r}"
                )
            if len(set(devices)) != len(devices) or not devices:
                raise ValueError(
                    f"devices must list at least one device, each once; got {list(devices)}"
                )
            mesh = Mesh(np.array(devices), ("batch",))
            self._replicated = NamedSharding(mesh, PartitionSpec())
            self._split = NamedSharding(mesh, PartitionSpec("batch"))
        loaded = as_model(model)
        checked = checked_entries(loaded)
        problems = [p for p in checked.problems if p.blocking]
        if problems:
            raise TrainingModelError(problems)
        initializers = checked.initializers
        names = mutable(loaded)
        self._dtypes = {n: initializers[n].dtype for n in names}
        self._order = list(initializers)
        self._fixed = {n: v for n, v in initializers.items() if n not in self._dtypes}
        self._entries = checked.entries  # built by the check, used as they are
        work = sum(entry.function.work for entry in self._entries)
        if work > DEFAULT_LIMITS.traced_nodes:
            raise ValueError(
                f"one step of the {len(self._entries)} training_info entries runs {work} nodes "
                "(a node inside a Gradient counts 3 times per level of Gradient around it), "
                f"more than the limit of {DEFAULT_LIMITS.traced_nodes} (Limits.traced_nodes)"
            )
        # The model without the bound initializers' data (the state holds it).
        if loaded is model:
            loaded = onnx.ModelProto()
            loaded.CopyFrom(model)
        for init in loaded.graph.initializer:
            if init.name in self._dtypes:
                init.CopyFrom(
                    onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims)
                )
        self._model = loaded
        state = {n: to_jax(f"initializer '{n}'", initializers.pop(n)) for n in names}
        self._state = self._put(state, split=False)
        self._constants = [self._put(e.constants, split=False) for e in self._entries]
        shard: dict[str, Any] = (
            {} if self._replicated is None else {"out_shardings": self._replicated}
        )
        # Every entry in one compiled function (one trace and one XLA compile per feed
        # signature, however many entries), the state donated.
        self._step = jax.jit(flattened(self._step_all), donate_argnums=0, **shard)
        self._evaluate = jax.jit(flattened(self._evaluate_all), **shard)
        self._classes: dict[Any, dict[str, int]] = {}  # by feed signature
        self._inference: dict[tuple[str, ...], Inference] = {}  # by output names

    def _put(self, values: Any, *, split: bool) -> Any:
        """``values`` on the session's devices: split along axis 0, or replicated."""
        if self._replicated is None:
            return values
        return jax.device_put(values, self._split if split else self._replicated)

    @property
    def inputs(self) -> list[str]:
        """The names a step feeds: every entry's algorithm inputs and the graph inputs it reads."""
        return list(dict.fromkeys(v.name for entry in self._entries for v in entry.feeds))

    def _current(self, name: str) -> np.ndarray:
        """The current value of the bound initializer ``name``, in its stored dtype."""
        return np.asarray(self._state[name]).astype(self._dtypes[name], copy=False)

    @property
    def initializers(self) -> dict[str, np.ndarray]:
        """The current value of every initializer of the model's graph, by name.

        Those a binding updates change with each step; the others are as stored.
        """
        return {n: self._current(n) if n in self._state else self._fixed[n] for n in self._order}

    def initialize(self) -> None:
        """Runs each entry's initialization graph and applies its ``initialization_binding``."""
        for info in self._model.training_info:
            if not info.initialization_binding:
                continue
            function = GraphFunction(info.initialization, opsets=opsets(self._model))
            values = dict(zip(function.output_names, function.apply({}), strict=True))
            for entry in info.initialization_binding:
                value = jax.numpy.asarray(values[entry.value])
                self._state[entry.key] = self._put(value, split=False)

    def _feeds(
        self, entry: Entry, inputs: Mapping[str, Any], dims: dict[str, Any]
    ) -> dict[str, Any]:
        feeds = entry.check_feeds(inputs, dims)
        count = 1 if self._split is None else self._split.num_devices
        for name, array in feeds.items():
            if array.ndim and array.shape[0] % count:
                raise ValueError(
                    f"{entry.where}: feed '{name}' has {array.shape[0]} rows, which the "
                    f"{count} devices do not divide; give a batch that is a multiple of {count}"
                )
        return self._put(feeds, split=True)

    def _all_feeds(self, inputs: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Every entry's feeds, all checked before any is used."""
        dims: dict[str, Any] = {}
        return [self._feeds(entry, inputs, dims) for entry in self._entries]

    def _checked_feeds(self, inputs: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Every entry's feeds, all checked before any is used.

        Per feed signature (traced once, not run): the class count of each loss
        node whose labels are a feed, against which the labels are checked on
        every call. That each update keeps its initializer's shape and dtype is
        checked while the step is traced, before it runs.
        """
        all_feeds = self._all_feeds(inputs)
        for entry, feeds in zip(self._entries, all_feeds, strict=True):
            if entry.targets:
                key = (id(entry), tuple((n, v.shape, str(v.dtype)) for n, v in feeds.items()))
                if key not in self._classes:
                    state = {n: abstract(self._state[n]) for n in entry.reads}
                    self._classes[key] = entry.classes(state, feeds)
                entry.check_targets(inputs, self._classes[key])
        return all_feeds

    def _step_all(
        self,
        state: dict[str, jax.Array],
        all_feeds: list[dict[str, jax.Array]],
        all_constants: list[dict[str, Any]],
    ) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
        """Every entry in order, each reading the state the previous ones left (for jit)."""
        state = dict(state)
        reported: dict[str, jax.Array] = {}
        for entry, feeds, constants in zip(self._entries, all_feeds, all_constants, strict=True):
            outputs, updates = entry.step(state, feeds, constants)
            for n, value in updates.items():  # while tracing: before anything runs
                if value.shape != state[n].shape or value.dtype != state[n].dtype:
                    raise ValueError(
                        f"{entry.where}: update_binding['{n}'] gives {value.dtype}"
                        f"{list(value.shape)} for these feeds; the initializer is "
                        f"{state[n].dtype}{list(state[n].shape)}"
                    )
            state.update(updates)
            reported.update(outputs)
        return reported, state

    def _evaluate_all(
        self,
        state: dict[str, jax.Array],
        all_feeds: list[dict[str, jax.Array]],
        all_constants: list[dict[str, Any]],
    ) -> dict[str, jax.Array]:
        """Every entry's unbound outputs from the same state (XLA drops the updates)."""
        reported: dict[str, jax.Array] = {}
        for entry, feeds, constants in zip(self._entries, all_feeds, all_constants, strict=True):
            reported.update(entry.step(state, feeds, constants)[0])
        return reported

    def step(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """One step of every entry in order; returns the algorithms' unbound outputs.

        Feeds are checked first (names, dtypes, declared shapes, class labels
        within the classes of a ``SoftmaxCrossEntropyLoss`` or
        ``NegativeLogLikelihoodLoss`` that reads them, and with several devices
        that they divide the batch), so a step that fails leaves
        :attr:`initializers` unchanged.
        """
        all_feeds = self._checked_feeds(inputs)
        with paused_gc():  # the first call of a signature traces and lowers every entry
            reported, self._state = self._step(self._state, all_feeds, self._constants)
        return {n: np.asarray(v) for n, v in reported.items()}

    def evaluate(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The algorithms' unbound outputs (the loss) from the current state, changing nothing.

        Takes the feeds :meth:`step` takes, checked as it checks them. Every
        entry reads the current initializers (no entry sees another's update,
        as none is applied); XLA drops what the unbound outputs do not need
        (the optimizer's update).
        """
        all_feeds = self._checked_feeds(inputs)
        with paused_gc():
            reported = self._evaluate(self._state, all_feeds, self._constants)
        return {n: np.asarray(v) for n, v in reported.items()}

    def run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """The inference graph's ``outputs`` (default: all) with the current initializers.

        Only the nodes those outputs need run, compiled once per set of
        outputs and feed signature: the current initializers are arguments of
        the compiled function, not constants in it, so a :meth:`step` between
        two runs needs no new compilation. The feeds those outputs need are
        checked as the graph declares them (names, dtypes, shapes); others
        are ignored. Runs on JAX's default device, or with ``devices=`` on each
        of the session's devices (replicated, like the parameters).
        """
        if outputs is not None and (
            isinstance(outputs, str)
            or not isinstance(outputs, Sequence)
            or not all(isinstance(n, str) for n in outputs)
        ):
            raise TypeError(f"outputs must be a list of output names or None; got {outputs!r}")
        names = (
            tuple(o.name for o in self._model.graph.output) if outputs is None else tuple(outputs)
        )
        inference = self._inference.get(names)
        if inference is None:
            inference = Inference(self._model, self._dtypes, names)
            self._inference[names] = inference
        feeds = check_feeds(
            "Session.run", f"the graph of outputs {list(names)}", inference.feeds, inputs, {}
        )
        values = inference.function({**feeds, **{n: self._state[n] for n in inference.state}})
        return dict(zip(inference.function.output_names, values, strict=True))

    def _with_state(self, strip: bool) -> onnx.ModelProto:
        model = onnx.ModelProto()
        model.CopyFrom(self._model)  # the bound initializers hold no data there
        if strip:
            strip_training(model)
        for init in model.graph.initializer:
            if init.name in self._state:
                init.CopyFrom(numpy_helper.from_array(self._current(init.name), init.name))
        return model

    def to_model(self) -> onnx.ModelProto:
        """The model with the same graphs and every bound initializer's current value.

        protobuf cannot serialize a model above 2 GiB: :meth:`save` writes one
        with external data.
        """
        return self._with_state(strip=False)

    def to_inference_model(self) -> onnx.ModelProto:
        """The inference graph with the current weights, and nothing of the training.

        No ``training_info``, no optimizer state or T, no local function or
        opset import only the training used; the weights are bit-identical to
        :attr:`initializers`.
        """
        return self._with_state(strip=True)

    def save(self, path: str | os.PathLike[str], *, external_data: bool | None = None) -> None:
        """Writes :meth:`to_model` to ``path``; ``Session(path)`` resumes bit-identically.

        Args:
          path: the ``.onnx`` file to write (its folder must exist).
          external_data: write every tensor of 1 KiB or more to
            ``<file name>.data`` beside it, as ONNX external data. None (the
            default) does so when the model would exceed protobuf's 2 GiB
            limit; False refuses such a model with a ValueError.
        """
        model = onnx.ModelProto()
        model.CopyFrom(self._model)  # the bound initializers hold no data there
        arrays = {n: functools.partial(self._current, n) for n in self._state}
        save_model(model, path, external_data, arrays)
