"""Hostile shapes and attributes against the nn and reduction ops (issue 20, items 2, 6 and 7).

Each test is a finding of the audit, and fails on f9a32ac:

- memory bombs (2): outputs computed by numpy from trace-time constants, and host
  arrays the size of a declared input, before any size check (MatMul, the
  reductions of an empty constant, AveragePool's Python loop over output
  positions, MaxPool's index constant, Dropout's mask), and a ConvTranspose
  stride that overflowed XLA's shapes (an abort);
- silent wrong results (6): shapes and attributes onnxruntime refuses that we
  computed (negative pads, a ConvTranspose output beyond its natural size or an
  output_padding not below the stride, BatchNormalization on a rank-1 X, statistics,
  biases and scales of the wrong shape, a Conv window larger than its padded input,
  ...), and windows onnxruntime computes that we got wrong (a pool window past the
  padded input, dilated taps that miss X, ConvTranspose's output_shape);
- exceptions outside the promised set (7): a table of attribute values 0, negative
  and huge, each ending in onnxruntime's result or a ValueError/TypeError naming
  the node (ZeroDivisionError and lax's own errors before).

Expected values are onnxruntime's, running the same model (the ONNX reference
evaluator where onnxruntime departs from the spec, said at each such test), never
our own output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto  # noqa: E402

from onnx_optax import backend  # noqa: E402
from tests.support.builders import run_capped as _outcome  # noqa: E402
from tests.support.node_models import NAMED, F, assert_as_onnxruntime, node_model, theirs  # noqa: E402
from tests.support.node_models import random_floats as _random  # noqa: E402


@pytest.mark.parametrize(
    ("op", "declared", "attrs"),
    [
        # a Python loop over 2**28 output positions and float64 pads: a hang in prepare
        ("AveragePool", ([1, 1, 2**28], TensorProto.FLOAT), {"kernel_shape": [3], "pads": [1, 1]}),
        # the flat indices, a numpy int32 constant 4 times the input's size
        ("MaxPool", ([1, 1, 2**30], TensorProto.UINT8), {"kernel_shape": [2]}),
        # the mask, a numpy array of the input's shape built while tracing
        ("Dropout", ([2**33], TensorProto.FLOAT16), {}),
    ],
)
def test_ops_on_a_large_declared_input_prepare_without_host_arrays_of_its_size(
    op: str, declared: tuple[list[int], int], attrs: dict[str, Any]
) -> None:
    outputs = (declared[1], TensorProto.INT64) if op == "MaxPool" else (declared[1],)
    if op == "Dropout":
        outputs = (declared[1], TensorProto.BOOL)
    found = _outcome(
        f"""
        import time
        from onnx_optax import backend
        from tests.support.node_models import node_model

        start = time.perf_counter()
        backend.prepare(node_model({op!r}, {{"x": {declared!r}}}, {attrs!r}, outputs={outputs!r}))
        print("RESULT prepared in", time.perf_counter() - start)
        """,
        timeout=90,
    )
    assert "RESULT prepared" in found, found


@pytest.mark.parametrize("stride", [2**31, 2**62])
def test_conv_transpose_with_an_overflowing_stride_is_refused_not_aborted(stride: int) -> None:
    # strides [2**62, 1] with output_shape [7, 7]: pads crop a natural size beyond int64,
    # whose shape XLA computed and aborted on (SIGABRT); at 2**31 a 7 x 7 crop of 2**33 rows.
    found = _outcome(f"""
        import numpy as np
        from onnx_optax import backend
        from tests.support.node_models import node_model

        x, w = np.ones((1, 2, 5, 5), np.float32), np.ones((2, 2, 3, 3), np.float32)
        model = node_model(
            "ConvTranspose", {{"x": x, "w": w}}, {{"strides": [{stride}, 1], "output_shape": [7, 7]}}
        )
        try:
            backend.prepare(model).run({{"x": x, "w": w}})
            print("RESULT ran")
        except ValueError as error:
            print("RESULT ValueError", error)
    """)
    assert "RESULT ValueError node 'n' (ai.onnx.ConvTranspose)" in found, found
    assert "uncropped output" in found, found


# name -> (op, input shapes, attributes): each one onnxruntime refuses and f9a32ac computed
REFUSED_BY_ONNXRUNTIME: dict[str, tuple[str, dict[str, list[int]], dict[str, Any]]] = {
    "ConvTranspose output_shape beyond the natural size": (
        "ConvTranspose",
        {"x": [1, 1, 3, 3], "w": [1, 1, 3, 3]},
        {"output_shape": [9, 9]},
    ),
    "ConvTranspose output_shape beyond natural + stride": (
        "ConvTranspose",
        {"x": [1, 1, 3, 3], "w": [1, 1, 3, 3]},
        {"strides": [3, 3], "output_shape": [12, 12]},
    ),
    "ConvTranspose negative pads": (
        "ConvTranspose",
        {"x": [1, 1, 3, 3], "w": [1, 1, 3, 3]},
        {"pads": [-1, -1, -1, -1]},
    ),
    "ConvTranspose output_padding == stride": (
        "ConvTranspose",
        {"x": [1, 1, 3, 3], "w": [1, 1, 3, 3]},
        {"strides": [2, 2], "output_padding": [2, 2]},
    ),
    "ConvTranspose output_padding < dilation, >= stride": (
        "ConvTranspose",
        {"x": [1, 1, 3, 3], "w": [1, 1, 3, 3]},
        {"strides": [2, 2], "dilations": [3, 3], "output_padding": [2, 2]},
    ),
    "ConvTranspose pads beyond the output": (
        "ConvTranspose",
        {"x": [1, 1, 3, 3], "w": [1, 1, 3, 3]},
        {"pads": [3, 3, 2, 2]},
    ),
    "ConvTranspose kernel_shape unlike W": (
        "ConvTranspose",
        {"x": [1, 1, 3, 3], "w": [1, 1, 3, 3]},
        {"kernel_shape": [2, 2]},
    ),
    "ConvTranspose bias of one value": (
        "ConvTranspose",
        {"x": [1, 1, 3, 3], "w": [1, 2, 3, 3], "b": [1]},
        {},
    ),
    "ConvTranspose output_shape of rank 4": (
        "ConvTranspose",
        {"x": [1, 1, 3, 3], "w": [1, 1, 3, 3]},
        {"strides": [3, 3], "output_shape": [1, 1, 10, 10]},
    ),
    "Conv kernel larger than X": ("Conv", {"x": [1, 1, 3, 3], "w": [1, 1, 4, 4]}, {}),
    "Conv kernel larger than X, stride 2": (
        "Conv",
        {"x": [1, 1, 3, 3], "w": [1, 1, 4, 4]},
        {"strides": [2, 2]},
    ),
    "Conv kernel larger than padded X": (
        "Conv",
        {"x": [1, 1, 3, 3], "w": [1, 1, 6, 6]},
        {"pads": [1, 1, 1, 1]},
    ),
    "Conv dilated kernel larger than X": (
        "Conv",
        {"x": [1, 1, 5, 5], "w": [1, 1, 3, 3]},
        {"dilations": [3, 3]},
    ),
    "Conv negative pads": ("Conv", {"x": [1, 1, 5, 5], "w": [1, 1, 3, 3]}, {"pads": [-1, 0, 0, 0]}),
    "Conv kernel_shape unlike W": (
        "Conv",
        {"x": [1, 1, 5, 5], "w": [1, 1, 3, 3]},
        {"kernel_shape": [2, 2]},
    ),
    "Conv bias of one value": ("Conv", {"x": [1, 1, 5, 5], "w": [2, 1, 3, 3], "b": [1]}, {}),
    "Conv kernel_shape 0": (
        "Conv",
        {"x": [1, 2, 5, 5], "w": [2, 2, 3, 3]},
        {"kernel_shape": [0, 2]},
    ),
    "Conv empty spatial axis": ("Conv", {"x": [1, 1, 0, 3], "w": [1, 1, 1, 1]}, {}),
    "MaxPool negative pads": (
        "MaxPool",
        {"x": [1, 1, 5, 5]},
        {"kernel_shape": [2, 2], "pads": [-1, 0, 0, 0]},
    ),
    "MaxPool pads as large as the kernel": (
        "MaxPool",
        {"x": [1, 1, 5, 5]},
        {"kernel_shape": [2, 2], "pads": [2, 0, 0, 0]},
    ),
    "AveragePool pads as large as the kernel": (
        "AveragePool",
        {"x": [1, 1, 5, 5]},
        {"kernel_shape": [2, 2], "pads": [2, 0, 0, 0]},
    ),
    "MaxPool window far larger than X": ("MaxPool", {"x": [1, 1, 3]}, {"kernel_shape": [8]}),
    "AveragePool window far larger than X": (
        "AveragePool",
        {"x": [1, 1, 3]},
        {"kernel_shape": [7], "strides": [2], "ceil_mode": 1},
    ),
    "MaxPool empty spatial axis": ("MaxPool", {"x": [1, 1, 0]}, {"kernel_shape": [1]}),
    "MaxPool huge dilation": (
        "MaxPool",
        {"x": [1, 2, 5, 5]},
        {"kernel_shape": [2, 2], "dilations": [2**31, 1]},
    ),
    "GlobalAveragePool empty spatial axis": ("GlobalAveragePool", {"x": [1, 1, 0]}, {}),
    "GlobalAveragePool rank 2": ("GlobalAveragePool", {"x": [1, 3]}, {}),
    "BatchNormalization rank-1 X": (
        "BatchNormalization",
        {"x": [3], "s": [3], "b": [3], "m": [3], "v": [3]},
        {},
    ),
    "BatchNormalization scale of one value": (
        "BatchNormalization",
        {"x": [2, 3, 4], "s": [1], "b": [3], "m": [3], "v": [3]},
        {},
    ),
    "BatchNormalization mean of shape [3, 1]": (
        "BatchNormalization",
        {"x": [4, 3, 2], "s": [3], "b": [3], "m": [3, 1], "v": [3]},
        {},
    ),
    "InstanceNormalization rank-2 X": (
        "InstanceNormalization",
        {"x": [2, 3], "s": [3], "b": [3]},
        {},
    ),
    "InstanceNormalization scale of one value": (
        "InstanceNormalization",
        {"x": [2, 3, 4], "s": [1], "b": [3]},
        {},
    ),
    "LayerNormalization scale of higher rank": ("LayerNormalization", {"x": [3], "s": [2, 3]}, {}),
    "LayerNormalization bias of higher rank": (
        "LayerNormalization",
        {"x": [2, 3], "s": [3], "b": [1, 2, 3]},
        {},
    ),
    "Gemm rank-1 A": ("Gemm", {"a": [3], "b": [3, 4]}, {}),
    "Gemm rank-3 A": ("Gemm", {"a": [2, 2, 3], "b": [3, 4]}, {}),
    "Gemm C of higher rank": ("Gemm", {"a": [2, 3], "b": [3, 4], "c": [5, 2, 4]}, {}),
}


@pytest.mark.parametrize("case", REFUSED_BY_ONNXRUNTIME)
def test_what_onnxruntime_refuses_is_refused_naming_the_node_and_shapes(case: str) -> None:
    op, shapes, attrs = REFUSED_BY_ONNXRUNTIME[case]
    rng = np.random.default_rng(0)
    feeds = {k: np.abs(_random(rng, s)) if k == "v" else _random(rng, s) for k, s in shapes.items()}
    model = node_model(op, feeds, attrs)
    assert theirs(model, feeds) is None  # onnxruntime refuses it
    with pytest.raises(ValueError, match=NAMED) as error:
        backend.prepare(model).run(feeds)
    assert "shape" in str(error.value) or "pads" in str(error.value), error.value


# name -> (op, inputs, attributes): onnxruntime computes each, f9a32ac gave other values
COMPUTED_BY_ONNXRUNTIME: dict[str, tuple[str, dict[str, np.ndarray], dict[str, Any]]] = {
    # pads 0 and zeros at the end; f9a32ac split the excess as negative pads (a shift)
    "ConvTranspose output_shape within the stride of the natural size": (
        "ConvTranspose",
        {"x": np.arange(1, 4, dtype=np.float32)[None, None], "w": np.ones((1, 1, 3), np.float32)},
        {"strides": [3], "output_shape": [11]},
    ),
    "ConvTranspose output_shape within the stride, kernel 1": (
        "ConvTranspose",
        {"x": np.arange(1, 4, dtype=np.float32)[None, None], "w": np.ones((1, 1, 1), np.float32)},
        {"strides": [3], "output_shape": [9]},
    ),
    # (1 - 2) / 3 rounds to 0: one window over X and past its end; f9a32ac gave none
    "AveragePool window past the end of X": (
        "AveragePool",
        {"x": np.array([[[2.0]]], np.float32)},
        {"kernel_shape": [2], "strides": [3], "count_include_pad": 1},
    ),
    "MaxPool window past the end of X": (
        "MaxPool",
        {"x": np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)},
        {"kernel_shape": [3, 1], "strides": [3, 2], "dilations": [2, 1]},
    ),
    # dilated taps that skip X: onnxruntime's 0 and lowest float; f9a32ac gave NaN and -inf
    "AveragePool window of padding only": (
        "AveragePool",
        {"x": np.array([[[5.0]]], np.float32)},
        {"kernel_shape": [2], "dilations": [2], "pads": [1, 1]},
    ),
    "MaxPool window of padding only": (
        "MaxPool",
        {"x": np.array([[[5.0]]], np.float32)},
        {"kernel_shape": [2], "dilations": [2], "pads": [1, 1]},
    ),
    # an empty axis has nothing to pick (f9a32ac: a ValueError from argmax)
    "Hardmax over an empty axis": ("Hardmax", {"x": np.zeros((2, 0), np.float32)}, {}),
}


@pytest.mark.parametrize("case", COMPUTED_BY_ONNXRUNTIME)
def test_what_onnxruntime_computes_is_computed_alike(case: str) -> None:
    op, feeds, attrs = COMPUTED_BY_ONNXRUNTIME[case]
    model = node_model(op, feeds, attrs)
    expected = theirs(model, feeds)
    assert expected is not None
    assert_as_onnxruntime(model, feeds, expected)


def test_max_pool_window_of_padding_only_points_at_no_element() -> None:
    # Values as onnxruntime (the lowest float); the index is -1, as onnxruntime's in 1-D
    # (in 2-D it gives -(W + 1), from its row arithmetic: no element either).
    feeds = {"x": np.array([[[5.0]]], np.float32)}
    attrs = {"kernel_shape": [2], "dilations": [2], "pads": [1, 1]}
    model = node_model("MaxPool", feeds, attrs, outputs=(F, TensorProto.INT64))
    expected = theirs(model, feeds)
    assert expected is not None and expected[1].tolist() == [[[-1]]]
    assert_as_onnxruntime(model, feeds, expected)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_same_pooling_that_needs_a_negative_pad_is_refused(op: str, auto_pad: str) -> None:
    # kernel 1, stride 5 over 5: the spec's SAME pad is -4. onnxruntime refuses MaxPool
    # ("padding values must be non-negative") and starts AveragePool's window 2 late
    # (x[2], not x[0]); the ONNX reference refuses AveragePool. f9a32ac clamped it to 0.
    feeds = {"x": np.arange(5, dtype=np.float32)[None, None]}
    attrs = {"kernel_shape": [1], "strides": [5], "auto_pad": auto_pad}
    with pytest.raises(ValueError, match=rf"{NAMED}: auto_pad {auto_pad} needs a negative pad"):
        backend.prepare(node_model(op, feeds, attrs)).run(feeds)
    # a pad of -1 starts no window late: computed, as onnxruntime (with indices asked)
    feeds = {"x": np.arange(6, dtype=np.float32)[None, None]}
    attrs = {"kernel_shape": [1], "strides": [4], "auto_pad": auto_pad}
    types = (F, TensorProto.INT64) if op == "MaxPool" else (F,)
    assert_as_onnxruntime(node_model(op, feeds, attrs, outputs=types), feeds)


# ----------------------------------------------------------------------------- random windows


def _pool_case(rng: np.random.Generator, op: str, same: bool) -> tuple[dict[str, Any], list[int]]:
    n = int(rng.integers(1, 4))
    spatial = [int(rng.integers(1, 9)) for _ in range(n)]
    kernel = [int(rng.integers(1, 5)) for _ in range(n)]
    attrs: dict[str, Any] = {"kernel_shape": kernel}
    if rng.random() < 0.7:
        attrs["strides"] = [int(rng.integers(1, 4)) for _ in range(n)]
    if same:  # onnxruntime's SAME pools leave dilations out of the pad (see below)
        attrs["auto_pad"] = str(rng.choice(["SAME_UPPER", "SAME_LOWER"]))
    else:
        if rng.random() < 0.5:
            attrs["dilations"] = [int(rng.integers(1, 3)) for _ in range(n)]
        if rng.random() < 0.75:
            attrs["pads"] = [int(rng.integers(0, k)) for k in kernel * 2]
        elif rng.random() < 0.5:
            attrs["auto_pad"] = "VALID"
    if rng.random() < 0.5:
        attrs["ceil_mode"] = 1
    if op == "AveragePool" and rng.random() < 0.5:
        attrs["count_include_pad"] = 1
    if op == "MaxPool" and rng.random() < 0.3:
        attrs["storage_order"] = 1
    return attrs, spatial


@pytest.mark.parametrize("same", [False, True], ids=["pads", "same"])
@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
def test_random_pools_equal_onnxruntime(op: str, same: bool) -> None:
    """Pads, strides, dilations, ceil_mode, count_include_pad and storage_order drawn at
    random; MaxPool asks for the indices (onnxruntime's path for them also takes the SAME
    pads of -1 its plain MaxPool refuses) and they are compared where onnxruntime's point
    at an element."""
    rng = np.random.default_rng(20 + same)
    for _ in range(40):
        attrs, spatial = _pool_case(rng, op, same)
        feeds = {"x": _random(rng, [2, 3, *spatial])}
        types = (F, TensorProto.INT64) if op == "MaxPool" else (F,)
        model = node_model(op, feeds, attrs, outputs=types)
        expected = theirs(model, feeds)
        if expected is not None and op == "MaxPool":
            got = backend.prepare(model).run(feeds)
            np.testing.assert_allclose(got[0], expected[0], rtol=1e-6, err_msg=str(attrs))
            pointed = expected[1] >= 0
            np.testing.assert_array_equal(got[1][pointed], expected[1][pointed], str(attrs))
            continue
        assert_as_onnxruntime(model, feeds, expected)


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_random_convolutions_equal_onnxruntime(op: str) -> None:
    """Groups, kernel_shape, strides, dilations, pads, output_padding and output_shape at
    random (auto_pad where onnxruntime follows the spec: see the tests below)."""
    rng = np.random.default_rng(30)
    for _ in range(40):
        n = int(rng.integers(1, 4))
        spatial = [int(rng.integers(1, 7)) for _ in range(n)]
        kernel = [int(rng.integers(1, 4)) for _ in range(n)]
        group = int(rng.choice([1, 1, 2]))
        c, m = group * int(rng.integers(1, 3)), group * int(rng.integers(1, 3))
        attrs: dict[str, Any] = {"group": group}
        if rng.random() < 0.3:
            attrs["kernel_shape"] = kernel
        strides = [int(rng.integers(1, 4)) for _ in range(n)]
        attrs["strides"] = strides
        if rng.random() < 0.4:
            attrs["dilations"] = [int(rng.integers(1, 3)) for _ in range(n)]
        if rng.random() < 0.6:
            attrs["pads"] = [int(rng.integers(0, 3)) for _ in range(2 * n)]
        elif op == "Conv" and "dilations" not in attrs:
            attrs["auto_pad"] = str(rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
        if op == "ConvTranspose":
            if rng.random() < 0.4:
                attrs["output_padding"] = [int(rng.integers(0, s + 1)) for s in strides]
            if rng.random() < 0.3:
                attrs["output_shape"] = [int(rng.integers(1, 14)) for _ in range(n)]
        w_shape = [c, m // group, *kernel] if op == "ConvTranspose" else [m, c // group, *kernel]
        feeds = {"x": _random(rng, [2, c, *spatial]), "w": _random(rng, w_shape)}
        if rng.random() < 0.5:
            feeds["b"] = _random(rng, [m])
        assert_as_onnxruntime(node_model(op, feeds, attrs), feeds)


def _reference(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[Any]:
    from onnx.reference import ReferenceEvaluator

    return list(ReferenceEvaluator(model).run(None, dict(feeds)))


@pytest.mark.parametrize(
    ("op", "attrs", "x_shape", "w_shape", "pads"),
    [
        # onnxruntime: "Dilation not supported for AutoPadType::SAME_UPPER or SAME_LOWER"
        (
            "Conv",
            {"dilations": [2, 2], "auto_pad": "SAME_UPPER"},
            [1, 1, 7, 7],
            [1, 1, 3, 3],
            [2] * 4,
        ),
        # onnxruntime leaves the dilation out of a SAME pool's pad: 5 windows, not ceil(7 / 1)
        (
            "MaxPool",
            {"kernel_shape": [3], "dilations": [2], "auto_pad": "SAME_UPPER"},
            [1, 1, 7],
            None,
            [2, 2],
        ),
        (
            "AveragePool",
            {"kernel_shape": [3], "dilations": [2], "auto_pad": "SAME_LOWER", "strides": [2]},
            [1, 1, 8],
            None,
            [2, 1],
        ),
    ],
)
def test_same_with_dilations_pads_as_the_spec_says(
    op: str, attrs: dict[str, Any], x_shape: list[int], w_shape: list[int] | None, pads: list[int]
) -> None:
    """The spec's SAME pad counts the dilated window: ``(ceil(in / s) - 1) * s + (k - 1) * d
    + 1 - in``, split toward the end (SAME_UPPER) or the start (SAME_LOWER). Expected:
    onnxruntime running the same node with those pads written out."""
    rng = np.random.default_rng(1)
    feeds = {"x": _random(rng, x_shape)}
    if w_shape is not None:
        feeds["w"] = _random(rng, w_shape)
    explicit = {k: v for k, v in attrs.items() if k != "auto_pad"} | {"pads": pads}
    expected = theirs(node_model(op, feeds, explicit), feeds)
    assert expected is not None
    own = theirs(node_model(op, feeds, attrs), feeds)  # onnxruntime's own SAME
    assert own is None or own[0].shape != expected[0].shape
    assert_as_onnxruntime(node_model(op, feeds, attrs), feeds, expected)


@pytest.mark.parametrize(("auto_pad", "stride"), [("SAME_UPPER", 2), ("SAME_LOWER", 3)])
def test_conv_transpose_same_with_a_kernel_shorter_than_the_stride_is_in_times_stride(
    auto_pad: str, stride: int
) -> None:
    # The spec's SAME output is in * stride (6, 9); onnxruntime gives the natural size (5, 7).
    # Expected: the ONNX reference evaluator.
    feeds = {
        "x": np.arange(1, 4, dtype=np.float32)[None, None],
        "w": np.ones((1, 1, 1), np.float32),
    }
    model = node_model("ConvTranspose", feeds, {"strides": [stride], "auto_pad": auto_pad})
    expected = _reference(model, feeds)
    assert expected[0].shape == (1, 1, 3 * stride)
    assert_as_onnxruntime(model, feeds, expected)
