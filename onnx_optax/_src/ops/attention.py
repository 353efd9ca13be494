"""The transformer ops of ai.onnx: RMSNormalization, Swish, SwiGLU, RotaryEmbedding, Attention,
the recurrent blocks LinearAttention and CausalConvWithState, and ai.onnx.preview's FlexAttention.

The blocks a decoder export is made of (opset 23 on): each one ``@register``-ed
function over jax.numpy, differentiable, its shapes checked (naming the node)
before anything is computed. Attention follows the spec's pattern: Q and K each
scaled by ``sqrt(scale)``, a softcap, one additive bias built from the mask, the
causal frontier, the window and ``nonpad_kv_seqlen``, a softmax whose fully
masked rows give zeros (never NaN), and the key/value cache concatenated in.
LinearAttention's state recurrence is one ``lax.scan`` over the steps;
CausalConvWithState is a depthwise convolution over its carried state and the
input; FlexAttention calls its ``score_mod``/``prob_mod`` subgraphs inline.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src.onnx_tensors import tensor_dtype
from onnx_optax._src.ops.arrays import check_at_run, check_size, int_check, norm_axis
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import canonical


def _shape(value: Any) -> list[int]:
    return [int(d) for d in np.shape(value)]


# ----------------------------------------------------------------------------- RMSNormalization


@register("RMSNormalization")
def _rms_norm(node: Node, x: Any, scale: Any) -> Any:
    """``x / sqrt(mean(x**2 over axis..) + epsilon) * scale``, computed in ``stash_type``."""
    axis = norm_axis(int(node["axis"]), np.ndim(x), node.where)
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
    if int(node.get("num_heads", 0)) < 0:  # onnxruntime refuses it, 4-D X or not
        raise ValueError(f"{node.where}: num_heads {node['num_heads']} must not be negative")
    if _shape(cos_cache) != _shape(sin_cache):  # onnxruntime refuses two shapes
        raise ValueError(
            f"{node.where}: cos_cache of shape {_shape(cos_cache)} and sin_cache of shape "
            f"{_shape(sin_cache)} must have one shape"
        )
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
            int_check(node, position_ids, "position_ids")
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
    else:  # given with 4-D inputs, they must agree with them (onnxruntime checks it)
        for name, heads, label, x in (
            ("q_num_heads", q_heads, "Q", q),
            ("kv_num_heads", kv_heads, "K", k),
        ):
            if heads and int(heads) != np.shape(x)[1]:
                raise ValueError(
                    f"{node.where}: {name} {heads} differs from the {np.shape(x)[1]} heads of "
                    f"{label} of shape {_shape(x)}"
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
        int_check(node, nonpad, "nonpad_kv_seqlen")
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


# ----------------------------------------------------------------------------- CausalConvWithState


def _wide(dtype: Any) -> np.dtype:
    """float32 for 16-bit floats, the dtype itself otherwise."""
    return np.dtype(np.float32) if np.dtype(dtype).itemsize < 4 else np.dtype(dtype)


@register("CausalConvWithState")
def _causal_conv_with_state(
    node: Node, x: Any, weight: Any, bias: Any = None, past: Any = None
) -> Any:
    """A depthwise causal 1-D convolution carrying its last ``k - 1`` inputs as state.

    With ``P = concat(past_state or zeros, X)`` along the length (``P`` of length
    ``L + k - 1``): ``Y[b, c, t] = sum_j W[c, 0, j] * P[b, c, t + j] + B[c]``, then
    ``Y * sigmoid(Y)`` under ``activation`` 'silu' or 'swish'; ``present_state`` is
    ``P[:, :, L:]``, the last ``k - 1`` positions of ``P``.
    """
    activation = node.get("activation", "none")
    if activation not in ("none", "silu", "swish"):
        raise ValueError(
            f"{node.where}: activation '{activation}' must be 'none', 'silu' or 'swish'"
        )
    if np.ndim(x) != 3 or np.ndim(weight) != 3:
        raise ValueError(
            f"{node.where}: input of shape {_shape(x)} must be (batch, channels, length) and "
            f"weight of shape {_shape(weight)} (channels, 1, k)"
        )
    batch, channels, length = _shape(x)
    taps = _shape(weight)[2]
    if _shape(weight)[:2] != [channels, 1] or taps < 1:
        raise ValueError(
            f"{node.where}: weight of shape {_shape(weight)} must be ({channels}, 1, k) with "
            f"k >= 1 for input of shape {_shape(x)} (depthwise: one kernel per channel)"
        )
    if bias is not None and _shape(bias) != [channels]:
        raise ValueError(f"{node.where}: bias of shape {_shape(bias)} must be ({channels},)")
    state_shape = [batch, channels, taps - 1]
    if past is not None and _shape(past) != state_shape:
        raise ValueError(
            f"{node.where}: past_state of shape {_shape(past)} must be (batch, channels, k - 1) "
            f"= {state_shape}"
        )
    dtype = jnp.asarray(x).dtype
    acc = _wide(dtype)  # 16-bit inputs accumulate in float32
    start = jnp.zeros(state_shape, dtype) if past is None else jnp.asarray(past)
    padded = jnp.concatenate([start, jnp.asarray(x)], axis=2)
    if not channels:  # no kernel to convolve (XLA takes no group count of 0)
        return jnp.zeros(_shape(x), dtype), padded[:, :, length:]
    y = jax.lax.conv_general_dilated(
        padded.astype(acc),
        jnp.asarray(weight).astype(acc),
        window_strides=(1,),
        padding="VALID",
        dimension_numbers=("NCH", "OIH", "NCH"),
        feature_group_count=channels,
    )
    if bias is not None:
        y = y + jnp.asarray(bias).astype(acc)[:, None]
    y = y.astype(dtype)
    if activation != "none":
        wide = y.astype(acc)
        y = (wide * jax.nn.sigmoid(wide)).astype(dtype)
    return y, padded[:, :, length:]


# ----------------------------------------------------------------------------- LinearAttention


def _default_scale(node: Node, head_size: int) -> float:
    """``1 / sqrt(head_size)``, the scale when none is given."""
    if head_size < 1:
        raise ValueError(
            f"{node.where}: a head size of {head_size} gives no default scale 1 / sqrt(size); "
            "give the scale attribute"
        )
    return 1 / math.sqrt(head_size)


_UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


def _packed(node: Node, name: str, value: Any, heads: int, batch: int, steps: int) -> Any:
    """A 3-D packed (B, T, H * D) input as (T, B, H, D), time first for the scan."""
    shape = _shape(value)
    if len(shape) != 3 or shape[:2] != [batch, steps] or shape[2] % heads:
        raise ValueError(
            f"{node.where}: {name} of shape {shape} must be (batch, T, heads * size) = "
            f"({batch}, {steps}, {heads} * size)"
        )
    size = shape[2] // heads
    return jnp.transpose(jnp.reshape(value, (batch, steps, heads, size)), (1, 0, 2, 3))


def _linear_attention_gates(
    node: Node, rule: str, decay: Any, beta: Any, kv_heads: int, d_k: int, batch: int, steps: int
) -> tuple[Any, Any]:
    """decay as (T, B, H_kv, 1 or d_k) and beta as (T, B, H_kv or 1, 1), or None each."""
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    for name, value, needed in (("decay", decay, gated), ("beta", beta, delta)):
        if (value is None) == needed:
            raise ValueError(
                f"{node.where}: update_rule '{rule}' "
                f"{'needs' if needed else 'takes no'} {name} input"
            )
    if decay is not None:
        last = _shape(decay)[-1] if np.ndim(decay) == 3 else -1
        if last not in (kv_heads, kv_heads * d_k):
            raise ValueError(
                f"{node.where}: decay of shape {_shape(decay)} must be (batch, T, kv_num_heads) "
                f"or (batch, T, kv_num_heads * d_k) = ({batch}, {steps}, {kv_heads} or "
                f"{kv_heads * d_k})"
            )
        decay = _packed(node, "decay", decay, kv_heads, batch, steps)
    if beta is not None:
        last = _shape(beta)[-1] if np.ndim(beta) == 3 else -1
        if last not in (kv_heads, 1):
            raise ValueError(
                f"{node.where}: beta of shape {_shape(beta)} must be (batch, T, kv_num_heads) "
                f"or (batch, T, 1) = ({batch}, {steps}, {kv_heads} or 1)"
            )
        beta = _packed(node, "beta", beta, last, batch, steps)
    return decay, beta


@register("LinearAttention")
def _linear_attention(
    node: Node,
    q: Any,
    k: Any,
    v: Any,
    past: Any = None,
    decay: Any = None,
    beta: Any = None,
) -> Any:
    """Linear attention's recurrence over T steps (one ``lax.scan``), state (B, H_kv, d_k, d_v).

    Per step, ``S = exp(g) * S`` (gated rules), ``v = beta * (v - S^T k)`` (delta
    rules), ``S = S + k ⊗ v``, ``o = scale * q^T S``; each K/V head (and its state)
    serves ``q_num_heads / kv_num_heads`` consecutive query heads. Computed in
    float32; ``present_state`` in past_state's dtype (the query's without one).
    """
    rule = node.get("update_rule", "gated_delta")
    if rule not in _UPDATE_RULES:
        raise ValueError(f"{node.where}: update_rule '{rule}' must be one of {list(_UPDATE_RULES)}")
    q_heads, kv_heads = int(node.get("q_num_heads", 0)), int(node.get("kv_num_heads", 0))
    if q_heads < 1 or kv_heads < 1 or q_heads % kv_heads:
        raise ValueError(
            f"{node.where}: q_num_heads {q_heads} must be a positive multiple of kv_num_heads "
            f"{kv_heads}"
        )
    if np.ndim(q) != 3:
        raise ValueError(
            f"{node.where}: query of shape {_shape(q)} must be (batch, T, heads * d_k)"
        )
    batch, steps, _ = _shape(q)
    qs = _packed(node, "query", q, q_heads, batch, steps)
    d_k = qs.shape[3]
    ks = _packed(node, "key", k, kv_heads, batch, steps)
    vs = _packed(node, "value", v, kv_heads, batch, steps)
    if ks.shape[3] != d_k:
        raise ValueError(
            f"{node.where}: key of shape {_shape(k)} gives head size {ks.shape[3]} where the "
            f"query's is {d_k}"
        )
    d_v = vs.shape[3]
    state_shape = [batch, kv_heads, d_k, d_v]
    if past is not None and _shape(past) != state_shape:
        raise ValueError(
            f"{node.where}: past_state of shape {_shape(past)} must be (batch, kv_num_heads, "
            f"d_k, d_v) = {state_shape}"
        )
    decays, betas = _linear_attention_gates(node, rule, decay, beta, kv_heads, d_k, batch, steps)
    check_size(node, (steps, batch, q_heads, d_v), np.float32, "the outputs of every step")
    scale = float(node.get("scale", 0.0)) or _default_scale(node, d_k)
    acc = np.dtype(np.float32)
    state = jnp.zeros(state_shape, acc) if past is None else jnp.asarray(past).astype(acc)
    xs = {
        "q": jnp.reshape(qs, (steps, batch, kv_heads, q_heads // kv_heads, d_k)).astype(acc),
        "k": ks.astype(acc),
        "v": vs.astype(acc),
    }
    if decays is not None:
        xs["g"] = decays.astype(acc)
    if betas is not None:
        xs["beta"] = betas.astype(acc)

    def step(s: Any, x: dict[str, Any]) -> tuple[Any, Any]:
        if "g" in x:
            s = s * jnp.exp(x["g"])[..., None]
        value = x["v"]
        if "beta" in x:
            value = x["beta"] * (value - jnp.einsum("bhdm,bhd->bhm", s, x["k"]))
        s = s + x["k"][..., :, None] * value[..., None, :]
        return s, jnp.einsum("bhgd,bhdm->bhgm", x["q"], s) * np.asarray(scale, acc)

    state, outs = jax.lax.scan(step, state, xs)
    y = jnp.transpose(jnp.reshape(outs, (steps, batch, q_heads * d_v)), (1, 0, 2))
    state_dtype = jnp.asarray(q if past is None else past).dtype
    return y.astype(jnp.asarray(q).dtype), state.astype(state_dtype)


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
    if _shape(out) != _shape(value) or np.dtype(out.dtype) != np.dtype(value.dtype):
        raise ValueError(
            f"{node.where}: {name} gives {np.dtype(out.dtype)}{_shape(out)} where "
            f"{np.dtype(value.dtype)}{_shape(value)} (its input's shape and type) is needed"
        )
    return jnp.asarray(out)


def _flex_precision(node: Node, dtype: Any) -> np.dtype:
    """softmax_precision's dtype; float32 for 16-bit inputs and the input's otherwise."""
    precision = node.get("softmax_precision")
    if precision is None:
        return _wide(dtype)
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
    shapes = [_shape(q), _shape(k), _shape(v)]
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
    scale = _default_scale(node, size) if scale is None else float(scale)
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
