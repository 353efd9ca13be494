"""Applying one operator's formula to a pytree: per leaf, or packed.

Every operator's formula has two parts, both elementwise: the new state from the
regularized gradient and the old state, and the update from the regularized
gradient, X and the new state. :func:`apply_formula` runs them leaf by leaf, or,
for a :class:`PackedTree` state, runs the first part once on flat buffers that
hold many small leaves and the second part per leaf on slices of them. On
XLA:CPU each array a step returns costs a few microseconds, so 500 small
leaves with packed state return 500 arrays instead of 1,500 (Adam). The results
are the same bit for bit: the formula is elementwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src.base import Array, PyTree, as_dtype, compute_dtype

# --------------------------------------------------------------------------
# The formula of one operator
# --------------------------------------------------------------------------


def regularized_gradient(
    g: Array, x: Array | None, norm_coefficient: Array, *, for_step: bool = False
) -> Array:
    """``G_regularized = norm_coefficient * X + G``; ``G`` when ``x`` is None.

    ``x`` is None when the coefficient is known to be zero: the term is then left
    out rather than computed as ``0 * X`` (which differs only where X is Inf or
    NaN), so X need not be read.

    ``for_step=True`` writes the same value as ``G - (-norm_coefficient) * X``,
    equal bit for bit (negation is exact and ``a - (-b)`` is ``a + b`` in IEEE
    arithmetic, fused multiply-adds included). When both the new state and the
    step read ``G_regularized``, XLA would otherwise compute it once into a
    parameter-sized temporary buffer; written differently, each kernel
    recomputes it from X and G, which costs no memory and less bandwidth.
    """
    if x is None:
        return g
    if for_step:
        return g - (-norm_coefficient) * x
    return norm_coefficient * x + g


@dataclasses.dataclass(frozen=True)
class Formula:
    """An operator's per-tensor formula, evaluated in a compute dtype.

    ``norm_coefficient(dtype)`` is the L2 coefficient; ``new_state(dtype, g_r,
    *state)`` returns the new state tensors from the regularized gradient;
    ``update(dtype, g_r, x, *new_state)`` returns what to add to X.
    """

    norm_coefficient: Callable[[jnp.dtype], Array]
    new_state: Callable[..., tuple[Array, ...]]
    update: Callable[..., Array]


# --------------------------------------------------------------------------
# Packed state
# --------------------------------------------------------------------------


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

    def unpack(self) -> PyTree:
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


def check_array_leaves(where: str, argument: str, tree: PyTree) -> None:
    """Every leaf must be an array (before the compiled update sees the tree)."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not isinstance(leaf, jax.Array | np.ndarray | np.generic):
            raise TypeError(
                f"{where}: {argument}{jax.tree_util.keystr(path)} must be a floating-point "
                f"array, got {type(leaf).__name__}"
            )


def check_update_arguments(
    where: str,
    state_class: type,
    state: Any,
    updates: PyTree,
    params: PyTree | None,
    reads_params: bool,
) -> None:
    """What every transformation's ``update`` checks before compiling anything."""
    if not isinstance(state, state_class):
        article = "an" if state_class.__name__[0] in "AEIOU" else "a"
        raise TypeError(
            f"{where}: state must be {article} {state_class.__name__}, got {type(state).__name__}"
        )
    check_array_leaves(where, "updates", updates)
    if reads_params:
        check_array_leaves(where, "params", params)


def check_pack_leaves_below(where: str, pack_leaves_below: Any) -> int | None:
    """A non-negative integer (``None`` if traced: only ``init`` reads it)."""
    if isinstance(pack_leaves_below, jax.core.Tracer):
        return None
    value = np.asarray(pack_leaves_below)
    if value.ndim or not np.issubdtype(value.dtype, np.integer) or value.dtype == np.bool_:
        raise TypeError(
            f"{where}: pack_leaves_below must be an integer (a leaf size), "
            f"got {pack_leaves_below!r}"
        )
    if int(value) < 0:
        raise ValueError(f"{where}: pack_leaves_below must be >= 0, got {int(value)}")
    return int(value)


def _check_float_leaves(where: str, argument: str, tree: PyTree) -> None:
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        dtype = getattr(leaf, "dtype", None)
        if dtype is None:
            raise TypeError(
                f"{where}: {argument}{jax.tree_util.keystr(path)} is a "
                f"{type(leaf).__name__}, not an array"
            )
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(
                f"{where}: {argument}{jax.tree_util.keystr(path)} has dtype {dtype}; "
                "only floating-point tensors can be optimized (mask integer leaves out "
                "with optax.masked)"
            )


def init_state(
    where: str,
    params: PyTree,
    accumulator_dtype: jnp.dtype | None,
    fill: Any,
    pack_leaves_below: int,
) -> PyTree:
    """A state tree like ``params`` filled with ``fill``, in the accumulator dtype.

    With ``pack_leaves_below > 0`` it is a :class:`PackedTree` in which leaves
    with fewer elements share one flat buffer per dtype.
    """
    _check_float_leaves(where, "params", params)

    def dtype_of(p: Array) -> jnp.dtype:
        return jnp.dtype(accumulator_dtype if accumulator_dtype is not None else p.dtype)

    if not pack_leaves_below:
        return jax.tree.map(
            lambda p: jnp.full_like(p, as_dtype(fill, dtype_of(p)), dtype=dtype_of(p)), params
        )
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
            own.append(jnp.full_like(p, as_dtype(fill, dtype_of(p)), dtype=dtype_of(p)))
            own_names.append(_key_name(named[len(slots) - 1][0]))
    layout = PackedLayout(
        treedef=treedef,
        shapes=tuple(tuple(p.shape) for p in leaves),
        slots=tuple(slots),
        buffer_sizes=tuple(sizes),
        own_names=tuple(own_names),
    )
    buffers = [
        jnp.full((size,), as_dtype(fill, dtype), dtype)
        for size, dtype in zip(sizes, dtypes, strict=True)
    ]
    return PackedTree(layout, buffers, own)


# --------------------------------------------------------------------------
# Applying a formula
# --------------------------------------------------------------------------


def _leaf_update(
    formula: Formula, g: Array, x: Array | None, state: Sequence[Array]
) -> tuple[Array, list[Array]]:
    dtype = compute_dtype(g.dtype, *(s.dtype for s in state))
    x_c = None if x is None else x.astype(dtype)
    g_c, nc = g.astype(dtype), formula.norm_coefficient(dtype)
    new = formula.new_state(
        dtype, regularized_gradient(g_c, x_c, nc), *(s.astype(dtype) for s in state)
    )
    update = formula.update(dtype, regularized_gradient(g_c, x_c, nc, for_step=True), x_c, *new)
    return update.astype(g.dtype), [n.astype(s.dtype) for n, s in zip(new, state, strict=True)]


def apply_formula(
    where: str,
    formula: Formula,
    updates: PyTree,
    params: PyTree | None,
    states: Sequence[tuple[str, PyTree]],
    *,
    reads_params: bool,
    why_params: str,
) -> tuple[PyTree, list[PyTree]]:
    """Applies ``formula`` to every gradient leaf and its state.

    Checks first, at trace time, that the trees line up: the gradients, each
    state tree and (when the formula reads them) the parameters have the same
    structure, shapes and floating dtypes. Updates come back in the gradients'
    dtypes and the new state in the state's dtypes and layout, so nothing
    changes from one step to the next.
    """
    leaves_with_path, treedef_ = jax.tree_util.tree_flatten_with_path(updates)
    treedef: Any = treedef_
    packed = [isinstance(tree, PackedTree) for _, tree in states]
    if any(packed) and not all(packed):
        raise TypeError(f"{where}: the state mixes packed and unpacked trees")
    layout = states[0][1].layout if states and packed[0] else None
    state_leaves: list[list[Any]] = []  # per-leaf state (unpacked layout only)
    state_shapes: list[list[tuple[int, ...]]] = []
    for name, tree in states:
        if layout is not None:
            if tree.layout != layout:
                raise ValueError(f"{where}: state.{name} has another packed layout than the rest")
            state_def = layout.treedef
        else:
            state_def = jax.tree.structure(tree)
        if state_def != treedef:
            raise ValueError(
                f"{where}: the updates (gradients) and state.{name} have different tree "
                f"structures; the state must come from init() on parameters shaped like "
                f"the gradients.\n  updates: {treedef}\n  state.{name}: {state_def}"
            )
        if layout is not None:
            state_shapes.append(list(layout.shapes))
        else:
            state_leaves.append(treedef.flatten_up_to(tree))
            state_shapes.append([leaf.shape for leaf in state_leaves[-1]])
    if reads_params and leaves_with_path:
        if params is None:
            raise ValueError(
                f"{where}: {why_params}, so update() needs the parameters: call "
                "tx.update(grads, state, params)"
            )
        params_def = jax.tree.structure(params)
        if params_def != treedef:
            raise ValueError(
                f"{where}: the updates (gradients) and params have different tree "
                f"structures.\n  updates: {treedef}\n  params: {params_def}"
            )
        param_leaves: list[Any] = treedef.flatten_up_to(params)
    else:
        param_leaves = [None] * len(leaves_with_path)

    for i, (path, g) in enumerate(leaves_with_path):
        location = jax.tree_util.keystr(path)
        if not hasattr(g, "dtype") or not jnp.issubdtype(g.dtype, jnp.floating):
            raise TypeError(
                f"{where}: updates{location} must be a floating-point array, got "
                f"{getattr(g, 'dtype', type(g).__name__)}"
            )
        for (name, _), shapes in zip(states, state_shapes, strict=True):
            if shapes[i] != g.shape:
                raise ValueError(
                    f"{where}: updates{location} has shape {g.shape} but "
                    f"state.{name}{location} has shape {shapes[i]}"
                )
        x = param_leaves[i]
        if x is not None:
            if x.shape != g.shape:
                raise ValueError(
                    f"{where}: updates{location} has shape {g.shape} but "
                    f"params{location} has shape {x.shape}"
                )
            if not jnp.issubdtype(x.dtype, jnp.floating):
                raise TypeError(f"{where}: params{location} has non-float dtype {x.dtype}")

    grads = [g for _, g in leaves_with_path]
    if layout is None:
        outputs = [
            _leaf_update(formula, g, x, [leaves[i] for leaves in state_leaves])
            for i, (g, x) in enumerate(zip(grads, param_leaves, strict=True))
        ]
        new_updates = [u for u, _ in outputs]
        new_states = [
            jax.tree.unflatten(treedef, [new[k] for _, new in outputs]) for k in range(len(states))
        ]
        return jax.tree.unflatten(treedef, new_updates), new_states
    return _apply_packed(formula, layout, grads, param_leaves, [t for _, t in states], treedef)


def _apply_packed(
    formula: Formula,
    layout: PackedLayout,
    grads: list[Array],
    xs: list[Array | None],
    trees: list[PackedTree],
    treedef: Any,
) -> tuple[PyTree, list[PyTree]]:
    new_updates: list[Any] = [None] * len(grads)
    new_own: list[list[Array]] = [[] for _ in trees]
    own_index = 0
    for i, slot in enumerate(layout.slots):
        if slot is None:
            update, new = _leaf_update(formula, grads[i], xs[i], [t.own[own_index] for t in trees])
            new_updates[i] = update
            for k, n in enumerate(new):
                new_own[k].append(n)
            own_index += 1
    new_buffers: list[list[Array]] = [[] for _ in trees]
    for b in range(len(layout.buffer_sizes)):
        members = [i for i, slot in enumerate(layout.slots) if slot is not None and slot[0] == b]
        buffers = [t.buffers[b] for t in trees]
        dtype = compute_dtype(*(grads[i].dtype for i in members), *(s.dtype for s in buffers))
        nc = formula.norm_coefficient(dtype)
        x_c: dict[int, Array | None] = {
            i: None if (x := xs[i]) is None else x.astype(dtype) for i in members
        }
        g_c = {i: grads[i].astype(dtype) for i in members}
        flat = jnp.concatenate(
            [regularized_gradient(g_c[i], x_c[i], nc).reshape(-1) for i in members]
        )
        new_flat = formula.new_state(dtype, flat, *(s.astype(dtype) for s in buffers))
        for i in members:
            offset, size = layout.slots[i][1], layout.size(i)  # type: ignore[index]
            new = [n[offset : offset + size].reshape(layout.shapes[i]) for n in new_flat]
            g_step = regularized_gradient(g_c[i], x_c[i], nc, for_step=True)
            new_updates[i] = formula.update(dtype, g_step, x_c[i], *new).astype(grads[i].dtype)
        for k, (n, s) in enumerate(zip(new_flat, buffers, strict=True)):
            new_buffers[k].append(n.astype(s.dtype))
    return jax.tree.unflatten(treedef, new_updates), [
        PackedTree(layout, new_buffers[k], new_own[k]) for k in range(len(trees))
    ]


def per_dtype(compute: Callable[[jnp.dtype], Any]) -> Callable[[jnp.dtype], Any]:
    """Memoizes the scalar part of a formula per compute dtype within one update."""
    cache: dict[jnp.dtype, Any] = {}

    def get(dtype: jnp.dtype) -> Any:
        if dtype not in cache:
            cache[dtype] = compute(dtype)
        return cache[dtype]

    return get
