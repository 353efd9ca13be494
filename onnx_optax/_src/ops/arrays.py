"""What the op families share about their values: static or traced, dtypes, axes, sizes.

Shape-valued inputs (``Op.static``: Reshape's shape, Slice's starts, Reduce
axes, ...) are numpy arrays known at trace time; ops whose inputs are all numpy
compute with numpy and return numpy (``_xp``), so shape arithmetic such as
``Shape -> Gather -> Concat -> Reshape`` folds while tracing and a whole graph
compiles into one XLA computation. A helper used by one family alone lives in
that family's module, not here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src.ops.registry import Node


def is_static(value: Any) -> bool:
    """Whether a value is known while tracing (a numpy array, not a JAX array)."""
    return isinstance(value, np.ndarray | np.generic)


def _xp(*values: Any) -> Any:
    """numpy when every given value is static (shape arithmetic), else jax.numpy."""
    return np if all(v is None or is_static(v) for v in values) else jnp


def _canonical(dtype: Any) -> np.dtype:
    """The dtype JAX holds for ``dtype`` (int64 -> int32 without 64-bit JAX)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(np.dtype(dtype)))


def _cast(x: Any, dtype: Any) -> Any:
    if is_static(x):
        return np.asarray(x).astype(dtype)
    return x.astype(_canonical(dtype))


def _ints(value: Any) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _axis(axis: int, rank: int, where: str) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"{where}: axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def _axes(axes: Sequence[int], rank: int, where: str) -> tuple[int, ...]:
    out = tuple(_axis(int(a), rank, where) for a in axes)
    if len(set(out)) != len(out):
        raise ValueError(f"{where}: repeated axes {list(axes)}")
    return out


def _same_dtype(node: Node, *values: Any) -> None:
    dtypes = {_canonical(v.dtype) for v in values if v is not None}
    if len(dtypes) > 1:
        raise TypeError(
            f"{node.where}: inputs have dtypes {sorted(map(str, dtypes))}; they must be of one type"
        )


def _broadcast_check(node: Node, *values: Any) -> None:
    given = [v for v in values if v is not None]
    try:
        shape = np.broadcast_shapes(*(np.shape(v) for v in given))
    except ValueError:
        shapes = [list(np.shape(v)) for v in given]
        raise ValueError(f"{node.where}: input shapes {shapes} do not broadcast") from None
    if given:
        widest = max((np.dtype(v.dtype) for v in given), key=lambda d: d.itemsize)
        check_size(node, shape, widest)


def check_size(node: Node, shape: Sequence[Any], dtype: Any, what: str = "output") -> None:
    """Refuses a tensor of ``shape`` larger than the node's limit, counted in Python ints.

    Called before numpy allocates a computed shape or XLA is handed one (an
    element count beyond int64 aborts XLA), with the limit keyword to raise it.
    """
    dims = [int(d) for d in shape]
    size = math.prod(dims) * np.dtype(dtype).itemsize
    if size > node.max_bytes:
        raise ValueError(
            f"{node.where}: its {what} of shape {dims} ({np.dtype(dtype)}) would take {size} "
            f"bytes, over the limit of {node.max_bytes} bytes per tensor; raise it with "
            "limits=Limits(tensor_bytes=...) if the model is yours"
        )


def _is_int(x: Any) -> bool:
    return bool(np.issubdtype(np.dtype(x.dtype), np.integer))


def _axes_of(node: Node, axes: Any) -> list[int] | None:
    """Axes from the input (newer opsets) or the attribute (older), None if neither."""
    if axes is not None:
        return _ints(axes)
    value = node.get("axes")
    return None if value is None else [int(a) for a in value]
