"""Grouped and depthwise Conv/ConvTranspose: the CPU lowering as shifted multiply-adds (issue 21).

On CPU, ``Conv`` lowers a group of few input channels as a sum over the kernel's
taps of strided slices times weights (``convolution.shifted_conv``), and a group of more
channels, a 1x1 kernel or a small output as one matrix product of the stacked taps
(``convolution.patches_conv``), not XLA's grouped conv. Expected values here never come from that path: they are XLA's native
``lax.conv_general_dilated`` with ``feature_group_count``, written out in each
test with its pads computed from the ONNX spec, and onnxruntime running the
same one-node model. Gradients are JAX's of both lowerings.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from onnx_optax import backend
from onnx_optax._src.ops import convolution
from onnx_optax._src.ops.registry import Node

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

# name -> (X's shape, W's shape, attributes): group is X's channels over W.shape[1]
GEOMETRIES: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = {
    "depthwise 3x3": ((2, 6, 7, 8), (6, 1, 3, 3), dict(pads=[1, 1, 1, 1])),
    "depthwise asymmetric pads": ((1, 4, 6, 9), (4, 1, 3, 3), dict(pads=[0, 2, 1, 0])),
    "depthwise stride 2": ((2, 5, 9, 8), (5, 1, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    "depthwise dilation 2": (
        (1, 3, 9, 10),
        (3, 1, 3, 3),
        dict(dilations=[2, 2], pads=[2, 1, 2, 1]),
    ),
    "depthwise 5x3 stride 2x1 dilation 1x2": (
        (2, 4, 11, 9),
        (4, 1, 5, 3),
        dict(strides=[2, 1], dilations=[1, 2], pads=[2, 0, 1, 3]),
    ),
    "depthwise multiplier 3": ((2, 4, 6, 6), (12, 1, 3, 3), dict(pads=[1, 1, 1, 1])),
    "SAME_UPPER stride 2": (
        (1, 6, 7, 8),
        (6, 1, 3, 3),
        dict(auto_pad="SAME_UPPER", strides=[2, 2]),
    ),
    "SAME_LOWER stride 2": (
        (1, 6, 7, 8),
        (6, 1, 4, 2),
        dict(auto_pad="SAME_LOWER", strides=[2, 2]),
    ),
    "VALID": ((2, 6, 7, 8), (6, 1, 3, 3), dict(auto_pad="VALID")),
    "2 channels a group": ((2, 8, 7, 7), (8, 2, 3, 3), dict(pads=[1, 1, 1, 1])),
    "4 channels a group, 2 outputs each": ((1, 8, 6, 7), (4, 4, 2, 3), dict(strides=[1, 2])),
    "8 channels a group": ((1, 16, 5, 5), (16, 8, 2, 2), dict(pads=[1, 0, 0, 1])),
    "6 channels a group, stride 2, dilation 2x1": (
        (2, 12, 9, 8),
        (6, 6, 3, 3),
        dict(strides=[2, 2], dilations=[2, 1], pads=[2, 1, 1, 2]),
    ),
    "1x1, 12 channels a group, stride 2": (
        (2, 24, 7, 6),
        (10, 12, 1, 1),
        dict(strides=[2, 2], pads=[1, 0, 0, 1]),
    ),
    "1x1, 16 channels a group, SAME_LOWER": (
        (1, 64, 5, 5),
        (8, 16, 1, 1),
        dict(auto_pad="SAME_LOWER", strides=[2, 1]),
    ),
    "1-D depthwise": ((3, 5, 17), (5, 1, 5), dict(pads=[2, 1], strides=[2])),
    "1-D 2 a group dilated": ((2, 6, 16), (9, 2, 3), dict(dilations=[3], pads=[0, 4])),
    "3-D depthwise": ((1, 3, 5, 6, 4), (3, 1, 3, 3, 2), dict(pads=[1, 1, 0, 1, 0, 1])),
    "16 channels a group, 3x3": ((2, 32, 6, 5), (8, 16, 3, 3), dict(pads=[1, 1, 1, 1])),
    # one group: a matrix product on CPU for 1x1 kernels and small outputs
    "one group, 1x1 stride 2": (
        (2, 6, 7, 6),
        (5, 6, 1, 1),
        dict(strides=[2, 2], pads=[1, 0, 0, 1]),
    ),
    "one group, 3x3 dilation 2x1": (
        (2, 5, 8, 9),
        (4, 5, 3, 3),
        dict(dilations=[2, 1], pads=[2, 0, 1, 1]),
    ),
    "one group, 1-D stride 2": ((2, 4, 15), (6, 4, 5), dict(strides=[2], pads=[2, 1])),
    "one group, 3-D": ((1, 3, 5, 4, 4), (4, 3, 2, 3, 2), dict(pads=[1, 0, 1, 0, 1, 0])),
}


def _same_pads(x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any]) -> list[int]:
    """The ONNX spec's SAME pads (begin..., end...), the extra one at the end for SAME_UPPER."""
    n = len(x) - 2
    strides = attrs.get("strides", [1] * n)
    dilations = attrs.get("dilations", [1] * n)
    begins, ends = [], []
    for size, k, s, d in zip(x[2:], w[2:], strides, dilations, strict=True):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small = total // 2
        first = small if attrs["auto_pad"] == "SAME_UPPER" else total - small
        begins.append(first)
        ends.append(total - first)
    return begins + ends


def _native(x: Any, w: Any, b: Any, xs: tuple[int, ...], attrs: dict[str, Any]) -> Any:
    """The expected Conv: XLA's grouped conv, pads from the attributes as the spec says."""
    n = len(xs) - 2
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad == "VALID":
        pads = [0] * 2 * n
    elif auto_pad.startswith("SAME"):
        pads = _same_pads(xs, w.shape, attrs)
    else:
        pads = attrs.get("pads", [0] * 2 * n)
    y = lax.conv_general_dilated(
        x,
        w,
        window_strides=attrs.get("strides", [1] * n),
        padding=[(pads[i], pads[i + n]) for i in range(n)],
        rhs_dilation=attrs.get("dilations", [1] * n),
        feature_group_count=xs[1] // w.shape[1],
    )
    return y + b.reshape((1, -1) + (1,) * n)


def _node(xs: tuple[int, ...], ws: tuple[int, ...], attrs: dict[str, Any]) -> Node:
    full = dict(auto_pad="NOTSET", dilations=None, kernel_shape=None, pads=None, strides=None)
    group = attrs["group"] if "group" in attrs else xs[1] // ws[1]
    return Node({**full, **attrs, "group": group}, 21, "node 'n' (ai.onnx.Conv)", 1)


def _inputs(case: str, dtype: Any) -> tuple[Any, ...]:
    xs, ws, _ = GEOMETRIES[case]
    rng = np.random.default_rng(sorted(GEOMETRIES).index(case))
    x = jnp.asarray(rng.standard_normal(xs), dtype)
    w = jnp.asarray(rng.standard_normal(ws), dtype)
    b = jnp.asarray(rng.standard_normal(ws[0]), dtype)
    return x, w, b


def _tolerance(dtype: str) -> dict[str, float]:
    return dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", GEOMETRIES)
def test_conv_equals_the_native_grouped_conv_and_so_do_its_gradients(case: str, dtype: str) -> None:
    xs, ws, attrs = GEOMETRIES[case]
    node = _node(xs, ws, attrs)
    x, w, b = _inputs(case, dtype)
    ours = jax.jit(lambda x, w, b: convolution.convolve(node, x, w, b))
    want = jax.jit(lambda *a: _native(*a, xs, attrs))(x, w, b)
    assert want.dtype == x.dtype
    got = ours(x, w, b)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, **_tolerance(dtype))
    if dtype == "float32":  # the gradients' sums are the same in float64, checked tighter
        return
    # the gradient of sum(Y * R) wrt X, W and B, through jit
    r = jnp.asarray(np.random.default_rng(1).standard_normal(want.shape), dtype)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(convolution.convolve(node, *a) * r), (0, 1, 2)))(
        x, w, b
    )
    expected = jax.jit(jax.grad(lambda *a: jnp.sum(_native(*a, xs, attrs) * r), (0, 1, 2)))(x, w, b)
    for ours_g, want_g in zip(grads, expected, strict=True):
        assert ours_g.dtype == want_g.dtype
        np.testing.assert_allclose(ours_g, want_g, **_tolerance(dtype))


def test_groups_lower_without_a_convolution_on_cpu_unless_their_window_is_large() -> None:
    """The rewrite is what the CPU runs for small groups (else the tests above test XLA twice)."""
    xs, ws, attrs = GEOMETRIES["depthwise 3x3"]
    x, w, b = _inputs("depthwise 3x3", "float32")
    node = _node(xs, ws, attrs)
    hlo = jax.jit(lambda x, w, b: convolution.convolve(node, x, w, b)).lower(x, w, b).as_text()
    assert "convolution" not in hlo
    big = convolution.SHIFTED_CHANNELS + 1
    for ws, native in (((4, big, 3, 3), False), ((4, 2, 12, 12), True)):  # beyond SHIFTED_TERMS
        xs = (1, 2 * ws[1], 12, 12)
        x, w = jnp.ones(xs, jnp.float32), jnp.ones(ws, jnp.float32)
        node = _node(xs, ws, {})
        hlo = (
            jax.jit(lambda x, w, node=node: convolution.convolve(node, x, w)).lower(x, w).as_text()
        )
        assert ("convolution" in hlo) == native
    # one group: a product for 1x1 kernels and few stacked taps, else XLA's own
    side = 3 + math.isqrt(convolution.PATCHES_ELEMENTS // 18)  # 2 channels x 9 taps: too many
    for xs, ws, native in (
        ((1, 2, 5, 5), (4, 2, 3, 3), False),
        ((1, 2, side, side), (4, 2, 1, 1), False),
        ((1, 2, side, side), (4, 2, 3, 3), True),
    ):
        x, w = jnp.ones(xs, jnp.float32), jnp.ones(ws, jnp.float32)
        node = _node(xs, ws, {"group": 1})
        hlo = (
            jax.jit(lambda x, w, node=node: convolution.convolve(node, x, w)).lower(x, w).as_text()
        )
        assert ("convolution" in hlo) == native, (xs, ws)


def test_stacked_taps_are_written_once_at_batch_above_one() -> None:
    """The taps' stack is built in the order its product reads it: the compiled CPU run
    holds one value of the stack's size, not the stack and a copy that moves the batch
    axis inside (taps copied one by one, past STACKED_IN_ONE)."""
    xs, ws = (4, 8, 30, 30), (16, 8, 3, 3)
    assert 9 * math.prod(xs) > convolution.STACKED_IN_ONE
    cpu = jax.devices("cpu")[0]  # the rewrite is the CPU's (and so is this test)
    x, w = (jax.device_put(jnp.ones(s, jnp.float32), cpu) for s in (xs, ws))
    node = _node(xs, ws, {"pads": [1, 1, 1, 1]})
    text = jax.jit(lambda x, w: convolution.convolve(node, x, w)).lower(x, w).compile().as_text()
    entry = text[text.index("\nENTRY") :]  # the run's own values, not the fused bodies'
    stacks = [
        line
        for line in entry.splitlines()
        if (shape := re.match(r"\s*(?:ROOT )?%\S+ = f32\[([\d,]+)\]\S* (\S+?)\(", line))
        and math.prod(int(d) for d in shape.group(1).split(",")) == 9 * math.prod(xs)
        and shape.group(2) != "bitcast"
    ]
    assert len(stacks) == 1, stacks


def test_gpu_lowering_keeps_the_native_conv_forward_and_backward() -> None:
    """Lowered for CUDA (no GPU needed), only XLA's conv is left, in the gradient too;
    traced on a CPU-only JAX outside ``every_platform()``, only the CPU's lowering."""
    xs, ws, attrs = GEOMETRIES["depthwise 3x3"]
    x, w, b = _inputs("depthwise 3x3", "float32")
    node = _node(xs, ws, attrs)
    loss = lambda x, w: jnp.sum(convolution.convolve(node, x, w, b))  # noqa: E731
    for fn in (lambda x, w: convolution.convolve(node, x, w, b), jax.grad(loss, (0, 1))):
        with convolution.every_platform():
            traced = jax.jit(fn).trace(x, w)
        text = traced.lower(lowering_platforms=("cuda",)).as_text()
        assert "convolution" in text and "stablehlo.slice" not in text
        text = traced.lower(lowering_platforms=("cpu",)).as_text()
        assert "convolution" not in text and "stablehlo.slice" in text
        assert (
            jax.default_backend() != "cpu"
            or "convolution"
            not in jax.jit(fn).trace(x, w).lower(lowering_platforms=("cpu",)).as_text()
        )


@pytest.mark.parametrize("kernel", [1, 3])
def test_groups_of_no_channel_give_zeros(kernel: int) -> None:
    xs, ws = (1, 0, 5, 5), (4, 0, kernel, kernel)
    x, w = jnp.ones(xs, jnp.float32), jnp.ones(ws, jnp.float32)
    got = jax.jit(lambda x, w: convolution.convolve(_node(xs, ws, {"group": 2}), x, w))(x, w)
    np.testing.assert_array_equal(got, np.zeros((1, 4, 6 - kernel, 6 - kernel), np.float32))


def test_half_precision_sums_in_float32() -> None:
    x, w, b = _inputs("depthwise 5x3 stride 2x1 dilation 1x2", "float32")
    xs, ws, attrs = GEOMETRIES["depthwise 5x3 stride 2x1 dilation 1x2"]
    x16, w16, b16 = (v.astype(jnp.bfloat16) for v in (x, w, b))
    got = jax.jit(lambda *a: convolution.convolve(_node(xs, ws, attrs), *a))(x16, w16, b16)
    assert got.dtype == jnp.bfloat16
    want = _native(*(v.astype(jnp.float32) for v in (x16, w16, b16)), xs, attrs)
    np.testing.assert_allclose(got.astype(jnp.float32), want, rtol=1e-2, atol=2e-2)


def _one_node(op: str, x: np.ndarray, w: np.ndarray, b: np.ndarray, **attrs: Any) -> Any:
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, list(v.shape))
        for name, v in (("x", x), ("w", w), ("b", b))
    ]
    node = helper.make_node(op, ["x", "w", "b"], ["y"], name="n", **attrs)
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [f"d{i}" for i in range(x.ndim)])
    graph = helper.make_graph([node], "g", inputs, [output])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize(
    "case",
    [
        "depthwise asymmetric pads",
        "depthwise 5x3 stride 2x1 dilation 1x2",
        "depthwise multiplier 3",
        "SAME_UPPER stride 2",
        "SAME_LOWER stride 2",
        "4 channels a group, 2 outputs each",
        "6 channels a group, stride 2, dilation 2x1",
        "1x1, 12 channels a group, stride 2",
        "1-D 2 a group dilated",
    ],
)
def test_conv_model_equals_onnxruntime(case: str) -> None:
    xs, ws, attrs = GEOMETRIES[case]
    x, w, b = (np.asarray(v) for v in _inputs(case, "float32"))
    model = _one_node("Conv", x, w, b, group=xs[1] // ws[1], **attrs)
    feeds = {"x": x, "w": w, "b": b}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, feeds)
    (got,) = backend.prepare(model).run(feeds)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


# X's shape, W's shape (C, M / group, k...), group, attributes
TRANSPOSED = [
    ((1, 6, 5, 4), (6, 1, 3, 3), 6, dict(strides=[2, 2], pads=[1, 0, 0, 1])),
    ((2, 4, 4, 5), (4, 2, 3, 2), 2, dict(strides=[2, 1], dilations=[1, 2], output_padding=[1, 0])),
    ((1, 6, 7), (6, 1, 4), 3, dict(strides=[3], auto_pad="SAME_UPPER")),
]


@pytest.mark.parametrize("xs, ws, group, attrs", TRANSPOSED)
def test_grouped_conv_transpose_model_equals_onnxruntime(
    xs: tuple[int, ...], ws: tuple[int, ...], group: int, attrs: dict[str, Any]
) -> None:
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal(xs, np.float32), rng.standard_normal(ws, np.float32)
    b = rng.standard_normal(ws[1] * group, np.float32)
    model = _one_node("ConvTranspose", x, w, b, group=group, **attrs)
    feeds = {"x": x, "w": w, "b": b}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, feeds)
    (got,) = backend.prepare(model).run(feeds)
    assert np.asarray(got).shape == want.shape
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


# A Conv whose X is a Transpose of a channels-last tensor (tf2onnx writes one before every
# Conv) stacks its taps channels-last on CPU: name -> (the Transpose's input shape, perm,
# W's shape, attributes, whether that path is taken)
CHANNELS_LAST: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], dict, bool]] = {
    "NHWC to NCHW, 3x3 stride 2": (
        (2, 7, 6, 16),
        (0, 3, 1, 2),
        (5, 16, 3, 3),
        dict(strides=[2, 2], pads=[1, 0, 1, 1]),
        True,
    ),
    "magika's 1-D conv on (N, L, C, 1)": ((2, 12, 16, 1), (0, 2, 1, 3), (8, 16, 5, 1), {}, True),
    "NWC to NCW, dilation 2": ((2, 11, 16), (0, 2, 1), (4, 16, 3), dict(dilations=[2]), True),
    "1x1 stride 2": ((1, 5, 5, 16), (0, 3, 1, 2), (8, 16, 1, 1), dict(strides=[2, 2]), True),
    "3-D NDHWC": ((1, 4, 3, 5, 16), (0, 4, 1, 2, 3), (3, 16, 2, 2, 3), {}, True),
    # not a channels-last source: the spatial axes swapped, or too few channels
    "H and W swapped": ((1, 6, 5, 16), (0, 3, 2, 1), (4, 16, 3, 3), {}, False),
    "3 channels": ((1, 6, 5, 3), (0, 3, 1, 2), (4, 3, 3, 3), {}, False),
}


@pytest.mark.parametrize("case", CHANNELS_LAST)
def test_conv_of_a_channels_last_transpose_equals_the_native_conv(case: str) -> None:
    source_shape, perm, ws, attrs, taken = CHANNELS_LAST[case]
    rng = np.random.default_rng(sorted(CHANNELS_LAST).index(case))
    with jax.enable_x64(True):
        source = jnp.asarray(rng.standard_normal(source_shape))
        w = jnp.asarray(rng.standard_normal(ws))
        b = jnp.asarray(rng.standard_normal(ws[0]))
        xs = tuple(source_shape[a] for a in perm)
        full = dict(auto_pad="NOTSET", dilations=None, kernel_shape=None, pads=None, strides=None)
        node = Node({**full, **attrs, "group": 1}, 21, "node 'n' (ai.onnx.Conv)", 1)
        fed = dataclasses.replace(node, input_perms=(perm, None, None))
        assert convolution.reads_channels_last(fed, jnp.transpose(source, perm)) == taken
        assert not convolution.reads_channels_last(node, jnp.transpose(source, perm))

        def ours(source: Any, w: Any, b: Any) -> Any:
            return convolution.convolve(fed, jnp.transpose(source, perm), w, b)

        def native(source: Any, w: Any, b: Any) -> Any:
            return _native(jnp.transpose(source, perm), w, b, xs, attrs)

        got, want = jax.jit(ours)(source, w, b), jax.jit(native)(source, w, b)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        r = jnp.asarray(rng.standard_normal(want.shape))
        grads = jax.jit(jax.grad(lambda *a: jnp.sum(ours(*a) * r), (0, 1, 2)))(source, w, b)
        expected = jax.jit(jax.grad(lambda *a: jnp.sum(native(*a) * r), (0, 1, 2)))(source, w, b)
        for ours_g, want_g in zip(grads, expected, strict=True):
            np.testing.assert_allclose(ours_g, want_g, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "case", ["NHWC to NCHW, 3x3 stride 2", "magika's 1-D conv on (N, L, C, 1)"]
)
def test_a_transpose_then_conv_model_equals_onnxruntime(case: str) -> None:
    """The graph tells the Conv which Transpose computed its X (Node.input_perms)."""
    source_shape, perm, ws, attrs, _ = CHANNELS_LAST[case]
    rng = np.random.default_rng(3)
    source = rng.standard_normal(source_shape, np.float32)
    w, b = rng.standard_normal(ws, np.float32), rng.standard_normal(ws[0], np.float32)
    nodes = [
        helper.make_node("Transpose", ["s"], ["x"], perm=list(perm)),
        helper.make_node("Conv", ["x", "w", "b"], ["y"], name="n", **attrs),
    ]
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, list(v.shape))
        for name, v in (("s", source), ("w", w), ("b", b))
    ]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "m", *"hwd"[: w.ndim - 2]])
    graph = helper.make_graph(nodes, "g", inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    feeds = {"s": source, "w": w, "b": b}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, feeds)
    prepared = backend.prepare(model)
    (conv_step,) = [s for s in prepared.graph.order if s.node.op_type == "Conv"]
    assert conv_step.info.input_perms == (tuple(perm), None, None)
    (got,) = prepared.run(feeds)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_a_small_stack_of_nine_taps_is_concatenated_eight_at_most_at_a_time() -> None:
    """XLA:CPU fuses a concatenation of at most 8 operands into one kernel (convolution._stacked)."""
    geometry = convolution.Geometry([1, 1], [(1, 1), (1, 1)], [1, 1], [1, 1], 1)
    x, w = jnp.ones((1, 16, 7, 7), jnp.float32), jnp.ones((4, 16, 3, 3), jnp.float32)
    for channels_last in (False, True):
        text = (
            jax.jit(
                lambda x, w, cl=channels_last: convolution.patches_conv(
                    x, w, geometry, channels_last=cl
                )
            )
            .lower(x, w)
            .as_text()
        )
        widths = [
            line.split("concatenate", 1)[1].split("dim", 1)[0].count("%")
            for line in text.splitlines()
            if "stablehlo.concatenate" in line
        ]
        assert widths and max(widths) <= convolution.FUSED_OPERANDS, widths
