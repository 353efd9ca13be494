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

import re
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import backend  # noqa: E402

HUGE = (2**31, 2**62)  # beyond int32; near int64's end
NAMED = r"node 'n' \(ai\.onnx\.\w+\)"


def node_model(
    op: str,
    feeds: Mapping[str, np.ndarray | tuple[list[int], int]],
    attrs: Mapping[str, Any] | None = None,
    *,
    consts: Mapping[str, np.ndarray] | None = None,
    opset: int = 21,
    outputs: tuple[int, ...] = (TensorProto.FLOAT,),
    rank: int | None = None,
) -> onnx.ModelProto:
    """One node named 'n' over graph inputs (arrays or declared (shape, type)) and initializers.

    Its outputs are declared of the given types and of ``rank`` symbolic dimensions
    (the first input's rank by default).
    """
    consts = dict(consts or {})
    inputs = []
    for name, value in feeds.items():
        shape, elem = (
            (list(value.shape), helper.np_dtype_to_tensor_dtype(value.dtype))
            if isinstance(value, np.ndarray)
            else value
        )
        inputs.append(helper.make_tensor_value_info(name, elem, shape))
    if rank is None:
        first = next(iter(feeds.values()), None) if feeds else next(iter(consts.values()))
        rank = np.ndim(first) if isinstance(first, np.ndarray) else len(first[0])  # type: ignore[index]
    names = [f"y{i}" for i in range(len(outputs))]
    node = helper.make_node(op, [*feeds, *consts], names, name="n", **dict(attrs or {}))
    graph = helper.make_graph(
        [node],
        "g",
        inputs,
        [
            helper.make_tensor_value_info(y, elem, [f"{y}_{i}" for i in range(rank)])
            for y, elem in zip(names, outputs, strict=True)
        ],
        initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def theirs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[Any] | None:
    """onnxruntime's outputs, or None where it refuses the model."""
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        return list(session.run(None, dict(feeds)))
    except Exception:  # onnxruntime's own error types
        return None


def assert_as_onnxruntime(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], expected: list[Any] | None = None
) -> None:
    """Our outcome is onnxruntime's: its outputs (shape, dtype, values), or a ValueError or
    TypeError naming the node where onnxruntime refuses the model."""
    expected = theirs(model, feeds) if expected is None else expected
    if expected is None:
        with pytest.raises((ValueError, TypeError), match=NAMED):
            backend.prepare(model).run(dict(feeds))
        return
    got = backend.prepare(model).run(dict(feeds))
    assert len(got) == len(expected)
    for ours, want in zip(got, expected, strict=True):
        ours = np.asarray(ours)
        assert ours.shape == want.shape, (ours.shape, want.shape)
        assert ours.dtype == want.dtype
        np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)


def _random(rng: np.random.Generator, shape: list[int]) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# ----------------------------------------------------------------------------- 2. memory


def _outcome(script: str, timeout: float = 120) -> str:
    """Runs ``script`` in a fresh interpreter under a 4 GiB data limit (as the audit).

    A hang, an abort or a huge allocation (before the fixes) must not take pytest down.
    """
    root = Path(__file__).parent.parent
    limit = "import resource; resource.setrlimit(resource.RLIMIT_DATA, (4 << 30, 4 << 30))\n"
    done = subprocess.run(
        [sys.executable, "-c", limit + textwrap.dedent(script)],
        cwd=root,
        env={"PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def folded_model(
    op: str, shapes: list[list[int]], attrs: Mapping[str, Any] | None = None, **consts: np.ndarray
) -> onnx.ModelProto:
    """A few hundred bytes: ``op`` (node 'n') over ConstantOfShape fills of ``shapes`` (ones,
    trace-time constants) and integer initializers ``consts`` (also trace-time)."""
    nodes, names = [], []
    for i, shape in enumerate(shapes):
        nodes.append(helper.make_node("Constant", [], [f"s{i}"], value_ints=shape))
        one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
        nodes.append(helper.make_node("ConstantOfShape", [f"s{i}"], [f"c{i}"], value=one))
        names.append(f"c{i}")
    nodes.append(helper.make_node(op, [*names, *consts], ["y"], name="n", **dict(attrs or {})))
    graph = helper.make_graph(
        nodes,
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])],
        initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


_FOLDED = """
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    import numpy as np
    from onnx_optax import backend
    from tests.test_hostile_nn import folded_model

    try:
        rep = backend.prepare(folded_model({args}), limits=backend.Limits(tensor_bytes={limit}))
        print("RESULT prepared")
        rep.run({{}})
        print("RESULT ran")
    except ValueError as error:
        print("RESULT ValueError", error)
"""


def test_matmul_of_constant_vectors_is_not_computed_on_the_host() -> None:
    # [65536, 1] x [1, 65536] of ConstantOfShape fills: a 16 GiB product (the limit, so
    # allowed) that numpy computed while tracing (MemoryError from a 300-byte file). It is
    # computed on the device now, whose memory (4 GiB here) refuses it with a ValueError.
    found = _outcome(_FOLDED.format(args='"MatMul", [[65536, 1], [1, 65536]]', limit=2**34))
    assert "RESULT prepared" in found, found
    assert "RESULT ValueError the graph of outputs ['y'] does not fit in the device's" in found


def test_matmul_of_constants_beyond_the_limit_is_refused_before_multiplying() -> None:
    # The same under a 1 GiB tensor limit: refused before numpy multiplied (MemoryError).
    found = _outcome(_FOLDED.format(args='"MatMul", [[65536, 1], [1, 65536]]', limit=2**30))
    assert "RESULT ValueError node 'n' (ai.onnx.MatMul)" in found, found
    assert "[65536, 65536]" in found and "tensor_bytes" in found, found


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceProd", "ReduceLogSumExp"])
@pytest.mark.parametrize("width", [2**30, 2**40])
def test_a_reduction_of_an_empty_constant_is_not_filled_on_the_host(op: str, width: int) -> None:
    # Reducing axis 0 of a [0, width] constant (zero bytes) gives width elements: numpy
    # filled them while tracing (4 GiB within the limit, 4 TiB beyond it: MemoryError).
    axes = "axes=np.array([0], np.int64)"
    found = _outcome(_FOLDED.format(args=f'"{op}", [[0, {width}]], {axes}', limit=2**34))
    if width > 2**32:
        assert f"RESULT ValueError node 'n' (ai.onnx.{op})" in found, found
        assert "tensor_bytes" in found, found
    else:
        assert "RESULT prepared" in found, found


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
        from tests.test_hostile_nn import node_model

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
        from tests.test_hostile_nn import node_model

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


# ----------------------------------------------------------------------------- 6. silent results

F = TensorProto.FLOAT
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


# ----------------------------------------------------------------------------- 7. attributes


def _attribute_cases() -> dict[str, tuple[str, dict[str, list[int]], dict[str, Any], int]]:
    """name -> (op, input shapes, attributes, opset): every attribute at 0, -1, -3 and huge."""
    conv = {"x": [1, 2, 5, 5], "w": [2, 2, 3, 3]}
    pool = {"x": [1, 2, 5, 5]}
    cases: dict[str, tuple[str, dict[str, list[int]], dict[str, Any], int]] = {}
    for value in (0, -1, -3, *HUGE):
        for op, shapes, base in (
            ("Conv", conv, {}),
            ("ConvTranspose", conv, {}),
            ("MaxPool", pool, {"kernel_shape": [2, 2]}),
            ("AveragePool", pool, {"kernel_shape": [2, 2]}),
        ):
            names = ["strides", "dilations", "kernel_shape", "pads"]
            names += ["group"] if op.startswith("Conv") else ["ceil_mode"]
            names += ["output_padding", "output_shape"] if op == "ConvTranspose" else []
            for name in names:
                if name in ("group", "ceil_mode"):
                    attrs = {**base, name: value}
                elif name == "pads":
                    attrs = {**base, name: [value, 0, 0, value]}
                elif name == "kernel_shape":
                    attrs = {**base, name: [value, 2 if op.endswith("Pool") else 3]}
                else:
                    attrs = {**base, name: [value, 1 if name != "output_shape" else 5]}
                cases[f"{op} {name}={value}"] = (op, shapes, attrs, 21)
                if name == "strides":  # the SAME pads and ceil_mode divide by the stride
                    same = {**attrs, "auto_pad": "SAME_UPPER"}
                    cases[f"{op} {name}={value} SAME_UPPER"] = (op, shapes, same, 21)
                    if op.endswith("Pool"):
                        ceil = {**attrs, "ceil_mode": 1}
                        cases[f"{op} {name}={value} ceil_mode"] = (op, shapes, ceil, 21)
        gemm = {"a": [3, 2], "b": [3, 4]}
        cases[f"Gemm transA={value}"] = ("Gemm", gemm, {"transA": value}, 21)
        cases[f"Gemm transB={value}"] = ("Gemm", {"a": [2, 3], "b": [4, 3]}, {"transB": value}, 21)
        x = {"x": [2, 3, 4]}
        for op in ("Softmax", "LogSoftmax", "Hardmax"):
            cases[f"{op} axis={value}"] = (op, x, {"axis": value}, 21)
            cases[f"{op} axis={value} opset 11"] = (op, x, {"axis": value}, 11)
        cases[f"Flatten axis={value}"] = ("Flatten", x, {"axis": value}, 21)
        cases[f"ReduceMean axes=[{value}]"] = ("ReduceMean", x, {"axes": [value]}, 13)
        cases[f"ArgMax axis={value}"] = ("ArgMax", x, {"axis": value}, 13)
    return cases


ATTRIBUTE_CASES = _attribute_cases()
# where onnxruntime's own arithmetic overflows: the result must equal the one for 2**31
OVERFLOWS_IN_ONNXRUNTIME = {f"Conv strides={2**62} SAME_UPPER": f"Conv strides={2**31} SAME_UPPER"}


@pytest.mark.parametrize("case", ATTRIBUTE_CASES)
def test_attribute_values_end_in_onnxruntimes_result_or_a_named_error(case: str) -> None:
    """A ValueError or TypeError naming the node, or (where onnxruntime computes too) its
    result: never another exception, an abort or a hang."""
    op, shapes, attrs, opset = ATTRIBUTE_CASES[case]
    rng = np.random.default_rng(0)
    feeds = {k: _random(rng, s) for k, s in shapes.items()}
    types = (TensorProto.INT64,) if op == "ArgMax" else (F,)
    model = node_model(op, feeds, attrs, opset=opset, outputs=types)
    try:
        got = backend.prepare(model).run(feeds)
    except (ValueError, TypeError) as error:
        assert re.match(NAMED, str(error)), error
        return
    twin = OVERFLOWS_IN_ONNXRUNTIME.get(case, case)
    op, shapes, attrs, opset = ATTRIBUTE_CASES[twin]
    expected = theirs(node_model(op, feeds, attrs, opset=opset, outputs=types), feeds)
    assert expected is not None, f"computed {[np.shape(g) for g in got]}; onnxruntime refuses"
    assert_as_onnxruntime(model, feeds, expected)


# ----------------------------------------------------------------------------- 11. fuzzer findings
# Found by the op-level mutations of tests/fuzz_mutations.py (issue 20, item 11); each case
# marked so fails on c038037.

SCALAR_CASES: dict[str, tuple[str, dict[str, np.ndarray], dict[str, Any], int]] = {
    # IndexError on c038037: a scalar was given the axis 0 of rank 1
    "ArgMax": ("ArgMax", {}, {"axis": 0}, 21),
    "ReduceSum axes [0]": ("ReduceSum", {"axes": np.array([0], np.int64)}, {}, 21),
    "ReduceMax axes [0]": ("ReduceMax", {"axes": np.array([0], np.int64)}, {}, 21),
    "ReduceMean axes=[0]": ("ReduceMean", {}, {"axes": [0]}, 13),
    # computed on c038037 (1.0, and the scalar normalized) where onnxruntime refuses
    "Softmax opset 11": ("Softmax", {}, {"axis": 0}, 11),
    "LayerNormalization": ("LayerNormalization", {"s": np.ones((), np.float32)}, {"axis": 0}, 21),
    # refused on c038037 too (by lax, for the same reason), kept beside them
    "Softmax": ("Softmax", {}, {"axis": -1}, 21),
}


@pytest.mark.parametrize("case", SCALAR_CASES)
def test_an_axis_of_a_scalar_is_refused_as_onnxruntime_refuses_it(case: str) -> None:
    op, consts, attrs, opset = SCALAR_CASES[case]
    feeds = {"x": np.array(2.0, np.float32)}
    types = (TensorProto.INT64,) if op == "ArgMax" else (F,)
    model = node_model(op, feeds, attrs, consts=consts, opset=opset, outputs=types)
    assert theirs(model, feeds) is None  # onnxruntime refuses it
    with pytest.raises(ValueError, match=rf"{NAMED}: axis -?[01] is out of range for rank 0"):
        backend.prepare(model).run(feeds)
