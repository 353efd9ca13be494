"""The channels-last pass (graph/passes/channels_last.py): the same values and gradients
as the channels-first lowering, in float64, and onnxruntime's outputs in float32."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_optax._src.graph import GraphFunction
from onnx_optax._src.graph.packing import ChannelsLast, materialize
from onnx_optax._src.graph.passes import PASS_NAMES

RNG = np.random.default_rng(35)
C = 16  # channels of the block's input (FEW_CHANNELS: a conv of fewer starts no region)


def _weights(dtype: Any) -> dict[str, np.ndarray]:
    """A mobile block's weights: expand 1x1 (C -> 2C), BN, depthwise 3x3, SE gate,
    project 1x1 (2C -> C), a grouped 1x1 (two groups) and a head."""
    e = 2 * C
    shapes = {
        "w_expand": (e, C, 1, 1),
        "bn_scale": (e,),
        "bn_bias": (e,),
        "bn_mean": (e,),
        "w_dw": (e, 1, 3, 3),
        "b_dw": (e,),
        "w_se1": (4, e, 1, 1),
        "w_se2": (e, 4, 1, 1),
        "w_project": (C, e, 1, 1),
        "w_k3": (C, C, 3, 3),
        "w_group": (C, C, 1, 1),
        "w_head": (2 * C, 5),
    }
    values = {k: RNG.normal(size=s) * 0.4 for k, s in shapes.items()}
    values["bn_var"] = RNG.uniform(0.5, 1.5, size=(e,))
    return {k: v.astype(dtype) for k, v in values.items()}


def _block(dtype: Any = np.float64) -> tuple[Any, dict[str, np.ndarray]]:
    """Every op the pass holds channels-last, in a mobile network's order: Conv, BN, Clip,
    a depthwise Conv, GlobalAveragePool and a squeeze-and-excitation gate (Conv, Relu,
    HardSigmoid, Mul), a residual Add, a k x k Conv, MaxPool, AveragePool, Concat, a
    channel shuffle (Reshape, Transpose, Reshape), a grouped Conv (channels-first), then
    a head that reads the values channels-first (ReduceMean, Gemm)."""
    kind = TensorProto.DOUBLE if dtype == np.float64 else TensorProto.FLOAT
    lo = numpy_helper.from_array(np.array(0.0, dtype), "lo")
    hi = numpy_helper.from_array(np.array(6.0, dtype), "hi")
    split = numpy_helper.from_array(np.array([0, 2, C, 9, 9], np.int64), "split")
    merge = numpy_helper.from_array(np.array([0, 2 * C, -1, 9], np.int64), "merge")
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w_expand"], ["e"]),
        n("BatchNormalization", ["e", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["bn"]),
        n("Clip", ["bn", "lo", "hi"], ["r6"]),
        n("Conv", ["r6", "w_dw", "b_dw"], ["dw"], group=2 * C, pads=[1, 1, 1, 1]),
        n("GlobalAveragePool", ["dw"], ["pooled"]),
        n("Conv", ["pooled", "w_se1"], ["s1"]),
        n("Relu", ["s1"], ["s2"]),
        n("Conv", ["s2", "w_se2"], ["s3"]),
        n("HardSigmoid", ["s3"], ["gate"]),
        n("Mul", ["dw", "gate"], ["gated"]),
        n("Conv", ["gated", "w_project"], ["p"]),
        n("Add", ["p", "x"], ["res"]),
        n("Conv", ["res", "w_k3"], ["k3"], pads=[1, 1, 1, 1]),
        n("Concat", ["k3", "res"], ["cat"], axis=1),
        n("Reshape", ["cat", "split"], ["s5"]),
        n("Transpose", ["s5"], ["t5"], perm=[0, 2, 1, 3, 4]),
        n("Reshape", ["t5", "merge"], ["shuffled"]),
        n("Conv", ["shuffled", "w_group"], ["grouped"], group=2),
        n("MaxPool", ["shuffled"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
        n("AveragePool", ["shuffled"], ["ap"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
        n("Add", ["mp", "ap"], ["pools"]),
        n("Sigmoid", ["pools"], ["sg"]),
        n("ReduceMean", ["sg"], ["m"], axes=[2, 3], keepdims=0),
        n("Gemm", ["m", "w_head"], ["y"]),
    ]
    weights = _weights(dtype)
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", kind, [2, C, 9, 9])],
        [
            helper.make_tensor_value_info("y", kind, None),
            helper.make_tensor_value_info("grouped", kind, None),
            helper.make_tensor_value_info("dw", kind, None),
        ],
        initializer=[*inits, lo, hi, split, merge],
    )
    feeds = {"x": RNG.normal(size=(2, C, 9, 9)).astype(dtype)}
    return graph, feeds


def _both(graph: Any) -> tuple[GraphFunction, GraphFunction]:
    on = GraphFunction(graph, opsets={"": 17})
    off = GraphFunction(graph, opsets={"": 17}, passes=PASS_NAMES - {"channels_last"})
    return on, off


def test_a_mobile_block_computes_the_channels_first_values_and_gradients_in_float64() -> None:
    with jax.enable_x64(True):
        graph, feeds = _block()
        on, off = _both(graph)
        ours, theirs = on(feeds), off(feeds)
        for a, b in zip(ours, theirs, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)

        def loss(fn: GraphFunction) -> Any:
            def of(params: dict[str, Any], x: Any) -> Any:
                y, grouped, dw = fn.apply({"x": x}, params)
                return jnp.sum(jnp.sin(y)) + jnp.sum(grouped**2) + jnp.sum(jnp.tanh(dw))

            return jax.grad(of, argnums=(0, 1))

        params = {k: jnp.asarray(v) for k, v in on.params.items()}
        (g_on, x_on), (g_off, x_off) = (loss(f)(params, feeds["x"]) for f in (on, off))
        assert set(_weights(np.float64)) <= set(g_on)
        for name in g_on:
            np.testing.assert_allclose(g_on[name], g_off[name], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(x_on, x_off, rtol=1e-10, atol=1e-12)


def test_the_block_equals_onnxruntime_and_its_values_are_held_channels_last() -> None:
    graph, feeds = _block(np.float32)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    on, _ = _both(graph)
    for a, b in zip(on(feeds), want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    env = dict(on.static)
    env.update({k: jnp.asarray(v) for k, v in on.params.items()})
    env["x"] = jnp.asarray(feeds["x"])
    on.evaluate(env)
    held = {name for name, value in env.items() if isinstance(value, ChannelsLast)}
    # every value from the first conv to the shuffle is held so, the shuffle's with 2 axes
    assert {"e", "bn", "r6", "dw", "pooled", "gate", "gated", "res", "k3", "cat", "mp"} <= held
    assert env["s5"].channels == 2 and env["shuffled"].channels == 1
    assert not held & {"grouped", "ap", "m"}  # channels-first: their ops' own
    assert materialize(env["cat"]).shape == (2, 2 * C, 9, 9)


def test_a_transpose_from_channels_last_starts_a_region_without_moving_anything() -> None:
    """tf2onnx's idiom: the model's input is NHWC, a Transpose before the first Conv."""
    w = numpy_helper.from_array(RNG.normal(size=(4, 3, 3, 3)).astype(np.float32), "w")
    dw = numpy_helper.from_array(RNG.normal(size=(4, 1, 3, 3)).astype(np.float32), "dw")
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["t", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c", "dw"], ["d"], pads=[1, 1, 1, 1], group=4),
        helper.make_node("Relu", ["d"], ["r"]),
        helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 3, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "tf",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 6, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[w, dw],
    )
    feeds = {"x": RNG.normal(size=(2, 6, 6, 3)).astype(np.float32)}
    on, off = _both(graph)
    np.testing.assert_allclose(on(feeds)[0], off(feeds)[0], rtol=1e-5, atol=1e-5)
    text = jax.jit(lambda x: on.apply({"x": x})).lower(feeds["x"]).as_text()
    assert "stablehlo.transpose %arg0" not in text  # x read as it lies
    assert (
        "stablehlo.transpose %arg0"
        in jax.jit(lambda x: off.apply({"x": x})).lower(feeds["x"]).as_text()
    )


@pytest.mark.parametrize(
    "attrs, w_shape",
    [
        ({"group": 6, "strides": [2, 1], "pads": [0, 1, 2, 1]}, (12, 1, 3, 2)),  # multiplier 2
        ({"group": 6, "dilations": [2, 2], "pads": [2, 2, 2, 2]}, (6, 1, 3, 3)),
        ({"strides": [2, 2]}, (5, 6, 1, 1)),  # a strided 1x1
        ({"pads": [1, 0, 0, 1]}, (5, 6, 2, 2)),
    ],
)
def test_channels_last_convs_equal_onnxruntime(attrs: dict[str, Any], w_shape: tuple) -> None:
    w = numpy_helper.from_array(RNG.normal(size=w_shape).astype(np.float32), "w")
    b = numpy_helper.from_array(RNG.normal(size=w_shape[:1]).astype(np.float32), "b")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6, 7, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": RNG.normal(size=(3, 6, 7, 8)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    on, _ = _both(graph)
    np.testing.assert_allclose(on(feeds)[0], want.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def test_a_bad_conv_in_a_region_names_its_node() -> None:
    """The checks are Conv's own, on the shape the held value stands for."""
    w1 = numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w1")
    w2 = numpy_helper.from_array(np.ones((4, 5, 3, 3), np.float32), "w2")  # 5 != 4 channels
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="first"),
        helper.make_node("Conv", ["a", "w2"], ["y"], name="second"),
    ]
    graph = helper.make_graph(
        nodes,
        "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[w1, w2],
    )
    with pytest.raises(ValueError, match=r"'second'.*X of shape \[1, 4, 5, 5\]"):
        on, _ = _both(graph)
        on({"x": np.ones((1, 3, 5, 5), np.float32)})


def test_a_network_without_depthwise_convs_keeps_every_value_channels_first() -> None:
    """Regions pay where depthwise convs are (``has_depthwise_conv``); elsewhere the pass
    changes nothing (light_resnet50 took 1.39x the time with them)."""
    w = numpy_helper.from_array(RNG.normal(size=(C, C, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[w],
    )
    on, _ = _both(graph)
    env = {**on.static, **{k: jnp.asarray(v) for k, v in on.params.items()}}
    env["x"] = jnp.ones((1, C, 5, 5), jnp.float32)
    on.evaluate(env)
    assert not any(isinstance(value, ChannelsLast) for value in env.values())
