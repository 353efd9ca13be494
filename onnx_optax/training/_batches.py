"""``batches``: one epoch of a data set as batches, in an order that a resumed run repeats."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np


def epoch_order(rows: int, *, seed: int, epoch: int) -> np.ndarray:
    """The rows of epoch ``epoch`` in shuffled order: a function of ``(seed, epoch)`` alone.

    Each epoch draws its own permutation from ``numpy.random.default_rng([seed,
    epoch])``, so epoch 7 is the same whether the epochs before it ran in this
    process or in another one.
    """
    return np.random.default_rng([seed, epoch]).permutation(rows)


class Batches:
    """The batches of one epoch (see :func:`batches`): iterate it, ``len()`` counts them.

    Iterating twice gives the same batches.
    """

    def __init__(
        self,
        arrays: dict[str, np.ndarray],
        axes: dict[str, int],
        rows: int,
        batch_size: int,
        order: np.ndarray | None,
        start: int,
        drop_last: bool,
    ) -> None:
        self.arrays, self.axes, self.rows = arrays, axes, rows
        self.batch_size, self.order, self.start, self.drop_last = (
            batch_size,
            order,
            start,
            drop_last,
        )

    def __len__(self) -> int:
        left = self.rows - self.start
        return left // self.batch_size if self.drop_last else -(-left // self.batch_size)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for first in range(self.start, self.start + len(self) * self.batch_size, self.batch_size):
            last = min(first + self.batch_size, self.rows)
            if self.order is None:  # views of consecutive rows, no copy
                yield {
                    name: array[(slice(None),) * self.axes[name] + (slice(first, last),)]
                    for name, array in self.arrays.items()
                }
            else:
                rows = self.order[first:last]
                yield {
                    name: np.take(array, rows, axis=self.axes[name])
                    for name, array in self.arrays.items()
                }


def batches(
    arrays: Mapping[str, Any],
    batch_size: int,
    *,
    shuffle: bool = False,
    seed: int = 0,
    axis: int | Mapping[str, int] = 0,
    epoch: int = 0,
    start: int = 0,
    drop_last: bool = False,
) -> Batches:
    """The batches of one epoch of ``arrays``: dicts of the same names, ``batch_size`` rows each.

    A row is one index along each array's batch axis (``axis``: one for all,
    or a mapping from name to axis, 0 for the names it leaves out: a
    time-major target ``[T, N]`` has its batch on axis 1). Every row comes
    once an epoch: in order, or with ``shuffle`` in the order of
    ``numpy.random.default_rng([seed, epoch]).permutation(rows)``, a function
    of ``(seed, epoch)`` alone. So a run stopped after ``k`` rows of epoch
    ``e`` continues exactly with ``batches(..., epoch=e, start=k)``, in
    another process too.

    Args:
      arrays: the data, by feed name: numpy arrays, or anything ``numpy.asarray``
        takes (lists), all with the same number of rows.
      batch_size: rows a batch.
      shuffle: shuffle the rows of each epoch (otherwise they come in order).
      seed: the shuffling's seed, an integer >= 0.
      axis: the batch axis of every array, or a mapping from name to axis.
      epoch: which epoch (>= 0): with ``shuffle``, which order.
      start: the rows of the epoch already taken (0 <= start <= rows); the
        batches begin after them.
      drop_last: leave out the last batch when it has fewer than
        ``batch_size`` rows (each step then has the same shape, so it
        compiles once; with ``shuffle`` the left-out rows change each epoch).

    Returns:
      An iterable of dicts of numpy arrays, one a batch; ``len()`` of it is the
      number of batches. Unshuffled batches are views of ``arrays``.

    Raises:
      ValueError: arrays without rows on their axis, with different numbers
        of rows, an axis naming no array, or a ``batch_size``, ``seed``,
        ``epoch`` or ``start`` out of range.

    Example:
      >>> import numpy as np
      >>> from onnx_optax import training
      >>> data = {"x": np.arange(10.0).reshape(5, 2), "t": np.arange(5)}
      >>> [b["t"].tolist() for b in training.batches(data, 2)]
      [[0, 1], [2, 3], [4]]
      >>> epoch_3 = dict(shuffle=True, seed=1, epoch=3)
      >>> [b["t"].tolist() for b in training.batches(data, 2, **epoch_3)]
      [[0, 4], [2, 3], [1]]
      >>> [b["t"].tolist() for b in training.batches(data, 2, **epoch_3, start=2)]  # resumed
      [[2, 3], [1]]
    """
    for label, value, least in (("batch_size", batch_size, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
            raise ValueError(f"{label} must be an integer >= {least}, got {value!r}")
    if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer) or epoch < 0:
        raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
    if not isinstance(arrays, Mapping) or not arrays:
        raise ValueError("arrays must be a non-empty mapping from feed name to array")
    data = {str(name): np.asarray(value) for name, value in arrays.items()}
    if isinstance(axis, Mapping):
        unknown = sorted(set(axis) - set(data))
        if unknown:
            raise ValueError(f"axis names {unknown}, which are not among the arrays {list(data)}")
        axes = {name: axis.get(name, 0) for name in data}
    else:
        axes = dict.fromkeys(data, axis)
    counts: dict[str, int] = {}
    for name, array in data.items():
        a = axes[name]
        if not array.ndim:
            raise ValueError(f"array '{name}' is a scalar: it has no rows to batch")
        if (
            isinstance(a, bool)
            or not isinstance(a, int | np.integer)
            or not -array.ndim <= a < array.ndim
        ):
            raise ValueError(
                f"array '{name}' has shape {list(array.shape)}: batch axis {a!r} is out of range"
            )
        axes[name] = int(a) % array.ndim
        counts[name] = array.shape[axes[name]]
    if len(set(counts.values())) != 1:
        raise ValueError(
            f"the arrays must have the same number of rows on their batch axes, got {counts}"
        )
    rows = next(iter(counts.values()))
    if isinstance(start, bool) or not isinstance(start, int | np.integer) or not 0 <= start <= rows:
        raise ValueError(f"start must be an integer in [0, {rows}] (the rows), got {start!r}")
    if drop_last and batch_size > rows:
        raise ValueError(
            f"batch_size {batch_size} is larger than the {rows} rows, and drop_last leaves no batch"
        )
    order = epoch_order(rows, seed=int(seed), epoch=int(epoch)) if shuffle else None
    return Batches(data, axes, rows, int(batch_size), order, int(start), bool(drop_last))
