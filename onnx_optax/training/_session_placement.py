"""Where a session's arrays live: JAX's default device, or a batch mesh over devices.

With ``devices``, feeds are split along their first axis (the batch) and the
parameters, optimizer state and constants replicated, or with
``shard_parameters`` split along their longest axis (ZeRO-3); reading a value
back gathers it, across processes too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

SHARDED_BYTES = 1024
"""With ``shard_parameters=True``, the smallest array split over the devices (1 KiB)."""


class Placement:
    """A session's devices: where feeds, parameters and constants are put, and read back."""

    _replicated: NamedSharding | None
    _split: NamedSharding | None
    _sharded: bool
    _state: dict[str, jax.Array]  # the bound initializers, as the steps read them
    _dtypes: dict[str, np.dtype]  # their stored dtypes

    def _placement(self, devices: Sequence[jax.Device] | None, shard_parameters: bool) -> None:
        """Checks ``devices`` and makes the batch mesh over them (None: JAX's default device)."""
        self._replicated = None
        self._split = None
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

    def _current(self, name: str) -> np.ndarray:
        """The current value of the bound initializer ``name``, in its stored dtype.

        An array split over several processes is gathered (every process must ask).
        """
        value = self._state[name]
        if not value.is_fully_addressable and not value.is_fully_replicated:
            value = multihost_utils.process_allgather(value, tiled=True)
        return np.asarray(value).astype(self._dtypes[name], copy=False)
