"""The driver: the one jitted map of an operator's kernel over tensors.

Each operator module (``adagrad.py``, ``adam.py``, ``momentum.py``) describes
itself once, in an :class:`Operator`: its ONNX op type, attributes, state and
the functions that hold its whole formula,

* ``scalars(attributes, R, T, dtype)``: the scalars of one update (e.g. Adam's
  bias-corrected learning rate), in a compute dtype, as a small NamedTuple
  with a ``norm_coefficient`` field (``None`` when it is known to be zero);
* the per-tensor kernel, in two halves read one after the other:
  ``new_state(scalars, g_r, *state)`` returns the new state tensors from the
  regularized gradient ``G_r = norm_coefficient * X + G`` (which all three
  operators share, so the driver computes it), and
  ``step(scalars, x, g_r, *new_state)`` returns ``(step, x_new)``, where
  ``x_new`` is ``None`` when it is ``X - step``.

This module maps that kernel over a transformation's pytrees (leaf by leaf, or
over the flat buffers of a :class:`~onnx_optax.PackedTree`) or over an op's
variadic tensors, casting in and out. The kernel has two halves because the
packed layout needs them apart: it computes the new state once on each flat
buffer and each leaf's step from its slice of that new state, exactly as an
unpacked leaf's step reads its new state, so both layouts compile to the same
arithmetic and give the same bits. :func:`_apply` is the only function that
is jitted, so eager and jitted calls round alike, and the op and the
transformation run the same kernel: their agreement holds by construction.

Dtype policy (the same for the ops and the transformations):

* Every kernel runs in its *compute dtype*: the widest of float32 and the
  dtypes of the tensors it reads. For the ONNX types (float32, float64) that is
  the tensor dtype itself; bfloat16 and float16 tensors are computed in float32
  and rounded once when stored (``0.999`` is ``1.0`` in bfloat16).
* Attributes are cast to the compute dtype before use, so ``1 - alpha`` is
  evaluated in tensor precision, as an ONNX runtime does with its float32
  attributes.
* An attribute in ``Operator.optional_x_terms`` (``norm_coefficient``) that is
  known to be zero reaches the kernel as ``None``: its ``c * X`` term is left
  out rather than computed as ``0 * X``, so X need not be read.

Rounding policy (every path computes the same operations in the same order):

* An attribute given as a number is a compile-time constant of the compiled
  update in every path, eager or under a caller's ``jit`` (see
  :func:`_static`), so XLA folds the same scalar expressions in both.
* XLA fuses a multiply and the add that reads it into one FMA, and where a sum
  has two products LLVM picks the fused one by the code around the kernel.
  The kernels pass one product of each such sum through :func:`rounded`, and
  their step too, so that each sum has one way to fuse and ``X - step`` in the
  op is exactly ``X + update`` as ``optax.apply_updates`` adds it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
import optax

from onnx_optax._src import checks, packed
from onnx_optax._src.packed import PackedTree

Params: TypeAlias = Any  # a pytree of arrays
Updates: TypeAlias = Any  # a pytree of arrays shaped like the parameters
OptState: TypeAlias = Any  # a transformation's state
Schedule: TypeAlias = Callable[[jax.Array], Any]

_DYNAMIC = ...  # marks an attribute whose value is passed to the compiled update as data


@dataclasses.dataclass(frozen=True, eq=False)
class Operator:
    """The one description of an ONNX training operator, read by everything else.

    The ONNX node reader and writer, interop, conformance, the benchmark and the
    tests' tables derive what they need from it (through ``registry.py``).
    """

    op_type: str  # the ONNX op type in ai.onnx.preview.training
    initial_count: int  # the factory's default first T
    attributes: Any  # NamedTuple class of the ONNX attributes: schema order and defaults
    ranges: Mapping[str, tuple[float | None, float | None]]  # numeric attributes' bounds
    choices: Mapping[str, tuple[str, ...]]  # string attributes' allowed values
    optional_x_terms: tuple[str, ...]  # attributes whose non-zero value makes X read
    state: Any  # the state NamedTuple class: count, then one field per ONNX state input
    state_inputs: tuple[tuple[str, str], ...]  # (ONNX input letter, state field), ONNX order
    scalars: Callable[..., Any]  # (attributes, R, T, dtype) -> scalars of one update
    new_state: Callable[..., tuple[jax.Array, ...]]  # (scalars, G_r, *state) -> new state
    step: Callable[..., tuple[jax.Array, jax.Array | None]]  # (scalars, X, G_r, *new) -> step, X'
    # (the step passed through ``rounded``, so that X - step is X + update)

    factory: Callable[..., Transformation]  # the optax transformation
    op: Callable[..., tuple[jax.Array, ...]]  # the op with the ONNX signature

    @property
    def groups(self) -> tuple[str, ...]:
        """The variadic input groups in ONNX order: X, G, then the state letters."""
        return ("X", "G", *(letter for letter, _ in self.state_inputs))

    @property
    def fields(self) -> tuple[str, ...]:
        """The state fields holding the ONNX state inputs, in ONNX order."""
        return tuple(field for _, field in self.state_inputs)


class Transformation(optax.GradientTransformationExtraArgs):
    """An optax transformation of an ONNX operator, with what it was built from.

    It is the ``(init, update)`` pair optax expects. ``hyperparameters`` holds
    the operator's ONNX attributes as given (a NamedTuple), ``learning_rate``
    and ``initial_count`` the other arguments that an ONNX model stores;
    :mod:`onnx_optax.interop` reads them to export the transformation.
    """

    operator: Operator | None
    hyperparameters: Any
    learning_rate: optax.ScalarOrSchedule
    initial_count: Any

    def __new__(
        cls,
        init: Any,
        update: Any,
        *,
        operator: Operator | None = None,
        hyperparameters: Any = None,
        learning_rate: optax.ScalarOrSchedule = 0.0,
        initial_count: Any = 0,
    ) -> Transformation:
        self = super().__new__(cls, init, update)
        self.operator = operator
        self.hyperparameters = hyperparameters
        self.learning_rate = learning_rate
        self.initial_count = initial_count
        return self

    def _replace(self, **changes: Any) -> Transformation:
        """Like ``NamedTuple._replace``, keeping what the transformation was built from."""
        return type(self)(
            changes.pop("init", self.init),
            changes.pop("update", self.update),
            operator=self.operator,
            hyperparameters=self.hyperparameters,
            learning_rate=self.learning_rate,
            initial_count=self.initial_count,
            **changes,
        )


def compute_dtype(*dtypes: Any) -> jnp.dtype:
    """The widest of float32 and ``dtypes``: float64 if any is, else float32."""
    if any(jnp.dtype(dtype) == jnp.float64 for dtype in dtypes):
        return jnp.dtype(jnp.float64)
    return jnp.dtype(jnp.float32)


def cast(value: Any, dtype: Any) -> jax.Array:
    """A scalar (Python number or array) as an array of ``dtype``; ``None`` stays ``None``."""
    return None if value is None else jnp.asarray(value).astype(dtype)  # type: ignore[return-value]


def regularized_gradient(
    g: jax.Array, x: jax.Array | None, norm_coefficient: jax.Array | None, *, for_step: bool = False
) -> jax.Array:
    """``G_regularized = norm_coefficient * X + G``; ``G`` when the coefficient is ``None``.

    ``for_step=True`` writes the same value as ``G - (-norm_coefficient) * X``,
    equal bit for bit (negation is exact and ``a - (-b)`` is ``a + b``, fused
    multiply-adds included). When both the new state and the step read
    ``G_regularized``, XLA would otherwise compute it once into a
    parameter-sized temporary buffer; written differently, each kernel
    recomputes it from X and G, which costs no memory and less bandwidth.
    """
    if norm_coefficient is None:
        return g
    assert x is not None
    if for_step:
        return g - (-norm_coefficient) * x
    return norm_coefficient * x + g


def run_time_zero(T: jax.Array, dtype: Any) -> jax.Array:
    """An integer 0 as wide as ``dtype`` that the compiler cannot tell is 0.

    ``T < 0`` is false for every update count (T >= 0 is checked wherever it
    is known); computed from the run-time T, it keeps :func:`rounded` from
    being folded away.
    """
    return (T < 0).astype(jnp.int64 if jnp.dtype(dtype).itemsize == 8 else jnp.int32)


@jax.custom_jvp
def rounded(product: jax.Array, zero: jax.Array) -> jax.Array:
    """``product`` rounded on its own, never fused into an FMA by the sum that reads it.

    XLA (on CPU and GPU) contracts a multiply followed by an add into one fused
    multiply-add. In ``a*b + c*d`` either product can be the fused one; LLVM
    picks by the order of the operands after its own canonicalization, which
    depends on the code around the kernel (a constant attribute, the
    concatenation of a packed buffer, a vmap). The two choices differ in the
    last bit, and by many ulp where the sum cancels. Passing one product
    through an integer OR with ``zero`` (:func:`run_time_zero`, one vector
    instruction, a no-op) hides it from the contraction, so the sum is the same
    FMA of the other product on every path (a sum with one product has one way
    to fuse). The kernels also round their step apart: otherwise the op fuses
    a step that ends in a product (Momentum's ``R * V_new``) into
    ``X - step``, while optax adds the update ``-step`` after rounding it.
    """
    bits = jax.lax.bitcast_convert_type(product, zero.dtype)
    return jax.lax.bitcast_convert_type(bits | zero, product.dtype)


@rounded.defjvp
def _rounded_jvp(
    primals: tuple[jax.Array, jax.Array], tangents: tuple[jax.Array, Any]
) -> tuple[jax.Array, jax.Array]:
    """``rounded`` is the identity on ``product``, so its derivative is too.

    An integer carries no tangent, so without this rule the bitcast round trip
    would differentiate to zero (``jax.grad`` of every update with respect to G,
    R, V or H would silently be 0). The primal is the same rounded value, so the
    rule changes no bit of the update.
    """
    product, zero = primals
    return rounded(product, zero), tangents[0]


# --------------------------------------------------------------------------
# Attributes: which are compile-time constants, which are data
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Constant:
    """An attribute's number, known at trace time: compiled in as a constant.

    Held as ``float.hex`` so that the compiled-function cache tells 0.0 from
    -0.0 (which compare equal as floats).
    """

    hex: str

    @property
    def value(self) -> float:
        return float.fromhex(self.hex)


def _static(operator: Operator, attributes: Any, *, arrays: bool) -> tuple[Any, ...]:
    """Per attribute: what the compiled update is specialized on.

    Its string (a choice), ``None`` (a zero optional X term, left out), a
    :class:`_Constant` (a number known at trace time), or _DYNAMIC (a traced
    value, or a JAX array unless ``arrays``: data of the compiled update).

    A number is a constant in every path, eager or under a caller's ``jit``
    (where a Python number is a constant anyway), so both compile the same
    kernel: XLA folds what depends only on constants (``1 - alpha``, Adam's
    ``log1p(beta - 1)``) the same way in both, instead of folding it under
    ``jit`` and evaluating it at run time eagerly, where its ``log1p``
    rounds differently. The transformation keeps JAX arrays as data
    (``arrays=False``), so that hyperparameters injected by
    ``optax.inject_hyperparams`` and changed between eager calls do not
    recompile; the op's attributes are ONNX constants (``arrays=True``).
    """

    def kind(name: str, value: Any) -> Any:
        if name in operator.choices:
            return value
        if name in operator.optional_x_terms and checks.is_static_zero(value):
            return None
        if checks.is_traced(value) or (isinstance(value, jax.Array) and not arrays):
            return _DYNAMIC
        number = checks.scalar(value)
        assert number is not None
        return _Constant(float(number).hex())

    return tuple(kind(name, value) for name, value in attributes._asdict().items())


def _dynamic(attributes: Any, static: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(
        value if kind is _DYNAMIC else None for value, kind in zip(attributes, static, strict=True)
    )


def _attributes(operator: Operator, static: tuple[Any, ...], dynamic: tuple[Any, ...]) -> Any:
    """The attributes a kernel reads, from their compile-time and run-time parts."""
    return operator.attributes(
        *(
            d if s is _DYNAMIC else s.value if isinstance(s, _Constant) else s
            for s, d in zip(static, dynamic, strict=True)
        )
    )


def _why_params(operator: Operator) -> str:
    return (
        f"{' or '.join(operator.optional_x_terms)} is non-zero (or not known at trace time) "
        "and the formula reads X"
    )


# --------------------------------------------------------------------------
# The compiled map
# --------------------------------------------------------------------------


@dataclasses.dataclass
class _Unit:
    """Tensors one kernel call computes: one leaf, or the leaves of one packed buffer."""

    members: list[int]  # leaf indices
    state: list[jax.Array]  # one array per state field
    flat: bool  # a packed buffer: leaves are flattened and concatenated


def _units(states: Sequence[Any], n: int) -> tuple[list[_Unit], packed.PackedLayout | None]:
    is_packed = [isinstance(tree, PackedTree) for tree in states]
    if not any(is_packed):
        leaves = [jax.tree.leaves(tree) for tree in states]
        return [_Unit([i], [fl[i] for fl in leaves], False) for i in range(n)], None
    layout = states[0].layout
    own_leaves = [i for i, slot in enumerate(layout.slots) if slot is None]
    units = [_Unit([i], [tree.own[k] for tree in states], False) for k, i in enumerate(own_leaves)]
    for b in range(len(layout.buffer_sizes)):
        members = [i for i, slot in enumerate(layout.slots) if slot is not None and slot[0] == b]
        units.append(_Unit(members, [tree.buffers[b] for tree in states], True))
    return units, layout


def _check_layouts(where: str, fields: Sequence[str], states: Sequence[Any]) -> None:
    is_packed = [isinstance(tree, PackedTree) for tree in states]
    if any(is_packed) and not all(is_packed):
        raise TypeError(f"{where}: the state mixes packed and unpacked trees")
    for field, tree in zip(fields, states, strict=True):
        if all(is_packed) and tree.layout != states[0].layout:
            raise ValueError(f"{where}: state.{field} has another packed layout than the rest")


def _tree_info(tree: Any) -> tuple[Any, list[tuple[int, ...]]]:
    if isinstance(tree, PackedTree):
        return tree.layout.treedef, list(tree.layout.shapes)
    return jax.tree.structure(tree), [leaf.shape for leaf in jax.tree.leaves(tree)]


@functools.partial(jax.jit, static_argnames=("operator", "where", "static", "schedule", "for_op"))
def _apply(
    dynamic: tuple[Any, ...],
    rate: Any,
    count: jax.Array,
    grads: Any,
    params: Any,
    states: tuple[Any, ...],
    *,
    operator: Operator,
    where: str,
    static: tuple[Any, ...],
    schedule: Schedule | None,
    for_op: bool,
) -> tuple[Any, tuple[Any, ...], jax.Array]:
    """One update of every tensor: ``(updates or X_new, new state per field, next count)``.

    ``for_op`` returns X_new per tensor (the op's outputs) and skips the tree
    checks (the op checked its variadic inputs); otherwise the update to add to
    X (the transformation's), after checking that the trees line up.
    """
    attributes = _attributes(operator, static, dynamic)
    R = rate if schedule is None else schedule(count)
    if np.ndim(R) != 0:
        raise ValueError(
            f"the learning-rate schedule returned shape {np.shape(R)}; it must return a scalar"
        )
    if for_op:
        g_leaves, treedef = jax.tree.flatten(grads)
        x_leaves = list(params)
    else:
        _check_layouts(where, operator.fields, states)
        g_leaves, treedef, x_leaves = checks.check_trees(
            where,
            grads,
            [(f, *_tree_info(t)) for f, t in zip(operator.fields, states, strict=True)],
            params,
            reads_params=any(getattr(attributes, n) is not None for n in operator.optional_x_terms),
            why_params=_why_params(operator),
        )
    units, layout = _units(states, len(g_leaves))

    scalars: dict[jnp.dtype, Any] = {}
    outputs: list[Any] = [None] * len(g_leaves)
    new_state: list[list[jax.Array]] = [[] for _ in states]
    for unit in units:
        dtype = compute_dtype(
            *(g_leaves[i].dtype for i in unit.members), *(s.dtype for s in unit.state)
        )
        if dtype not in scalars:
            scalars[dtype] = operator.scalars(attributes, cast(R, dtype), count, dtype)

        s = scalars[dtype]

        def regularized(i: int, *, for_step: bool = False, dtype: Any = dtype, s: Any = s) -> Any:
            x = None if x_leaves[i] is None else x_leaves[i].astype(dtype)
            g = g_leaves[i].astype(dtype)
            return x, regularized_gradient(g, x, s.norm_coefficient, for_step=for_step)

        state = [st.astype(dtype) for st in unit.state]
        if unit.flat:
            assert layout is not None
            g_r = jnp.concatenate([regularized(i)[1].reshape(-1) for i in unit.members])
            new = list(operator.new_state(s, g_r, *state))
        for i in unit.members:
            if unit.flat:
                offset, size = layout.slots[i][1], layout.size(i)  # type: ignore[index,union-attr]
                leaf_new = [n[offset : offset + size].reshape(g_leaves[i].shape) for n in new]
            else:
                new = leaf_new = list(operator.new_state(s, regularized(i)[1], *state))
            x, g_r = regularized(i, for_step=True)
            step, x_new = operator.step(s, x, g_r, *leaf_new)
            if for_op:
                out = x - step if x_new is None else x_new
            else:
                out = -step if x_new is None else x_new - x
            outputs[i] = out.astype(g_leaves[i].dtype)
        for k, (n, st) in enumerate(zip(new, unit.state, strict=True)):
            new_state[k].append(n.astype(st.dtype))

    if layout is None:
        trees = tuple(jax.tree.unflatten(treedef, leaves) for leaves in new_state)
    else:
        n_own = sum(slot is None for slot in layout.slots)
        trees = tuple(PackedTree(layout, leaves[n_own:], leaves[:n_own]) for leaves in new_state)
    return jax.tree.unflatten(treedef, outputs), trees, optax.safe_increment(count)


# --------------------------------------------------------------------------
# The two faces of an operator
# --------------------------------------------------------------------------


class Options(NamedTuple):
    """A factory's arguments that are not ONNX attributes."""

    initial_count: Any  # the T of the first update
    accumulator_dtype: Any  # the state's dtype (None: the parameters')
    pack_leaves_below: Any  # pack the state of leaves smaller than this (0: never)
    initial_value: Any = 0.0  # the state's value at init (Adagrad's initial_accumulator_value)


def transformation(
    operator: Operator,
    where: str,
    hyperparameters: Any,
    learning_rate: optax.ScalarOrSchedule,
    options: Options,
) -> Transformation:
    """The optax transformation of ``operator`` with ``hyperparameters`` (its attributes).

    ``None`` options take their defaults (the operator's first T, no packing):
    ``optax.inject_hyperparams`` then keeps them static rather than injecting
    them as float hyperparameters.
    """
    initial_count, accumulator_dtype, pack_leaves_below, initial_value = options
    if initial_count is None:
        initial_count = operator.initial_count
    if pack_leaves_below is None:
        pack_leaves_below = 0
    checks.check_attributes(
        where, hyperparameters, operator.ranges, operator.choices, constant=False
    )
    checks.check_learning_rate(where, learning_rate)
    checks.check_initial_count(where, initial_count)
    state_dtype = checks.check_accumulator_dtype(where, accumulator_dtype)
    packing = checks.check_pack_leaves_below(where, pack_leaves_below)
    static = _static(operator, hyperparameters, arrays=False)
    reads_params = any(
        kind is not None
        for name, kind in zip(hyperparameters._fields, static, strict=True)
        if name in operator.optional_x_terms
    )
    schedule, rate = (learning_rate, None) if callable(learning_rate) else (None, learning_rate)
    dynamic = _dynamic(hyperparameters, static)

    def init_fn(params: Params) -> OptState:
        count = jnp.asarray(initial_count).astype(jnp.int32)
        trees = {
            field: packed.init_state(where, params, state_dtype, initial_value, packing or 0)
            for field in operator.fields
        }
        return operator.state(count=count, **trees)

    def update_fn(
        updates: Updates, state: OptState, params: Params | None = None, **extra_args: Any
    ) -> tuple[Updates, OptState]:
        del extra_args
        checks.check_update_arguments(where, operator.state, state, updates, params, reads_params)
        new_updates, trees, count = _apply(
            dynamic,
            rate,
            state.count,
            updates,
            params if reads_params else None,
            tuple(getattr(state, field) for field in operator.fields),
            operator=operator,
            where=where,
            static=static,
            schedule=schedule,
            for_op=False,
        )
        return new_updates, operator.state(count, *trees)

    return Transformation(
        init_fn,
        update_fn,
        operator=operator,
        hyperparameters=hyperparameters,
        learning_rate=learning_rate,
        initial_count=initial_count,
    )


def op(
    operator: Operator, where: str, R: Any, T: Any, inputs: Sequence[Any], attributes: Any
) -> tuple[jax.Array, ...]:
    """Runs ``operator`` as the ONNX op: ``(R, T, *inputs)`` in, outputs in ONNX order."""
    checks.check_attributes(where, attributes, operator.ranges, operator.choices, constant=True)
    r = checks.check_learning_rate_input(where, R)
    t = checks.check_count_input(where, T)
    xs, gs, *states = checks.split_variadic(where, inputs, operator.groups)
    static = _static(operator, attributes, arrays=True)
    x_new, trees, _ = _apply(
        _dynamic(attributes, static),
        r,
        t,
        gs,
        xs,
        tuple(states),
        operator=operator,
        where=where,
        static=static,
        schedule=None,
        for_op=True,
    )
    return (*x_new, *(tensor for tree in trees for tensor in tree))
