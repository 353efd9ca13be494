"""The transformer blocks of ai.onnx around attention: RMSNormalization, Swish, SwiGLU and
RotaryEmbedding (opset 23 on).

Each one ``@register``-ed function over jax.numpy, differentiable, its shapes checked
(naming the node) before anything is computed.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src.onnx_tensors import tensor_dtype
from onnx_optax._src.ops.arrays import (
    check_at_run,
    int_check,
    int_shape,
    norm_axis,
)
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import canonical

# ----------------------------------------------------------------------------- RMSNormalization


@register("RMSNormalization")
def _rms_norm(node: Node, x: Any, scale: Any) -> Any:
    """``x / sqrt(mean(x**2 over axis..) + epsilon) * scale``, computed in ``stash_type``."""
    axis = norm_axis(int(node["axis"]), np.ndim(x), node.where)
    target = tuple(int_shape(x))
    try:
        fits = np.broadcast_shapes(target, tuple(int_shape(scale))) == target
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"{node.where}: scale of shape {int_shape(scale)} does not broadcast to X of shape "
            f"{list(target)}"
        )
    stash = canonical(tensor_dtype(node["stash_type"], node.where))
    xs = jnp.asarray(x).astype(stash)
    mean_square = jnp.mean(jnp.square(xs), axis=tuple(range(axis, xs.ndim)), keepdims=True)
    normalized = xs * jax.lax.rsqrt(mean_square + np.asarray(node["epsilon"], stash))
    return normalized.astype(x.dtype).astype(scale.dtype) * scale


# ----------------------------------------------------------------------------- Swish, SwiGLU


@register("Swish")
def _swish(node: Node, x: Any) -> Any:
    """``x * sigmoid(alpha * x)`` (SiLU when alpha is 1); SwiGLU's expansion uses it."""
    return x * jax.nn.sigmoid(np.asarray(node["alpha"], x.dtype) * x)


@register("SwiGLU")
def _swiglu(node: Node, a: Any, b: Any) -> Any:
    """``a * sigmoid(alpha * a) * b`` of two tensors of one shape (no broadcasting)."""
    if int_shape(a) != int_shape(b):
        raise ValueError(
            f"{node.where}: A of shape {int_shape(a)} and B of shape {int_shape(b)} must have one "
            "shape (SwiGLU does not broadcast)"
        )
    alpha = np.asarray(node["alpha"], a.dtype)
    return a * jax.nn.sigmoid(alpha * a) * b


# ----------------------------------------------------------------------------- RotaryEmbedding


@register("RotaryEmbedding")
def _rotary_embedding(
    node: Node, x: Any, cos_cache: Any, sin_cache: Any, position_ids: Any = None
) -> Any:
    """Rotates the first ``rotary_embedding_dim`` features of each head by the cached angles.

    X is (batch, heads, seq, head_size), or (batch, seq, hidden) with ``num_heads``;
    the caches are (max_position, dim / 2) read at ``position_ids`` (batch, seq), or
    (batch, seq, dim / 2) without them. Pairs are the two halves, or with
    ``interleaved`` the even and odd features.
    """
    rank = np.ndim(x)
    if rank not in (3, 4):
        raise ValueError(f"{node.where}: X of shape {int_shape(x)} must be 3-D or 4-D")
    if int(node.get("num_heads", 0)) < 0:  # onnxruntime refuses it, 4-D X or not
        raise ValueError(f"{node.where}: num_heads {node['num_heads']} must not be negative")
    if int_shape(cos_cache) != int_shape(sin_cache):  # onnxruntime refuses two shapes
        raise ValueError(
            f"{node.where}: cos_cache of shape {int_shape(cos_cache)} and sin_cache of shape "
            f"{int_shape(sin_cache)} must have one shape"
        )
    x = jnp.asarray(x)
    if rank == 4:
        x = jnp.transpose(x, (0, 2, 1, 3))  # (batch, seq, heads, head_size)
    else:
        heads = int(node.get("num_heads", 0))
        if heads < 1 or x.shape[2] % heads:
            raise ValueError(
                f"{node.where}: a 3-D X of shape {int_shape(x)} needs num_heads (got {heads}) "
                "dividing its hidden size"
            )
        x = x.reshape(x.shape[0], x.shape[1], heads, x.shape[2] // heads)
    batch, seq, _, head_size = x.shape
    dim = int(node.get("rotary_embedding_dim", 0)) or head_size
    if dim % 2 or not 0 < dim <= head_size:
        raise ValueError(
            f"{node.where}: rotary_embedding_dim {dim} must be even and at most the head "
            f"size {head_size}"
        )
    caches = []
    for name, cache in (("cos_cache", cos_cache), ("sin_cache", sin_cache)):
        if position_ids is not None:
            if np.ndim(cache) != 2 or int_shape(position_ids) != [batch, seq]:
                raise ValueError(
                    f"{node.where}: with position_ids of shape {int_shape(position_ids)} "
                    f"({[batch, seq]} expected), {name} of shape {int_shape(cache)} must be "
                    f"(max_position, {dim // 2})"
                )
            int_check(node, position_ids, "position_ids")
            limit = cache.shape[0]
            check_at_run(
                f"{node.where}: position_ids hold {{}}, outside [0, {limit})",
                (position_ids < 0) | (position_ids >= limit),
                position_ids,
            )
            cache = jnp.take(jnp.asarray(cache), jnp.asarray(position_ids), axis=0)
        if int_shape(cache)[:2] != [batch, seq] or int_shape(cache)[2:] != [dim // 2]:
            raise ValueError(
                f"{node.where}: {name} of shape {int_shape(cache)} gives no angle of shape "
                f"{[batch, seq, dim // 2]} for X of shape {int_shape(x)}"
            )
        caches.append(jnp.asarray(cache)[:, :, None, :])
    cos, sin = caches
    rotated, kept = x[..., :dim], x[..., dim:]
    if node.get("interleaved", 0):
        x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
    else:
        x1, x2 = rotated[..., : dim // 2], rotated[..., dim // 2 :]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if node.get("interleaved", 0):
        rotated = jnp.stack([real, imag], axis=-1).reshape(rotated.shape)
    else:
        rotated = jnp.concatenate([real, imag], axis=-1)
    out = jnp.concatenate([rotated, kept], axis=-1)
    if rank == 4:
        return jnp.transpose(out, (0, 2, 1, 3))
    return out.reshape(batch, seq, -1)
