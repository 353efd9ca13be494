"""ONNX ``ai.onnx.preview.training.Momentum`` (opset 1): formula, transformation, op."""

from __future__ import annotations

import functools
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

from onnx_optax._src import base, tree

_ATTRIBUTES = ("alpha", "beta", "mode", "norm_coefficient")
MODES = ("standard", "nesterov")


class MomentumState(NamedTuple):
    """State of :func:`onnx_optax.momentum`: the ONNX T and V."""

    count: jax.Array  # type: ignore[assignment]  # shape=(), int32: T of the next update
    v: base.PyTree  # like params: the momentum (ONNX V)


def check_mode(where: str, mode: Any) -> None:
    """``mode`` must be exactly "standard" or "nesterov"."""
    if not isinstance(mode, str):
        raise TypeError(
            f"{where}: mode must be the string 'standard' or 'nesterov', "
            f"got {type(mode).__name__} {mode!r}"
        )
    if mode not in MODES:
        raise ValueError(f"{where}: mode must be 'standard' or 'nesterov', got {mode!r}")


def _check(where: str, hyperparameters: dict[str, Any]) -> None:
    for name in ("alpha", "beta", "norm_coefficient"):
        base.check_hyperparameter(where, name, hyperparameters[name])


# ------------------------------------------------------------------ the formula


def adjusted_beta(T: jax.Array, beta: jax.Array) -> jax.Array:
    """``beta_adjusted = T > 0 ? beta : 1``."""
    return jnp.where(T > 0, beta, jnp.ones_like(beta))


def momentum_velocity(
    g_regularized: jax.Array, v: jax.Array, beta_adjusted: jax.Array, *, alpha: jax.Array
) -> jax.Array:
    """``V_new = alpha * V + beta_adjusted * G_r``."""
    return alpha * v + beta_adjusted * g_regularized


def momentum_step(
    g_regularized: jax.Array,
    v_new: jax.Array,
    R: jax.Array,
    *,
    alpha: jax.Array,
    nesterov: bool,
) -> jax.Array:
    """``R * V_new`` (standard) or ``R * (G_r + alpha * V_new)`` (Nesterov).

    ``X_new = X - step``.
    """
    if nesterov:
        return R * (g_regularized + alpha * v_new)
    return R * v_new


# ----------------------------------------------------------- the transformation


def momentum(
    learning_rate: optax.ScalarOrSchedule,
    *,
    alpha: float,
    beta: float,
    norm_coefficient: float,
    mode: Literal["standard", "nesterov"] = "standard",
    initial_count: int = 0,
    accumulator_dtype: Any | None = None,
    pack_leaves_below: int = 0,
) -> optax.GradientTransformationExtraArgs:
    r"""ONNX Momentum (``ai.onnx.preview.training``, opset 1) as an optax transformation.

    With learning rate :math:`R`, update count :math:`T` (``state.count``),
    gradient :math:`G`, parameters :math:`X` and momentum :math:`V`:

    .. math::

      G_r &= \mathrm{norm\_coefficient} \cdot X + G \\
      \beta_T &= \begin{cases} \beta & T > 0 \\ 1 & T = 0 \end{cases} \\
      V' &= \alpha V + \beta_T G_r \\
      X' &= \begin{cases} X - R V' & \text{standard} \\
                          X - R (G_r + \alpha V') & \text{nesterov} \end{cases}

    The returned update is exactly :math:`X' - X` as the step above, so
    ``optax.apply_updates(params, updates)`` equals the op's ``X_new`` bit for
    bit, and ``state.v`` equals its ``V_new``.

    ``alpha``, ``beta`` and ``norm_coefficient`` are required, as in the ONNX
    schema. With ``beta = 1 - alpha`` this is an exponential moving average; with
    ``beta = 1`` it is ``optax.sgd(R, momentum=alpha)`` (heavy ball), and
    ``mode="nesterov"`` with ``beta = 1`` is ``optax.sgd(..., nesterov=True)``.

    .. warning::
      At :math:`T = 0` the gradient enters with coefficient 1 whatever ``beta``
      is; ONNX says T "should be zero in the first training iteration", hence
      ``initial_count=0``.

    Args:
      learning_rate: R: a float, a scalar array, or an optax schedule called with
        ``state.count``.
      alpha: decay of the previous momentum.
      beta: coefficient of the gradient in the new momentum (for T > 0).
      norm_coefficient: L2 coefficient; adds ``norm_coefficient * X`` to the
        gradient. A non-zero value needs ``params`` in ``update``; with zero the
        term is left out and ``params`` are not read.
      mode: ``"standard"`` or ``"nesterov"``; any other value is an error.
      initial_count: the T used by the first update (default 0, as ONNX says).
      accumulator_dtype: dtype of V (default: the parameters' dtype).
      pack_leaves_below: if > 0, V of parameters with fewer elements is packed
        into one flat buffer per dtype (a :class:`~onnx_optax.PackedTree`, read per
        parameter with ``.unpack()``): much faster for many small leaves, same
        numbers. Not for parameters sharded across devices.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose state is a
      :class:`MomentumState`.

    Example:
      >>> import jax.numpy as jnp, numpy as np, optax, onnx_optax
      >>> tx = onnx_optax.momentum(0.1, alpha=0.9, beta=0.1, norm_coefficient=0.0)
      >>> params = jnp.array([1.0, 2.0])
      >>> state = tx.init(params)
      >>> for _ in range(2):
      ...     updates, state = tx.update(jnp.array([1.0, -1.0]), state)
      ...     params = optax.apply_updates(params, updates)
      >>> print(np.round(np.asarray(params), 4), np.round(np.asarray(state.v), 4))
      [0.8 2.2] [ 1. -1.]

    References:
      ONNX operator ``ai.onnx.preview.training.Momentum``, version 1.
      Sutskever et al., *On the importance of initialization and momentum in deep
      learning*, ICML 2013.
    """
    where = "onnx_optax.momentum" if mode != "nesterov" else "onnx_optax.nesterov"
    hyperparameters = {"alpha": alpha, "beta": beta, "norm_coefficient": norm_coefficient}
    check_mode(where, mode)
    _check(where, hyperparameters)
    base.check_learning_rate(where, learning_rate)
    base.check_initial_count(where, initial_count)
    state_dtype = base.check_accumulator_dtype(where, accumulator_dtype)
    packing = tree.check_pack_leaves_below(where, pack_leaves_below)
    reads_params = not base.is_static_zero(norm_coefficient)
    nesterov = mode == "nesterov"

    def init_fn(params: base.PyTree) -> MomentumState:
        return MomentumState(
            count=base.initial_count_array(initial_count),
            v=tree.init_state(where, params, state_dtype, 0.0, packing or 0),
        )

    def update_fn(
        updates: base.PyTree,
        state: MomentumState,
        params: base.PyTree | None = None,
        **extra_args: Any,
    ) -> tuple[base.PyTree, MomentumState]:
        del extra_args
        tree.check_update_arguments(where, MomentumState, state, updates, params, reads_params)
        schedule, rate = base.split_learning_rate(learning_rate)
        return _momentum_update(
            updates,
            state,
            params if reads_params else None,
            rate,
            hyperparameters,
            schedule=schedule,
            reads_params=reads_params,
            nesterov=nesterov,
        )

    spec = base.OnnxSpec(
        "Momentum",
        {**hyperparameters, "mode": mode},
        learning_rate,
        initial_count,
        {"accumulator_dtype": state_dtype},
    )
    return base.onnx_transformation(init_fn, update_fn, spec)


def nesterov(
    learning_rate: optax.ScalarOrSchedule,
    *,
    alpha: float,
    beta: float,
    norm_coefficient: float,
    initial_count: int = 0,
    accumulator_dtype: Any | None = None,
    pack_leaves_below: int = 0,
) -> optax.GradientTransformationExtraArgs:
    r"""ONNX Momentum with ``mode="nesterov"``: :func:`momentum` with that mode.

    .. math::

      V' = \alpha V + \beta_T G_r, \qquad X' = X - R (G_r + \alpha V')

    Args:
      learning_rate: R: a float, a scalar array or an optax schedule.
      alpha: decay of the previous momentum.
      beta: coefficient of the gradient in the new momentum (for T > 0).
      norm_coefficient: L2 coefficient.
      initial_count: the T used by the first update (default 0).
      accumulator_dtype: dtype of V (default: the parameters' dtype).
      pack_leaves_below: see :func:`momentum`.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose state is a
      :class:`MomentumState`.

    Example:
      >>> import jax.numpy as jnp, numpy as np, onnx_optax
      >>> tx = onnx_optax.nesterov(0.1, alpha=0.9, beta=1.0, norm_coefficient=0.0)
      >>> state = tx.init(jnp.zeros(2))
      >>> updates, state = tx.update(jnp.array([1.0, -1.0]), state)
      >>> print(np.round(np.asarray(updates), 4))
      [-0.19  0.19]

    References:
      ONNX operator ``ai.onnx.preview.training.Momentum``, version 1.
    """
    return momentum(
        learning_rate,
        alpha=alpha,
        beta=beta,
        norm_coefficient=norm_coefficient,
        mode="nesterov",
        initial_count=initial_count,
        accumulator_dtype=accumulator_dtype,
        pack_leaves_below=pack_leaves_below,
    )


@functools.partial(jax.jit, static_argnames=("schedule", "reads_params", "nesterov"))
def _momentum_update(
    updates: base.PyTree,
    state: MomentumState,
    params: base.PyTree | None,
    rate: Any,
    hyperparameters: dict[str, Any],
    *,
    schedule: base.Schedule | None,
    reads_params: bool,
    nesterov: bool,
) -> tuple[base.PyTree, MomentumState]:
    """The transformation's update, compiled (eager calls round like jitted ones)."""
    R = base.learning_rate_at(schedule, rate, state.count)

    @tree.per_dtype
    def scalars(dtype: jnp.dtype) -> dict[str, jax.Array]:
        cast = {name: base.as_dtype(value, dtype) for name, value in hyperparameters.items()}
        cast["R"] = base.as_dtype(R, dtype)
        cast["beta_adjusted"] = adjusted_beta(state.count, cast["beta"])
        return cast

    def new_state(dtype: jnp.dtype, g_r: jax.Array, v: jax.Array) -> tuple[jax.Array, ...]:
        s = scalars(dtype)
        return (momentum_velocity(g_r, v, s["beta_adjusted"], alpha=s["alpha"]),)

    def update(
        dtype: jnp.dtype, g_r: jax.Array, x: jax.Array | None, v_new: jax.Array
    ) -> jax.Array:
        s = scalars(dtype)
        return -momentum_step(g_r, v_new, s["R"], alpha=s["alpha"], nesterov=nesterov)

    new_updates, (v,) = tree.apply_formula(
        "onnx_optax.nesterov" if nesterov else "onnx_optax.momentum",
        tree.Formula(lambda dtype: scalars(dtype)["norm_coefficient"], new_state, update),
        updates,
        params,
        [("v", state.v)],
        reads_params=reads_params,
        why_params="norm_coefficient is non-zero (or not known at trace time) and the "
        "formula reads X",
    )
    return new_updates, MomentumState(count=optax.safe_increment(state.count), v=v)


# ----------------------------------------------------------------------- the op


@functools.partial(jax.jit, static_argnames=_ATTRIBUTES)
def _momentum_op(
    R: jax.Array,
    T: jax.Array,
    xs: list[jax.Array],
    gs: list[jax.Array],
    vs: list[jax.Array],
    *,
    alpha: float,
    beta: float,
    mode: str,
    norm_coefficient: float,
) -> tuple[jax.Array, ...]:
    dtype = base.compute_dtype(xs[0].dtype)
    R_ = base.as_dtype(R, dtype)
    alpha_ = base.as_dtype(alpha, dtype)
    beta_adjusted = adjusted_beta(T, base.as_dtype(beta, dtype))
    x_out, v_out = [], []
    for x, g, v in zip(xs, gs, vs, strict=True):
        x_c = x.astype(dtype)
        g_c, nc = g.astype(dtype), base.as_dtype(norm_coefficient, dtype)
        x_r = x_c if norm_coefficient else None
        g_r = tree.regularized_gradient(g_c, x_r, nc)
        v_new = momentum_velocity(g_r, v.astype(dtype), beta_adjusted, alpha=alpha_)
        step = momentum_step(
            tree.regularized_gradient(g_c, x_r, nc, for_step=True),
            v_new,
            R_,
            alpha=alpha_,
            nesterov=mode == "nesterov",
        )
        x_out.append((x_c - step).astype(x.dtype))
        v_out.append(v_new.astype(x.dtype))
    return (*x_out, *v_out)


def momentum_op(
    R: Any,
    T: Any,
    *inputs: Any,
    alpha: float,
    beta: float,
    mode: Literal["standard", "nesterov"],
    norm_coefficient: float,
) -> tuple[jax.Array, ...]:
    r"""The ONNX Momentum op: ``(R, T, X_1..X_n, G_1..G_n, V_1..V_n)``.

    For each tensor, with ``beta_adjusted = T > 0 ? beta : 1``:

    .. math::

      G_r &= \mathrm{norm\_coefficient} \cdot X + G \\
      V_{new} &= \alpha V + \beta_{adjusted} G_r \\
      X_{new} &= X - R V_{new} \quad \text{(standard)}, \qquad
      X_{new} = X - R (G_r + \alpha V_{new}) \quad \text{(nesterov)}

    All four attributes are required, as in the ONNX schema.

    Args:
      R: learning rate, a floating scalar.
      T: update count, an integer scalar (0 in the first iteration).
      *inputs: ``X_1..X_n, G_1..G_n, V_1..V_n``: float tensors of one dtype, each
        X_i, G_i, V_i of the same shape.
      alpha, beta, norm_coefficient: the ONNX float attributes (constants).
      mode: ``"standard"`` or ``"nesterov"``; anything else is an error
        (``onnx.reference`` treats every value other than "standard" as Nesterov).

    Returns:
      ``(X_1_new..X_n_new, V_1_new..V_n_new)`` in the input dtype.

    Example:
      >>> import numpy as np, onnx_optax
      >>> x, g = np.array([1.2, 2.8], np.float32), np.array([-0.94, -2.5], np.float32)
      >>> v = np.array([1.7, 3.6], np.float32)
      >>> x_new, v_new = onnx_optax.ops.momentum(
      ...     np.float32(0.1), 0, x, g, v, alpha=0.95, beta=0.1, mode="standard",
      ...     norm_coefficient=0.001)
      >>> print(np.round(np.asarray(x_new), 4), np.round(np.asarray(v_new), 4))
      [1.1324 2.7077] [0.6762 0.9228]

    References:
      ONNX operator ``ai.onnx.preview.training.Momentum``, version 1.
    """
    where = "onnx_optax.ops.momentum"
    check_mode(where, mode)
    attributes = base.check_attributes(
        where, alpha=alpha, beta=beta, norm_coefficient=norm_coefficient
    )
    r = base.check_learning_rate_input(where, R)
    t = base.check_count_input(where, T)
    xs, gs, vs = base.split_variadic(where, inputs, ("X", "G", "V"))
    return _momentum_op(r, t, xs, gs, vs, mode=mode, **attributes)
