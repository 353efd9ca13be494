"""Graphs that XLA:CPU's own lowering got wrong or ran slowly, and that onnx_optax works around.

Each expected value is computed here in numpy, by onnxruntime or by XLA's direct
lowering (``lax.conv_general_dilated``) written out in the test; each graph is
what an exporter writes (ONNX's light SqueezeNet holds its weights as
ConstantOfShape nodes; tf2onnx writes a 1-D conv on [N, C, T, 1]).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax._src.ops import convolution  # noqa: E402
from onnx_optax._src.ops.registry import Node  # noqa: E402


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


# X's shape, W's shape, pads, strides, dilations: some spatial axes of one element, kernel 1
FLAT_CONVS: dict[str, tuple[tuple[int, ...], tuple[int, ...], list[int], list[int], list[int]]] = {
    "magika's [N, C, T, 1]": ((2, 6, 13, 1), (4, 6, 5, 1), [0, 0, 0, 0], [1, 1], [1, 1]),
    "[N, C, 1, T] padded, strided, dilated": (
        (2, 6, 1, 13),
        (4, 6, 1, 3),
        [0, 2, 0, 1],
        [1, 2],
        [1, 2],
    ),
    "3-D, two flat axes": (
        (2, 4, 1, 9, 1),
        (3, 4, 1, 3, 1),
        [0, 1, 0, 0, 1, 0],
        [1, 1, 1],
        [1] * 3,
    ),
    "every axis flat: one is kept": ((3, 5, 1, 1), (2, 5, 1, 1), [0] * 4, [1, 1], [1, 1]),
    "a flat axis padded: kept": ((2, 6, 1, 7), (4, 6, 1, 3), [1, 0, 1, 0], [1, 1], [1, 1]),
}


@pytest.mark.parametrize("case", FLAT_CONVS)
def test_a_conv_with_axes_of_one_element_equals_the_direct_conv(case: str) -> None:
    """Conv drops the spatial axes that X and W hold one element of (XLA:CPU ran magika's
    1-D conv 3-4x slower with its trailing axis of 1): the same output as onnxruntime and
    as XLA's conv on every axis, and the same gradients as the direct conv's."""
    xs, ws, pads, strides, dilations = FLAT_CONVS[case]
    n = len(xs) - 2
    rng = np.random.default_rng(len(case))
    x, w = (rng.standard_normal(s).astype(np.float32) for s in (xs, ws))
    b = rng.standard_normal(ws[0]).astype(np.float32)

    def direct(x: Any, w: Any, b: Any) -> Any:
        y = lax.conv_general_dilated(
            x, w, strides, [(pads[i], pads[i + n]) for i in range(n)], rhs_dilation=dilations
        )
        return y + b.reshape((1, -1) + (1,) * n)

    attrs: dict[str, Any] = dict(pads=pads, strides=strides, dilations=dilations)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "flat_conv",
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, v.shape)
            for name, v in [("x", x), ("w", w), ("b", b)]
        ],
        [
            helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, jax.eval_shape(direct, x, w, b).shape
            )
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    feeds = {"x": x, "w": w, "b": b}
    (want,) = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    (got,) = backend.prepare(model).run(feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    np.testing.assert_allclose(jax.jit(direct)(x, w, b), want, rtol=1e-5, atol=1e-5)
    full = dict(auto_pad="NOTSET", kernel_shape=None, group=1, **attrs)
    op = Node(full, 13, "node 'n' (ai.onnx.Conv)", 1)
    r = rng.standard_normal(want.shape).astype(np.float32)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(convolution.convolve(op, *a) * r), (0, 1, 2)))(
        x, w, b
    )
    expected = jax.jit(jax.grad(lambda *a: jnp.sum(direct(*a) * r), (0, 1, 2)))(x, w, b)
    for ours, theirs in zip(grads, expected, strict=True):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    # the conv XLA is given reads X without the dropped axes (on the CPU a small output
    # is a matrix product, no conv: the lowering for a GPU has XLA's)
    with convolution.every_platform():
        traced = jax.jit(lambda x, w: convolution.convolve(op, x, w)).trace(x, w)
    hlo = "\n".join(traced.lower(lowering_platforms=(p,)).as_text() for p in ("cpu", "cuda"))
    flat = [d for d in range(n) if xs[2 + d] == ws[2 + d] == 1 and pads[d] == pads[d + n] == 0]
    dropped = flat if len(flat) < n else flat[1:]
    kept = [xs[2 + d] for d in range(n) if d not in dropped]
    squeezed = "x".join(str(size) for size in (*xs[:2], *kept))
    # on the CPU X is read channels-last (kernels over 1 tap), elsewhere as it is
    last = "x".join(str(size) for size in (xs[0], *kept, xs[1]))
    lines = [line for line in hlo.splitlines() if "stablehlo.convolution" in line]
    assert lines
    for line in lines:
        assert f"(tensor<{squeezed}xf32>" in line or f"(tensor<{last}xf32>" in line, line


@pytest.mark.parametrize("kernel", [[3], [3, 3], [2, 3, 3]])
def test_a_channels_last_conv_whose_weight_is_a_constant_of_shape_then_a_mean(
    kernel: list[int],
) -> None:
    """On the CPU a conv of a kernel over 1 tap runs channels-last. With the barrier on the
    transposed weight only, XLA:CPU (jaxlib 0.10.2) dropped that barrier, fused the conv of
    the broadcast constant weight with the mean into one YNNPACK fusion and read garbage
    (-8e28 where the mean is 16; light_squeezenet's softmax NaN)."""
    spatial = [5 + k for k in kernel]
    x = np.random.default_rng(0).random((1, 64, *spatial)).astype(np.float32)
    shape = helper.make_tensor("shape", TensorProto.INT64, [2 + len(kernel)], [300, 64, *kernel])
    half = helper.make_tensor("half", TensorProto.FLOAT, [1], [0.5])
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["w"], value=half),
        helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=kernel),
        helper.make_node("GlobalAveragePool", ["y"], ["m"]),
    ]
    ones = [1] * len(kernel)
    graph = helper.make_graph(
        nodes,
        "channels_last_conv_of_a_constant",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 300, *ones])],
        initializer=[shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    got = backend.prepare(model).run([x])[0]
    # every output is 0.5 x the sum of its window over all channels
    summed = x.astype(np.float64).sum(1)[0]
    windows = np.lib.stride_tricks.sliding_window_view(summed, kernel)
    mean = 0.5 * windows.sum(tuple(range(-len(kernel), 0))).mean()
    np.testing.assert_allclose(got, np.full((1, 300, *ones), mean), rtol=1e-5)


# X's shape, W's shape, pads, strides, dilations
CHANNELS_LAST: dict[
    str, tuple[tuple[int, ...], tuple[int, ...], list[int], list[int], list[int]]
] = {
    "1-D": ((2, 5, 11), (4, 5, 3), [1, 2], [2], [1]),
    "2-D strided, dilated": ((2, 5, 9, 8), (4, 5, 3, 2), [1, 0, 2, 1], [2, 1], [1, 2]),
    "3-D": ((1, 3, 5, 6, 4), (2, 3, 2, 3, 2), [0, 1, 1, 1, 0, 0], [1, 2, 1], [1, 1, 2]),
}


@pytest.mark.parametrize("case", CHANNELS_LAST)
def test_the_channels_last_conv_equals_the_direct_conv(case: str) -> None:
    """The CPU's channels-last lowering: XLA's direct NCHW conv's output and gradients."""
    xs, ws, pads, strides, dilations = CHANNELS_LAST[case]
    n = len(xs) - 2
    rng = np.random.default_rng(len(case))
    x, w = (rng.standard_normal(s).astype(np.float32) for s in (xs, ws))
    padding = [(pads[i], pads[i + n]) for i in range(n)]

    def direct(x: Any, w: Any) -> Any:
        return lax.conv_general_dilated(x, w, strides, padding, rhs_dilation=dilations)

    def ours(x: Any, w: Any) -> Any:
        return convolution.channels_last_conv(
            x, w, convolution.Geometry(strides, padding, [1] * n, dilations, 1)
        )

    want = jax.jit(direct)(x, w)
    np.testing.assert_allclose(jax.jit(ours)(x, w), want, rtol=1e-5, atol=1e-5)
    r = rng.standard_normal(want.shape).astype(np.float32)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(ours(*a) * r), (0, 1)))(x, w)
    expected = jax.jit(jax.grad(lambda *a: jnp.sum(direct(*a) * r), (0, 1)))(x, w)
    for mine, theirs in zip(grads, expected, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-5)
    # dW: one matrix product a tap (JAX's own rule: a convolution over the batch)
    only_w = jax.jit(jax.grad(lambda w: jnp.sum(ours(x, w) * r))).lower(w).as_text()
    assert only_w.count("stablehlo.dot_general") == math.prod(ws[2:])
    # forward mode too (the rule is a JVP)
    dx, dw = (rng.standard_normal(s).astype(np.float32) for s in (xs, ws))
    _, mine = jax.jit(lambda *a: jax.jvp(ours, (x, w), a))(dx, dw)
    _, theirs = jax.jit(lambda *a: jax.jvp(direct, (x, w), a))(dx, dw)
    np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-5)
