"""The loss ops of ai.onnx: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both share one negative log-likelihood (``_nll``) with its ``reduction``,
``ignore_index`` and class weights. A label outside ``[0, C)`` that is not the
``ignore_index`` is an error naming the node (while tracing when the labels are
static, after the run otherwise), never a clamped class; an ``ignore_index``
beyond the labels' dtype matches no label. A new loss op goes here.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src.ops.arrays import checked_labels
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import canonical


def _nll(node: Node, log_prob: Any, labels: Any, weights: Any) -> Any:
    """Negative log-likelihood of ``labels`` under ``log_prob`` (N, C, d...), with reduction."""
    reduction = node.get("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"{node.where}: reduction must be none, sum or mean, got {reduction!r}")
    ignore = node.get("ignore_index")
    scores = np.shape(log_prob)
    if len(scores) < 2 or np.shape(labels) != (scores[0], *scores[2:]):
        raise ValueError(
            f"{node.where}: labels of shape {list(np.shape(labels))} do not match scores of "
            f"shape {list(scores)} (N, C, d...)"
        )
    classes = scores[1]
    if weights is not None and np.shape(weights) != (classes,):
        raise ValueError(
            f"{node.where}: weights of shape {list(np.shape(weights))} do not match the "
            f"{classes} classes"
        )
    ignore = _ignore_index(ignore, labels)
    checked_labels(node, labels, classes, ignore)
    labels = jnp.asarray(labels)
    valid = jnp.ones(labels.shape, bool) if ignore is None else labels != ignore
    safe = jnp.where(valid, labels, 0)
    picked = jnp.take_along_axis(log_prob, safe[:, None], axis=1, mode="clip")[:, 0]
    w = (
        jnp.ones(labels.shape, log_prob.dtype)
        if weights is None
        else jnp.take(weights, safe, mode="clip")
    )
    w = jnp.where(valid, w, jnp.zeros_like(w))
    loss = -picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return jnp.sum(loss)
    return jnp.sum(loss) / jnp.sum(w)


def _ignore_index(ignore: int | None, labels: Any) -> int | None:
    """The ignore_index, or None where no label of the labels' dtype can equal it.

    onnxruntime compares the labels with the int64 attribute; JAX cannot compare
    int32 labels (or int64 ones held as int32 without 64-bit JAX) with a number
    beyond int32, and no such label equals it.
    """
    if ignore is None or not np.issubdtype(labels.dtype, np.integer):
        return ignore  # non-integer labels: refused by the label check
    bounds = np.iinfo(canonical(labels.dtype))  # as JAX holds them, where they are compared
    return ignore if bounds.min <= ignore <= bounds.max else None


@register("NegativeLogLikelihoodLoss")
def _nll_loss(node: Node, log_prob: Any, labels: Any, weights: Any = None) -> Any:
    return _nll(node, log_prob, labels, weights)


@register("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(node: Node, scores: Any, labels: Any, weights: Any = None) -> Any:
    log_prob = jax.nn.log_softmax(scores, axis=1)
    loss = _nll(node, log_prob, labels, weights)
    return (loss, log_prob)[: node.n_outputs]
