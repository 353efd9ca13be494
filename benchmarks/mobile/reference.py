"""MobileNetV2 written by hand in JAX, channels-last, on the weights of the exported file:
what XLA makes of the network when nothing stands between it and the formulas.

Every value is (N, H, W, C) from the image to the head; a depthwise 3x3 conv is 9 shifted
multiply-adds over it, a 1x1 conv one ``jnp.dot`` over C, the first 3x3 conv XLA's own
(NHWC, HWIO). The weights are the exported file's, in the order its Conv nodes come (the
order of the PyTorch modules); the block table is ``export.V2_TABLE``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import optax
from jax import lax
from onnx import numpy_helper

V2_TABLE = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
            (6, 160, 3, 2), (6, 320, 1, 1)]  # fmt: skip


def weights(model: onnx.ModelProto) -> tuple[list[tuple[Any, Any]], tuple[Any, Any]]:
    """Each Conv's (W, B) in the graph's order, and the head's Gemm (W, B)."""
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:  # the exporter's aliases of equal initializers
        if node.op_type == "Identity" and node.input[0] in values:
            values[node.output[0]] = values[node.input[0]]
    convs = [
        (values[n.input[1]], values[n.input[2]]) for n in model.graph.node if n.op_type == "Conv"
    ]
    (gemm,) = [n for n in model.graph.node if n.op_type == "Gemm"]
    return convs, (values[gemm.input[1]], values[gemm.input[2]])


def _pointwise(x: Any, w: Any, b: Any) -> Any:
    return jnp.dot(x, w[:, :, 0, 0].T) + b


def _depthwise(x: Any, w: Any, b: Any, stride: int) -> Any:
    padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    h, v = (x.shape[1] - 1) // stride + 1, (x.shape[2] - 1) // stride + 1
    y = b
    for i in range(3):
        for j in range(3):
            rows = slice(i, i + (h - 1) * stride + 1, stride)
            columns = slice(j, j + (v - 1) * stride + 1, stride)
            y = y + padded[:, rows, columns] * w[:, 0, i, j]
    return y


def _relu6(x: Any) -> Any:
    return jnp.clip(x, 0.0, 6.0)


def forward(params: Any, image: Any) -> Any:
    """The logits of an image batch (N, 3, H, W), as the exported file computes them."""
    convs, (head_w, head_b) = params
    x = jnp.transpose(image, (0, 2, 3, 1))
    w, b = convs[0]
    x = lax.conv_general_dilated(
        x, jnp.transpose(w, (2, 3, 1, 0)), (2, 2), [(1, 1), (1, 1)],
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    ) + b  # fmt: skip
    x = _relu6(x)
    k = 1
    for t, _, n, s in V2_TABLE:
        for i in range(n):
            inp = x
            if t != 1:
                x = _relu6(_pointwise(x, *convs[k]))
                k += 1
            x = _relu6(_depthwise(x, *convs[k], s if i == 0 else 1))
            x = _pointwise(x, *convs[k + 1])
            k += 2
            if x.shape == inp.shape:
                x = x + inp
    x = _relu6(_pointwise(x, *convs[k]))
    return jnp.mean(x, axis=(1, 2)) @ head_w.T + head_b


def train_step(params: Any) -> tuple[Callable[..., Any], Any]:
    """A jitted Adam step on softmax cross-entropy (every weight trained), and its state."""
    optimizer = optax.adam(1e-3)

    def loss(params: Any, image: Any, labels: Any) -> Any:
        logits = forward(params, image)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    @jax.jit
    def step(params: Any, state: Any, image: Any, labels: Any) -> Any:
        value, grads = jax.value_and_grad(loss)(params, image, labels)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    return step, optimizer.init(params)


def as_jax(params: Any) -> Any:
    return jax.tree.map(lambda v: jnp.asarray(np.asarray(v, np.float32)), params)
