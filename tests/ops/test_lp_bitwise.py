"""LpNormalization and LpPool, the Bitwise ops, BitShift and BitCast against onnxruntime on
random inputs beyond ONNX's node cases (p of 1 and 3, negative values, a zero norm, dilated,
strided, padded and ceil_mode windows; shifts past the width and negative ones, signed and
unsigned, broadcast), refusals naming the node, and Lp gradients against float64 central
differences.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax._src.graph import GraphFunction  # noqa: E402

RNG = np.random.default_rng(0)


def op_model(op: str, feeds: dict[str, np.ndarray], opset: int, **attrs: Any) -> Any:
    """One node named 'n' reading ``feeds``, its one output of the first input's type."""
    first = next(iter(feeds.values()))
    elem = helper.np_dtype_to_tensor_dtype(first.dtype)
    node = helper.make_node(op, list(feeds), ["y"], name="n", **attrs)
    inputs = [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)
        )
        for name, value in feeds.items()
    ]
    output = helper.make_tensor_value_info("y", elem, [None] * first.ndim)
    graph = helper.make_graph([node], "g", inputs, [output])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def compare(
    op: str, feeds: dict[str, np.ndarray], opset: int = 22, out: Any = None, **attrs: Any
) -> np.ndarray:
    """Asserts onnx_optax's output equals onnxruntime's; returns onnxruntime's."""
    model = op_model(op, feeds, opset, **attrs)
    if out is not None:  # the output's dtype, where it is not the input's
        model.graph.output[0].type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(out)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)[0]
    with jax.enable_x64(True):  # 64-bit integers and floats as they are
        got = np.asarray(backend.prepare(model).run(feeds)[0])
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=2e-6)
    return expected


# ----------------------------------------------------------------------------- Lp


@pytest.mark.parametrize(("p", "axis"), [(1, 0), (2, -1)])
def test_lp_normalization_matches_onnxruntime(p: int, axis: int) -> None:
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    x[1] = 0  # a zero row (p=2) and zero entries in each column (p=1)
    expected = compare("LpNormalization", {"x": x}, axis=axis, p=p)
    norms = np.linalg.norm(x, ord=p, axis=axis, keepdims=True)
    np.testing.assert_allclose(
        expected, np.divide(x, norms, out=np.zeros_like(x), where=norms > 0), rtol=1e-6
    )


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [2, 3], "p": 3, "strides": [2, 1], "pads": [1, 0, 1, 2]},
        {"kernel_shape": [2, 2], "p": 1, "dilations": [2, 1], "strides": [2, 2], "ceil_mode": 1},
        {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER"},
    ],
)
def test_lp_pool_matches_onnxruntime(attrs: dict[str, Any]) -> None:
    x = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
    compare("LpPool", {"x": x}, **attrs)


# ----------------------------------------------------------------------------- bits


@pytest.mark.parametrize(
    ("dtype", "direction", "opset"),
    [("uint8", "LEFT", 11), ("uint64", "RIGHT", 11), ("int8", "RIGHT", 28), ("int32", "LEFT", 28)],
)
def test_bit_shift_past_the_width_and_negative_matches_onnxruntime(
    dtype: str, direction: str, opset: int
) -> None:
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max, (5, 1), dtype=dtype, endpoint=True)
    low = -2 if info.min else 0
    shift = np.arange(low, info.bits + 3).astype(dtype)[None, :]  # broadcast (5, 1) x (1, n)
    expected = compare("BitShift", {"x": x, "s": shift}, opset, direction=direction)
    inside = (shift >= 0) & (shift < info.bits)
    by_hand = (x << shift) if direction == "LEFT" else (x >> shift)
    np.testing.assert_array_equal(expected[:, inside[0]], by_hand[:, inside[0]])


@pytest.mark.parametrize(
    ("op", "dtype"), [("BitwiseAnd", "int16"), ("BitwiseOr", "uint32"), ("BitwiseXor", "int64")]
)
def test_bitwise_ops_broadcast_as_onnxruntime(op: str, dtype: str) -> None:
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, (3, 4), dtype=dtype, endpoint=True)
    b = RNG.integers(info.min, info.max, (4,), dtype=dtype, endpoint=True)
    expected = compare(op, {"a": a, "b": b}, 18)
    fn = {"BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or, "BitwiseXor": np.bitwise_xor}
    np.testing.assert_array_equal(expected, fn[op](a, b))
    not_a = compare("BitwiseNot", {"a": a}, 18)
    np.testing.assert_array_equal(not_a, ~a)


@pytest.mark.parametrize(
    ("source", "target"),
    [("float32", "int32"), ("int16", "float16"), ("bool", "uint8"), ("uint64", "float64")],
)
def test_bit_cast_keeps_the_bytes_as_onnxruntime(source: str, target: str) -> None:
    """The same bytes, read as the target; onnxruntime has no BitCast of bool."""
    x = (RNG.standard_normal(6) * 1000).astype(source)
    tp = helper.np_dtype_to_tensor_dtype(np.dtype(target))
    if source == "bool":
        model = op_model("BitCast", {"x": x}, 26, to=tp)
        model.graph.output[0].type.tensor_type.elem_type = tp
        got = np.asarray(backend.prepare(model).run({"x": x})[0])
    else:
        got = compare("BitCast", {"x": x}, 26, out=np.dtype(target), to=tp)
    assert got.dtype == np.dtype(target)
    np.testing.assert_array_equal(got.view(np.uint8), x.view(np.uint8))


@pytest.mark.parametrize(
    ("op", "attrs", "message"),
    [
        ("LpNormalization", {"p": 3}, "p 3 must be 1 or 2"),
        ("LpNormalization", {"axis": 2}, "axis 2 is out of range"),
        ("LpPool", {"kernel_shape": [2, 2], "p": 0}, "p 0 must be positive"),
        ("LpPool", {"kernel_shape": [2, 2], "pads": [2, 0, 0, 0]}, "smaller than kernel_shape"),
        ("BitCast", {"to": onnx.TensorProto.INT16}, "changes the width"),
        ("BitCast", {"to": onnx.TensorProto.BOOL}, "bit casts to or from bool"),
    ],
)
def test_refusals_name_the_node(op: str, attrs: dict[str, Any], message: str) -> None:
    x = np.ones((1, 1, 3, 3) if op == "LpPool" else (2, 3), np.float32)
    opset = 26 if op == "BitCast" else 22
    with pytest.raises(ValueError, match=rf"node 'n' \(ai\.onnx\.{op}\).*{message}"):
        backend.prepare(op_model(op, {"x": x}, opset, **attrs)).run({"x": x})


def test_bit_cast_to_64_bits_without_64_bit_jax_is_refused() -> None:
    x = np.arange(3, dtype=np.int64)
    model = op_model("BitCast", {"x": x}, 26, to=onnx.TensorProto.DOUBLE)
    with pytest.raises(ValueError, match=r"node 'n' \(ai\.onnx\.BitCast\).*needs 64-bit JAX"):
        backend.prepare(model).run({"x": x})


def _check_gradient(op: str, x: np.ndarray, **attrs: Any) -> None:
    with jax.enable_x64(True):
        graph = GraphFunction(op_model(op, {"x": x}, 22, **attrs).graph, opsets={"": 22})
        weights = np.random.default_rng(5).standard_normal(np.shape(graph.apply({"x": x})[0]))

        @jax.jit
        def loss(value: Any) -> Any:
            return (graph.apply({"x": value})[0] * weights).sum()

        grad = np.asarray(jax.grad(loss)(x))
        assert np.isfinite(grad).all() and np.abs(grad).max() > 1e-3
        step = 1e-6
        for flat in range(0, x.size, max(x.size // 6, 1)):
            index = np.unravel_index(flat, x.shape)
            if x[index] == 0:
                continue  # |x| has no derivative there
            plus, minus = x.copy(), x.copy()
            plus[index] += step
            minus[index] -= step
            expected = (float(loss(plus)) - float(loss(minus))) / (2 * step)
            assert abs(grad[index] - expected) <= 1e-8 + 1e-6 * abs(expected), index


def test_lp_gradients_match_central_differences_and_are_finite_at_zero() -> None:
    x = np.random.default_rng(6).standard_normal((1, 2, 4, 4))
    x[0, 0, :2, :2] = 0  # a window of zeros: its norm is 0, its gradient finite
    _check_gradient("LpPool", x, kernel_shape=[2, 2], strides=[2, 2], p=3)
    _check_gradient("LpNormalization", x.reshape(8, 4), axis=1, p=2)
