"""ONNX ``ai.onnx.preview.training.Momentum`` (opset 1): state, kernel, transformation, op."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import DTypeLike

from onnx_optax._src import arguments, driver
from onnx_optax._src.driver import Transformation, cast

Mode = Literal["standard", "nesterov"]


class MomentumState(NamedTuple):
    """State of :func:`onnx_optax.momentum`: the ONNX T and V."""

    count: jax.Array  # type: ignore[assignment]  # shape=(), int32: T of the next update
    v: driver.Params  # like params: the momentum (ONNX V)


class MomentumAttributes(NamedTuple):
    """The ONNX attributes of Momentum, in schema order; the schema requires all four."""

    alpha: Any
    beta: Any
    mode: Any  # "standard" or "nesterov"
    norm_coefficient: Any


# ------------------------------------------------------------------ the formula


class _Scalars(NamedTuple):
    alpha: jax.Array
    beta_adjusted: jax.Array  # T > 0 ? beta : 1
    norm_coefficient: jax.Array | None  # None: known zero, X not read
    R: jax.Array
    nesterov: bool
    zero: jax.Array  # driver.run_time_zero: for driver.rounded


def _scalars(a: MomentumAttributes, R: jax.Array, T: jax.Array, dtype: DTypeLike) -> _Scalars:
    beta = cast(a.beta, dtype)
    beta_adjusted = jnp.where(T > 0, beta, jnp.ones_like(beta))
    return _Scalars(
        cast(a.alpha, dtype),
        beta_adjusted,
        cast(a.norm_coefficient, dtype),
        R,
        a.mode == "nesterov",
        driver.run_time_zero(T, dtype),
    )


def _new_state(s: _Scalars, g_r: jax.Array, v: jax.Array) -> tuple[jax.Array]:
    # One FMA, alpha * V + round(beta_adjusted * G_r), on every path (driver.rounded).
    return (s.alpha * v + driver.rounded(s.beta_adjusted * g_r, s.zero),)


def _step(
    s: _Scalars, x: jax.Array | None, g_r: jax.Array, v_new: jax.Array
) -> tuple[jax.Array, None]:
    step = s.R * (g_r + s.alpha * v_new) if s.nesterov else s.R * v_new
    return driver.rounded(step, s.zero), None


# ----------------------------------------------------------- the transformation


@arguments.explain_arguments("onnx_optax.momentum")
def momentum(
    learning_rate: optax.ScalarOrSchedule,
    *,
    alpha: float,
    beta: float,
    norm_coefficient: float,
    mode: Mode = "standard",
    initial_count: int | None = None,
    accumulator_dtype: DTypeLike | None = None,
    pack_leaves_below: int | None = None,
) -> Transformation:
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
      pack_leaves_below: if > 0, the momentum of every parameter with fewer
        elements lives in a shared flat buffer (see :func:`onnx_optax.adam`).

    Returns:
      An ``optax.GradientTransformationExtraArgs`` (a :class:`Transformation`)
      whose state is a :class:`MomentumState`.

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
    attributes = MomentumAttributes(alpha, beta, mode, norm_coefficient)
    options = driver.Options(initial_count, accumulator_dtype, pack_leaves_below)
    where = "onnx_optax.nesterov" if mode == "nesterov" else "onnx_optax.momentum"
    return driver.transformation(OPERATOR, where, attributes, learning_rate, options)


@arguments.explain_arguments("onnx_optax.nesterov")
def nesterov(
    learning_rate: optax.ScalarOrSchedule,
    *,
    alpha: float,
    beta: float,
    norm_coefficient: float,
    initial_count: int | None = None,
    accumulator_dtype: DTypeLike | None = None,
    pack_leaves_below: int | None = None,
) -> Transformation:
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
      An ``optax.GradientTransformationExtraArgs`` (a :class:`Transformation`)
      whose state is a :class:`MomentumState`.

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


# ----------------------------------------------------------------------- the op


@arguments.explain_arguments("onnx_optax.ops.momentum")
def momentum_op(
    R: Any,
    T: Any,
    *inputs: Any,
    alpha: float,
    beta: float,
    mode: Mode,
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
      alpha: the ONNX float attribute (a constant of the compiled op).
      beta: the ONNX float attribute (a constant of the compiled op).
      norm_coefficient: the ONNX float attribute (a constant of the compiled op).
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
    attributes = MomentumAttributes(alpha, beta, mode, norm_coefficient)
    return driver.op(OPERATOR, "onnx_optax.ops.momentum", R, T, inputs, attributes)


OPERATOR = driver.Operator(
    initial_count=0,
    op_type="Momentum",
    attributes=MomentumAttributes,
    ranges={},
    choices={"mode": ("standard", "nesterov")},
    optional_x_terms=("norm_coefficient",),
    state=MomentumState,
    state_inputs=(("V", "v"),),
    scalars=_scalars,
    new_state=_new_state,
    step=_step,
    factory=momentum,
    op=momentum_op,
)
