"""A Gradient node and the outer graph share one forward (issue 21).

When a training graph outputs its loss and a Gradient of that loss, the forward
nodes run once: the traced step holds as many matrix products and convolutions as
``jax.value_and_grad`` of the same model written by hand. Expected counts and values
come from that hand-written JAX; never from onnx_optax itself.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax._src.graph.remat import rematerialized  # noqa: E402
from onnx_optax._src.ops import convolution  # noqa: E402

TRAINING = "ai.onnx.preview.training"
F32 = TensorProto.FLOAT
RNG = np.random.default_rng(21)


def _vi(name: str, shape: list[int] | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, F32, shape)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(TRAINING, 1)]
    )


def _grad(xs: list[str], zs: list[str], y: str, outs: list[str], inputs: Any = None) -> Any:
    kw = {"zs": zs} if zs else {}
    return helper.make_node(
        "Gradient", inputs or [*xs, *zs], outs, domain=TRAINING, xs=xs, y=y, **kw
    )


def _primitives(jaxpr: Any, counts: Counter[str] | None = None) -> Counter[str]:
    """How many times each primitive is bound, in nested jaxprs (calls, custom rules) too."""
    counts = Counter() if counts is None else counts
    for eqn in jaxpr.eqns:
        counts[eqn.primitive.name] += 1
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _primitives(inner, counts)
    return counts


def _traced(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Counter[str]:
    """The primitives of the graph's function as a compiled step traces it."""
    graph = backend.prepare(model).graph
    jaxpr = jax.make_jaxpr(lambda f: graph.apply(f, differentiable=False))(feeds)
    return _primitives(jaxpr.jaxpr)


# ----------------------------------------------------------------------------- an MLP


def _mlp_model() -> onnx.ModelProto:
    """loss = mean((relu(X @ W1 + B1) @ W2 - Y) ** 2); Gradient w.r.t. W1, B1, W2."""
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["XW"]),
        helper.make_node("Add", ["XW", "B1"], ["H"]),
        helper.make_node("Relu", ["H"], ["A"]),
        helper.make_node("MatMul", ["A", "W2"], ["P"]),
        helper.make_node("Sub", ["P", "Y"], ["E"]),
        helper.make_node("Mul", ["E", "E"], ["E2"]),
        helper.make_node("ReduceMean", ["E2"], ["loss"], keepdims=0),
        _grad(["W1", "B1", "W2"], ["X", "Y"], "loss", ["dW1", "dB1", "dW2"]),
    ]
    shapes = {"W1": [3, 5], "B1": [5], "W2": [5, 2], "X": [8, 3], "Y": [8, 2]}
    outputs = [_vi("loss", []), _vi("dW1", [3, 5]), _vi("dB1", [5]), _vi("dW2", [5, 2])]
    return _model(nodes, [_vi(n, s) for n, s in shapes.items()], outputs)


def _mlp_feeds() -> dict[str, np.ndarray]:
    shapes = {"W1": (3, 5), "B1": (5,), "W2": (5, 2), "X": (8, 3), "Y": (8, 2)}
    return {n: RNG.normal(size=s).astype(np.float32) for n, s in shapes.items()}


def _mlp_loss(w1: jax.Array, b1: jax.Array, w2: jax.Array, x: jax.Array, y: jax.Array) -> Any:
    return jnp.mean((jax.nn.relu(x @ w1 + b1[None, :]) @ w2 - y) ** 2)


def test_an_mlp_step_has_the_matrix_products_of_value_and_grad() -> None:
    feeds = _mlp_feeds()
    by_hand = jax.make_jaxpr(jax.value_and_grad(_mlp_loss, argnums=(0, 1, 2)))(*feeds.values())
    expected = _primitives(by_hand.jaxpr)["dot_general"]
    assert expected == 5  # two forward, three backward (dW2, dA, dW1)
    assert _traced(_mlp_model(), feeds)["dot_general"] == expected


def test_an_mlp_step_gives_the_loss_and_gradients_of_value_and_grad() -> None:
    feeds = _mlp_feeds()
    out = backend.prepare(_mlp_model()).run(feeds)
    loss, grads = jax.value_and_grad(_mlp_loss, argnums=(0, 1, 2))(*feeds.values())
    np.testing.assert_allclose(out.loss, loss, rtol=1e-6)
    for ours, theirs in zip((out.dW1, out.dB1, out.dW2), grads, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_under_remat_the_step_keeps_its_values() -> None:
    """Rematerialized Gradients keep today's schedule (the forward run apart)."""
    feeds = _mlp_feeds()
    graph = backend.prepare(_mlp_model()).graph
    with rematerialized():
        out = jax.jit(lambda f: graph.apply(f, differentiable=False))(feeds)
    loss, grads = jax.value_and_grad(_mlp_loss, argnums=(0, 1, 2))(*feeds.values())
    np.testing.assert_allclose(out[0], loss, rtol=1e-6)
    for ours, theirs in zip(out[1:], grads, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- a convolution


def _conv_model() -> onnx.ModelProto:
    """loss = sum(tanh(conv(X, K)) ** 2); Gradient w.r.t. K (X a z)."""
    nodes = [
        helper.make_node("Conv", ["X", "K"], ["C"], pads=[1, 1, 1, 1]),
        helper.make_node("Tanh", ["C"], ["T"]),
        helper.make_node("Mul", ["T", "T"], ["T2"]),
        helper.make_node("ReduceSum", ["T2"], ["loss"], keepdims=0),
        _grad(["K"], ["X"], "loss", ["dK"]),
    ]
    inputs = [_vi("X", [2, 3, 6, 6]), _vi("K", [4, 3, 3, 3])]
    return _model(nodes, inputs, [_vi("loss", []), _vi("dK", [4, 3, 3, 3])])


def _conv_loss(k: jax.Array, x: jax.Array) -> Any:
    c = jax.lax.conv_general_dilated(x, k, (1, 1), [(1, 1), (1, 1)])
    return jnp.sum(jnp.tanh(c) ** 2)


def test_a_conv_step_has_the_convolutions_of_value_and_grad() -> None:
    feeds = {
        "X": RNG.normal(size=(2, 3, 6, 6)).astype(np.float32),
        "K": RNG.normal(size=(4, 3, 3, 3)).astype(np.float32),
    }

    # Counted in the lowering for a GPU, whose Conv is XLA's (on the CPU a small conv is a
    # matrix product); traced within every_platform(), the function holds each
    # backend's lowering (lax.platform_dependent), the lowering only the one its
    # platform runs.
    def lowered(fn: Any, *args: Any) -> str:
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

    expected = lowered(jax.value_and_grad(_conv_loss), feeds["K"], feeds["X"])
    assert expected.count("stablehlo.convolution") == 2  # the forward and dK
    graph = backend.prepare(_conv_model()).graph
    with convolution.every_platform():
        ours = lowered(lambda f: graph.apply(f, differentiable=False), feeds)
    assert ours.count("stablehlo.convolution") == 2
    out = backend.prepare(_conv_model()).run(feeds)
    loss, dk = jax.value_and_grad(_conv_loss)(feeds["K"], feeds["X"])
    np.testing.assert_allclose(out.loss, loss, rtol=1e-5)
    np.testing.assert_allclose(out.dK, dk, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- not fused


def test_an_x_computed_from_the_forward_keeps_the_forward_apart() -> None:
    """x = sin(H) where H = X * W is also on y's path: fusing would be a cycle.

    y = sum(S * H), S = sin(H); dy/dS = H (H is not differentiated: it is past no x).
    """
    nodes = [
        helper.make_node("Mul", ["X", "W"], ["H"]),
        helper.make_node("Sin", ["H"], ["S"]),
        helper.make_node("Mul", ["S", "H"], ["P"]),
        helper.make_node("ReduceSum", ["P"], ["y"], keepdims=0),
        _grad(["S"], [], "y", ["dS"]),
    ]
    model = _model(nodes, [_vi("X", [3]), _vi("W", [3])], [_vi("y", []), _vi("dS", [3])])
    x, w = (RNG.normal(size=3).astype(np.float32) for _ in range(2))
    out = backend.prepare(model).run([x, w])
    np.testing.assert_allclose(out.y, np.sum(np.sin(x * w) * (x * w)), rtol=1e-5)
    np.testing.assert_allclose(out.dS, x * w, rtol=1e-6)


def test_inputs_other_than_xs_and_zs_keep_the_forward_apart() -> None:
    """The Gradient's input is V, not W: y's forward (on W) and the differentiated one
    (on V's value) differ, so the outer forward runs on its own."""
    nodes = [
        helper.make_node("Mul", ["X", "W"], ["H"]),
        helper.make_node("ReduceSum", ["H"], ["loss"], keepdims=0),
        _grad(["W"], ["X"], "loss", ["dW"], inputs=["V", "X"]),
    ]
    inputs = [_vi(n, [3]) for n in "XWV"]
    model = _model(nodes, inputs, [_vi("loss", []), _vi("dW", [3])])
    x, w, v = (RNG.normal(size=3).astype(np.float32) for _ in range(3))
    out = backend.prepare(model).run([x, w, v])
    np.testing.assert_allclose(out.loss, np.sum(x * w), rtol=1e-6)
    np.testing.assert_allclose(out.dW, x, rtol=1e-6)


def test_two_gradients_share_the_forward_and_each_is_right() -> None:
    """Gradient(y=loss, xs=[W1, B1]) and Gradient(y=loss2, xs=[W2]) where loss2 reads
    the same forward and more of its own: the second fuses with what the first left."""
    nodes = [
        *_mlp_model().graph.node[:7],
        helper.make_node("Sin", ["P"], ["S"]),
        helper.make_node("ReduceSum", ["S"], ["loss2"], keepdims=0),
        _grad(["W1", "B1"], ["W2", "X", "Y"], "loss", ["dW1", "dB1"]),
        _grad(["W2"], ["W1", "B1", "X"], "loss2", ["dW2"]),
    ]
    model = _mlp_model()
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    del model.graph.output[:]
    shapes = {"loss": [], "loss2": [], "dW1": [3, 5], "dB1": [5], "dW2": [5, 2]}
    model.graph.output.extend(_vi(n, s) for n, s in shapes.items())
    feeds = _mlp_feeds()
    traced = _traced(model, feeds)  # a forward per Gradient (2 products each), 3 backward
    assert (traced["dot_general"], traced["sin"]) == (7, 1)
    out = backend.prepare(model).run(feeds)
    w1, b1, w2, x, y = feeds.values()

    def loss2(w2: jax.Array) -> Any:
        return jnp.sum(jnp.sin(jax.nn.relu(x @ w1 + b1[None, :]) @ w2))

    loss, (dw1, db1) = jax.value_and_grad(_mlp_loss, argnums=(0, 1))(w1, b1, w2, x, y)
    np.testing.assert_allclose(out.loss, loss, rtol=1e-6)
    np.testing.assert_allclose(out.loss2, loss2(w2), rtol=1e-5)
    np.testing.assert_allclose(out.dW1, dw1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.dB1, db1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.dW2, jax.grad(loss2)(w2), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- a Session


def test_a_session_step_of_an_attached_mlp_has_the_products_of_value_and_grad() -> None:
    """training.attach's graph (forward, loss, Gradient, Adam): as many matrix products
    in the compiled step's trace as jax.value_and_grad of the network by hand."""
    import onnx_optax
    from onnx_optax import training
    from tests.support.training_models import data, mlp
    from tests.support.training_models import mlp_forward as _forward
    from tests.support.training_models import mlp_params as _params

    session = training.Session(training.attach(mlp(), optimizer=onnx_optax.adam(0.01)))
    inputs = data()
    arguments = (session._state, session._checked_feeds(inputs), session._constants)
    ours = _primitives(jax.make_jaxpr(session._step_all)(*arguments).jaxpr)

    def loss(p: dict[str, jax.Array]) -> jax.Array:
        logits = _forward(p, jnp.asarray(inputs["x"]))
        picked = jnp.take_along_axis(logits, inputs["target"][:, None], axis=1)
        return jnp.mean(jax.nn.logsumexp(logits, axis=1) - picked[:, 0])

    by_hand = _primitives(jax.make_jaxpr(jax.value_and_grad(loss))(_params()).jaxpr)
    assert by_hand["dot_general"] == 5  # two forward, three backward
    assert ours["dot_general"] == by_hand["dot_general"]
    first = float(session.step(inputs)["loss"])
    np.testing.assert_allclose(first, loss(_params()), rtol=1e-6)


def test_an_error_in_the_shared_forward_names_its_node() -> None:
    """A forward node that fails inside the fused Gradient is named, not the Gradient."""
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["P"], name="mm"),
        helper.make_node("ReduceSum", ["P"], ["loss"], keepdims=0),
        _grad(["W"], ["X"], "loss", ["dW"]),
    ]
    inputs = [_vi("X", [4, 3]), _vi("W", [2, 2])]
    model = _model(nodes, inputs, [_vi("loss", []), _vi("dW", [2, 2])])
    with pytest.raises(ValueError, match=r"^node 'mm' \(ai\.onnx\.MatMul\)"):
        backend.prepare(model)
