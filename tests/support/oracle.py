"""Float64 numpy restatement of the ONNX training operators, from their documents.

This is the test oracle. It is written from the pseudo code of the ONNX
``ai.onnx.preview.training`` Adagrad, Adam and Momentum documents (opset 1) and
imports neither ``onnx`` nor ``onnx_optax``. Every input is converted to
float64 and T is a Python int, so the only rounding is float64's.

Each function handles one tensor; the multi-tensor case of the operators
applies the same formula to each tensor independently.

``dtype`` (float64 by default) selects the precision of the arithmetic: the
extreme-value tests evaluate the formula in the tensors' own precision, where
float32 overflows (1e30 ** 2 is inf) as any float32 implementation must.
``flush_subnormals=True`` also reads subnormal numbers as zero and writes
subnormal results as zero, after every operation, which is how XLA evaluates
floating point on CPU and GPU (flush-to-zero, denormals-are-zero).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

F64 = np.float64


def flush(array: np.ndarray) -> np.ndarray:
    """Subnormal numbers replaced by zeros of the same sign."""
    array = np.asarray(array)
    if not np.issubdtype(array.dtype, np.floating):
        return array
    tiny = np.finfo(array.dtype).tiny
    return np.where(np.abs(array) < tiny, np.copysign(np.zeros_like(array), array), array)


class FlushToZero(np.ndarray):
    """An array whose arithmetic reads and writes subnormal numbers as zeros."""

    def __array_ufunc__(
        self, ufunc: np.ufunc, method: str, *inputs: object, **kwargs: object
    ) -> object:
        plain = [
            flush(np.asarray(i)) if isinstance(i, np.ndarray | np.generic) else i for i in inputs
        ]
        result = getattr(ufunc, method)(*plain, **kwargs)
        return flush(result).view(FlushToZero)


def _as(dtype: type, *arrays: object, flush_subnormals: bool = False) -> list[np.ndarray]:
    converted = [np.asarray(a, dtype=dtype) for a in arrays]
    if flush_subnormals:
        return [flush(a).view(FlushToZero) for a in converted]
    return converted


def one_minus_power(base: float, t: int) -> F64:
    """``1 - base**t`` rounded once: exact rational arithmetic, or expm1/log1p for large t."""
    if t <= 2048:
        return F64(float(1 - Fraction(float(base)) ** t))
    with np.errstate(divide="ignore"):
        # ``+ 0.0``: base 1 gives -expm1(0) = -0.0, and 1 - 1**t is +0.0 (the sign
        # decides the sign of an infinite step).
        return F64(-np.expm1(t * np.log1p(F64(base) - 1.0)) + 0.0)


def adagrad(
    r: float,
    t: int,
    x: np.ndarray,
    g: np.ndarray,
    h: np.ndarray,
    *,
    decay_factor: float,
    epsilon: float,
    norm_coefficient: float,
    dtype: type = F64,
    flush_subnormals: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """ONNX Adagrad: returns ``(X_new, H_new)``."""
    x, g, h = _as(dtype, x, g, h, flush_subnormals=flush_subnormals)
    r_decayed = dtype(r) / (dtype(1.0) + dtype(int(t)) * dtype(decay_factor))
    g_regularized = dtype(norm_coefficient) * x + g
    h_new = h + g_regularized * g_regularized
    h_adaptive = np.sqrt(h_new) + dtype(epsilon)
    x_new = x - r_decayed * g_regularized / h_adaptive
    return np.asarray(x_new), np.asarray(h_new)


def adam(
    r: float,
    t: int,
    x: np.ndarray,
    g: np.ndarray,
    v: np.ndarray,
    h: np.ndarray,
    *,
    alpha: float,
    beta: float,
    epsilon: float,
    norm_coefficient: float,
    norm_coefficient_post: float,
    dtype: type = F64,
    flush_subnormals: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX Adam: returns ``(X_final, V_new, H_new)``."""
    x, g, v, h = _as(dtype, x, g, v, h, flush_subnormals=flush_subnormals)
    one = dtype(1.0)
    alpha, beta = dtype(alpha), dtype(beta)
    g_regularized = dtype(norm_coefficient) * x + g
    v_new = alpha * v + (one - alpha) * g_regularized
    h_new = beta * h + (one - beta) * g_regularized * g_regularized
    h_sqrt = np.sqrt(h_new) + dtype(epsilon)
    t = int(t)
    if t > 0:
        # The bias factor is a scalar: computed to full float64 precision whatever
        # dtype is (1 - beta**t loses digits to cancellation when beta**t ~ 1).
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = np.sqrt(one_minus_power(beta, t)) / one_minus_power(alpha, t)
            r_adjusted = dtype(F64(r) * factor)
    else:
        r_adjusted = dtype(r)
    x_new = x - r_adjusted * v_new / h_sqrt
    x_final = (one - dtype(norm_coefficient_post)) * x_new
    return np.asarray(x_final), np.asarray(v_new), np.asarray(h_new)


def momentum(
    r: float,
    t: int,
    x: np.ndarray,
    g: np.ndarray,
    v: np.ndarray,
    *,
    alpha: float,
    beta: float,
    norm_coefficient: float,
    mode: str,
    dtype: type = F64,
    flush_subnormals: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """ONNX Momentum, ``mode`` "standard" or "nesterov": returns ``(X_new, V_new)``."""
    if mode not in ("standard", "nesterov"):
        raise ValueError(mode)
    x, g, v = _as(dtype, x, g, v, flush_subnormals=flush_subnormals)
    alpha = dtype(alpha)
    g_regularized = dtype(norm_coefficient) * x + g
    beta_adjusted = dtype(beta) if int(t) > 0 else dtype(1.0)
    v_new = alpha * v + beta_adjusted * g_regularized
    if mode == "standard":
        x_new = x - dtype(r) * v_new
    else:
        x_new = x - dtype(r) * (g_regularized + alpha * v_new)
    return np.asarray(x_new), np.asarray(v_new)
