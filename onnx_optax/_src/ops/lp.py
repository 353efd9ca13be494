"""The Lp ops of ai.onnx: LpNormalization and LpPool.

LpPool reads its windows as the other pools do (``windows.pool_geometry``: kernel,
strides, dilations, pads, ``auto_pad``, ``ceil_mode``, checked naming the node)
and sums ``|x| ** p`` over each in one ``reduce_window``; pads count as zeros.
Both are differentiable, also where a norm is zero (the result there is 0).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src.ops.arrays import norm_axis
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.windows import pool_geometry


def _p(node: Node, allowed: tuple[int, ...] | None = None) -> float:
    p = float(node["p"])
    if (allowed is not None and p not in allowed) or p <= 0:
        wanted = " or ".join(map(str, allowed)) if allowed else "positive"
        raise ValueError(f"{node.where}: p {node['p']} must be {wanted}")
    return p


def _root(total: Any, p: float) -> Any:
    """``total ** (1 / p)``, 0 where ``total`` is 0 (with a zero gradient there, not inf)."""
    zero = total == 0
    safe = jnp.where(zero, jnp.ones_like(total), total)
    root = safe if p == 1 else safe ** np.asarray(1 / p, total.dtype)
    return jnp.where(zero, jnp.zeros_like(total), root)


def _powered(x: Any, p: float) -> Any:
    """``|x| ** p``: exact for p 1 and 2, differentiable at 0."""
    if p == 1:
        return jnp.abs(x)
    if p == 2:
        return jnp.square(x)
    return jnp.abs(x) ** np.asarray(p, x.dtype)


@register("LpNormalization")
def _lp_normalization(node: Node, x: Any) -> Any:
    """``x / ||x||_p`` along ``axis`` (p is 1 or 2); 0 where the norm is 0."""
    p = _p(node, (1, 2))
    axis = norm_axis(int(node["axis"]), np.ndim(x), node.where)
    x = jnp.asarray(x)
    norm = _root(jnp.sum(_powered(x, p), axis=axis, keepdims=True), p)
    zero = norm == 0
    return jnp.where(zero, jnp.zeros_like(x), x / jnp.where(zero, jnp.ones_like(norm), norm))


@register("LpPool")
def _lp_pool(node: Node, x: Any) -> Any:
    """``(sum of |x| ** p over each window) ** (1 / p)``, pads counting as zeros."""
    p = _p(node)
    kernel, strides, dilations, padding, extra, sizes = pool_geometry(node, x)
    if 0 in (x.shape[0], *sizes):
        return jnp.zeros((x.shape[0], x.shape[1], *sizes), x.dtype)
    pads = [(lo, hi + more) for (lo, hi), (_, more) in zip(padding, extra, strict=True)]
    total = lax.reduce_window(
        _powered(jnp.asarray(x), p),
        np.asarray(0, x.dtype),
        lax.add,
        window_dimensions=(1, 1, *kernel),
        window_strides=(1, 1, *strides),
        padding=[(0, 0), (0, 0), *pads],
        window_dilation=(1, 1, *dilations),
    )
    return _root(total, p)
