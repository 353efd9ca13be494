"""Many small graph inputs as a few flat buffers, so a large graph compiles to a few arguments.

On XLA each argument and result of a compiled graph costs compile memory and
a transfer per call: an optimizer node over 5,000 tensors fed one array each
has 20,000 arguments. The graph's caller packs the small host values (fewer
than :data:`PACK_BELOW` elements) that only optimizer nodes read into one flat
buffer per dtype (:func:`pack`), in the order the nodes read them; inside the
compiled graph each packed value is a :class:`Part` of its buffer. An
optimizer node whose tensors of one group lie side by side in one buffer runs
its elementwise formula once on that stretch of the buffer, and its outputs
are Parts of the flat results, which go back to the caller whole and are cut
into tensors there, on the host: no per-tensor operation is compiled.

Slicing is what this avoids: XLA compiles a thousand small slices of one buffer
far more slowly than a thousand arguments, so a Part is sliced out
(:func:`materialize`) only where some other op reads it.

A value a step stores may likewise stand for an array it is not: a Part, or a
:class:`ChannelsLast` value (the channels-last pass's), which holds its array's
axes in another order. :func:`materialize` gives the array itself.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

PACK_BELOW = 1 << 16  # host values with fewer elements share a flat buffer per dtype


@dataclasses.dataclass(frozen=True)
class Part:
    """A value that is ``buffer[start:start + size]`` reshaped to ``shape``."""

    buffer: Any  # a flat array (traced inside the compiled graph)
    start: int
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class ChannelsLast:
    """A value (N, C1, ..., Ck, D1, ...) held channels-last: ``array`` is
    (N, D1, ..., C1, ..., Ck), its last ``channels`` axes the channels (more than one
    where a Reshape split them, as a channel shuffle does)."""

    array: Any  # traced inside the compiled graph
    channels: int = 1

    @property
    def order(self) -> tuple[int, ...]:
        """The array's axes in the order of the value it stands for."""
        rank, k = self.array.ndim, self.channels
        return (0, *range(rank - k, rank), *range(1, rank - k))

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the value it stands for."""
        return tuple(self.array.shape[a] for a in self.order)


def materialize(value: Any) -> Any:
    """The array a value stands for: a Part is sliced out of its buffer, a ChannelsLast
    value transposed back to (N, C, ...)."""
    if isinstance(value, Part):
        return value.buffer[value.start : value.start + value.size].reshape(value.shape)
    if isinstance(value, ChannelsLast):
        return value.array.transpose(value.order)
    return value


Layout = tuple[tuple[str, int, int, tuple[int, ...]], ...]  # (name, buffer, start, shape)


def pack(
    values: Mapping[str, Any], names: Sequence[str]
) -> tuple[Layout, list[np.ndarray], dict[str, Any]]:
    """Packs the small numpy values among ``names``, in that order, one flat buffer per dtype.

    Returns the layout (hashable: it keys the compiled graph), the buffers and
    the values left as they are (the others, large ones, arrays on a device).
    """
    buffer_of: dict[np.dtype, int] = {}
    pieces: list[list[np.ndarray]] = []
    sizes: list[int] = []
    layout = []
    own = dict(values)
    for name in names:
        value = own.get(name)
        if not isinstance(value, np.ndarray | np.generic) or not 0 < value.size < PACK_BELOW:
            continue
        del own[name]
        b = buffer_of.setdefault(value.dtype, len(pieces))
        if b == len(pieces):
            pieces.append([])
            sizes.append(0)
        layout.append((name, b, sizes[b], tuple(value.shape)))
        pieces[b].append(value.reshape(-1))
        sizes[b] += value.size
    return tuple(layout), [np.concatenate(p) for p in pieces], own


def unpack(layout: Layout, buffers: Sequence[Any]) -> dict[str, Part]:
    """The packed values as Parts of their (traced) buffers."""
    return {name: Part(buffers[b], start, shape) for name, b, start, shape in layout}


def contiguous(parts: Sequence[Part]) -> Any:
    """The stretch of one buffer that ``parts`` fill side by side, in order; else None."""
    buffer, start = parts[0].buffer, parts[0].start
    end = start
    for part in parts:
        if part.buffer is not buffer or part.start != end:
            return None
        end += part.size
    return buffer[start:end]


def cut(buffers: Sequence[np.ndarray], layout: Layout) -> dict[str, np.ndarray]:
    """The packed outputs, cut out of the flat results on the host (views, no copies)."""
    return {
        name: buffers[b][start : start + math.prod(shape)].reshape(shape)
        for name, b, start, shape in layout
    }


def outputs_of(
    values: Sequence[Any], names: Sequence[str]
) -> tuple[Layout, list[Any], dict[str, Any]]:
    """Splits a compiled graph's outputs: Parts become a layout over their distinct buffers."""
    buffers: list[Any] = []
    index: dict[int, int] = {}
    layout = []
    own = {}
    for name, value in zip(names, values, strict=True):
        if isinstance(value, Part):
            b = index.setdefault(id(value.buffer), len(buffers))
            if b == len(buffers):
                buffers.append(value.buffer)
            layout.append((name, b, value.start, value.shape))
        else:
            own[name] = value
    return tuple(layout), buffers, own
