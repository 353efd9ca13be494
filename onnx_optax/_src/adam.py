"""ONNX ``ai.onnx.preview.training.Adam`` (opset 1): state, kernel, transformation, op."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import DTypeLike

from onnx_optax._src import arguments, driver
from onnx_optax._src.driver import Transformation, cast


class AdamState(NamedTuple):
    """State of :func:`onnx_optax.adam`: the ONNX T, V and H."""

    count: jax.Array  # type: ignore[assignment]  # shape=(), int32: T of the next update
    v: driver.Params  # like params: exponentially averaged gradient (ONNX V)
    h: driver.Params  # like params: exponentially averaged squared gradient (ONNX H)


class AdamAttributes(NamedTuple):
    """The ONNX attributes of Adam, in schema order, with the schema's defaults."""

    alpha: Any = 0.9  # in [0, 1]
    beta: Any = 0.999  # in [0, 1]
    epsilon: Any = 1e-6  # >= 0 (some renderings of the documentation print 0.0)
    norm_coefficient: Any = 0.0
    norm_coefficient_post: Any = 0.0


# ------------------------------------------------------------------ the formula


def one_minus_power(base: jax.Array, T: jax.Array) -> jax.Array:
    """``1 - base**T`` for an integer ``T >= 0``, to full relative precision.

    Computed as ``-expm1(T * log1p(base - 1))``: the naive float32
    ``1 - 0.9999**2`` keeps only ~4 correct digits, this keeps ~7 (the error is
    a few ulp for every ``base`` in [0, 1] and every T). A zero result is +0,
    as ``1 - 1**T`` is.
    """
    one_minus = -jnp.expm1(T.astype(base.dtype) * jnp.log1p(base - 1))
    return jnp.where(one_minus == 0, jnp.zeros_like(one_minus), one_minus)


class _Scalars(NamedTuple):
    alpha: jax.Array
    beta: jax.Array
    epsilon: jax.Array
    norm_coefficient: jax.Array | None  # None: known zero, X not read
    norm_coefficient_post: jax.Array | None  # None: known zero
    r_adjusted: jax.Array  # R_adjusted = T > 0 ? R sqrt(1 - beta**T) / (1 - alpha**T) : R
    zero: jax.Array  # driver.run_time_zero: for driver.rounded


def _scalars(a: AdamAttributes, R: jax.Array, T: jax.Array, dtype: DTypeLike) -> _Scalars:
    alpha, beta = cast(a.alpha, dtype), cast(a.beta, dtype)
    # At T = 0 the bias correction is 0 / 0; it is computed from ones there, so that
    # the branch jnp.where leaves out has a finite derivative (0 * NaN would be NaN).
    first = T <= 0
    one = jnp.ones_like(alpha)
    corrected = (
        R
        * jnp.sqrt(jnp.where(first, one, one_minus_power(beta, T)))
        / jnp.where(first, one, one_minus_power(alpha, T))
    )
    return _Scalars(
        alpha=alpha,
        beta=beta,
        epsilon=cast(a.epsilon, dtype),
        norm_coefficient=cast(a.norm_coefficient, dtype),
        norm_coefficient_post=cast(a.norm_coefficient_post, dtype),
        r_adjusted=jnp.where(T > 0, corrected, R),
        zero=driver.run_time_zero(T, dtype),
    )


def _new_state(
    s: _Scalars, g_r: jax.Array, v: jax.Array, h: jax.Array
) -> tuple[jax.Array, jax.Array]:
    # One FMA each, of the decayed state and the rounded gradient term, on every
    # path (driver.rounded).
    v_new = s.alpha * v + driver.rounded((1 - s.alpha) * g_r, s.zero)
    h_new = s.beta * h + driver.rounded((1 - s.beta) * g_r * g_r, s.zero)
    return v_new, h_new


def _step(
    s: _Scalars, x: jax.Array | None, g_r: jax.Array, v_new: jax.Array, h_new: jax.Array
) -> tuple[jax.Array, jax.Array | None]:
    step = driver.rounded(s.r_adjusted * v_new / (jnp.sqrt(h_new) + s.epsilon), s.zero)
    if s.norm_coefficient_post is None:
        return step, None
    assert x is not None
    return step, (1 - s.norm_coefficient_post) * (x - step)


# ----------------------------------------------------------- the transformation


@arguments.explain_arguments("onnx_optax.adam")
def adam(
    learning_rate: optax.ScalarOrSchedule,
    *,
    alpha: float = 0.9,
    beta: float = 0.999,
    epsilon: float = 1e-6,
    norm_coefficient: float = 0.0,
    norm_coefficient_post: float = 0.0,
    initial_count: int | None = None,
    accumulator_dtype: DTypeLike | None = None,
    pack_leaves_below: int | None = None,
) -> Transformation:
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
      An ``optax.GradientTransformationExtraArgs`` (a :class:`Transformation`)
      whose state is an :class:`AdamState`.

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
    attributes = AdamAttributes(alpha, beta, epsilon, norm_coefficient, norm_coefficient_post)
    options = driver.Options(initial_count, accumulator_dtype, pack_leaves_below)
    where = "onnx_optax.adam"
    return driver.transformation(OPERATOR, where, attributes, learning_rate, options)


# ----------------------------------------------------------------------- the op


@arguments.explain_arguments("onnx_optax.ops.adam")
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
      alpha: the ONNX attribute (a constant of the compiled op).
      beta: the ONNX attribute (a constant of the compiled op).
      epsilon: the ONNX attribute (a constant of the compiled op).
      norm_coefficient: the ONNX attribute (a constant of the compiled op).
      norm_coefficient_post: the ONNX attribute (a constant of the compiled op).

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
    attributes = AdamAttributes(alpha, beta, epsilon, norm_coefficient, norm_coefficient_post)
    return driver.op(OPERATOR, "onnx_optax.ops.adam", R, T, inputs, attributes)


OPERATOR = driver.Operator(
    initial_count=1,
    op_type="Adam",
    attributes=AdamAttributes,
    ranges={"alpha": (0.0, 1.0), "beta": (0.0, 1.0), "epsilon": (0.0, None)},
    choices={},
    optional_x_terms=("norm_coefficient", "norm_coefficient_post"),
    state=AdamState,
    state_inputs=(("V", "v"), ("H", "h")),
    scalars=_scalars,
    new_state=_new_state,
    step=_step,
    factory=adam,
    op=adam_op,
)
