"""Graphs that XLA:CPU's own lowering got wrong, and that onnx_optax works around.

Each expected value is computed here in numpy; each graph is what an exporter
writes (ONNX's light SqueezeNet holds its weights as ConstantOfShape nodes).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx import TensorProto, helper

from onnx_optax import backend


@pytest.mark.parametrize("channels", [64, 512])
def test_a_conv_whose_weight_is_a_constant_of_shape_then_a_mean(channels: int) -> None:
    """XLA:CPU (jaxlib 0.10.2, its YNNPACK fusion) turned a conv with a broadcast constant
    weight followed by a reduction into code that read garbage: NaN, 0 or -3.9e34 where
    the mean is 128."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [4], [1000, channels, 1, 1])
    half = helper.make_tensor("half", TensorProto.FLOAT, [1], [0.5])
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["w"], value=half),
        helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1]),
        helper.make_node("GlobalAveragePool", ["y"], ["m"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_of_a_constant",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 5, 5])],
        [helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 1000, 1, 1])],
        initializer=[shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.random.default_rng(0).random((1, channels, 5, 5)).astype(np.float32)
    got = backend.prepare(model).run([x])[0]
    expected = np.full((1, 1000, 1, 1), 0.5 * x.astype(np.float64).sum(1).mean())
    np.testing.assert_allclose(got, expected, rtol=1e-5)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_a_softmax_of_a_mean_of_large_values(op: str) -> None:
    """light_squeezenet's head: GlobalAveragePool then Softmax of logits near 6.5e9, all
    equal. XLA:CPU recomputed the mean's product by 1/169 in the fusion that subtracts
    the max, where LLVM contracted the two into an FMA: ``x - max(x)`` came out 221, not
    0, and the softmax NaN."""
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["m"]),
        helper.make_node(op, ["m"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "softmax_of_a_mean",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1000, 13, 13])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1000, 1, 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    rep = backend.prepare(model)
    rng = np.random.default_rng(0)
    for scale in (1e8, 1e9, 6e9, 3e10):
        row = rng.random((1, 1, 13, 13)) * scale + scale
        x = np.broadcast_to(row, (1, 1000, 13, 13)).astype(np.float32)
        got = rep.run([x])[0]
        uniform = np.full((1, 1000, 1, 1), 1e-3)
        expected = uniform if op == "Softmax" else np.log(uniform)
        np.testing.assert_allclose(got, expected, rtol=1e-5, err_msg=f"scale {scale}")
