"""The packed state layout: many small leaves' state in one flat buffer per dtype.

On XLA:CPU each array a jitted step takes or returns costs a few microseconds,
so 500 small leaves cost more in overhead than in arithmetic. With
``pack_leaves_below=n`` the state of every leaf with fewer than ``n`` elements
lives in one flat buffer per dtype (a :class:`PackedTree`); the formulas are
elementwise, so the numbers are the same bit for bit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src import checks


@dataclasses.dataclass(frozen=True, eq=False)
class PackedLayout:
    """Where each parameter's state lives: a slice of a flat buffer, or its own array."""

    treedef: Any  # the parameters' tree structure
    shapes: tuple[tuple[int, ...], ...]  # each leaf's shape
    slots: tuple[tuple[int, int] | None, ...]  # (buffer, offset) per leaf; None: own array
    buffer_sizes: tuple[int, ...]
    own_names: tuple[str, ...]  # key of each leaf kept as its own array

    def __post_init__(self) -> None:
        # jax hashes and compares a pytree's static data on every jitted call;
        # hash the long tuples once.
        fields = (self.treedef, self.shapes, self.slots, self.buffer_sizes, self.own_names)
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, PackedLayout) or hash(self) != hash(other):
            return False
        return (self.treedef, self.shapes, self.slots, self.buffer_sizes, self.own_names) == (
            other.treedef,
            other.shapes,
            other.slots,
            other.buffer_sizes,
            other.own_names,
        )

    def size(self, leaf: int) -> int:
        return int(np.prod(self.shapes[leaf], dtype=np.int64))


def path_keys(path: Sequence[Any]) -> list[str]:
    """The keys of a pytree path as strings: dict keys, sequence indices, attribute names."""
    return [
        str(getattr(entry, "key", getattr(entry, "idx", getattr(entry, "name", entry))))
        for entry in path
    ]


def _key_name(path: Sequence[Any]) -> str:
    return ".".join(path_keys(path)) or "leaf"


@jax.tree_util.register_pytree_with_keys_class
class PackedTree:
    """State shaped like the parameters, with small leaves packed into flat buffers.

    Its pytree children are the flat buffers (one per dtype of packed leaves)
    and the leaves kept as their own arrays, so a jitted step passes a handful of
    arrays instead of one per parameter. Read it per parameter with
    :meth:`unpack` (the parameters' tree of arrays) or by indexing like that
    tree (``state.v["layer"]["w"]``).

    Example:
      >>> import jax, jax.numpy as jnp, onnx_optax
      >>> tx = onnx_optax.adam(0.1, pack_leaves_below=1000)
      >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
      >>> state = tx.init(params)
      >>> state.v
      PackedTree(2 leaves; packed buffers of sizes [8], 0 own arrays)
      >>> [leaf.shape for leaf in jax.tree.leaves(state.v)]
      [(8,)]
      >>> state.v["w"].shape
      (3, 2)
    """

    def __init__(self, layout: PackedLayout, buffers: Sequence[Any], own: Sequence[Any]) -> None:
        self.layout = layout
        self.buffers = tuple(buffers)
        self.own = tuple(own)

    def tree_flatten(self) -> tuple[tuple[Any, ...], PackedLayout]:
        return (*self.buffers, *self.own), self.layout

    def tree_flatten_with_keys(self) -> tuple[list[tuple[Any, Any]], PackedLayout]:
        keys = [f"packed_{b}" for b in range(len(self.buffers))] + list(self.layout.own_names)
        children = [*self.buffers, *self.own]
        return [
            (jax.tree_util.DictKey(k), c) for k, c in zip(keys, children, strict=True)
        ], self.layout

    @classmethod
    def tree_unflatten(cls, layout: PackedLayout, children: Sequence[Any]) -> PackedTree:
        n = len(layout.buffer_sizes)
        return cls(layout, children[:n], children[n:])

    def leaves(self) -> list[Any]:
        """Each parameter's state, in the parameters' leaf order."""
        own = iter(self.own)
        result = []
        for leaf, slot in enumerate(self.layout.slots):
            if slot is None:
                result.append(next(own))
            else:
                buffer, offset = slot
                size = self.layout.size(leaf)
                flat = self.buffers[buffer][..., offset : offset + size]
                result.append(flat.reshape(*flat.shape[:-1], *self.layout.shapes[leaf]))
        return result

    def unpack(self) -> Any:
        """The state as the parameters' tree of arrays."""
        return jax.tree.unflatten(self.layout.treedef, self.leaves())

    def __getitem__(self, key: Any) -> Any:
        return self.unpack()[key]

    def __repr__(self) -> str:
        sizes = ", ".join(str(s) for s in self.layout.buffer_sizes)
        return (
            f"PackedTree({len(self.layout.shapes)} leaves; packed buffers of sizes [{sizes}], "
            f"{len(self.own)} own arrays)"
        )


def init_state(
    where: str,
    params: Any,
    accumulator_dtype: jnp.dtype | None,
    fill: Any,
    pack_leaves_below: int,
) -> Any:
    """A state tree like ``params`` filled with ``fill``, in the accumulator dtype.

    With ``pack_leaves_below > 0`` it is a :class:`PackedTree` in which leaves
    with fewer elements share one flat buffer per dtype. A leaf of ``params``
    may be a ``jax.ShapeDtypeStruct``: the state is made of arrays all the same
    (zeros, or ``fill``, as optax's ``init`` makes them), with its sharding.
    """
    checks.check_leaves(where, "params", params, floating=True, abstract=True)

    def dtype_of(p: jax.Array) -> jnp.dtype:
        return jnp.dtype(accumulator_dtype if accumulator_dtype is not None else p.dtype)

    def filled(p: jax.Array) -> jax.Array:
        return jnp.full_like(p, jnp.asarray(fill).astype(dtype_of(p)), dtype=dtype_of(p))

    if not pack_leaves_below:
        return jax.tree.map(filled, params)
    named, treedef = jax.tree_util.tree_flatten_with_path(params)
    leaves = [p for _, p in named]
    own_names = []
    buffer_of_dtype: dict[jnp.dtype, int] = {}
    sizes: list[int] = []
    dtypes: list[jnp.dtype] = []
    slots: list[tuple[int, int] | None] = []
    own = []
    for p in leaves:
        size = int(np.prod(p.shape, dtype=np.int64))
        if 0 < size < pack_leaves_below:
            dtype = dtype_of(p)
            if dtype not in buffer_of_dtype:
                buffer_of_dtype[dtype] = len(sizes)
                sizes.append(0)
                dtypes.append(dtype)
            b = buffer_of_dtype[dtype]
            slots.append((b, sizes[b]))
            sizes[b] += size
        else:
            slots.append(None)
            own.append(filled(p))
            own_names.append(_key_name(named[len(slots) - 1][0]))
    layout = PackedLayout(
        treedef=treedef,
        shapes=tuple(tuple(p.shape) for p in leaves),
        slots=tuple(slots),
        buffer_sizes=tuple(sizes),
        own_names=tuple(own_names),
    )
    buffers = [
        jnp.full((size,), jnp.asarray(fill).astype(dtype), dtype)
        for size, dtype in zip(sizes, dtypes, strict=True)
    ]
    return PackedTree(layout, buffers, own)
