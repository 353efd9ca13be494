"""The recurrent blocks of ai.onnx's decoders: LinearAttention and CausalConvWithState.

LinearAttention's state recurrence is one ``lax.scan`` over the steps;
CausalConvWithState is a depthwise convolution over its carried state and the input.
Each checks its shapes (naming the node) before anything is computed.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src.ops.arrays import (
    check_size,
    default_scale,
    int_shape,
    wide_float,
)
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node

# ----------------------------------------------------------------------------- CausalConvWithState


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
            f"{node.where}: input of shape {int_shape(x)} must be (batch, channels, length) and "
            f"weight of shape {int_shape(weight)} (channels, 1, k)"
        )
    batch, channels, length = int_shape(x)
    taps = int_shape(weight)[2]
    if int_shape(weight)[:2] != [channels, 1] or taps < 1:
        raise ValueError(
            f"{node.where}: weight of shape {int_shape(weight)} must be ({channels}, 1, k) with "
            f"k >= 1 for input of shape {int_shape(x)} (depthwise: one kernel per channel)"
        )
    if bias is not None and int_shape(bias) != [channels]:
        raise ValueError(f"{node.where}: bias of shape {int_shape(bias)} must be ({channels},)")
    state_shape = [batch, channels, taps - 1]
    if past is not None and int_shape(past) != state_shape:
        raise ValueError(
            f"{node.where}: past_state of shape {int_shape(past)} must be (batch, channels, k - 1) "
            f"= {state_shape}"
        )
    dtype = jnp.asarray(x).dtype
    acc = wide_float(dtype)  # 16-bit inputs accumulate in float32
    start = jnp.zeros(state_shape, dtype) if past is None else jnp.asarray(past)
    padded = jnp.concatenate([start, jnp.asarray(x)], axis=2)
    if not channels:  # no kernel to convolve (XLA takes no group count of 0)
        return jnp.zeros(int_shape(x), dtype), padded[:, :, length:]
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


_UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


def _packed(node: Node, name: str, value: Any, heads: int, batch: int, steps: int) -> Any:
    """A 3-D packed (B, T, H * D) input as (T, B, H, D), time first for the scan."""
    shape = int_shape(value)
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
        last = int_shape(decay)[-1] if np.ndim(decay) == 3 else -1
        if last not in (kv_heads, kv_heads * d_k):
            raise ValueError(
                f"{node.where}: decay of shape {int_shape(decay)} must be (batch, T, kv_num_heads) "
                f"or (batch, T, kv_num_heads * d_k) = ({batch}, {steps}, {kv_heads} or "
                f"{kv_heads * d_k})"
            )
        decay = _packed(node, "decay", decay, kv_heads, batch, steps)
    if beta is not None:
        last = int_shape(beta)[-1] if np.ndim(beta) == 3 else -1
        if last not in (kv_heads, 1):
            raise ValueError(
                f"{node.where}: beta of shape {int_shape(beta)} must be (batch, T, kv_num_heads) "
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
            f"{node.where}: query of shape {int_shape(q)} must be (batch, T, heads * d_k)"
        )
    batch, steps, _ = int_shape(q)
    qs = _packed(node, "query", q, q_heads, batch, steps)
    d_k = qs.shape[3]
    ks = _packed(node, "key", k, kv_heads, batch, steps)
    vs = _packed(node, "value", v, kv_heads, batch, steps)
    if ks.shape[3] != d_k:
        raise ValueError(
            f"{node.where}: key of shape {int_shape(k)} gives head size {ks.shape[3]} where the "
            f"query's is {d_k}"
        )
    d_v = vs.shape[3]
    state_shape = [batch, kv_heads, d_k, d_v]
    if past is not None and int_shape(past) != state_shape:
        raise ValueError(
            f"{node.where}: past_state of shape {int_shape(past)} must be (batch, kv_num_heads, "
            f"d_k, d_v) = {state_shape}"
        )
    decays, betas = _linear_attention_gates(node, rule, decay, beta, kv_heads, d_k, batch, steps)
    check_size(node, (steps, batch, q_heads, d_v), np.float32, "the outputs of every step")
    scale = float(node.get("scale", 0.0)) or default_scale(node, d_k)
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
