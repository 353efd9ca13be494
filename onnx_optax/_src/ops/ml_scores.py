"""What the ai.onnx.ml ops share (``ml``, ``trees``): their domain, the features they read
as rows and the post-transforms of the scores they compute, as onnxruntime does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src.ops.registry import Node

ML_DOMAIN = "ai.onnx.ml"

FEATURES = ("float32", "float64", "int32", "int64")  # the schemas' T for features
_TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")
_F32 = np.float32


def check_dtype(node: Node, x: Any, name: str, allowed: Sequence[str]) -> None:
    if np.dtype(x.dtype).name not in allowed:
        raise TypeError(
            f"{node.where}: input {name} has dtype {np.dtype(x.dtype)}; it must be one of "
            f"{', '.join(allowed)}"
        )


def feature_rows(node: Node, x: Any) -> Any:
    """The features as a float32 ``[N, C]`` matrix; a vector ``[C]`` is one row."""
    check_dtype(node, x, "X", FEATURES)
    if np.ndim(x) not in (1, 2):
        raise ValueError(
            f"{node.where}: input X has shape {list(np.shape(x))}; it must be [N, C] or [C]"
        )
    x = jnp.asarray(x)
    return (x.reshape(1, -1) if x.ndim == 1 else x).astype(_F32)


def post_transform_of(node: Node) -> str:
    """The node's post_transform, refused unless it is one of the five the ops know."""
    value = node["post_transform"]
    if value not in _TRANSFORMS:
        raise ValueError(
            f"{node.where}: post_transform {value!r} is not one of {', '.join(_TRANSFORMS)}"
        )
    return str(value)


def _probit(p: Any) -> Any:
    """``sqrt(2) * erfinv(2p - 1)``, erfinv by Winitzki's approximation (a = 0.147).

    The approximation is the semantics: onnxruntime and onnx's reference both use it.
    """
    x = 2 * p - 1
    log = jnp.log((1 - x) * (1 + x))
    a = 2 / (math.pi * 0.147) + 0.5 * log
    root = jnp.sqrt(jnp.sqrt(a * a - log / 0.147) - a)
    return math.sqrt(2) * jnp.where(x < 0, -root, root)


def _softmax_zero(scores: Any) -> Any:
    """Softmax over each row that leaves (near-)zero scores out of the sum.

    A score within 1e-7 of zero becomes ``score * exp(-max)`` instead of
    ``exp(score - max)`` and adds nothing to the row's sum (a row of zeros
    gives NaN, as in onnxruntime).
    """
    peak = jnp.max(scores, axis=1, keepdims=True)
    kept = jnp.abs(scores) > 1e-7
    values = jnp.where(kept, jnp.exp(scores - peak), scores * jnp.exp(-peak))
    return values / jnp.sum(jnp.where(kept, values, 0), axis=1, keepdims=True)


def post_transform(scores: Any, transform: str) -> Any:
    """A post-transform of ``[N, K]`` scores; a single column (K = 1) takes only PROBIT."""
    if transform == "PROBIT":
        return _probit(scores)
    if scores.shape[1] == 1 or transform == "NONE":
        return scores
    if transform == "LOGISTIC":
        return jax.nn.sigmoid(scores)
    if transform == "SOFTMAX":
        return jax.nn.softmax(scores, axis=1)
    return _softmax_zero(scores)


def first_max(scores: Any) -> Any:
    """Each row's first largest column; a NaN never wins, and a NaN first column stays."""
    best = jnp.argmax(jnp.where(jnp.isnan(scores), -jnp.inf, scores), axis=1)
    return jnp.where(jnp.isnan(scores[:, 0]), 0, best)
