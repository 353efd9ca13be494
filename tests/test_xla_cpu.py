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
