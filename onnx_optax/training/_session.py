"""``Session``: runs a model's ``training_info`` on XLA, on one device or split over several.

This file holds the core: loading the checked model, compiling and running the step.
Its parts live beside it: where arrays are placed (``_session_placement``), the feeds
(``_session_feeds``), the learning rate (``_session_rate``), inference
(``_session_run``) and writing the model back (``_session_saving``).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import onnx

from onnx_optax._src.graph import GraphFunction, jit_graph, paused_gc, to_jax
from onnx_optax._src.graph.jit import part_of_trace
from onnx_optax._src.graph.load import DEFAULT_LIMITS
from onnx_optax._src.graph.remat import rematerialized
from onnx_optax._src.ops import RunChecks, raise_failed
from onnx_optax._src.random_keys import step_key
from onnx_optax.training._check import checked_entries
from onnx_optax.training._combined import Entry, Inference
from onnx_optax.training._model import (
    TrainingModelError,
    as_model,
    copy_model,
    mutable,
    opsets,
)
from onnx_optax.training._rate import Rate
from onnx_optax.training._session_feeds import Feeds
from onnx_optax.training._session_placement import Placement
from onnx_optax.training._session_rate import LearningRate
from onnx_optax.training._session_run import Inferring
from onnx_optax.training._session_saving import Saving


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


def _check_options(remat: Any, shard_parameters: Any, micro_batches: Any) -> None:
    """Refuses a flag that is not a bool, and a micro-batch count that is not an int >= 1."""
    for flag, value in (("remat", remat), ("shard_parameters", shard_parameters)):
        if not isinstance(value, bool):  # "no" or 0.5 would otherwise read as True
            raise TypeError(f"{flag} must be True or False; got {value!r}")
    if (
        not isinstance(micro_batches, int | np.integer)
        or isinstance(micro_batches, bool)
        or micro_batches < 1
    ):
        raise ValueError(f"micro_batches must be an integer >= 1; got {micro_batches!r}")


class Session(Feeds, LearningRate, Inferring, Saving, Placement):
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
    two processes of four CPU devices each (``tests/training/test_multiprocess.py``).

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
        _check_options(remat, shard_parameters, micro_batches)
        self._remat = remat
        self._micro_batches = int(micro_batches)
        self._placement(devices, shard_parameters)
        self._load(model)
        self._compile()
        # The feed signatures traced for a step: their run-time checks (None: none).
        self._checked: dict[Any, Any] = {}
        self._classes: dict[Any, dict[str, int]] = {}  # by feed signature
        self._inference: dict[tuple[str, ...], Inference] = {}  # by output names
        self._rate = Rate(self._model)
        self._seed = self._checked_seed(seed)

    def _load(self, model: onnx.ModelProto | bytes | str | os.PathLike[str]) -> None:
        """The checked model's entries, and its bound initializers placed as the state."""
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

    def _compile(self) -> None:
        """The jitted step, its run-time checks and the evaluation, laid out on the devices."""
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
        self._checks_options = shard  # a signature's checks: part_of_trace(its step)
        self._evaluate = jit_graph(evaluate_all, **shard)

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

    @property
    def inputs(self) -> list[str]:
        """The names a step feeds: every entry's algorithm inputs and the graph inputs it reads."""
        return list(dict.fromkeys(v.name for entry in self._entries for v in entry.feeds))

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
                self._state[entry.key] = self._place(value)

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
                has_checks = any(len(c) for c in traced.out_info[2])
                self._checked[key] = (
                    part_of_trace(traced, lambda out: out[2], **self._checks_options)
                    if has_checks
                    else None
                )
            checks = self._checked[key]
            if checks is not None:
                # Indices and labels only known now, checked before the step (the state
                # is donated): a small program of what the checks read, from the step's
                # trace; a failure changes nothing.
                for entry_checks in checks(*arguments):
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
