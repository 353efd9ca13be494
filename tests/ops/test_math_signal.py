"""The math, normalization, layout and signal ops added for issue 23, beyond ONNX's node cases.

Expected values come from numpy written here (``np.fft``, ``np.linalg.det``, numpy's
windows) or onnxruntime; gradients of the differentiable ops against float64 central
differences; refusals name the node.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, shape_inference  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax._src.graph import GraphFunction  # noqa: E402
from tests.support.finite_differences import assert_graph_gradients  # noqa: E402

RNG = np.random.default_rng(0)


def op_model(
    op: str,
    feeds: dict[str, np.ndarray],
    opset: int,
    domain: str = "",
    rank: int | None = None,
    out_dtype: Any = None,
    **attrs: Any,
) -> Any:
    """One node named 'n' reading ``feeds`` (graph inputs; '' skips an optional input)."""
    node = helper.make_node(op, list(feeds), ["y"], name="n", domain=domain, **attrs)
    inputs = [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)
        )
        for name, value in feeds.items()
        if name
    ]
    first = next(value for value in feeds.values() if value.size)
    kind = helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype or first.dtype))
    shape = None if rank is None else [None] * rank
    output = helper.make_value_info("y", helper.make_tensor_type_proto(kind, shape=shape))
    graph = helper.make_graph([node], "g", inputs, [output])
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    # the output's shape (the checker wants one): its rank, or as onnx's inference gives it
    model = helper.make_model(graph, opset_imports=imports)
    return model if rank is not None else shape_inference.infer_shapes(model)


def run(op: str, feeds: dict[str, np.ndarray], opset: int = 24, **attrs: Any) -> np.ndarray:
    given = {name: value for name, value in feeds.items() if name}
    with jax.enable_x64(True):
        return np.asarray(backend.prepare(op_model(op, feeds, opset, **attrs)).run(given)[0])


def refused(
    op: str, feeds: dict[str, np.ndarray], message: str, opset: int = 24, **attrs: Any
) -> None:
    given = {name: value for name, value in feeds.items() if name}
    with (
        jax.enable_x64(True),
        pytest.raises(ValueError, match=rf"'n' \(ai\.onnx\.{op}\).*{message}"),
    ):
        backend.prepare(op_model(op, feeds, opset, **attrs)).run(given)


# ----------------------------------------------------------------------------- values


def test_dft_pads_and_cuts_to_dft_length_as_numpy() -> None:
    x = RNG.standard_normal((2, 7, 3, 2))
    signal = x[..., 0] + 1j * x[..., 1]
    for length in (4, 7, 11):
        y = run("DFT", {"x": x, "n": np.array(length, np.int64), "axis": np.array(1)}, opset=20)
        expected = np.fft.fft(signal, n=length, axis=1)
        np.testing.assert_allclose(y[..., 0] + 1j * y[..., 1], expected, atol=1e-12)


def test_dft_onesided_of_a_real_odd_length_signal_and_its_inverse() -> None:
    x = RNG.standard_normal((3, 9, 1))
    y = run("DFT", {"x": x}, opset=19, axis=1, onesided=1)
    np.testing.assert_allclose(y[..., 0] + 1j * y[..., 1], np.fft.rfft(x[..., 0], axis=1))
    full = run("DFT", {"x": x}, opset=19, axis=1)
    np.testing.assert_allclose(full[..., 0] + 1j * full[..., 1], np.fft.fft(x[..., 0], axis=1))
    feeds = {"spectrum": y, "n": np.array(9, np.int64)}
    back = run("DFT", feeds, opset=19, rank=3, axis=1, inverse=1, onesided=1)
    np.testing.assert_allclose(back, x, atol=1e-12)


def test_stft_of_a_complex_signal_matches_numpy_frames() -> None:
    x = RNG.standard_normal((2, 20, 2))
    window = np.hanning(6)
    y = run(
        "STFT",
        {"x": x, "step": np.array(3, np.int64), "w": window},
        opset=17,
        rank=4,
        onesided=0,
    )
    signal = x[..., 0] + 1j * x[..., 1]
    frames = np.stack([signal[:, s : s + 6] * window for s in range(0, 15, 3)], axis=1)
    np.testing.assert_allclose(y[..., 0] + 1j * y[..., 1], np.fft.fft(frames, axis=-1))


@pytest.mark.parametrize(
    ("op", "reference"),
    [("HannWindow", np.hanning), ("BlackmanWindow", np.blackman)],
)
def test_symmetric_windows_match_numpy(op: str, reference: Any) -> None:
    y = run(
        op,
        {"size": np.array(9, np.int64)},
        opset=17,
        rank=1,
        out_dtype=np.float64,
        periodic=0,
        output_datatype=11,
    )
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, reference(9), atol=1e-12)


def test_hamming_window_uses_the_spec_coefficients() -> None:
    y = run(
        "HammingWindow",
        {"size": np.array(8, np.int64)},
        opset=17,
        rank=1,
        out_dtype=np.float64,
        output_datatype=11,
    )
    n = np.arange(8)
    np.testing.assert_allclose(y, 25 / 46 - 21 / 46 * np.cos(2 * np.pi * n / 8), atol=1e-12)


def test_det_of_a_batch_matches_numpy() -> None:
    x = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(run("Det", {"x": x}), np.linalg.det(x), rtol=1e-5)


def test_group_normalization_opset_18_scales_per_group() -> None:
    """Opset 18's form (deprecated: onnx's checker refuses it, so run without the checker)."""
    x = RNG.standard_normal((2, 6, 3)).astype(np.float32)
    scale, bias = np.array([2.0, -1.0], np.float32), np.array([0.5, 3.0], np.float32)
    feeds = {"x": x, "s": scale, "b": bias}
    model = op_model("GroupNormalization", feeds, 18, rank=3, num_groups=2)
    y = np.asarray(GraphFunction(model.graph, opsets={"": 18}).apply(feeds)[0])
    groups = x.reshape(2, 2, 9)
    normed = (groups - groups.mean(-1, keepdims=True)) / np.sqrt(
        groups.var(-1, keepdims=True) + 1e-5
    )
    expected = normed * scale[:, None] + bias[:, None]
    np.testing.assert_allclose(y, expected.reshape(x.shape), rtol=1e-5, atol=1e-5)


def test_shrink_of_integers_compares_exactly() -> None:
    x = np.arange(-4, 5, dtype=np.int8)
    y = run("Shrink", {"x": x}, opset=9, lambd=1.5, bias=1.0)
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, [-3, -2, -1, 0, 0, 0, 1, 2, 3])


def test_binarizer_keeps_the_dtype() -> None:
    x = np.array([[-2, 0, 1, 5]], np.int64)
    with jax.enable_x64(True):
        model = op_model("Binarizer", {"x": x}, 13, domain="ai.onnx.ml", threshold=0.5)
        y = np.asarray(backend.prepare(model).run({"x": x})[0])
    np.testing.assert_array_equal(y, [[0, 0, 1, 1]])
    assert y.dtype == np.int64


def test_tensor_scatter_circular_wraps_around() -> None:
    cache = np.zeros((2, 1, 4, 2), np.float32)
    update = RNG.standard_normal((2, 1, 3, 2)).astype(np.float32)
    where = np.array([2, 0], np.int64)
    y = run("TensorScatter", {"c": cache, "u": update, "i": where}, mode="circular")
    expected = cache.copy()
    for b in range(2):
        for t in range(3):
            expected[b, :, (where[b] + t) % 4] = update[b, :, t]
    np.testing.assert_array_equal(y, expected)


def test_reverse_sequence_with_batch_first() -> None:
    x = RNG.standard_normal((3, 5, 2))
    lengths = np.array([5, 0, 3], np.int64)
    y = run("ReverseSequence", {"x": x, "l": lengths}, batch_axis=0, time_axis=1)
    expected = x.copy()
    for b, n in enumerate(lengths):
        expected[b, :n] = x[b, :n][::-1]
    np.testing.assert_array_equal(y, expected)


def against_onnxruntime(
    op: str, feeds: dict[str, np.ndarray], opset: int, rank: int, tol: float, **attrs: Any
) -> None:
    ort = pytest.importorskip("onnxruntime")
    model = op_model(op, feeds, opset, rank=rank, out_dtype=np.float32, **attrs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    given = {name: value for name, value in feeds.items() if name}
    (expected,) = session.run(None, given)
    got = np.asarray(backend.prepare(model).run(given)[0])
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


def test_upsample_opset_7_and_9_match_onnxruntime() -> None:
    x = RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)
    scales = [1.0, 1.0, 2.0, 1.5]
    for mode in ("nearest", "linear"):
        against_onnxruntime("Upsample", {"x": x}, 7, 4, 1e-6, mode=mode, scales=scales)
        feeds = {"x": x, "scales": np.array(scales, np.float32)}
        against_onnxruntime("Upsample", feeds, 9, 4, 1e-6, mode=mode)


def test_mel_weight_matrix_and_stft_with_frame_length_match_onnxruntime() -> None:
    feeds = {
        "bins": np.array(8, np.int64),
        "length": np.array(64, np.int64),
        "rate": np.array(8000, np.int64),
        "low": np.array(100.0, np.float32),
        "high": np.array(3000.0, np.float32),
    }
    against_onnxruntime("MelWeightMatrix", feeds, 17, 2, 0.0)
    signal = RNG.standard_normal((2, 30, 1)).astype(np.float32)
    feeds = {"x": signal, "step": np.array(4, np.int64), "": np.zeros(0), "n": np.array(10)}
    against_onnxruntime("STFT", feeds, 17, 4, 2e-5)


# ----------------------------------------------------------------------------- refusals


def test_bad_attributes_and_inputs_are_refused_naming_the_node() -> None:
    cache, update = np.zeros((1, 4, 2), np.float32), np.zeros((1, 2, 2), np.float32)
    refused("TensorScatter", {"c": cache, "u": update}, "mode 'ring'", mode="ring")
    refused(
        "TensorScatter",
        {"c": cache, "u": update, "i": np.array([3], np.int64)},
        r"write_indices hold 3, outside \[0, 2\]",
    )
    x = np.zeros((1, 6, 2), np.float32)
    s = np.ones(6, np.float32)
    refused("GroupNormalization", {"x": x, "s": s, "b": s}, "num_groups 4", rank=3, num_groups=4)
    refused(
        "DFT",
        {"x": np.zeros((1, 4, 2), np.float32)},
        "axis 2 is the trailing",
        opset=19,
        rank=3,
        axis=2,
    )
    refused(
        "ReverseSequence",
        {"x": np.zeros((4, 2)), "l": np.array([1, 5], np.int64)},
        r"sequence_lens hold 5, outside \[0, 4\]",
    )


# ----------------------------------------------------------------------------- gradients


def check_gradient(
    op: str, feeds: dict[str, np.ndarray], wrts: list[str], opset: int = 24, **attrs: Any
) -> None:
    """Gradients of a weighted sum of the output against float64 central differences."""
    with jax.enable_x64(True):
        model = op_model(op, feeds, opset, **attrs)
    assert_graph_gradients(model, feeds, wrts, opset)


@pytest.mark.parametrize("op", ["Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Atanh"])
def test_unary_gradients(op: str) -> None:
    check_gradient(op, {"x": RNG.uniform(-0.9, 0.9, (3, 4))}, ["x"])


def test_acosh_and_shrink_gradients() -> None:
    check_gradient("Acosh", {"x": RNG.uniform(1.1, 3.0, (3, 4))}, ["x"])
    x = RNG.uniform(-3, 3, (3, 4))
    x[np.abs(np.abs(x) - 1) < 0.05] = 2.0  # away from the kinks at +-lambd
    check_gradient("Shrink", {"x": x}, ["x"], lambd=1.0, bias=0.5)


def test_normalization_gradients() -> None:
    x = RNG.standard_normal((2, 4, 3, 2))
    check_gradient("MeanVarianceNormalization", {"x": x}, ["x"])
    s, b = RNG.standard_normal(4), RNG.standard_normal(4)
    feeds = {"x": x, "s": s, "b": b}
    check_gradient("GroupNormalization", feeds, ["x", "s", "b"], num_groups=2, stash_type=11)


def test_layout_gradients() -> None:
    x = RNG.standard_normal((1, 2, 2, 2))
    indices = np.array([[[[0, 3], [9, 14]], [[17, 22], [24, 31]]]], np.int64)
    check_gradient("MaxUnpool", {"x": x, "i": indices}, ["x"], kernel_shape=[2, 2], strides=[2, 2])
    seq = {"x": RNG.standard_normal((4, 3, 2)), "l": np.array([4, 1, 2], np.int64)}
    check_gradient("ReverseSequence", seq, ["x"])
    cache, update = RNG.standard_normal((2, 5, 3)), RNG.standard_normal((2, 2, 3))
    feeds = {"c": cache, "u": update, "i": np.array([1, 4], np.int64)}
    check_gradient("TensorScatter", feeds, ["c", "u"], mode="circular")
    check_gradient("Det", {"x": RNG.standard_normal((2, 3, 3))}, ["x"])


def test_signal_gradients() -> None:
    check_gradient("DFT", {"x": RNG.standard_normal((2, 6, 1))}, ["x"], opset=19, onesided=1)
    check_gradient("DFT", {"x": RNG.standard_normal((2, 5, 2))}, ["x"], opset=19, inverse=1)
    feeds = {
        "x": RNG.standard_normal((1, 12, 1)),
        "step": np.array(2, np.int64),
        "w": RNG.uniform(0.5, 1.0, 4),
    }
    check_gradient("STFT", feeds, ["x", "w"], opset=17)
