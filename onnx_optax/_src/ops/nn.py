"""Neural-network ops of ai.onnx: activations, the Softmax family, MatMul, Gemm, Einsum.

Each is a small ``@register``-ed function over jax.numpy/lax. Convolutions and pools
live in ``conv``, normalizations, Dropout and LRN in ``normalization``. To add an
activation or a product, register it here under the section it belongs to.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src.ops.arrays import (
    broadcast_check,
    check_broadcasts_to,
    check_size,
    matmul_shape,
    norm_axis,
    same_dtype,
    xp_sized,
)
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node

# ----------------------------------------------------------------------------- activations


@register("LeakyRelu")
def _leaky_relu(node: Node, x: Any) -> Any:
    return jnp.where(x < 0, x * np.asarray(node["alpha"], x.dtype), x)


@register("PRelu")
def _prelu(node: Node, x: Any, slope: Any) -> Any:
    if node.opset < 7 and np.ndim(slope) == 1 and np.ndim(x) > 2 and slope.shape[0] == x.shape[1]:
        slope = slope.reshape((-1,) + (1,) * (np.ndim(x) - 2))  # per channel
    same_dtype(node, x, slope)
    broadcast_check(node, x, slope)
    return jnp.where(x < 0, x * slope, x)


@register("Elu")
def _elu(node: Node, x: Any) -> Any:
    alpha = np.asarray(node["alpha"], x.dtype)
    return jnp.where(x < 0, alpha * jnp.expm1(jnp.minimum(x, 0)), x)


@register("Celu")
def _celu(node: Node, x: Any) -> Any:
    alpha = np.asarray(node["alpha"], x.dtype)
    return jnp.maximum(x, 0) + jnp.minimum(0, alpha * jnp.expm1(jnp.minimum(x, 0) / alpha))


@register("Selu")
def _selu(node: Node, x: Any) -> Any:
    alpha = np.asarray(node["alpha"], x.dtype)
    gamma = np.asarray(node["gamma"], x.dtype)
    return gamma * jnp.where(x <= 0, alpha * jnp.expm1(jnp.minimum(x, 0)), x)


@register("ThresholdedRelu")
def _thresholded_relu(node: Node, x: Any) -> Any:
    return jnp.where(x > np.asarray(node["alpha"], x.dtype), x, jnp.zeros_like(x))


@register("HardSigmoid")
def _hard_sigmoid(node: Node, x: Any) -> Any:
    alpha = np.asarray(node["alpha"], x.dtype)
    beta = np.asarray(node["beta"], x.dtype)
    return jnp.clip(alpha * x + beta, 0, 1)


@register("HardSwish")
def _hard_swish(node: Node, x: Any) -> Any:
    del node
    return x * jnp.clip(x / np.asarray(6, x.dtype) + np.asarray(0.5, x.dtype), 0, 1)


@register("Mish")
def _mish(node: Node, x: Any) -> Any:
    del node
    return x * jnp.tanh(jax.nn.softplus(x))


@register("Gelu")
def _gelu(node: Node, x: Any) -> Any:
    approximate = node.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ValueError(f"{node.where}: approximate must be 'none' or 'tanh', got {approximate!r}")
    return jax.nn.gelu(x, approximate=approximate == "tanh")


def _softmax_like(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(node: Node, x: Any) -> Any:
        rank = np.ndim(x)
        if node.opset >= 13:
            return fn(x, axis=norm_axis(int(node.get("axis", -1)), rank, node.where))
        # opset < 13: coerce to 2-D at `axis` (default 1) and normalise each row
        axis = norm_axis(int(node.get("axis", 1)), rank, node.where)
        rows = math.prod(x.shape[:axis])
        flat = x.reshape(rows, math.prod(x.shape[axis:]))
        return fn(flat, axis=1).reshape(x.shape)

    return run


def _shifted(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` applied to ``x - max(x)``: softmax and log-softmax are unchanged by the shift.

    jax's softmax computes ``exp(x - max(x))`` and relies on the largest term
    being ``exp(0) = 1``. XLA:CPU recomputes a cheap producer of ``x`` (the
    product that a mean or a scale is) in each fusion that reads it, and LLVM
    contracts the product and the subtraction into one FMA in the ``exp`` fusion
    only: ``x - max(x)`` is then the product's rounding error, not 0 (221 for
    light_squeezenet's logits of 6.5e9), ``exp`` overflows to inf or underflows
    to 0 and the softmax is NaN. Subtracting the max first makes every fusion
    that reads the product read it as that same subtraction (contracted or not,
    the same way in each), so the max that ``fn`` subtracts in turn is one of
    the values it exponentiates.
    """

    def run(x: Any, axis: int) -> Any:
        top = jnp.max(x, axis=axis, keepdims=True, initial=-jnp.inf)  # -inf: an empty axis
        return fn(x - lax.stop_gradient(top), axis=axis)

    return run


register("Softmax")(_softmax_like(_shifted(jax.nn.softmax)))
register("LogSoftmax")(_softmax_like(_shifted(jax.nn.log_softmax)))


def _hardmax(x: Any, axis: int) -> Any:
    if x.shape[axis] == 0:  # nothing to pick: the empty result onnxruntime gives
        return jnp.zeros(x.shape, x.dtype)
    index = jnp.argmax(x, axis=axis, keepdims=True)
    positions = lax.broadcasted_iota(index.dtype, x.shape, axis)
    return (positions == index).astype(x.dtype)


register("Hardmax")(_softmax_like(_hardmax))


# ----------------------------------------------------------------------------- linear algebra


@register("MatMul")
def _matmul(node: Node, a: Any, b: Any) -> Any:
    same_dtype(node, a, b)
    return xp_sized(node, matmul_shape(node, a, b), a.dtype, a, b).matmul(a, b)


def one_hot_product(ids: Any, b: Any) -> Any:
    """``MatMul(one_hot(ids, K), B)`` for integer ``ids`` and B (K, M), as the rows of B the
    ids pick: the product's values, not its work (the graph uses it for an exporter's
    one-hot embedding; see the graph pass ``graph/passes/one_hot.py``).

    Exactly what the product gives: an id outside 0..K-1 picks no row (zeros), and
    column j is NaN where a row the id does not pick holds an inf or NaN there (0 x inf
    in the product). For a finite B the gradient with respect to B is the product's:
    each row of the output's gradient added to the row its id picked (where a NaN was
    chosen, none reaches B). K >= 1.
    """
    k = b.shape[0]
    # K - 1, not K: it fits the ids' type (uint8 ids of a 256-row table: 256 wraps to 0)
    inside = ((ids >= 0) & (ids <= k - 1))[..., None]
    picked = jnp.clip(ids, 0, k - 1)
    rows = jnp.take(b, picked, axis=0)
    bad = ~jnp.isfinite(b)
    own = (jnp.take(bad, picked, axis=0) & inside).astype(jnp.int32)
    others = jnp.sum(bad, axis=0, dtype=jnp.int32) - own
    zero = jnp.zeros((), b.dtype)
    return jnp.where(others > 0, jnp.asarray(jnp.nan, b.dtype), jnp.where(inside, rows, zero))


@register("Gemm")
def _gemm(node: Node, a: Any, b: Any, c: Any = None) -> Any:
    same_dtype(node, a, b, c)
    for name in ("transA", "transB"):
        if node[name] not in (0, 1):
            raise ValueError(f"{node.where}: {name} {node[name]} must be 0 or 1")
    if np.ndim(a) != 2 or np.ndim(b) != 2:
        raise ValueError(
            f"{node.where}: Gemm needs 2-D A and B, got shapes {list(np.shape(a))} and "
            f"{list(np.shape(b))}"
        )
    # the axes contracted, read where they are: a transposed operand (an exporter's
    # transB=1 weight) would be copied on every run by XLA:CPU (6.5 MB a weight in the
    # PyTorch CRNN: 3.5 of its 9 ms at batch 1)
    inner_a, inner_b = 1 - node["transA"], node["transB"]
    if a.shape[inner_a] != b.shape[inner_b]:
        raise ValueError(
            f"{node.where}: Gemm's A of shape {list(a.shape)} (transA {node['transA']}) and B "
            f"of shape {list(b.shape)} (transB {node['transB']}) do not match: the inner "
            f"dimensions are {a.shape[inner_a]} and {b.shape[inner_b]}"
        )
    shape = (a.shape[1 - inner_a], b.shape[1 - inner_b])
    check_size(node, shape, a.dtype)
    if c is not None:
        check_broadcasts_to(node, "C", c, shape)
    out = lax.dot_general(a, b, (((inner_a,), (inner_b,)), ((), ())))
    alpha, beta = node["alpha"], node["beta"]
    if alpha != 1.0:
        out = out * np.asarray(alpha, out.dtype)
    if c is not None:
        out = out + (c if beta == 1.0 else c * np.asarray(beta, c.dtype))
    return out


@register("Einsum")
def _einsum(node: Node, *xs: Any) -> Any:
    same_dtype(node, *xs)
    equation = node["equation"].replace(" ", "")
    terms, arrow, output = equation.partition("->")
    if arrow and "..." not in output:  # onnxruntime sums no axis an ellipsis stands for
        for term, x in zip(terms.split(","), xs, strict=False):
            if "..." in term and np.ndim(x) > len(term.replace("...", "")):
                raise ValueError(
                    f"{node.where}: equation {equation!r}: an input's ellipsis stands for "
                    "axes, so the output must hold one"
                )
    return jnp.einsum(equation, *xs)
