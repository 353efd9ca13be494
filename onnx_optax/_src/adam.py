"""ONNX ``ai.onnx.preview.training.Adam`` (opset 1): formula, transformation, op."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from onnx_optax._src import base, tree

_ATTRIBUTES = ("alpha", "beta", "epsilon", "norm_coefficient", "norm_coefficient_post")


class AdamState(NamedTuple):
    """State of :func:`onnx_optax.adam`: the ONNX T, V and H."""

    count: jax.Array  # type: ignore[assignment]  # shape=(), int32: T of the next update
    v: base.PyTree  # like params: exponentially averaged gradient (ONNX V)
    h: base.PyTree  # like params: exponentially averaged squared gradient (ONNX H)


def _check(where: str, hyperparameters: dict[str, Any]) -> None:
    for name in ("alpha", "beta"):
        base.check_hyperparameter(where, name, hyperparameters[name], minimum=0.0, maximum=1.0)
    base.check_hyperparameter(where, "epsilon", hyperparameters["epsilon"], minimum=0.0)
    base.check_hyperparameter(where, "norm_coefficient", hyperparameters["norm_coefficient"])
    base.check_hyperparameter(
        where, "norm_coefficient_post", hyperparameters["norm_coefficient_post"]
    )


# ------------------------------------------------------------------ the formula


def one_minus_power(base_: jax.Array, T: jax.Array) -> jax.Array:
    """``1 - base_**T`` for an integer ``T >= 0``, to full relative precision.

    Computed as ``-expm1(T * log1p(base_ - 1))``: the naive float32
    ``1 - 0.9999**2`` keeps only ~4 correct digits, this keeps ~7 (the error is
    a few ulp for every ``base_`` in [0, 1] and every T). A zero result is +0,
    as ``1 - 1**T`` is.
    """
    one_minus = -jnp.expm1(T.astype(base_.dtype) * jnp.log1p(base_ - 1))
    return jnp.where(one_minus == 0, jnp.zeros_like(one_minus), one_minus)


def adjusted_learning_rate(R: jax.Array, T: jax.Array, alpha: jax.Array, beta: jax.Array) -> Any:
    """``R_adjusted = T > 0 ? R * Sqrt(1 - beta**T) / (1 - alpha**T) : R``.

    ``R``, ``alpha`` and ``beta`` are in the compute dtype; ``T`` is an integer.
    """
    corrected = R * jnp.sqrt(one_minus_power(beta, T)) / one_minus_power(alpha, T)
    return jnp.where(T > 0, corrected, R)


def adam_moments(
    g_regularized: jax.Array, v: jax.Array, h: jax.Array, *, alpha: jax.Array, beta: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``V_new = alpha V + (1 - alpha) G_r`` and ``H_new = beta H + (1 - beta) G_r G_r``."""
    v_new = alpha * v + (1 - alpha) * g_regularized
    h_new = beta * h + (1 - beta) * g_regularized * g_regularized
    return v_new, h_new


def adam_step(
    v_new: jax.Array, h_new: jax.Array, r_adjusted: jax.Array, *, epsilon: jax.Array
) -> jax.Array:
    """``R_adjusted * V_new / (Sqrt(H_new) + epsilon)``: ``X_new = X - step``."""
    return r_adjusted * v_new / (jnp.sqrt(h_new) + epsilon)


# ----------------------------------------------------------- the transformation


def adam(
    learning_rate: optax.ScalarOrSchedule,
    *,
    alpha: float = 0.9,
    beta: float = 0.999,
    epsilon: float = 1e-6,
    norm_coefficient: float = 0.0,
    norm_coefficient_post: float = 0.0,
    initial_count: int = 1,
    accumulator_dtype: Any | None = None,
    pack_leaves_below: int = 0,
) -> optax.GradientTransformationExtraArgs:
    r"""ONNX Adam (``ai.onnx.preview.training``, opset 1) as an optax transformation.

    With learning rate :math:`R`, update count :math:`T` (``state.count``),
    gradient :math:`G`, parameters :math:`X` and state :math:`V, H`:

    .. math::

      G_r &= \mathrm{norm\_coefficient} \cdot X + G \\
      V' &= \alpha V + (1 - \alpha) G_r \\
      H' &= \beta H + (1 - \beta) G_r^2 \\
      R_T &= \begin{cases} R \sqrt{1 - \beta^T} / (1 - \alpha^T) & T > 0 \\
                           R & T = 0 \end{cases} \\
      X' &= (1 - \mathrm{norm\_coefficient\_post})
            \left(X - R_T V' / (\sqrt{H'} + \epsilon)\right)

    and the returned update is :math:`X' - X`, so that
    ``optax.apply_updates(params, updates)`` is the op's ``X_new``: bit for bit
    when ``norm_coefficient_post`` is zero (the update is then exactly
    :math:`-R_T V'/(\sqrt{H'}+\epsilon)`), else to within rounding of the last
    addition. ``state.v``/``state.h`` equal the op's ``V_new``/``H_new`` bit for
    bit.

    .. warning::
      ONNX adds :math:`\epsilon` to :math:`\sqrt{H'}` *before* the bias
      correction is applied, unlike ``optax.adam`` and ``torch.optim.Adam``, which
      add it to the bias-corrected :math:`\sqrt{\hat{H}}`. The two agree only when
      :math:`\epsilon` is negligible. At :math:`T = 0` ONNX applies no bias
      correction at all; that is why this transformation starts at
      ``initial_count=1`` (the usual bias-corrected first step), whereas a graph
      that feeds ``T = 0`` first takes a step about
      :math:`(1-\alpha)/\sqrt{1-\beta}` (3.2x) larger.

    Args:
      learning_rate: R: a float, a scalar array, or an optax schedule called with
        ``state.count`` (the T of the update being made).
      alpha: coefficient of the previous V in its running average, in [0, 1].
      beta: coefficient of the previous H in its running average, in [0, 1].
      epsilon: added to :math:`\sqrt{H'}`; finite and >= 0.
      norm_coefficient: L2 coefficient; adds ``norm_coefficient * X`` to the
        gradient. Non-zero values need ``params`` in ``update``.
      norm_coefficient_post: multiplicative decay applied after the step,
        :math:`X' = (1 - c) X_{new}`. Non-zero values need ``params``.
      initial_count: the T used by the first update (default 1, see above).
      accumulator_dtype: dtype of V and H (default: the parameters' dtype), e.g.
        ``jnp.float32`` to keep float32 state for bfloat16 parameters.
      pack_leaves_below: if > 0, V and H of parameters with fewer elements are
        packed into one flat buffer per dtype (a :class:`~onnx_optax.PackedTree`,
        read per parameter with ``.unpack()``): much faster for many small
        leaves, same numbers. Not for parameters sharded across devices.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose state is an
      :class:`AdamState`.

    Example:
      >>> import jax.numpy as jnp, numpy as np, optax, onnx_optax
      >>> tx = onnx_optax.adam(0.1)
      >>> params = {"w": jnp.array([1.0, -2.0])}
      >>> state = tx.init(params)
      >>> grads = {"w": jnp.array([0.5, -0.5])}
      >>> updates, state = tx.update(grads, state)
      >>> print(np.round(np.asarray(optax.apply_updates(params, updates)["w"]), 4))
      [ 0.9 -1.9]
      >>> int(state.count)
      2

    References:
      ONNX operator ``ai.onnx.preview.training.Adam``, version 1.
      Kingma and Ba, *Adam: A Method for Stochastic Optimization*, 2015.
    """
    where = "onnx_optax.adam"
    hyperparameters = {
        "alpha": alpha,
        "beta": beta,
        "epsilon": epsilon,
        "norm_coefficient": norm_coefficient,
        "norm_coefficient_post": norm_coefficient_post,
    }
    _check(where, hyperparameters)
    base.check_learning_rate(where, learning_rate)
    base.check_initial_count(where, initial_count)
    state_dtype = base.check_accumulator_dtype(where, accumulator_dtype)
    packing = tree.check_pack_leaves_below(where, pack_leaves_below)
    post_is_zero = base.is_static_zero(norm_coefficient_post)
    reads_params = not (base.is_static_zero(norm_coefficient) and post_is_zero)

    def init_fn(params: base.PyTree) -> AdamState:
        return AdamState(
            count=base.initial_count_array(initial_count),
            v=tree.init_state(where, params, state_dtype, 0.0, packing or 0),
            h=tree.init_state(where, params, state_dtype, 0.0, packing or 0),
        )

    def update_fn(
        updates: base.PyTree,
        state: AdamState,
        params: base.PyTree | None = None,
        **extra_args: Any,
    ) -> tuple[base.PyTree, AdamState]:
        del extra_args
        tree.check_update_arguments(where, AdamState, state, updates, params, reads_params)
        schedule, rate = base.split_learning_rate(learning_rate)
        return _adam_update(
            updates,
            state,
            params if reads_params else None,
            rate,
            hyperparameters,
            schedule=schedule,
            reads_params=reads_params,
            post_is_zero=post_is_zero,
        )

    spec = base.OnnxSpec(
        "Adam", hyperparameters, learning_rate, initial_count, {"accumulator_dtype": state_dtype}
    )
    return base.onnx_transformation(init_fn, update_fn, spec)


@functools.partial(jax.jit, static_argnames=("schedule", "reads_params", "post_is_zero"))
def _adam_update(
    updates: base.PyTree,
    state: AdamState,
    params: base.PyTree | None,
    rate: Any,
    hyperparameters: dict[str, Any],
    *,
    schedule: base.Schedule | None,
    reads_params: bool,
    post_is_zero: bool,
) -> tuple[base.PyTree, AdamState]:
    """The transformation's update, compiled (eager calls round like jitted ones)."""
    R = base.learning_rate_at(schedule, rate, state.count)

    @tree.per_dtype
    def scalars(dtype: jnp.dtype) -> dict[str, jax.Array]:
        cast = {name: base.as_dtype(value, dtype) for name, value in hyperparameters.items()}
        cast["r_adjusted"] = adjusted_learning_rate(
            base.as_dtype(R, dtype), state.count, cast["alpha"], cast["beta"]
        )
        return cast

    def new_state(
        dtype: jnp.dtype, g_r: jax.Array, v: jax.Array, h: jax.Array
    ) -> tuple[jax.Array, ...]:
        s = scalars(dtype)
        return adam_moments(g_r, v, h, alpha=s["alpha"], beta=s["beta"])

    def update(
        dtype: jnp.dtype, g_r: jax.Array, x: jax.Array | None, v_new: jax.Array, h_new: jax.Array
    ) -> jax.Array:
        s = scalars(dtype)
        step = adam_step(v_new, h_new, s["r_adjusted"], epsilon=s["epsilon"])
        if post_is_zero:
            return -step
        assert x is not None
        return (1 - s["norm_coefficient_post"]) * (x - step) - x

    new_updates, (v, h) = tree.apply_formula(
        "onnx_optax.adam",
        tree.Formula(lambda dtype: scalars(dtype)["norm_coefficient"], new_state, update),
        updates,
        params,
        [("v", state.v), ("h", state.h)],
        reads_params=reads_params,
        why_params="norm_coefficient or norm_coefficient_post is non-zero (or not known at "
        "trace time) and the formula reads X",
    )
    return new_updates, AdamState(count=optax.safe_increment(state.count), v=v, h=h)


# ----------------------------------------------------------------------- the op


@functools.partial(jax.jit, static_argnames=_ATTRIBUTES)
def _adam_op(
    R: jax.Array,
    T: jax.Array,
    xs: list[jax.Array],
    gs: list[jax.Array],
    vs: list[jax.Array],
    hs: list[jax.Array],
    *,
    alpha: float,
    beta: float,
    epsilon: float,
    norm_coefficient: float,
    norm_coefficient_post: float,
) -> tuple[jax.Array, ...]:
    dtype = base.compute_dtype(xs[0].dtype)
    alpha_, beta_ = base.as_dtype(alpha, dtype), base.as_dtype(beta, dtype)
    r_adjusted = adjusted_learning_rate(base.as_dtype(R, dtype), T, alpha_, beta_)
    post = base.as_dtype(norm_coefficient_post, dtype)
    x_out, v_out, h_out = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs, strict=True):
        x_c = x.astype(dtype)
        g_c, nc = g.astype(dtype), base.as_dtype(norm_coefficient, dtype)
        x_r = x_c if norm_coefficient else None
        g_r = tree.regularized_gradient(g_c, x_r, nc)
        v_new, h_new = adam_moments(g_r, v.astype(dtype), h.astype(dtype), alpha=alpha_, beta=beta_)
        step = adam_step(v_new, h_new, r_adjusted, epsilon=base.as_dtype(epsilon, dtype))
        x_out.append(((1 - post) * (x_c - step)).astype(x.dtype))
        v_out.append(v_new.astype(x.dtype))
        h_out.append(h_new.astype(x.dtype))
    return (*x_out, *v_out, *h_out)


def adam_op(
    R: Any,
    T: Any,
    *inputs: Any,
    alpha: float = 0.9,
    beta: float = 0.999,
    epsilon: float = 1e-6,
    norm_coefficient: float = 0.0,
    norm_coefficient_post: float = 0.0,
) -> tuple[jax.Array, ...]:
    r"""The ONNX Adam op: ``(R, T, X_1..X_n, G_1..G_n, V_1..V_n, H_1..H_n)``.

    For each tensor, with :math:`T` the update count:

    .. math::

      G_r &= \mathrm{norm\_coefficient} \cdot X + G \\
      V_{new} &= \alpha V + (1 - \alpha) G_r \\
      H_{new} &= \beta H + (1 - \beta) G_r^2 \\
      R_T &= T > 0\ ?\ R \sqrt{1 - \beta^T} / (1 - \alpha^T) : R \\
      X_{new} &= (1 - \mathrm{norm\_coefficient\_post})
                 (X - R_T V_{new} / (\sqrt{H_{new}} + \epsilon))

    Jitted, compiled once per input signature and attribute set. The attribute
    defaults are those of the ONNX schema (``epsilon`` is 1e-6, not the 0.0 that
    some renderings of the documentation show).

    Args:
      R: learning rate, a floating scalar.
      T: update count, an integer scalar (bias correction applies when T > 0).
      *inputs: ``X_1..X_n, G_1..G_n, V_1..V_n, H_1..H_n``: float tensors of one
        dtype, each X_i, G_i, V_i, H_i of the same shape.
      alpha, beta, epsilon, norm_coefficient, norm_coefficient_post: the ONNX
        attributes (constants).

    Returns:
      ``(X_1_new..X_n_new, V_1_new..V_n_new, H_1_new..H_n_new)`` in the input dtype.

    Example:
      >>> import numpy as np, onnx_optax
      >>> x, g = np.array([1.2, 2.8], np.float32), np.array([-0.94, -2.5], np.float32)
      >>> v, h = np.array([1.7, 3.6], np.float32), np.array([0.1, 0.1], np.float32)
      >>> x_new, v_new, h_new = onnx_optax.ops.adam(
      ...     np.float32(0.1), 0, x, g, v, h, alpha=0.95, beta=0.1, epsilon=1e-7,
      ...     norm_coefficient=0.001)
      >>> print(np.round(np.asarray(x_new), 4), np.round(np.asarray(v_new), 4))
      [1.025 2.661] [1.5681 3.2951]

    References:
      ONNX operator ``ai.onnx.preview.training.Adam``, version 1.
    """
    where = "onnx_optax.ops.adam"
    attributes = base.check_attributes(
        where,
        alpha=alpha,
        beta=beta,
        epsilon=epsilon,
        norm_coefficient=norm_coefficient,
        norm_coefficient_post=norm_coefficient_post,
    )
    _check(where, attributes)
    r = base.check_learning_rate_input(where, R)
    t = base.check_count_input(where, T)
    xs, gs, vs, hs = base.split_variadic(where, inputs, ("X", "G", "V", "H"))
    return _adam_op(r, t, xs, gs, vs, hs, **attributes)
