"""ONNX ``ai.onnx.preview.training.Adagrad`` (opset 1): state, kernel, transformation, op."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import DTypeLike

from onnx_optax._src import arguments, checks, driver
from onnx_optax._src.driver import Transformation, cast


class AdagradState(NamedTuple):
    """State of :func:`onnx_optax.adagrad`: the ONNX T and H."""

    count: jax.Array  # type: ignore[assignment]  # shape=(), int32: T of the next update
    h: driver.Params  # like params: accumulated squared gradient (ONNX H)


class AdagradAttributes(NamedTuple):
    """The ONNX attributes of Adagrad, in schema order, with the schema's defaults."""

    decay_factor: Any = 0.0  # >= 0
    epsilon: Any = 1e-6  # >= 0
    norm_coefficient: Any = 0.0


# ------------------------------------------------------------------ the formula


class _Scalars(NamedTuple):
    epsilon: jax.Array
    norm_coefficient: jax.Array | None  # None: known zero, X not read
    r: jax.Array  # r = R / (1 + T * decay_factor)
    zero: jax.Array  # driver.run_time_zero: for driver.rounded


def _scalars(a: AdagradAttributes, R: jax.Array, T: jax.Array, dtype: DTypeLike) -> _Scalars:
    r = R / (1 + T.astype(dtype) * cast(a.decay_factor, dtype))
    zero = driver.run_time_zero(T, dtype)
    return _Scalars(cast(a.epsilon, dtype), cast(a.norm_coefficient, dtype), r, zero)


def _new_state(s: _Scalars, g_r: jax.Array, h: jax.Array) -> tuple[jax.Array]:
    return (h + g_r * g_r,)


def _step(
    s: _Scalars, x: jax.Array | None, g_r: jax.Array, h_new: jax.Array
) -> tuple[jax.Array, None]:
    return driver.rounded(s.r * g_r / (jnp.sqrt(h_new) + s.epsilon), s.zero), None


# ----------------------------------------------------------- the transformation


@arguments.explain_arguments("onnx_optax.adagrad")
def adagrad(
    learning_rate: optax.ScalarOrSchedule,
    *,
    decay_factor: float = 0.0,
    epsilon: float = 1e-6,
    norm_coefficient: float = 0.0,
    initial_accumulator_value: float = 0.0,
    initial_count: int | None = None,
    accumulator_dtype: DTypeLike | None = None,
    pack_leaves_below: int | None = None,
) -> Transformation:
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
      initial_accumulator_value: the value H starts at; finite and >= 0 (a negative
        H would make :math:`\sqrt{H'}` NaN).
      initial_count: the T used by the first update (default 0: ONNX calls the
        first Adagrad update "generally 0 or 1"; 0 makes ``decay_factor`` start
        at the undecayed R, as in PyTorch).
      accumulator_dtype: dtype of H (default: the parameters' dtype).
      pack_leaves_below: if > 0, the accumulator of every parameter with fewer
        elements lives in a shared flat buffer (see :func:`onnx_optax.adam`).

    Returns:
      An ``optax.GradientTransformationExtraArgs`` (a :class:`Transformation`)
      whose state is an :class:`AdagradState`.

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
    checks.check_hyperparameter(
        "onnx_optax.adagrad", "initial_accumulator_value", initial_accumulator_value, minimum=0.0
    )
    attributes = AdagradAttributes(decay_factor, epsilon, norm_coefficient)
    options = driver.Options(
        initial_count, accumulator_dtype, pack_leaves_below, initial_accumulator_value
    )
    where = "onnx_optax.adagrad"
    return driver.transformation(OPERATOR, where, attributes, learning_rate, options)


# ----------------------------------------------------------------------- the op


@arguments.explain_arguments("onnx_optax.ops.adagrad")
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
      decay_factor: the ONNX attribute (a constant of the compiled op).
      epsilon: the ONNX attribute (a constant of the compiled op).
      norm_coefficient: the ONNX attribute (a constant of the compiled op).

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
    attributes = AdagradAttributes(decay_factor, epsilon, norm_coefficient)
    return driver.op(OPERATOR, "onnx_optax.ops.adagrad", R, T, inputs, attributes)


OPERATOR = driver.Operator(
    initial_count=0,
    op_type="Adagrad",
    attributes=AdagradAttributes,
    ranges={"decay_factor": (0.0, None), "epsilon": (0.0, None)},
    choices={},
    optional_x_terms=("norm_coefficient",),
    state=AdagradState,
    state_inputs=(("H", "h"),),
    scalars=_scalars,
    new_state=_new_state,
    step=_step,
    factory=adagrad,
    op=adagrad_op,
)
