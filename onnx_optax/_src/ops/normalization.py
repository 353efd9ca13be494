"""Normalizations of ai.onnx, with Dropout and LRN.

BatchNormalization (inference and training mode), InstanceNormalization,
LayerNormalization, GroupNormalization, MeanVarianceNormalization, LRN, and Dropout
(training mode with a seeded key: see ``onnx_optax._src.random_keys``). A new
normalization goes here.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src import random_keys
from onnx_optax._src.onnx_tensors import tensor_dtype
from onnx_optax._src.ops.arrays import (
    check_at_run,
    check_broadcasts_to,
    norm_axes,
    norm_axis,
    same_dtype,
    xp_of,
)
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import canonical, is_static

# ----------------------------------------------------------------------------- normalization


def _channel(value: Any, rank: int) -> Any:
    """A per-channel (C, ...) statistic shaped to broadcast against (N, C, ...)."""
    return value.reshape(tuple(value.shape) + (1,) * (rank - 1 - np.ndim(value)))


@register("BatchNormalization")
def _batch_norm(node: Node, x: Any, scale: Any, bias: Any, mean: Any, var: Any) -> Any:
    same_dtype(node, scale, bias)
    same_dtype(node, mean, var)
    rank = np.ndim(x)
    if rank < 2:
        raise ValueError(f"{node.where}: X of shape {list(np.shape(x))} needs (N, C, ...)")
    # per channel; before opset 9, spatial=0 kept statistics per activation (C, D1, ...)
    shapes = [(x.shape[1],)]
    if node.opset < 9 and not node.get("spatial", 1):
        shapes.append(tuple(x.shape[1:]))
    for name, value in (("scale", scale), ("B", bias), ("input_mean", mean), ("input_var", var)):
        if tuple(np.shape(value)) not in shapes:
            raise ValueError(
                f"{node.where}: {name} of shape {list(np.shape(value))} does not fit X of shape "
                f"{list(x.shape)} (it must be {' or '.join(str(list(t)) for t in shapes)})"
            )
    eps = node["epsilon"]
    if node.opset >= 14:
        training = bool(node.get("training_mode", 0))
        needs = 3 if training else 1  # onnx's shape inference, run by onnxruntime, checks it
        if node.n_outputs != needs:
            raise ValueError(
                f"{node.where}: training_mode {int(node.get('training_mode', 0))} needs {needs} "
                f"output{'s' if needs > 1 else ''}, the node has {node.n_outputs}"
            )
    else:  # before opset 14, asking for the statistics outputs meant training
        training = node.n_outputs > 1 and not node.get("is_test", 0)
    outputs: tuple[Any, ...] = ()
    if training:
        axes = (0, *range(2, rank))
        batch_mean = jnp.mean(x, axis=axes)
        batch_var = jnp.mean(jnp.square(x - _channel(batch_mean, rank)), axis=axes)
        momentum = np.asarray(node.get("momentum", 0.9), mean.dtype)
        outputs = (
            mean * momentum + batch_mean.astype(mean.dtype) * (1 - momentum),
            var * momentum + batch_var.astype(var.dtype) * (1 - momentum),
            batch_mean,
            batch_var,
        )
        mean, var = batch_mean, batch_var
    inv = lax.rsqrt(_channel(var, rank) + np.asarray(eps, var.dtype))
    out = (x - _channel(mean, rank).astype(x.dtype)) * (inv * _channel(scale, rank)).astype(x.dtype)
    y = out + _channel(bias, rank).astype(x.dtype)
    return ((y, *outputs) + (None,) * node.n_outputs)[: node.n_outputs]


@register("InstanceNormalization")
def _instance_norm(node: Node, x: Any, scale: Any, bias: Any) -> Any:
    if np.ndim(x) < 3:
        raise ValueError(f"{node.where}: X of shape {list(np.shape(x))} needs (N, C, D1, ...)")
    for name, value in (("scale", scale), ("B", bias)):
        if tuple(np.shape(value)) != (x.shape[1],):
            raise ValueError(
                f"{node.where}: {name} of shape {list(np.shape(value))} must be the {x.shape[1]} "
                f"channels of X of shape {list(x.shape)}"
            )
    axes = tuple(range(2, x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    eps = np.asarray(node["epsilon"], x.dtype)
    return (x - mean) * lax.rsqrt(var + eps) * _channel(scale, x.ndim) + _channel(bias, x.ndim)


@register("LayerNormalization")
def _layer_norm(node: Node, x: Any, scale: Any, bias: Any = None) -> Any:
    rank = x.ndim
    axis = norm_axis(int(node["axis"]), rank, node.where)
    check_broadcasts_to(node, "Scale", scale, x.shape)
    if bias is not None:
        check_broadcasts_to(node, "B", bias, x.shape)
    stash = tensor_dtype(node["stash_type"], node.where)
    axes = tuple(range(axis, rank))
    xs = x.astype(canonical(stash))
    mean = jnp.mean(xs, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xs - mean), axis=axes, keepdims=True)
    inv_std = lax.rsqrt(var + np.asarray(node["epsilon"], xs.dtype))
    y = ((xs - mean) * inv_std).astype(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return (y, mean, inv_std)[: node.n_outputs]


@register("MeanVarianceNormalization")
def _mean_variance_norm(node: Node, x: Any) -> Any:
    """``(x - mean) / (std + 1e-9)``, mean and std over ``axes`` (default N and the spatial
    axes 0, 2, 3), as the op's function body in the spec."""
    axes = norm_axes([int(a) for a in node["axes"]], x.ndim, node.where)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    std = jnp.sqrt(jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True))
    return (x - mean) / (std + np.asarray(1e-9, x.dtype))


@register("GroupNormalization")
def _group_norm(node: Node, x: Any, scale: Any, bias: Any) -> Any:
    """``scale * (x - mean) / sqrt(var + epsilon) + bias``, the statistics per sample and
    group of ``C / num_groups`` consecutive channels (over them and the spatial axes).

    ``scale`` and ``bias`` hold one value per channel (opset 21) or per group (opset
    18); the statistics are computed in ``stash_type`` (opset 21; float32 by default).
    """
    if np.ndim(x) < 3:
        raise ValueError(f"{node.where}: X of shape {list(np.shape(x))} needs (N, C, D1, ...)")
    groups, channels = int(node["num_groups"]), x.shape[1]
    if groups < 1 or channels % groups:
        raise ValueError(
            f"{node.where}: num_groups {groups} must be positive and divide the {channels} "
            f"channels of X of shape {list(x.shape)}"
        )
    per = channels if node.opset >= 21 else groups
    for name, value in (("scale", scale), ("bias", bias)):
        if tuple(np.shape(value)) != (per,):
            what = "channels" if node.opset >= 21 else "groups"
            raise ValueError(
                f"{node.where}: {name} of shape {list(np.shape(value))} must hold one value per "
                f"{what[:-1]} ({per}) at opset {node.opset}"
            )
    stash = tensor_dtype(node.get("stash_type", 1), node.where) if node.opset >= 21 else x.dtype
    xs = x.astype(canonical(stash)).reshape((x.shape[0], groups, -1))
    mean = jnp.mean(xs, axis=2, keepdims=True)
    var = jnp.mean(jnp.square(xs - mean), axis=2, keepdims=True)
    normed = ((xs - mean) * lax.rsqrt(var + np.asarray(node["epsilon"], xs.dtype))).astype(x.dtype)
    normed = normed.reshape(x.shape)
    if node.opset < 21:  # one value per group, for each of its channels
        scale, bias = (jnp.repeat(v, channels // groups) for v in (scale, bias))
    return normed * _channel(scale, x.ndim) + _channel(bias, x.ndim)


@register("Dropout")
def _dropout(node: Node, x: Any, ratio: Any = None, training_mode: Any = None) -> Any:
    """Dropout: ``y = x`` in inference mode; in training mode ``y = mask * x / (1 - ratio)``.

    ``mask`` keeps each element with probability ``1 - ratio`` (``u >= ratio``, ``u``
    uniform in [0, 1)), drawn from :func:`_dropout_key`. Training mode is opset 12's
    ``training_mode`` input when true (a traced one selects at run time); ratio 0 is the
    identity with every element kept. The gradient is ``mask / (1 - ratio)``: zero where
    an element was dropped.
    """
    if node.opset < 7 and not node.get("is_test", 0) and node.n_outputs > 1:
        raise ValueError(
            f"{node.where}: Dropout of opset {node.opset} in training mode (is_test=0) is "
            "not supported; convert the model to opset 12 or later, where training_mode says it"
        )
    if ratio is not None:  # onnxruntime checks it in inference mode too
        if np.ndim(ratio) != 0:
            raise ValueError(
                f"{node.where}: ratio of shape {list(np.shape(ratio))} must be a scalar"
            )
        check_at_run(
            f"{node.where}: ratio must be in [0, 1), got {{}}", ~((ratio >= 0) & (ratio < 1)), ratio
        )
    kept = xp_of(x).ones(x.shape, bool) if node.opset >= 10 else xp_of(x).ones(x.shape, x.dtype)
    off = training_mode is None or (is_static(training_mode) and not bool(training_mode))
    if off or (ratio is not None and is_static(ratio) and float(ratio) == 0):
        return (x, kept)[: node.n_outputs]
    rate = jnp.asarray(0.5 if ratio is None else ratio, jnp.float32)
    keep = jax.random.uniform(_dropout_key(node), x.shape, jnp.float32) >= rate
    # A fed ratio of 1 drops everything: scale 0, not inf (whose 0 * inf is a NaN gradient).
    scale = jnp.where(rate < 1, 1 / (1 - rate), 0).astype(x.dtype)
    y = jnp.where(keep, x * scale, jnp.zeros((), x.dtype))
    mask = keep if node.opset >= 10 else keep.astype(x.dtype)
    if not is_static(training_mode):  # fed: chosen when the step runs
        y = jnp.where(training_mode, y, x)
        mask = jnp.where(training_mode, mask, jnp.ones((), mask.dtype))
    return (y, mask)[: node.n_outputs]


def _dropout_key(node: Node) -> Any:
    """The key of a training-mode Dropout node: the step's key folded with the node's name
    inside a ``Session(seed=)``, else its ``seed`` attribute; else a ValueError."""
    step = random_keys.current()
    if step is not None and step.key is not None:
        return random_keys.node_key(step.key, f"{node.where} -> {node.outputs[0]}")
    if step is not None:
        raise ValueError(
            f"{node.where}: Dropout runs in training mode (training_mode is true), which draws "
            f"random masks; give {step.owner} a seed (Session(model, seed=0)) to draw them "
            "reproducibly"
        )
    seed = node.get("seed")
    if seed is None:
        raise ValueError(
            f"{node.where}: Dropout runs in training mode (training_mode is true) and has no "
            "seed attribute to draw its mask from; set the node's seed attribute, or run the "
            "model in training.Session(model, seed=...)"
        )
    return jax.random.key(int(seed))


# ----------------------------------------------------------------------------- LRN


@register("LRN")
def _lrn(node: Node, x: Any) -> Any:
    """Local response normalization across channels (axis 1).

    ``y = x / (bias + alpha / size * s) ** beta`` where ``s`` sums ``x**2`` over the
    channels ``c - floor((size-1)/2)`` to ``c + ceil((size-1)/2)`` that exist. The window
    sum is one ``reduce_window`` (differentiable); a window reaching past every channel
    is clipped to them, so a huge ``size`` builds no huge padding.
    """
    size = int(node["size"])
    if size < 1:
        raise ValueError(f"{node.where}: size must be at least 1, got {size}")
    if x.ndim < 2:
        raise ValueError(
            f"{node.where}: X of shape {list(x.shape)} has no channel axis; LRN takes "
            "(N, C, D1, ..., Dk)"
        )
    channels = x.shape[1]
    before = min((size - 1) // 2, max(channels - 1, 0))
    after = min(size // 2, max(channels - 1, 0))  # ceil((size - 1) / 2)
    window = (1, before + after + 1) + (1,) * (x.ndim - 2)
    padding = [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2)
    x = jnp.asarray(x)
    sums = lax.reduce_window(
        jnp.square(x), np.array(0, x.dtype), lax.add, window, (1,) * x.ndim, padding
    )
    scale = np.asarray(node["alpha"] / size, x.dtype)
    bias = np.asarray(node["bias"], x.dtype)
    return x / (bias + scale * sums) ** np.asarray(node["beta"], x.dtype)
