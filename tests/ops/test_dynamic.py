"""NonZero, Unique and Compress (outputs sized by an input's values) against onnxruntime,
with that input an initializer, a Constant node or a graph input fed a concrete value
(each read while tracing), and the refusal, naming the node, of one computed from the
values fed (XLA compiles static shapes).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

from onnx_optax import backend  # noqa: E402

RNG = np.random.default_rng(0)
INT64 = onnx.TensorProto.INT64


def model_of(
    op: str,
    inits: dict[str, np.ndarray],
    feeds: dict[str, np.ndarray],
    n_out: int = 1,
    opset: int = 13,
    before: list[Any] | None = None,
    inputs: list[str] | None = None,
    **attrs: Any,
) -> Any:
    """One node 'n' of ``op`` reading ``inputs`` (default: the initializers, then the feeds)."""
    outputs = ["y", "indices", "inverse", "counts"][:n_out]
    names = inputs if inputs is not None else [*inits, *feeds]
    data = {**inits, **feeds}.get(names[0], np.zeros(0, np.float32))
    elem = INT64 if op == "NonZero" else helper.np_dtype_to_tensor_dtype(data.dtype)
    rank = 2 if op == "NonZero" else data.ndim if "axis" in attrs else 1
    node = helper.make_node(op, names, outputs, name="n", **attrs)
    graph = helper.make_graph(
        [*(before or []), node],
        "g",
        [
            helper.make_tensor_value_info(
                k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)
            )
            for k, v in feeds.items()
        ],
        [
            helper.make_tensor_value_info(o, elem, [None] * rank)
            if o == "y"
            else helper.make_tensor_value_info(o, INT64, [None])
            for o in outputs
        ],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def compare(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Asserts every output equals onnxruntime's (dtype, shape, values); returns them."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    with jax.enable_x64(True):
        got = backend.prepare(model).run(feeds)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        g = np.asarray(g)
        assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype, e.shape)
        np.testing.assert_array_equal(g, e)
    return expected


# ----------------------------------------------------------------------------- NonZero


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 4), (0, 5)])
def test_non_zero_of_an_initializer(shape: tuple[int, ...], dtype: Any) -> None:
    x = (RNG.integers(0, 3, shape) * (RNG.random(shape) < 0.5)).astype(dtype)
    out = compare(model_of("NonZero", {"x": x}, {}), {})
    assert out[0].shape == (len(shape), np.count_nonzero(x))


def test_non_zero_of_a_fed_input_and_a_constant_node() -> None:
    x = np.array([[0, 1.5, 0], [2, 0, -1]], np.float32)
    compare(model_of("NonZero", {}, {"x": x}), {"x": x})
    constant = helper.make_node(
        "Constant", [], ["c"], value=numpy_helper.from_array(np.array([0, 3, 0, 4], np.int64))
    )
    compare(model_of("NonZero", {}, {}, before=[constant], inputs=["c"]), {})


# ----------------------------------------------------------------------------- Unique


@pytest.mark.parametrize("is_sorted", [0, 1])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_unique_of_an_initializer(axis: int | None, is_sorted: int) -> None:
    x = RNG.integers(0, 3, (4, 5)).astype(np.float32)
    x[2] = x[0]  # a repeated row
    x[:, 3] = x[:, 1]  # a repeated column
    attrs = {"sorted": is_sorted} if axis is None else {"sorted": is_sorted, "axis": axis}
    compare(model_of("Unique", {"x": x}, {}, n_out=4, opset=11, **attrs), {})


def test_unique_of_a_fed_int_input_and_3d_slices() -> None:
    x = np.array([2, 1, 1, 3, 4, 3, -7], np.int64)
    compare(model_of("Unique", {}, {"x": x}, n_out=4, opset=11, sorted=0), {"x": x})
    x3 = RNG.integers(0, 2, (2, 4, 2)).astype(np.int64)
    x3[:, 2] = x3[:, 0]
    compare(model_of("Unique", {"x": x3}, {}, n_out=4, opset=11, axis=1), {})


@pytest.mark.parametrize(
    ("x", "axis"),
    [
        (np.array([1.0, np.nan, np.nan, 0.0, -0.0], np.float32), None),  # onnxruntime: NaN == 1
        (np.array([[1, np.nan], [1, np.nan], [0, 0]], np.float32), 0),
        (np.zeros((0, 3), np.float32), 0),  # onnxruntime aborts on empty slices
        (np.zeros((3, 0), np.float32), 0),
    ],
)
@pytest.mark.parametrize("is_sorted", [0, 1])
def test_unique_nans_and_empty_slices_as_onnx_reference(
    x: np.ndarray, axis: int | None, is_sorted: int
) -> None:
    from onnx.reference import ReferenceEvaluator

    attrs = {"sorted": is_sorted} if axis is None else {"sorted": is_sorted, "axis": axis}
    model = model_of("Unique", {"x": x}, {}, n_out=4, opset=11, **attrs)
    expected = ReferenceEvaluator(model).run(None, {})
    with jax.enable_x64(True):
        got = backend.prepare(model).run({})
    for g, e in zip(got, expected, strict=True):
        g = np.asarray(g)
        assert g.shape == e.shape
        np.testing.assert_array_equal(g, np.asarray(e, g.dtype))


# ----------------------------------------------------------------------------- Compress


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress_with_a_constant_condition(axis: int | None) -> None:
    x = RNG.standard_normal((3, 4, 2)).astype(np.float32)
    length = x.size if axis is None else x.shape[axis]
    condition = np.array([True, False] * length)[: length - 1]  # shorter than the axis
    attrs = {} if axis is None else {"axis": axis}
    # the data fed (traced): the condition alone sets the size
    compare(model_of("Compress", {"c": condition}, {"x": x}, inputs=["x", "c"], **attrs), {"x": x})
    # both known: computed on the host
    compare(model_of("Compress", {"x": x, "c": condition}, {}, **attrs), {})


def test_compress_refuses_a_condition_longer_than_the_axis() -> None:
    x = np.ones((2, 3), np.float32)
    model = model_of("Compress", {"x": x, "c": np.ones(3, bool)}, {}, axis=0)
    with pytest.raises(ValueError, match=r"node 'n'.*condition holds 3 values"):
        backend.prepare(model).run({})


# ----------------------------------------------------------------------------- NonMaxSuppression


def nms_model(inits: dict[str, np.ndarray], **attrs: Any) -> Any:
    node = helper.make_node("NonMaxSuppression", list(inits), ["y"], name="n", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [],
        [helper.make_tensor_value_info("y", INT64, [None, 3])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize(
    ("max_boxes", "iou", "floor"),
    [(3, 0.5, None), (100, 0.3, 0.4), (0, 0.5, None), (2, 0.0, 0.9), (None, None, None)],
)
def test_non_max_suppression_as_onnxruntime(
    center: int, max_boxes: int | None, iou: float | None, floor: float | None
) -> None:
    corners = RNG.random((2, 12, 2)).astype(np.float32) * 4
    sizes = RNG.random((2, 12, 2)).astype(np.float32) * 2
    if center:
        boxes = np.concatenate([corners, sizes], axis=2)
    else:  # [y1, x1, y2, x2], some given with the corners swapped
        boxes = np.concatenate([corners, corners + sizes], axis=2)
        boxes[:, ::3] = boxes[:, ::3][..., [2, 3, 0, 1]]
    scores = RNG.random((2, 3, 12)).astype(np.float32).round(1)  # ties of equal scores
    inits: dict[str, np.ndarray] = {"boxes": boxes, "scores": scores}
    for name, value, dtype in (
        ("max", max_boxes, np.int64),
        ("iou", iou, np.float32),
        ("floor", floor, np.float32),
    ):
        if value is not None:
            inits[name] = np.array([value], dtype)
    compare(nms_model(inits, center_point_box=center), {})


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("op", "n_out", "position"),
    [("NonZero", 1, 0), ("Unique", 4, 0), ("Compress", 1, 1), ("NonMaxSuppression", 1, 0)],
)
def test_an_input_computed_from_the_feeds_is_refused_naming_the_node(
    op: str, n_out: int, position: int
) -> None:
    # 20 elements: more than a small source (graph.SMALL_SOURCE), so x stays traced
    x = np.tile(np.array([0.0, 1.0, -2.0, 3.0], np.float32), 5)
    relu = helper.make_node("Relu", ["x"], ["r"])
    if op == "Compress":
        cast = helper.make_node("Cast", ["r"], ["b"], to=onnx.TensorProto.BOOL)
        before, inputs = [relu, cast], ["x", "b"]
    elif op == "NonMaxSuppression":  # boxes [1, 5, 4] computed from the feeds
        shape = helper.make_node(
            "Constant", [], ["s"], value=numpy_helper.from_array(np.array([1, 5, 4]))
        )
        boxes = helper.make_node("Reshape", ["r", "s"], ["boxes"])
        before, inputs = [relu, shape, boxes], ["boxes", "boxes"]
    else:
        before, inputs = [relu], ["r"]
    model = model_of(op, {}, {"x": x}, n_out=n_out, opset=13, before=before, inputs=inputs)
    with pytest.raises(ValueError, match=r"node 'n'.*XLA compiles static shapes") as raised:
        backend.prepare(model).run({"x": x})
    assert repr(inputs[position]) in str(raised.value)


def test_a_large_initializer_is_data_and_refused_a_large_constant_node_runs() -> None:
    x = (RNG.random(5000) < 0.1).astype(np.float32)  # over the 4096 elements kept on the host
    with pytest.raises(ValueError, match=r"node 'n'.*XLA compiles static shapes"):
        backend.prepare(model_of("NonZero", {"x": x}, {})).run({})
    constant = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(x))
    compare(model_of("NonZero", {}, {}, before=[constant], inputs=["c"]), {})


def test_a_large_initializer_read_as_a_shape_is_named_as_data_not_as_fed() -> None:
    """The refusal says why an initializer is traced (its size), not that it was fed."""
    x = (RNG.random(5000) < 0.1).astype(np.float32)
    with pytest.raises(ValueError, match=r"initializer of more than 4096 elements"):
        backend.prepare(model_of("NonZero", {"x": x}, {})).run({})
