"""Central finite differences in float64: the independent check of every gradient test.

``central_difference`` differentiates any scalar function of one array, element by
element; ``assert_graph_gradients`` checks jax.grad through an ONNX graph (a weighted
sum of its first output, the weights fixed) against it at a few spread-out elements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np


def central_difference(loss: Callable[[np.ndarray], float], x: np.ndarray) -> np.ndarray:
    """d loss / d x by central differences, element by element (float64)."""
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        step = 1e-6 * max(1.0, abs(float(x[index])))
        plus, minus = x.copy(), x.copy()
        plus[index] += step
        minus[index] -= step
        grad[index] = (loss(plus) - loss(minus)) / (2 * step)
    return grad


def assert_graph_gradients(
    model: Any,
    feeds: dict[str, np.ndarray],
    wrts: Sequence[str],
    opset: int,
    *,
    points: int = 5,
    atol: float = 1e-7,
) -> None:
    """jax.grad of ``sum(w * y)`` (y the model's first output) w.r.t. ``wrts`` equals the
    central difference at about ``points`` elements of each, in float64 (64-bit JAX)."""
    from onnx_optax._src.graph import GraphFunction

    with jax.enable_x64(True):
        graph = GraphFunction(model.graph, opsets={"": opset})
        given = {name: value for name, value in feeds.items() if name}
        shape = jax.eval_shape(lambda: graph.apply(given)[0]).shape
        weights = np.random.default_rng(5).standard_normal(shape)

        @jax.jit
        @jax.value_and_grad
        def loss(values: dict[str, Any]) -> Any:  # one compile: values and gradients
            return (graph.apply({**given, **values})[0] * weights).sum()

        start = {name: feeds[name] for name in wrts}
        grads = loss(start)[1]
        step = 1e-6
        for name in wrts:
            x = feeds[name]
            grad = np.asarray(grads[name])
            assert np.isfinite(grad).all() and np.abs(grad).max() > 1e-3, name
            for flat in range(0, x.size, max(x.size // points, 1)):
                index = np.unravel_index(flat, x.shape)
                plus, minus = x.copy(), x.copy()
                plus[index] += step
                minus[index] -= step
                expected = (
                    float(loss({**start, name: plus})[0]) - float(loss({**start, name: minus})[0])
                ) / (2 * step)
                assert abs(grad[index] - expected) <= atol + 1e-6 * abs(expected), (name, index)
