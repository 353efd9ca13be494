"""The transformer ops of ai.onnx: RMSNormalization, Swish, SwiGLU, RotaryEmbedding, Attention.

The blocks a decoder export is made of (opset 23 on): each one ``@register``-ed
function over jax.numpy, differentiable, its shapes checked (naming the node)
before anything is computed. Attention follows the spec's pattern: Q and K each
scaled by ``sqrt(scale)``, a softcap, one additive bias built from the mask, the
causal frontier, the window and ``nonpad_kv_seqlen``, a softmax whose fully
masked rows give zeros (never NaN), and the key/value cache concatenated in.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src.onnx_tensors import tensor_dtype
from onnx_optax._src.ops.arrays import (
    _axis,
    _canonical,
    _int_check,
    check_at_run,
    check_size,
)
from onnx_optax._src.ops.registry import Node, register


def _shape(value: Any) -> list[int]:
    return [int(d) for d in np.shape(value)]


# ----------------------------------------------------------------------------- RMSNormalization


@register("RMSNormalization")
def _rms_norm(node: Node, x: Any, scale: Any) -> Any:
    """``x / sqrt(mean(x**2 over axis..) + epsilon) * scale``, computed in ``stash_type``."""
    axis = _axis(int(node["axis"]), np.ndim(x), node.where)
    target = tuple(_shape(x))
    try:
        fits = np.broadcast_shapes(target, tuple(_shape(scale))) == target
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"{node.where}: scale of shape {_shape(scale)} does not broadcast to X of shape "
            f"{list(target)}"
        )
    stash = _canonical(tensor_dtype(node["stash_type"], node.where))
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
    if _shape(a) != _shape(b):
        raise ValueError(
            f"{node.where}: A of shape {_shape(a)} and B of shape {_shape(b)} must have one "
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
        raise ValueError(f"{node.where}: X of shape {_shape(x)} must be 3-D or 4-D")
    x = jnp.asarray(x)
    if rank == 4:
        x = jnp.transpose(x, (0, 2, 1, 3))  # (batch, seq, heads, head_size)
    else:
        heads = int(node.get("num_heads", 0))
        if heads < 1 or x.shape[2] % heads:
            raise ValueError(
                f"{node.where}: a 3-D X of shape {_shape(x)} needs num_heads (got {heads}) "
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
            if np.ndim(cache) != 2 or _shape(position_ids) != [batch, seq]:
                raise ValueError(
                    f"{node.where}: with position_ids of shape {_shape(position_ids)} "
                    f"({[batch, seq]} expected), {name} of shape {_shape(cache)} must be "
                    f"(max_position, {dim // 2})"
                )
            _int_check(node, position_ids, "position_ids")
            limit = cache.shape[0]
            check_at_run(
                f"{node.where}: position_ids hold {{}}, outside [0, {limit})",
                (position_ids < 0) | (position_ids >= limit),
                position_ids,
            )
            cache = jnp.take(jnp.asarray(cache), jnp.asarray(position_ids), axis=0)
        if _shape(cache)[:2] != [batch, seq] or _shape(cache)[2:] != [dim // 2]:
            raise ValueError(
                f"{node.where}: {name} of shape {_shape(cache)} gives no angle of shape "
                f"{[batch, seq, dim // 2]} for X of shape {_shape(x)}"
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


# ----------------------------------------------------------------------------- Attention


def _heads(node: Node, name: str, value: Any, heads: int) -> Any:
    """A 3-D (batch, seq, heads * size) input as (batch, heads, seq, size)."""
    b, s, hidden = value.shape
    if hidden % heads:
        raise ValueError(
            f"{node.where}: {name} of shape {_shape(value)}: its hidden size {hidden} is not a "
            f"multiple of {heads} heads"
        )
    return jnp.transpose(jnp.reshape(value, (b, s, heads, hidden // heads)), (0, 2, 1, 3))


def _attention_inputs(node: Node, q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
    """Q, K and V as 4-D (batch, heads, seq, size), their shapes checked against each other."""
    ranks = {np.ndim(q), np.ndim(k), np.ndim(v)}
    if len(ranks) != 1 or ranks - {3, 4}:
        raise ValueError(
            f"{node.where}: Q, K and V of shapes {_shape(q)}, {_shape(k)} and {_shape(v)} "
            "must all be 3-D or all 4-D"
        )
    q_heads, kv_heads = node.get("q_num_heads"), node.get("kv_num_heads")
    if ranks == {3}:
        if not q_heads or not kv_heads or q_heads < 1 or kv_heads < 1:
            raise ValueError(
                f"{node.where}: 3-D Q, K and V need positive q_num_heads and kv_num_heads "
                f"(got {q_heads} and {kv_heads})"
            )
        q = _heads(node, "Q", q, int(q_heads))
        k = _heads(node, "K", k, int(kv_heads))
        v = _heads(node, "V", v, int(kv_heads))
    elif node.opset >= 25 and (q_heads or kv_heads):
        raise ValueError(
            f"{node.where}: q_num_heads and kv_num_heads are for 3-D inputs; Q, K and V are 4-D"
        )
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    if (
        len({q.shape[0], k.shape[0], v.shape[0]}) != 1
        or k.shape[1:3] != v.shape[1:3]
        or q.shape[3] != k.shape[3]
        or not k.shape[1]
        or q.shape[1] % k.shape[1]
    ):
        raise ValueError(
            f"{node.where}: Q (batch, heads, seq, size) {list(q.shape)}, K {list(k.shape)} and "
            f"V {list(v.shape)} do not fit: one batch, K and V of the same heads and length, Q "
            "and K of one head size, Q's heads a multiple of K's"
        )
    return q, k, v


def _cache(node: Node, name: str, past: Any, current: Any) -> Any:
    want = [*current.shape[:2], None, current.shape[3]]
    got = _shape(past)
    if len(got) != 4 or [d if i != 2 else None for i, d in enumerate(got)] != want:
        raise ValueError(
            f"{node.where}: {name} of shape {got} must be (batch, kv_heads, past, size) "
            f"matching {list(current.shape)}"
        )
    return jnp.concatenate([jnp.asarray(past).astype(current.dtype), current], axis=2)


def _mask_bias(node: Node, mask: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """The attention mask as an additive bias: booleans give 0 or -inf, floats are added;
    a last axis shorter than the keys is padded with -inf (False)."""
    kv_len = shape[3]
    given = _shape(mask)
    try:
        fits = bool(given) and given[-1] <= kv_len
        fits = fits and np.broadcast_shapes(shape, (*given[:-1], kv_len)) == shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"{node.where}: attn_mask of shape {given} does not broadcast to (batch, heads, "
            f"q_len, kv_len) {list(shape)} (its last axis may be shorter than the keys)"
        )
    mask = jnp.asarray(mask)
    if mask.dtype == bool:
        bias = jnp.where(mask, np.asarray(0, dtype), np.asarray(-np.inf, dtype))
    else:
        bias = mask.astype(dtype)
    if given[-1] < kv_len:
        pad = [(0, 0)] * (len(given) - 1) + [(0, kv_len - given[-1])]
        bias = jnp.pad(bias, pad, constant_values=np.asarray(-np.inf, dtype))
    return bias


def _attention_bias(
    node: Node, mask: Any, nonpad: Any, past_len: int | None, shape: tuple[int, ...], dtype: Any
) -> Any:
    """One additive bias (0 or -inf, plus a float mask) of the mask, causality, the window
    and the padding, broadcasting to (batch, heads, q_len, kv_len)."""
    batch, _, q_len, kv_len = shape
    bias = jnp.zeros((q_len, kv_len), dtype)
    if mask is not None:
        bias = bias + _mask_bias(node, mask, shape, dtype)
    rows = jnp.arange(q_len)[:, None]
    cols = jnp.arange(kv_len)[None, :]
    if nonpad is not None and past_len is None:
        offset = (jnp.asarray(nonpad).reshape(-1) - q_len).reshape(-1, 1, 1, 1)
    else:
        offset = jnp.asarray(past_len or 0)
    allowed = jnp.ones((), bool)
    if node.get("is_causal", 0):
        allowed = allowed & (cols <= rows + offset)
    left, right = int(node.get("left_window_size", -1)), int(node.get("right_window_size", -1))
    if left < -1 or right < -1:
        raise ValueError(
            f"{node.where}: left_window_size {left} and right_window_size {right} must be -1 "
            "or non-negative"
        )
    if left >= 0:
        allowed = allowed & (rows + offset - cols <= left)
    if right >= 0:
        allowed = allowed & (cols - rows - offset <= right)
    if nonpad is not None:
        allowed = allowed & (cols < jnp.asarray(nonpad).reshape(batch, 1, 1, 1))
    return bias + jnp.where(allowed, np.asarray(0, dtype), np.asarray(-np.inf, dtype))


@register("Attention")
def _attention(
    node: Node,
    q: Any,
    k: Any,
    v: Any,
    mask: Any = None,
    past_key: Any = None,
    past_value: Any = None,
    nonpad: Any = None,
) -> Any:
    """Scaled dot-product attention (MHA, GQA, MQA), with its cache, masks and softcap."""
    three_d = np.ndim(q) == 3
    q, k, v = _attention_inputs(node, q, k, v)
    if (past_key is None) != (past_value is None):
        raise ValueError(f"{node.where}: past_key and past_value must be given together")
    if nonpad is not None and past_key is not None:
        raise ValueError(
            f"{node.where}: nonpad_kv_seqlen cannot be combined with past_key and past_value"
        )
    if nonpad is not None:
        _int_check(node, nonpad, "nonpad_kv_seqlen")
        if _shape(nonpad) != [q.shape[0]]:
            raise ValueError(
                f"{node.where}: nonpad_kv_seqlen of shape {_shape(nonpad)} must be "
                f"({q.shape[0]},), one length per batch"
            )
    past_len = None
    if past_key is not None:
        past_len = int(np.shape(past_key)[2]) if np.ndim(past_key) == 4 else 0
        k = _cache(node, "past_key", past_key, k)
        v = _cache(node, "past_value", past_value, v)
    present_key, present_value = k, v
    mode = int(node.get("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise ValueError(f"{node.where}: qk_matmul_output_mode {mode} must be 0, 1, 2 or 3")
    batch, heads, q_len, head_size = q.shape
    kv_len = k.shape[2]
    shape = (batch, heads, q_len, kv_len)
    check_size(node, shape, q.dtype, "attention scores")
    check_size(node, (batch, heads, kv_len, max(head_size, v.shape[3])), q.dtype, "repeated K, V")
    scale = node.get("scale")
    scale = 1 / math.sqrt(head_size) if scale is None else float(scale)
    if not scale > 0:  # onnxruntime refuses 0 and negative scales too
        raise ValueError(
            f"{node.where}: scale {scale} must be positive; Q and K are each scaled by its "
            "square root"
        )
    root = np.asarray(math.sqrt(scale), q.dtype)
    if heads != k.shape[1]:  # grouped queries: each K, V head serves heads / kv_heads of Q's
        k = jnp.repeat(k, heads // k.shape[1], axis=1)
        v = jnp.repeat(v, heads // v.shape[1], axis=1)
    scores = jnp.matmul(q * root, jnp.swapaxes(k * root, -1, -2))
    raw = scores
    softcap = float(node.get("softcap", 0.0))
    if softcap > 0:
        cap = np.asarray(softcap, scores.dtype)
        scores = jnp.tanh(scores / cap) * cap
    bias = _attention_bias(node, mask, nonpad, past_len, shape, q.dtype)
    biased = scores + bias
    precision = node.get("softmax_precision")
    dtype = _canonical(tensor_dtype(precision, node.where)) if precision else q.dtype
    masked_row = jnp.isneginf(jnp.max(bias, axis=-1, keepdims=True))
    logits = jnp.where(masked_row, np.asarray(0, dtype), biased.astype(dtype))
    probs = jnp.where(masked_row, np.asarray(0, dtype), jax.nn.softmax(logits, axis=-1))
    probs = jnp.broadcast_to(probs.astype(q.dtype), shape)
    y = jnp.matmul(probs, v)
    if three_d:
        y = jnp.transpose(y, (0, 2, 1, 3)).reshape(batch, q_len, -1)
    qk = (raw, scores, biased, probs)[mode]
    qk = jnp.broadcast_to(qk, shape)
    return (y, present_key, present_value, qk)[: node.n_outputs]
