"""ONNX ``ai.onnx.preview.training.Adagrad`` (opset 1): formula, transformation, op."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from onnx_optax._src import base, tree

_ATTRIBUTES = ("decay_factor", "epsilon", "norm_coefficient")


class AdagradState(NamedTuple):
    """State of :func:`onnx_optax.adagrad`: the ONNX T and H."""

    count: jax.Array  # type: ignore[assignment]  # shape=(), int32: T of the next update
    h: base.PyTree  # like params: accumulated squared gradient (ONNX H)


def _check(where: str, hyperparameters: dict[str, Any]) -> None:
    base.check_hyperparameter(where, "decay_factor", hyperparameters["decay_factor"], minimum=0.0)
    base.check_hyperparameter(where, "epsilon", hyperparameters["epsilon"], minimum=0.0)
    base.check_hyperparameter(where, "norm_coefficient", hyperparameters["norm_coefficient"])


# ------------------------------------------------------------------ the formula


def decayed_learning_rate(R: jax.Array, T: jax.Array, decay_factor: jax.Array) -> jax.Array:
    """``r = R / (1 + T * decay_factor)``, in the dtype of ``R``."""
    return R / (1 + T.astype(R.dtype) * decay_factor)


def adagrad_accumulate(g_regularized: jax.Array, h: jax.Array) -> jax.Array:
    """``H_new = H + G_r * G_r``."""
    return h + g_regularized * g_regularized


def adagrad_step(
    g_regularized: jax.Array, h_new: jax.Array, r: jax.Array, *, epsilon: jax.Array
) -> jax.Array:
    """``r * G_r / (Sqrt(H_new) + epsilon)``: ``X_new = X - step``."""
    return r * g_regularized / (jnp.sqrt(h_new) + epsilon)


# ----------------------------------------------------------- the transformation


def adagrad(
    learning_rate: optax.ScalarOrSchedule,
    *,
    decay_factor: float = 0.0,
    epsilon: float = 1e-6,
    norm_coefficient: float = 0.0,
    initial_accumulator_value: float = 0.0,
    initial_count: int = 0,
    accumulator_dtype: Any | None = None,
    pack_leaves_below: int = 0,
) -> optax.GradientTransformationExtraArgs:
    r"""ONNX Adagrad (``ai.onnx.preview.training``, opset 1) as an optax transformation.

    With learning rate :math:`R`, update count :math:`T` (``state.count``),
    gradient :math:`G`, parameters :math:`X` and accumulator :math:`H`:

    .. math::

      r &= R / (1 + T \cdot \mathrm{decay\_factor}) \\
      G_r &= \mathrm{norm\_coefficient} \cdot X + G \\
      H' &= H + G_r^2 \\
      X' &= X - r \, G_r / (\sqrt{H'} + \epsilon)

    and the returned update is exactly :math:`-r G_r / (\sqrt{H'} + \epsilon)`,
    so ``optax.apply_updates(params, updates)`` equals the op's ``X_new`` bit for
    bit, and ``state.h`` equals its ``H_new``.

    .. warning::
      ``epsilon`` is added *outside* the square root, and the accumulator starts
      at ``initial_accumulator_value=0.0``; ``optax.adagrad`` puts epsilon inside
      the root and starts at 0.1. ``torch.optim.Adagrad`` with ``lr_decay``
      matches this formula with T = its step - 1, i.e. with the default
      ``initial_count=0``.

    Args:
      learning_rate: R: a float, a scalar array, or an optax schedule called with
        ``state.count``.
      decay_factor: learning-rate decay, :math:`r = R / (1 + T d)`; >= 0.
      epsilon: added to :math:`\sqrt{H'}`; finite and >= 0.
      norm_coefficient: L2 coefficient; adds ``norm_coefficient * X`` to the
        gradient. A non-zero value needs ``params`` in ``update``; with zero the
        term is left out and ``params`` are not read.
      initial_accumulator_value: the value H starts at.
      initial_count: the T used by the first update (default 0: ONNX calls the
        first Adagrad update "generally 0 or 1"; 0 makes ``decay_factor`` start
        at the undecayed R, as in PyTorch).
      accumulator_dtype: dtype of H (default: the parameters' dtype).
      pack_leaves_below: if > 0, H of parameters with fewer elements is packed
        into one flat buffer per dtype (a :class:`~onnx_optax.PackedTree`, read per
        parameter with ``.unpack()``): much faster for many small leaves, same
        numbers. Not for parameters sharded across devices.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose state is an
      :class:`AdagradState`.

    Example:
      >>> import jax.numpy as jnp, numpy as np, optax, onnx_optax
      >>> tx = onnx_optax.adagrad(0.1, epsilon=1e-5, norm_coefficient=0.001,
      ...                         decay_factor=0.1, initial_accumulator_value=2.0)
      >>> params = jnp.array([1.0])
      >>> state = tx.init(params)
      >>> updates, state = tx.update(jnp.array([-1.0]), state, params)
      >>> x_new = optax.apply_updates(params, updates)
      >>> print(np.round(np.asarray(x_new), 4), np.round(np.asarray(state.h), 4))
      [1.0577] [2.998]

    References:
      ONNX operator ``ai.onnx.preview.training.Adagrad``, version 1.
      Duchi, Hazan and Singer, *Adaptive Subgradient Methods for Online Learning
      and Stochastic Optimization*, JMLR 2011.
    """
    where = "onnx_optax.adagrad"
    hyperparameters = {
        "decay_factor": decay_factor,
        "epsilon": epsilon,
        "norm_coefficient": norm_coefficient,
    }
    _check(where, hyperparameters)
    base.check_hyperparameter(where, "initial_accumulator_value", initial_accumulator_value)
    base.check_learning_rate(where, learning_rate)
    base.check_initial_count(where, initial_count)
    state_dtype = base.check_accumulator_dtype(where, accumulator_dtype)
    packing = tree.check_pack_leaves_below(where, pack_leaves_below)
    reads_params = not base.is_static_zero(norm_coefficient)

    def init_fn(params: base.PyTree) -> AdagradState:
        return AdagradState(
            count=base.initial_count_array(initial_count),
            h=tree.init_state(where, params, state_dtype, initial_accumulator_value, packing or 0),
        )

    def update_fn(
        updates: base.PyTree,
        state: AdagradState,
        params: base.PyTree | None = None,
        **extra_args: Any,
    ) -> tuple[base.PyTree, AdagradState]:
        del extra_args
        tree.check_update_arguments(where, AdagradState, state, updates, params, reads_params)
        schedule, rate = base.split_learning_rate(learning_rate)
        return _adagrad_update(
            updates,
            state,
            params if reads_params else None,
            rate,
            hyperparameters,
            schedule=schedule,
            reads_params=reads_params,
        )

    spec = base.OnnxSpec(
        "Adagrad",
        hyperparameters,
        learning_rate,
        initial_count,
        {
            "initial_accumulator_value": initial_accumulator_value,
            "accumulator_dtype": state_dtype,
        },
    )
    return base.onnx_transformation(init_fn, update_fn, spec)


@functools.partial(jax.jit, static_argnames=("schedule", "reads_params"))
def _adagrad_update(
    updates: base.PyTree,
    state: AdagradState,
    params: base.PyTree | None,
    rate: Any,
    hyperparameters: dict[str, Any],
    *,
    schedule: base.Schedule | None,
    reads_params: bool,
) -> tuple[base.PyTree, AdagradState]:
    """The transformation's update, compiled (eager calls round like jitted ones)."""
    R = base.learning_rate_at(schedule, rate, state.count)

    @tree.per_dtype
    def scalars(dtype: jnp.dtype) -> dict[str, jax.Array]:
        cast = {name: base.as_dtype(value, dtype) for name, value in hyperparameters.items()}
        cast["r"] = decayed_learning_rate(
            base.as_dtype(R, dtype), state.count, cast["decay_factor"]
        )
        return cast

    def new_state(dtype: jnp.dtype, g_r: jax.Array, h: jax.Array) -> tuple[jax.Array, ...]:
        return (adagrad_accumulate(g_r, h),)

    def update(
        dtype: jnp.dtype, g_r: jax.Array, x: jax.Array | None, h_new: jax.Array
    ) -> jax.Array:
        s = scalars(dtype)
        return -adagrad_step(g_r, h_new, s["r"], epsilon=s["epsilon"])

    new_updates, (h,) = tree.apply_formula(
        "onnx_optax.adagrad",
        tree.Formula(lambda dtype: scalars(dtype)["norm_coefficient"], new_state, update),
        updates,
        params,
        [("h", state.h)],
        reads_params=reads_params,
        why_params="norm_coefficient is non-zero (or not known at trace time) and the "
        "formula reads X",
    )
    return new_updates, AdagradState(count=optax.safe_increment(state.count), h=h)


# ----------------------------------------------------------------------- the op


@functools.partial(jax.jit, static_argnames=_ATTRIBUTES)
def _adagrad_op(
    R: jax.Array,
    T: jax.Array,
    xs: list[jax.Array],
    gs: list[jax.Array],
    hs: list[jax.Array],
    *,
    decay_factor: float,
    epsilon: float,
    norm_coefficient: float,
) -> tuple[jax.Array, ...]:
    dtype = base.compute_dtype(xs[0].dtype)
    r = decayed_learning_rate(base.as_dtype(R, dtype), T, base.as_dtype(decay_factor, dtype))
    x_out, h_out = [], []
    for x, g, h in zip(xs, gs, hs, strict=True):
        x_c = x.astype(dtype)
        g_c, nc = g.astype(dtype), base.as_dtype(norm_coefficient, dtype)
        x_r = x_c if norm_coefficient else None
        g_r = tree.regularized_gradient(g_c, x_r, nc)
        h_new = adagrad_accumulate(g_r, h.astype(dtype))
        step = adagrad_step(
            tree.regularized_gradient(g_c, x_r, nc, for_step=True),
            h_new,
            r,
            epsilon=base.as_dtype(epsilon, dtype),
        )
        x_out.append((x_c - step).astype(x.dtype))
        h_out.append(h_new.astype(x.dtype))
    return (*x_out, *h_out)


def adagrad_op(
    R: Any,
    T: Any,
    *inputs: Any,
    decay_factor: float = 0.0,
    epsilon: float = 1e-6,
    norm_coefficient: float = 0.0,
) -> tuple[jax.Array, ...]:
    r"""The ONNX Adagrad op: ``(R, T, X_1..X_n, G_1..G_n, H_1..H_n)``.

    For each tensor:

    .. math::

      r &= R / (1 + T \cdot \mathrm{decay\_factor}) \\
      G_r &= \mathrm{norm\_coefficient} \cdot X + G \\
      H_{new} &= H + G_r^2 \\
      X_{new} &= X - r \, G_r / (\sqrt{H_{new}} + \epsilon)

    Jitted, compiled once per input signature and attribute set.

    Args:
      R: learning rate, a floating scalar.
      T: update count, an integer scalar.
      *inputs: ``X_1..X_n, G_1..G_n, H_1..H_n``: float tensors of one dtype, each
        X_i, G_i, H_i of the same shape.
      decay_factor, epsilon, norm_coefficient: the ONNX attributes (constants).

    Returns:
      ``(X_1_new..X_n_new, H_1_new..H_n_new)`` in the input dtype.

    Example:
      >>> import numpy as np, onnx_optax
      >>> x_new, h_new = onnx_optax.ops.adagrad(
      ...     np.float32(0.1), 0, np.array([1.0], np.float32), np.array([-1.0], np.float32),
      ...     np.array([2.0], np.float32), decay_factor=0.1, epsilon=1e-5,
      ...     norm_coefficient=0.001)
      >>> print(np.round(np.asarray(x_new), 4), np.round(np.asarray(h_new), 4))
      [1.0577] [2.998]

    References:
      ONNX operator ``ai.onnx.preview.training.Adagrad``, version 1.
    """
    where = "onnx_optax.ops.adagrad"
    attributes = base.check_attributes(
        where, decay_factor=decay_factor, epsilon=epsilon, norm_coefficient=norm_coefficient
    )
    _check(where, attributes)
    r = base.check_learning_rate_input(where, R)
    t = base.check_count_input(where, T)
    xs, gs, hs = base.split_variadic(where, inputs, ("X", "G", "H"))
    return _adagrad_op(r, t, xs, gs, hs, **attributes)
