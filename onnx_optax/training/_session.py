"""``Session``: runs a model's ``training_info`` on XLA, on one device or split over several."""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import onnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from onnx import numpy_helper

from onnx_optax._src import checks
from onnx_optax._src.graph import GraphFunction, jit_graph, paused_gc, to_jax
from onnx_optax._src.graph.load import DEFAULT_LIMITS
from onnx_optax._src.onnx_tensors import tensor_dtype
from onnx_optax._src.ops import RunChecks, raise_failed
from onnx_optax._src.random_keys import step_key
from onnx_optax._src.remat import rematerialized
from onnx_optax.training._check import checked_entries
from onnx_optax.training._combined import Entry, Inference, check_feeds
from onnx_optax.training._dropout import switched_off
from onnx_optax.training._export import fold_casts, save_model, strip_training
from onnx_optax.training._feeds import from_python, is_python
from onnx_optax.training._metrics import shortest_float
from onnx_optax.training._model import (
    TrainingModelError,
    abstract,
    as_model,
    copy_model,
    declared,
    mutable,
    opsets,
)
from onnx_optax.training._rate import Rate, scale_reaching

SHARDED_BYTES = 1024
"""With ``shard_parameters=True``, the smallest array split over the devices (1 KiB)."""


def _weak(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method``, calling its object through a weak reference.

    A jitted function the session holds then does not hold the session: with no
    cycle, ``del session`` frees its state at once, not at the next garbage
    collection (a model of a few GiB otherwise lingers beside the next session).
    """
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        bound = ref()
        assert bound is not None  # its session runs it
        return bound(*args)

    call.__name__ = call.__qualname__ = method.__name__
    return call


class Session:
    """Runs a model's ``training_info``: initialization, then algorithm steps.

    Each entry compiles once (per feed signature) into one jitted function
    whose state (the bound initializers) is donated. Construction runs
    :func:`check` and raises :class:`TrainingModelError` listing the problems.

    Args:
      model: an ``onnx.ModelProto``, its bytes or the path of a model file; a file's
        external data is read from inside its folder only (see :func:`load`).
      devices: None (JAX's default device) or a list of JAX devices, such as
        ``jax.devices()``. Each feed of rank 1 or more is then split along its
        first axis (the batch) over the devices, and the parameters, optimizer
        state and T are replicated on each; XLA's collectives sum what the
        devices computed, so the numbers are those of one device up to the
        order of summation. A batch must be a multiple of ``len(devices)``.
      shard_parameters: with ``devices``, split the parameters and the optimizer
        state over the devices as well (fully sharded data parallelism, ZeRO-3):
        each array bound by the training (a weight, its V and H, any state an
        ``update_binding`` writes) and each initializer the steps only read,
        of 1 KiB or more, is split along its longest axis
        that ``len(devices)`` divides (the first of equal ones); smaller ones
        and those with no such axis are replicated. Each device then holds
        about ``1/len(devices)`` of them, and XLA gathers what a step needs
        while it runs. The numbers are those of the replicated layout up to
        the order of summation. :attr:`initializers`, :meth:`save` and
        :meth:`to_model` gather the full arrays; across several processes
        that is a collective, so every process calls them.
      micro_batches: accumulate the gradients over this many micro-batches
        (default 1: none). Each feed of rank 1 or more is cut along its first
        axis into ``micro_batches`` parts (part j holds rows j, j + k, ...);
        the forward pass and the Gradient run on one part at a time in a
        ``lax.scan``, which sums the gradients, and the optimizer runs once on
        their mean, so the memory of the activations is one part's. The step
        trains on the mean of the parts' losses, and reports it: for a loss
        that is a mean over the rows (every loss of :func:`attach`) that is the
        whole batch's loss and gradient, up to rounding; for a loss summed over
        the rows it is ``1/micro_batches`` of the sum (scale the learning rate
        by ``micro_batches``). A batch must be a multiple of ``micro_batches``
        (times ``len(devices)``). :meth:`evaluate` averages the same way.
      remat: rematerialize the forward pass (as ``jax.checkpoint``): the nodes each
        Gradient differentiates run in about sqrt(n) segments of about sqrt(n)
        nodes, the backward pass recomputing one segment's activations at a
        time instead of keeping all of them, for about one more forward pass
        of compute. The same ops on the same values: the numbers equal the
        default's up to XLA's choices of fusion (bit-identical in our tests
        on CPU, not promised).
      seed: the seed of the random masks of Dropout nodes in training mode
        (``training_mode`` true; see :func:`attach`'s ``dropout``). A node's
        mask at step T is drawn from ``fold_in(fold_in(key(seed), T), crc32(n))``,
        ``n`` its description and first output name: a pure function of
        (seed, T, node), so a session saved at T and resumed draws the masks
        an uninterrupted one draws, bit for bit, and :meth:`evaluate` draws
        those of the next step. None (the default):
        a training-mode Dropout node is refused when the step is traced.

    Several processes (hosts) are JAX's own business: call
    ``jax.distributed.initialize()`` in every process first, pass
    ``jax.devices()`` (the devices of all processes), and call :meth:`step`
    in every process, each time with :meth:`global_feeds` of that process's
    own rows. A replicated state is then the same in every process, and any
    one of them can :meth:`save` it; with ``shard_parameters`` every process
    calls :meth:`save` (or :attr:`initializers`), which gathers. Tested with
    two processes of four CPU devices each (``tests/test_multiprocess.py``).

    The learning rate changes between steps as onnxruntime-training's
    ``optimizer.set_learning_rate`` does, keeping V, H and T: :attr:`attach`
    writes R as the learning rate (or the schedule's value at T) times an
    initializer ``R.scale`` holding 1, which :attr:`learning_rate_scale` and
    :meth:`set_learning_rate` set. The scale is an argument of the compiled
    step, so the next step uses it without a new compilation, and
    :meth:`save` and :meth:`to_model` write it, so a resumed session keeps it.
    """

    def __init__(
        self,
        model: onnx.ModelProto | bytes | str | os.PathLike[str],
        *,
        devices: Sequence[jax.Device] | None = None,
        shard_parameters: bool = False,
        micro_batches: int = 1,
        remat: bool = False,
        seed: int | None = None,
    ) -> None:
        for flag, value in (("remat", remat), ("shard_parameters", shard_parameters)):
            if not isinstance(value, bool):  # "no" or 0.5 would otherwise read as True
                raise TypeError(f"{flag} must be True or False; got {value!r}")
        self._remat = remat
        if (
            not isinstance(micro_batches, int | np.integer)
            or isinstance(micro_batches, bool)
            or micro_batches < 1
        ):
            raise ValueError(f"micro_batches must be an integer >= 1; got {micro_batches!r}")
        self._micro_batches = int(micro_batches)
        self._replicated: NamedSharding | None = None
        self._split: NamedSharding | None = None
        self._sharded = bool(shard_parameters)
        if self._sharded and devices is None:
            raise ValueError(
                "shard_parameters=True splits the parameters over the session's devices; "
                "give devices= as well, such as jax.devices()"
            )
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
        # The model without the bound initializers' data (the state holds it), copied a
        # tensor at a time: a model above 2 GiB is no one protobuf message to copy.
        self._model = copy_model(loaded, self._dtypes)
        del loaded, checked
        state = {n: to_jax(f"initializer '{n}'", initializers.pop(n)) for n in names}
        self._state = {n: self._place(v) for n, v in state.items()}
        self._constants = [
            {n: self._place(v) for n, v in e.constants.items()} for e in self._entries
        ]
        shard: dict[str, Any] = {}
        step_shard: dict[str, Any] = {}
        if self._replicated is not None:
            shard = {"out_shardings": self._replicated}
            # The new state keeps each array's layout (sharded ones stay sharded).
            layout = {n: v.sharding for n, v in self._state.items()}
            step_shard = {"out_shardings": (self._replicated, layout, self._replicated)}
        # Every entry in one compiled function (one trace and one XLA compile per feed
        # signature, however many entries), the state donated; the run-time checks
        # (indices and labels only known then) alone in another, run first.
        step_all, evaluate_all = _weak(self._step_all), _weak(self._evaluate_all)
        self._step = jit_graph(step_all, donate_argnums=0, **step_shard)
        self._checks = jit_graph(lambda *a: step_all(*a)[2], **shard)
        self._evaluate = jit_graph(evaluate_all, **shard)
        # The feed signatures traced for a step: whether their ops check at run time.
        self._checked: dict[Any, bool] = {}
        self._classes: dict[Any, dict[str, int]] = {}  # by feed signature
        self._inference: dict[tuple[str, ...], Inference] = {}  # by output names
        self._rate = Rate(self._model)
        self._seed = self._checked_seed(seed)

    def _checked_seed(self, seed: int | None) -> int | None:
        """``seed`` as an int, with T (the optimizer node's count) bound to key the masks."""
        if seed is None:
            return None
        if not isinstance(seed, int | np.integer) or isinstance(seed, bool):
            raise TypeError(f"seed must be an integer or None; got {seed!r}")
        if not 0 <= int(seed) < 2**63:
            raise ValueError(f"seed must be in [0, 2**63); got {seed}")
        if self._rate.count not in self._state:
            raise ValueError(
                "seed= keys the Dropout masks by the step count T, but the model binds no "
                f"T of one optimizer node ({self._rate.why})"
            )
        return int(seed)

    def _key(self, state: Mapping[str, jax.Array]) -> jax.Array | None:
        """The step's random key: ``fold_in(key(seed), T)``, T as this step reads it."""
        if self._seed is None:
            return None
        count = state[self._rate.count].astype(np.uint32)  # T's low 32 bits
        return jax.random.fold_in(jax.random.key(self._seed), count)

    def _put(self, values: Any) -> Any:
        """Feeds on the session's devices, split along axis 0 (the batch)."""
        if self._split is None:
            return values
        return jax.device_put(values, self._split)

    def _place(self, value: Any) -> Any:
        """A parameter, optimizer state or constant on the session's devices, in its layout.

        Replicated; with ``shard_parameters``, split along its longest axis the
        device count divides when it holds ``SHARDED_BYTES`` or more.
        """
        if self._replicated is None or self._split is None:
            return value
        count = self._split.num_devices
        shape = np.shape(value)
        axes = [a for a, size in enumerate(shape) if size % count == 0]
        if not self._sharded or not axes or value.nbytes < SHARDED_BYTES:
            return jax.device_put(value, self._replicated)
        axis = max(axes, key=lambda a: (shape[a], -a))  # the longest, the first of equal ones
        spec = PartitionSpec(*[None] * axis, "batch")
        return jax.device_put(value, NamedSharding(self._split.mesh, spec))

    @property
    def inputs(self) -> list[str]:
        """The names a step feeds: every entry's algorithm inputs and the graph inputs it reads."""
        return list(dict.fromkeys(v.name for entry in self._entries for v in entry.feeds))

    def _current(self, name: str) -> np.ndarray:
        """The current value of the bound initializer ``name``, in its stored dtype.

        An array split over several processes is gathered (every process must ask).
        """
        value = self._state[name]
        if not value.is_fully_addressable and not value.is_fully_replicated:
            value = multihost_utils.process_allgather(value, tiled=True)
        return np.asarray(value).astype(self._dtypes[name], copy=False)

    @property
    def initializers(self) -> dict[str, np.ndarray]:
        """The current value of every initializer of the model's graph, by name.

        Those a binding updates change with each step; the others are as stored.
        """
        return {n: self._current(n) if n in self._state else self._fixed[n] for n in self._order}

    # -- the learning rate

    @property
    def learning_rate(self) -> float | None:
        """R of the next step: computed as the model computes it, at the current T.

        The shortest number that reads back as R in R's dtype (0.01, not
        0.009999999776). None when R is not computed from T and constants
        alone (it is fed, or the model has several optimizer nodes).
        """
        rate = self._rate
        if rate.unscaled is None:
            return None
        value = rate.unscaled(self._count())
        if rate.scale:
            value = value * self._fixed[rate.scale]
        return shortest_float(value)

    @property
    def learning_rate_scale(self) -> float | None:
        """The factor on R stored in the model: ``R = (learning rate at T) * scale``.

        ``attach`` stores 1. Setting it (a finite number >= 0) multiplies R
        from the next step on (with a schedule, every later value of it) and
        keeps the parameters, V, H and T; the step is not compiled again, and
        :meth:`save` and :meth:`to_model` keep the value. None for a model
        without a scale (attached by an earlier onnx_optax, or made by another
        tool): setting it then raises ValueError saying why.
        """
        if not self._rate.scale:
            return None
        return float(self._fixed[self._rate.scale])

    @learning_rate_scale.setter
    def learning_rate_scale(self, value: float) -> None:
        where = "Session.learning_rate_scale"
        name = self._scale_name(where)
        number = checks.stored_number(where, "the scale", value)
        if number < 0:
            raise ValueError(f"{where}: the scale must be >= 0, got {number}")
        self._set_scale(where, np.asarray(number, self._fixed[name].dtype))

    def set_learning_rate(self, value: float) -> None:
        """Sets the scale so that R of the next step (at the current T) is ``value``.

        As onnxruntime-training's ``optimizer.set_learning_rate``: parameters,
        V, H and T are kept, and nothing is compiled again. With a schedule,
        the whole rest of the schedule is scaled by the same factor (R keeps
        following its shape); :attr:`learning_rate_scale` says by how much.
        ``value`` is rounded to R's dtype, and the scale is chosen so that R
        equals that number exactly where one exists.

        Raises:
          ValueError: the model has no learning-rate scale (see
            :attr:`learning_rate_scale`), R at this T is 0 before the scale
            (a warmup's start: no scale reaches ``value``), or ``value`` is
            not a finite number >= 0.
        """
        where = "Session.set_learning_rate"
        name = self._scale_name(where)
        rate = self._rate
        if rate.unscaled is None:
            raise ValueError(f"{where}: {rate.why}")
        number = checks.stored_number(where, "the learning rate", value)
        if number < 0:
            raise ValueError(f"{where}: the learning rate must be >= 0, got {number}")
        count = self._count()
        unscaled = np.asarray(rate.unscaled(count), self._fixed[name].dtype)
        if unscaled == 0 or not np.isfinite(unscaled):
            raise ValueError(
                f"{where}: R before the scale is {unscaled} at T = {count} (the schedule's "
                f"value there), which no scale turns into {number}; set learning_rate_scale "
                "instead"
            )
        self._set_scale(where, scale_reaching(unscaled, number))

    def _count(self) -> int:
        name = self._rate.count
        return int(self._current(name) if name in self._state else self._fixed[name])

    def _scale_name(self, where: str) -> str:
        if not self._rate.scale:
            raise ValueError(f"{where}: {self._rate.why}")
        return self._rate.scale

    def _set_scale(self, where: str, scale: np.ndarray) -> None:
        """Writes ``scale`` where the steps and :meth:`save` read it (no recompilation)."""
        if not np.isfinite(scale) or scale < 0:
            raise ValueError(f"{where}: the scale would be {scale}, which is not finite and >= 0")
        name = self._rate.scale
        self._fixed[name] = scale
        for constants in self._constants:
            if name in constants:
                constants[name] = self._place(to_jax(f"initializer '{name}'", scale))
        for init in self._model.graph.initializer:
            if init.name == name:
                init.CopyFrom(numpy_helper.from_array(scale, name))

    def initialize(self) -> None:
        """Runs each entry's initialization graph and applies its ``initialization_binding``."""
        for info in self._model.training_info:
            if not info.initialization_binding:
                continue
            function = GraphFunction(info.initialization, opsets=opsets(self._model))
            values = dict(zip(function.output_names, function.apply({}), strict=True))
            for entry in info.initialization_binding:
                value = jax.numpy.asarray(values[entry.value])
                self._state[entry.key] = self._place(value)

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
            parts = self._micro_batches
            if array.ndim and array.shape[0] % (count * parts):
                raise ValueError(
                    f"{entry.where}: feed '{name}' has {array.shape[0]} rows, which "
                    f"{parts} micro-batches of a multiple of {count} devices do not divide; "
                    f"give a batch that is a multiple of {count * parts}"
                )
        return self._put(feeds)

    def global_feeds(self, rows: Mapping[str, Any]) -> dict[str, jax.Array]:
        """Each feed made of every process's rows: what :meth:`step` takes on several hosts.

        With ``devices`` spanning several processes (after
        ``jax.distributed.initialize()``), each process passes its own rows of
        every feed of rank 1 or more, as many in each process and a multiple of
        its number of the session's devices; the global batch is the processes'
        rows in process order. A feed of rank 0 is the same in every process.
        The arrays are ``jax.make_array_from_process_local_data``'s, split along
        axis 0 over the session's devices as :meth:`step` splits a batch, so the
        step moves nothing between hosts before it runs. In one process the
        rows are the whole batch.

        Raises:
          ValueError: the session has no ``devices``, or a feed's rows are not a
            multiple of this process's devices.
        """
        if self._split is None:
            raise ValueError(
                "Session.global_feeds: the session runs on JAX's default device; give "
                "Session(model, devices=jax.devices()) to split batches over every process's"
                " devices"
            )
        local = len(self._split.addressable_devices)
        arrays = {}
        for name, value in self._from_python(rows).items():
            array = np.asarray(value)
            if array.ndim and array.shape[0] % local:
                raise ValueError(
                    f"Session.global_feeds: feed '{name}' has {array.shape[0]} rows here, "
                    f"which this process's {local} devices do not divide"
                )
            sharding = self._split if array.ndim else self._replicated
            arrays[name] = jax.make_array_from_process_local_data(sharding, array)
        return arrays

    def _all_feeds(self, inputs: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Every entry's feeds, all checked before any is used."""
        dims: dict[str, Any] = {}
        return [self._feeds(entry, inputs, dims) for entry in self._entries]

    def _from_python(self, inputs: Mapping[str, Any]) -> Mapping[str, Any]:
        """``inputs`` with Python numbers and lists as arrays of the dtype a step declares.

        Converted once, so the class labels are checked on the values the step reads.
        """
        if not isinstance(inputs, Mapping) or not any(is_python(v) for v in inputs.values()):
            return inputs
        converted = dict(inputs)
        for entry in self._entries:
            for value in entry.feeds:
                name = value.name
                if name in converted and is_python(converted[name]):
                    elem = declared(value)[0]
                    want = tensor_dtype(elem, f"input '{name}'") if elem else None
                    converted[name] = from_python(entry.where, name, converted[name], want)
        return converted

    def _checked_feeds(self, inputs: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Every entry's feeds, all checked before any is used.

        Per feed signature (traced once, not run): the class count of each loss
        node whose labels are a feed, against which the labels are checked on
        every call. That each update keeps its initializer's shape and dtype is
        checked while the step is traced, before it runs.
        """
        inputs = self._from_python(inputs)
        all_feeds = self._all_feeds(inputs)
        for entry, feeds in zip(self._entries, all_feeds, strict=True):
            if entry.targets:
                key = (id(entry), tuple((n, v.shape, str(v.dtype)) for n, v in feeds.items()))
                if key not in self._classes:
                    state = {n: abstract(self._state[n]) for n in entry.reads}
                    with step_key(jax.random.key(0), "the Session"):  # shapes only
                        self._classes[key] = entry.classes(state, feeds)
                entry.check_targets(inputs, self._classes[key])
        return all_feeds

    def _step_all(
        self,
        state: dict[str, jax.Array],
        all_feeds: list[dict[str, jax.Array]],
        all_constants: list[dict[str, Any]],
    ) -> tuple[dict[str, jax.Array], dict[str, jax.Array], list[RunChecks]]:
        """Every entry in order, each reading the state the previous ones left (for jit);
        the unbound outputs, the new state and each entry's run-time checks."""
        state = dict(state)
        reported: dict[str, jax.Array] = {}
        run_checks = []
        key = self._key(state)  # T before any entry's update
        for entry, feeds, constants in zip(self._entries, all_feeds, all_constants, strict=True):
            outputs, updates, entry_checks = self._entry_step(entry, state, feeds, constants, key)
            for n, value in updates.items():  # while tracing: before anything runs
                if value.shape != state[n].shape or value.dtype != state[n].dtype:
                    raise ValueError(
                        f"{entry.where}: update_binding['{n}'] gives {value.dtype}"
                        f"{list(value.shape)} for these feeds; the initializer is "
                        f"{state[n].dtype}{list(state[n].shape)}"
                    )
            state.update(updates)
            reported.update(outputs)
            run_checks.append(entry_checks)
        return reported, state, run_checks

    def _entry_step(
        self,
        entry: Entry,
        state: dict[str, jax.Array],
        feeds: dict[str, jax.Array],
        constants: dict[str, Any],
        key: jax.Array | None,
    ) -> tuple[dict[str, jax.Array], dict[str, jax.Array], RunChecks]:
        """One entry's step, over micro-batches and rematerialized when the session says so;
        its random ops draw from ``key``."""
        # Read while the Gradients and random ops are traced.
        with rematerialized(self._remat), step_key(key, "the Session"):
            if self._micro_batches == 1:
                return entry.step(state, feeds, constants)
            return entry.micro_step(state, feeds, constants, self._micro_batches)

    def _evaluate_all(
        self,
        state: dict[str, jax.Array],
        all_feeds: list[dict[str, jax.Array]],
        all_constants: list[dict[str, Any]],
    ) -> tuple[dict[str, jax.Array], list[RunChecks]]:
        """Every entry's unbound outputs from the same state (XLA drops the updates)."""
        reported: dict[str, jax.Array] = {}
        run_checks = []
        key = self._key(state)
        for entry, feeds, constants in zip(self._entries, all_feeds, all_constants, strict=True):
            outputs, _, entry_checks = self._entry_step(entry, state, feeds, constants, key)
            reported.update(outputs)
            run_checks.append(entry_checks)
        return reported, run_checks

    def step(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """One step of every entry in order; returns the algorithms' unbound outputs.

        Feeds are checked first (names, dtypes, declared shapes, class labels
        within the classes of a ``SoftmaxCrossEntropyLoss`` or
        ``NegativeLogLikelihoodLoss`` that reads them, and with several devices
        that they divide the batch), then what only the run knows (an index
        or a label the graph computes, outside its axis or classes), so a step
        that fails leaves :attr:`initializers` unchanged.
        """
        all_feeds = self._checked_feeds(inputs)
        arguments = (self._state, all_feeds, self._constants)
        with paused_gc():  # the first call of a signature traces and lowers every entry
            # The state and constants keep their structure for the session's life: the
            # feeds alone tell one step signature from another.
            key = (
                jax.tree.structure(all_feeds),
                tuple((v.shape, str(v.dtype)) for v in jax.tree.leaves(all_feeds)),
            )
            if key not in self._checked:  # the step's own trace, kept for its call
                traced = self._step.trace(*arguments)
                self._checked[key] = any(len(c) for c in traced.out_info[2])
            if self._checked[key]:
                # Indices and labels only known now, checked before the step (the state
                # is donated): a small program of what the checks read; a failure
                # changes nothing.
                for entry_checks in self._checks(*arguments):
                    raise_failed(entry_checks)
            reported, self._state, _ = self._step(*arguments)
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
            reported, run_checks = self._evaluate(self._state, all_feeds, self._constants)
        for entry_checks in run_checks:
            raise_failed(entry_checks)
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
        are ignored. Runs on JAX's default device, or with ``devices=`` on the
        session's devices, reading the weights in their layout there.
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
            inference = Inference(self._model, self._dtypes, names, switched_off(self._model.graph))
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
            off = switched_off(model.graph)  # Dropout in inference mode
            for init in model.graph.initializer:
                if init.name in off:
                    init.CopyFrom(off[init.name])
        for init in model.graph.initializer:
            if init.name in self._state:
                init.CopyFrom(numpy_helper.from_array(self._current(init.name), init.name))
        if strip:  # float32 master weights back to the dtype the inference graph reads
            fold_casts(model, self._state)
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

    def save(
        self,
        path: str | os.PathLike[str],
        *,
        external_data: bool | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """Writes :meth:`to_model` to ``path``; ``Session(path)`` resumes bit-identically.

        Args:
          path: the ``.onnx`` file to write (its folder must exist).
          external_data: write every tensor of 1 KiB or more to
            ``<file name>.data`` beside it, as ONNX external data. None (the
            default) does so when the model would exceed protobuf's 2 GiB
            limit; False refuses such a model with a ValueError.
          metadata: entries to set in the saved model's ``metadata_props``
            (replacing those of the same key; the session's model is unchanged).

        Each file is written new in the folder and renamed into place (the
        data file first): a symbolic link at ``path`` or at its ``.data`` file
        is replaced, its target never written; a failure leaves the previous
        files as they were. A ``path`` that is a folder is a ValueError.
        """
        model = onnx.ModelProto()
        model.CopyFrom(self._model)  # the bound initializers hold no data there
        if metadata:
            kept = [(p.key, p.value) for p in model.metadata_props if p.key not in metadata]
            del model.metadata_props[:]
            for key, value in [*kept, *metadata.items()]:
                model.metadata_props.add(key=str(key), value=str(value))
        arrays = {n: functools.partial(self._current, n) for n in self._state}
        save_model(model, path, external_data, arrays)
