"""Float64 numpy restatement of the ONNX training operators, from their documents.

This is the test oracle. It is written from the pseudo code of the ONNX
``ai.onnx.preview.training`` Adagrad, Adam and Momentum documents (opset 1) and
imports neither ``onnx`` nor ``onnx_optax``. Every input is converted to
float64 and T is a Python int, so the only rounding is float64's.

Each function handles one tensor; the multi-tensor case of the operators
applies the same formula to each tensor independently.
"""

from __future__ import annotations

import numpy as np

F64 = np.float64


def _f64(*arrays: object) -> list[np.ndarray]:
    return [np.asarray(a, dtype=F64) for a in arrays]


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
) -> tuple[np.ndarray, np.ndarray]:
    """ONNX Adagrad: returns ``(X_new, H_new)``."""
    x, g, h = _f64(x, g, h)
    r_decayed = F64(r) / (1.0 + int(t) * F64(decay_factor))
    g_regularized = F64(norm_coefficient) * x + g
    h_new = h + g_regularized * g_regularized
    h_adaptive = np.sqrt(h_new) + F64(epsilon)
    x_new = x - r_decayed * g_regularized / h_adaptive
    return x_new, h_new


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
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX Adam: returns ``(X_final, V_new, H_new)``."""
    x, g, v, h = _f64(x, g, v, h)
    alpha, beta = F64(alpha), F64(beta)
    g_regularized = F64(norm_coefficient) * x + g
    v_new = alpha * v + (1.0 - alpha) * g_regularized
    h_new = beta * h + (1.0 - beta) * g_regularized * g_regularized
    h_sqrt = np.sqrt(h_new) + F64(epsilon)
    t = int(t)
    if t > 0:
        with np.errstate(divide="ignore", invalid="ignore"):
            r_adjusted = F64(r) * np.sqrt(1.0 - beta**t) / (1.0 - alpha**t)
    else:
        r_adjusted = F64(r)
    x_new = x - r_adjusted * v_new / h_sqrt
    x_final = (1.0 - F64(norm_coefficient_post)) * x_new
    return x_final, v_new, h_new


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
) -> tuple[np.ndarray, np.ndarray]:
    """ONNX Momentum, ``mode`` "standard" or "nesterov": returns ``(X_new, V_new)``."""
    if mode not in ("standard", "nesterov"):
        raise ValueError(mode)
    x, g, v = _f64(x, g, v)
    alpha = F64(alpha)
    g_regularized = F64(norm_coefficient) * x + g
    beta_adjusted = F64(beta) if int(t) > 0 else F64(1.0)
    v_new = alpha * v + beta_adjusted * g_regularized
    if mode == "standard":
        x_new = x - F64(r) * v_new
    else:
        x_new = x - F64(r) * (g_regularized + alpha * v_new)
    return x_new, v_new
