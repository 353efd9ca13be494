"""Attention of ai.onnx (opset 23 on) and ai.onnx.preview's FlexAttention.

The blocks around it are ``transformer``'s (RMSNormalization, Swish, SwiGLU,
RotaryEmbedding) and ``linear_attention``'s (LinearAttention, CausalConvWithState).
Each op is one ``@register``-ed function over jax.numpy, differentiable, its shapes
checked (naming the node) before anything is computed. Attention follows the
spec's pattern: Q and K each scaled by ``sqrt(scale)``, a softcap, one additive
bias built from the mask, the causal frontier, the window and
``nonpad_kv_seqlen``, a softmax whose fully masked rows give zeros (never NaN),
and the key/value cache concatenated in.
FlexAttention calls its ``score_mod``/``prob_mod`` subgraphs inline.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src.onnx_tensors import tensor_dtype
from onnx_optax._src.ops.arrays import (
    check_at_run,
    check_size,
    default_scale,
    int_check,
    int_shape,
    wide_float,
)
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import canonical

# ----------------------------------------------------------------------------- Attention


def _heads(node: Node, name: str, value: Any, heads: int) -> Any:
    """A 3-D (batch, seq, heads * size) input as (batch, heads, seq, size)."""
    b, s, hidden = value.shape
    if hidden % heads:
        raise ValueError(
            f"{node.where}: {name} of shape {int_shape(value)}: its hidden size {hidden} is not a "
            f"multiple of {heads} heads"
        )
    return jnp.transpose(jnp.reshape(value, (b, s, heads, hidden // heads)), (0, 2, 1, 3))


def _attention_inputs(node: Node, q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
    """Q, K and V as 4-D (batch, heads, seq, size), their shapes checked against each other."""
    ranks = {np.ndim(q), np.ndim(k), np.ndim(v)}
    if len(ranks) != 1 or ranks - {3, 4}:
        raise ValueError(
            f"{node.where}: Q, K and V of shapes {int_shape(q)}, {int_shape(k)} and {int_shape(v)} "
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
    else:  # given with 4-D inputs, they must agree with them (onnxruntime checks it)
        for name, heads, label, x in (
            ("q_num_heads", q_heads, "Q", q),
            ("kv_num_heads", kv_heads, "K", k),
        ):
            if heads and int(heads) != np.shape(x)[1]:
                raise ValueError(
                    f"{node.where}: {name} {heads} differs from the {np.shape(x)[1]} heads of "
                    f"{label} of shape {int_shape(x)}"
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
    got = int_shape(past)
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
    given = int_shape(mask)
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
        int_check(node, nonpad, "nonpad_kv_seqlen")
        if int_shape(nonpad) != [q.shape[0]]:
            raise ValueError(
                f"{node.where}: nonpad_kv_seqlen of shape {int_shape(nonpad)} must be "
                f"({q.shape[0]},), one length per batch"
            )
    past_len = None
    if past_key is not None:
        past_len = int(np.shape(past_key)[2]) if np.ndim(past_key) == 4 else 0
        k = _cache(node, "past_key", past_key, k)
        v = _cache(node, "past_value", past_value, v)
    present_key, present_value = k, v
    if nonpad is not None:  # onnxruntime: "nonpad_kv_seqlen[0] = 7 is out of range [0, 3]"
        kv = k.shape[2]
        check_at_run(
            f"{node.where}: nonpad_kv_seqlen holds {{}}, outside [0, {kv}]",
            (nonpad < 0) | (nonpad > kv),
            nonpad,
        )
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
    dtype = canonical(tensor_dtype(precision, node.where)) if precision else q.dtype
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


# ----------------------------------------------------------------------------- FlexAttention

PREVIEW_DOMAIN = "ai.onnx.preview"


def _modified(node: Node, name: str, modifier: Any, value: Any) -> Any:
    """``modifier(value)``: a subgraph of one input and one output of value's shape and dtype."""
    if len(modifier.input_names) != 1 or len(modifier.output_names) != 1:
        raise ValueError(
            f"{node.where}: {name} takes {len(modifier.input_names)} inputs and gives "
            f"{len(modifier.output_names)} outputs; it must take and give one tensor"
        )
    (out,) = modifier(value)
    if int_shape(out) != int_shape(value) or np.dtype(out.dtype) != np.dtype(value.dtype):
        raise ValueError(
            f"{node.where}: {name} gives {np.dtype(out.dtype)}{int_shape(out)} where "
            f"{np.dtype(value.dtype)}{int_shape(value)} (its input's shape and type) is needed"
        )
    return jnp.asarray(out)


def _flex_precision(node: Node, dtype: Any) -> np.dtype:
    """softmax_precision's dtype; float32 for 16-bit inputs and the input's otherwise."""
    precision = node.get("softmax_precision")
    if precision is None:
        return wide_float(dtype)
    chosen = canonical(tensor_dtype(int(precision), node.where))
    if not jnp.issubdtype(chosen, jnp.floating) or chosen.itemsize < 2:
        raise ValueError(
            f"{node.where}: softmax_precision {precision} ({chosen}) must be float16, "
            "bfloat16, float or double"
        )
    return chosen


@register("FlexAttention", domain=PREVIEW_DOMAIN)
def _flex_attention(node: Node, q: Any, k: Any, v: Any) -> Any:
    """``softmax(score_mod((Q @ K^T) * scale)) @ V``, with prob_mod applied to the softmax.

    Q and K are each scaled by ``sqrt(scale)`` (default ``1 / sqrt(head_size)``) in
    Q's dtype; the scores, both modifiers (subgraphs called inline, so gradients
    flow through them), the softmax and the product with V are in softmax_precision;
    grouped heads: query head ``h`` reads K/V head ``h // (q_heads / kv_heads)``.
    """
    shapes = [int_shape(q), int_shape(k), int_shape(v)]
    if any(len(s) != 4 for s in shapes):
        raise ValueError(f"{node.where}: Q, K and V of shapes {shapes} must all be 4-D")
    (batch, heads, _, size), (kb, kv_heads, kv_len, k_size), (vb, v_heads, v_len, _) = shapes
    if (
        len({batch, kb, vb}) != 1
        or (kv_heads, kv_len) != (v_heads, v_len)
        or size != k_size
        or kv_heads < 1
        or heads % kv_heads
    ):
        raise ValueError(
            f"{node.where}: Q (batch, heads, seq, size) {shapes[0]}, K {shapes[1]} and V "
            f"{shapes[2]} do not fit: one batch, K and V of the same heads and length, Q and K "
            "of one head size, Q's heads a multiple of K's"
        )
    check_size(node, (batch, heads, shapes[0][2], kv_len), np.float64, "attention scores")
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    scale = node.get("scale")
    scale = default_scale(node, size) if scale is None else float(scale)
    if scale < 0:
        raise ValueError(
            f"{node.where}: scale {scale} is negative; Q and K are each scaled by its square root"
        )
    root = np.asarray(np.sqrt(np.float32(scale)), q.dtype)
    if heads != kv_heads:
        k = jnp.repeat(k, heads // kv_heads, axis=1)
        v = jnp.repeat(v, heads // kv_heads, axis=1)
    dtype = _flex_precision(node, q.dtype)
    scores = jnp.matmul(q * root, jnp.swapaxes(k * root, -1, -2)).astype(dtype)
    if node.get("score_mod") is not None:
        scores = _modified(node, "score_mod", node["score_mod"], scores)
    probs = jax.nn.softmax(scores, axis=-1)
    if node.get("prob_mod") is not None:
        probs = _modified(node, "prob_mod", node["prob_mod"], probs)
    return jnp.matmul(probs, v.astype(dtype)).astype(v.dtype)
