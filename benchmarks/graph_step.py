"""Forward+backward step time: a prepared ONNX graph vs the same network written in JAX.

Two networks (an MLP and a small CNN, each ending in SoftmaxCrossEntropyLoss) are
built as ONNX models and run two ways through ``onnx_optax.backend.prepare``:

- ``grad``: ``jax.jit(jax.grad(...))`` of the prepared graph's ``apply`` with
  respect to the float initializers;
- ``Gradient``: the same model plus an ONNX ``Gradient`` node (xs = the weights),
  run by the prepared graph's own jitted function;

and compared with ``jax.jit(jax.grad(loss))`` of the network written directly in
jax.numpy. Medians over rounds, after a warm-up; ``block_until_ready`` inside
the timed region. Run::

    .venv/bin/python benchmarks/graph_step.py [--rounds 30] [--repeat 20]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnx_optax
from onnx_optax import backend

TRAINING = "ai.onnx.preview.training"
F32 = TensorProto.FLOAT


def _init(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    return (rng.normal(size=shape) / np.sqrt(fan_in)).astype(np.float32)


def mlp(batch: int = 256, sizes: tuple[int, ...] = (784, 1024, 1024, 10)) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    params = {}
    nodes = []
    h = "X"
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        params[f"W{i}"] = _init(rng, (n_in, n_out), n_in)
        params[f"b{i}"] = np.zeros(n_out, np.float32)
        nodes.append(helper.make_node("Gemm", [h, f"W{i}", f"b{i}"], [f"z{i}"]))
        h = f"z{i}"
        if i < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [h], [f"a{i}"]))
            h = f"a{i}"
    nodes.append(helper.make_node("SoftmaxCrossEntropyLoss", [h, "labels"], ["loss"]))
    x = rng.normal(size=(batch, sizes[0])).astype(np.float32)
    labels = rng.integers(0, sizes[-1], size=batch).astype(np.int64)

    def by_hand(p: dict[str, jax.Array], x: jax.Array, labels: jax.Array) -> jax.Array:
        h = x
        n = len(sizes) - 1
        for i in range(n):
            h = h @ p[f"W{i}"] + p[f"b{i}"]
            if i < n - 1:
                h = jax.nn.relu(h)
        logp = jax.nn.log_softmax(h, axis=1)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    return {
        "name": f"MLP {'-'.join(map(str, sizes))}, batch {batch}",
        "nodes": nodes,
        "params": params,
        "inputs": {"X": x, "labels": labels},
        "by_hand": by_hand,
    }


def cnn(batch: int = 64) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    params = {
        "K1": _init(rng, (16, 1, 3, 3), 9),
        "c1": np.zeros(16, np.float32),
        "K2": _init(rng, (32, 16, 3, 3), 144),
        "c2": np.zeros(32, np.float32),
        "W": _init(rng, (32 * 7 * 7, 10), 32 * 49),
        "b": np.zeros(10, np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["X", "K1", "c1"], ["y1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["y1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "K2", "c2"], ["y2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["y2"], ["r2"]),
        helper.make_node("AveragePool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p2"], ["f"]),
        helper.make_node("Gemm", ["f", "W", "b"], ["logits"]),
        helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"]),
    ]
    x = rng.normal(size=(batch, 1, 28, 28)).astype(np.float32)
    labels = rng.integers(0, 10, size=batch).astype(np.int64)

    def conv(x: jax.Array, k: jax.Array, c: jax.Array) -> jax.Array:
        y = jax.lax.conv_general_dilated(x, k, (1, 1), [(1, 1), (1, 1)])
        return y + c[None, :, None, None]

    def by_hand(p: dict[str, jax.Array], x: jax.Array, labels: jax.Array) -> jax.Array:
        h = jax.nn.relu(conv(x, p["K1"], p["c1"]))
        h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
        h = jax.nn.relu(conv(h, p["K2"], p["c2"]))
        h = jax.lax.reduce_window(h, 0.0, jax.lax.add, (1, 1, 2, 2), (1, 1, 2, 2), "VALID") / 4
        logits = h.reshape(h.shape[0], -1) @ p["W"] + p["b"]
        logp = jax.nn.log_softmax(logits, axis=1)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    return {
        "name": f"CNN conv16-pool-conv32-avgpool-dense on 28x28, batch {batch}",
        "nodes": nodes,
        "params": params,
        "inputs": {"X": x, "labels": labels},
        "by_hand": by_hand,
    }


def _model(net: dict[str, Any], with_gradient: bool) -> onnx.ModelProto:
    nodes = list(net["nodes"])
    outputs = [helper.make_tensor_value_info("loss", F32, [])]
    names = list(net["params"])
    if with_gradient:
        nodes.append(
            helper.make_node(
                "Gradient", names, [f"d_{n}" for n in names], domain=TRAINING, xs=names, y="loss"
            )
        )
        outputs += [
            helper.make_tensor_value_info(f"d_{n}", F32, list(net["params"][n].shape))
            for n in names
        ]
    x, labels = net["inputs"]["X"], net["inputs"]["labels"]
    inputs = [
        helper.make_tensor_value_info("X", F32, list(x.shape)),
        helper.make_tensor_value_info("labels", TensorProto.INT64, list(labels.shape)),
    ]
    if with_gradient:  # the weights are inputs of Gradient: feed them
        inputs += [
            helper.make_tensor_value_info(n, F32, list(v.shape)) for n, v in net["params"].items()
        ]
        inits = []
    else:
        inits = [numpy_helper.from_array(v, n) for n, v in net["params"].items()]
    graph = helper.make_graph(nodes, "net", inputs, outputs, initializer=inits)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(TRAINING, 1)]
    )


def _median_times(fns: dict[str, Callable[[], Any]], rounds: int, repeat: int) -> dict[str, float]:
    """Median seconds per call of each function; the functions take turns in every round,
    so that a busy machine slows them alike."""
    for fn in fns.values():
        jax.block_until_ready(fn())  # compile
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(repeat):
                out = fn()
            jax.block_until_ready(out)
            times[name].append((time.perf_counter() - start) / repeat)
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench(net: dict[str, Any], rounds: int, repeat: int) -> dict[str, float]:
    params = {k: jnp.asarray(v) for k, v in net["params"].items()}
    x = jnp.asarray(net["inputs"]["X"])
    labels = jnp.asarray(net["inputs"]["labels"].astype(np.int32))

    hand = jax.jit(jax.value_and_grad(net["by_hand"]))
    rep = backend.prepare(_model(net, with_gradient=False))

    def through_graph(p: dict[str, jax.Array], x: jax.Array, labels: jax.Array) -> jax.Array:
        return rep.graph.apply({"X": x, "labels": labels}, p)[0]

    graph_grad = jax.jit(jax.value_and_grad(through_graph))
    rep_g = backend.prepare(_model(net, with_gradient=True))
    feeds = {"X": x, "labels": labels, **params}
    onnx_gradient = rep_g.graph._jitted

    # Same numbers first: the comparison is meaningless otherwise.
    loss_h, grads_h = hand(params, x, labels)
    loss_g, grads_g = graph_grad(params, x, labels)
    outs = onnx_gradient(feeds, {})
    np.testing.assert_allclose(loss_g, loss_h, rtol=1e-4)
    np.testing.assert_allclose(outs[0], loss_h, rtol=1e-4)
    for i, name in enumerate(params):
        np.testing.assert_allclose(grads_g[name], grads_h[name], rtol=1e-3, atol=1e-5)
        np.testing.assert_allclose(outs[1 + i], grads_h[name], rtol=1e-3, atol=1e-5)

    return _median_times(
        {
            "hand": lambda: hand(params, x, labels),
            "grad": lambda: graph_grad(params, x, labels),
            "gradient_node": lambda: onnx_gradient(feeds, {}),
        },
        rounds,
        repeat,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    print(
        f"JAX {jax.__version__} on {jax.devices()[0].device_kind}; medians of {args.rounds} rounds"
    )
    print(
        "| network | JAX by hand | prepared graph, jax.grad | ratio | ONNX Gradient node | ratio |"
    )
    print("|---|---|---|---|---|---|")
    for net in (mlp(), cnn()):
        t = bench(net, args.rounds, args.repeat)
        print(
            f"| {net['name']} | {t['hand'] * 1e3:.2f} ms | {t['grad'] * 1e3:.2f} ms | "
            f"{t['grad'] / t['hand']:.2f}x | {t['gradient_node'] * 1e3:.2f} ms | "
            f"{t['gradient_node'] / t['hand']:.2f}x |"
        )


if __name__ == "__main__":
    onnx_optax.reuse_host_memory()  # as the onnx-optax command does (docs/performance.md)
    main()
