"""The graph as a pure function: ``apply(params, inputs)`` and its parameter table."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper

from onnx_optax import backend
from onnx_optax._src.graph import GraphFunction, graph_function

RNG = np.random.default_rng(3)
W = RNG.normal(size=(3, 4)).astype(np.float32)
B = RNG.normal(size=4).astype(np.float32)
X = RNG.normal(size=(2, 3)).astype(np.float32)


def _model() -> object:
    """y = tanh(x @ w + b) reshaped by an integer initializer (shape data, not a param)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["a"]),
        helper.make_node("Tanh", ["a"], ["t"]),
        helper.make_node("Reshape", ["t", "shape"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(W, "w"),
        numpy_helper.from_array(B, "b"),
        numpy_helper.from_array(np.array([8], np.int64), "shape"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _by_hand(params: dict, x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ params["w"] + params["b"][None, :]).reshape(8)


def test_params_are_the_float_initializers() -> None:
    _, params = graph_function(GraphFunction(_model().graph))
    assert sorted(params) == ["b", "w"]
    np.testing.assert_array_equal(params["w"], W)


def test_apply_jitted_equals_the_backend_run() -> None:
    model = _model()
    apply, params = graph_function(GraphFunction(model.graph))
    (ours,) = jax.jit(apply)(params, {"x": X})
    (theirs,) = backend.prepare(model).run({"x": X})
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ours, _by_hand(params, X), rtol=1e-6, atol=1e-7)


def test_apply_differentiates_as_the_hand_written_function() -> None:
    apply, params = graph_function(GraphFunction(_model().graph))

    def loss(p: dict) -> jax.Array:
        return jnp.sum(apply(p, {"x": X})[0] ** 2)

    ours = jax.jit(jax.grad(loss))(params)
    theirs = jax.grad(lambda p: jnp.sum(_by_hand(p, X) ** 2))(params)
    for name in ("w", "b"):
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-5, atol=1e-6)


def test_new_params_change_the_outputs() -> None:
    apply, params = graph_function(GraphFunction(_model().graph))
    doubled = {**params, "w": params["w"] * 2}
    (ours,) = apply(doubled, {"x": X})
    np.testing.assert_allclose(ours, _by_hand(doubled, X), rtol=1e-6, atol=1e-7)


def test_the_backend_rep_gives_the_function() -> None:
    rep = backend.prepare(_model())
    apply, params = rep.function()
    (ours,) = jax.jit(apply)(params, {"x": X})
    np.testing.assert_allclose(ours, rep.run({"x": X})[0], rtol=1e-6, atol=1e-7)
