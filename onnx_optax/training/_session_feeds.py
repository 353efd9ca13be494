"""A session's feeds: checked against what each entry declares, converted, split over devices."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from onnx_optax._src.onnx_tensors import tensor_dtype
from onnx_optax._src.random_keys import step_key
from onnx_optax.training._combined import Entry
from onnx_optax.training._feeds import from_python, is_python
from onnx_optax.training._model import abstract, declared
from onnx_optax.training._session_placement import Placement


class Feeds(Placement):
    """The feeds of a step: names, dtypes, shapes and class labels checked, then placed."""

    _entries: list[Entry]
    _micro_batches: int
    _classes: dict[Any, dict[str, int]]  # by feed signature

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
