"""TopK, GatherND, ScatterND, ScatterElements, CumSum/CumProd, OneHot, Trilu and EyeLike
against onnxruntime on random inputs, where ONNX's node cases (one small input each) stop:
every scatter reduction, batch_dims, negative indices, ties; indices out of range refused
naming the node (while tracing when constant, after the run when fed); gradients against
float64 central differences.
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
from onnx_optax._src.graph import GraphFunction  # noqa: E402

RNG = np.random.default_rng(0)


def op_model(
    op: str,
    feeds: dict[str, np.ndarray],
    outputs: list[tuple[str, int, list[Any] | None]],
    opset: int = 18,
    constants: dict[str, np.ndarray] | None = None,
    **attrs: Any,
) -> Any:
    """One node named 'n' reading ``feeds`` (graph inputs) and ``constants`` (initializers)."""
    constants = constants or {}
    names = [*feeds, *constants]
    node = helper.make_node(op, names, [name for name, _, _ in outputs], name="n", **attrs)

    def info(name: str, value: np.ndarray) -> Any:
        return helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)
        )

    graph = helper.make_graph(
        [node],
        "g",
        [info(name, value) for name, value in feeds.items()],
        [helper.make_tensor_value_info(name, elem, shape) for name, elem, shape in outputs],
        initializer=[numpy_helper.from_array(v, name) for name, v in constants.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def inferred(op: str, feeds: dict[str, np.ndarray], n_outputs: int, **kw: Any) -> Any:
    """The model with its outputs' types and shapes as onnx's shape inference gives them."""
    names = [f"y{i}" for i in range(n_outputs)]
    model = op_model(op, feeds, [], **kw)
    model.graph.node[0].ClearField("output")
    model.graph.node[0].output.extend(names)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    found = {v.name: v for v in model.graph.value_info}
    model.graph.output.extend(found[name] for name in names)
    del model.graph.value_info[:]
    return model


def compare(op: str, feeds: dict[str, np.ndarray], n_outputs: int = 1, **kw: Any) -> list[Any]:
    """Runs ``op`` on onnxruntime, then on onnx_optax, and asserts they agree."""
    loose = inferred(op, feeds, n_outputs, **kw)
    session = ort.InferenceSession(loose.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    outputs = [
        (f"y{i}", helper.np_dtype_to_tensor_dtype(e.dtype), list(e.shape))
        for i, e in enumerate(expected)
    ]
    with jax.enable_x64(True):
        got = backend.prepare(op_model(op, feeds, outputs, **kw)).run(feeds)
    for g, e in zip(got, expected, strict=True):
        assert np.asarray(g).dtype == e.dtype and np.shape(g) == e.shape
        np.testing.assert_allclose(np.asarray(g), e, rtol=1e-6, atol=1e-6)
    return expected


# ----------------------------------------------------------------------------- scatters


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements_reductions_and_negative_indices(reduction: str, axis: int) -> None:
    data = RNG.standard_normal((4, 5, 6)).astype(np.float32)
    shape = [3, 4, 5]
    size = data.shape[axis]
    if reduction == "none":  # duplicates are undefined without a reduction: one each
        order = np.argsort(RNG.random((*shape[: axis % 3], size, *shape[axis % 3 + 1 :])), axis)
        indices = np.take(order, np.arange(shape[axis]), axis=axis)
    else:
        indices = RNG.integers(0, size, shape)
    indices = np.where(RNG.random(shape) < 0.5, indices - size, indices).astype(np.int64)
    assert (indices < 0).any()
    updates = RNG.standard_normal(shape).astype(np.float32)
    expected = compare(
        "ScatterElements",
        {"data": data, "indices": indices, "updates": updates},
        axis=axis,
        reduction=reduction,
    )
    assert not np.array_equal(expected[0], data)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_scatter_nd_reductions(reduction: str, depth: int) -> None:
    data = RNG.standard_normal((4, 5, 3)).astype(np.float32)
    count = 3 if reduction == "none" else 6
    if reduction == "none":  # distinct targets
        flat = RNG.choice(int(np.prod(data.shape[:depth])), count, replace=False)
        indices = np.stack(np.unravel_index(flat, data.shape[:depth]), -1)
    else:
        indices = np.stack([RNG.integers(0, d, count) for d in data.shape[:depth]], -1)
    indices = indices.reshape(count, depth).astype(np.int64)
    updates = RNG.standard_normal((count, *data.shape[depth:])).astype(np.float32)
    compare(
        "ScatterND", {"data": data, "indices": indices, "updates": updates}, reduction=reduction
    )


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_with_indices_smaller_than_data_off_the_axis(axis: int) -> None:
    """Indices shorter than data on the other axes read data's leading part there; the
    output has the indices' shape (issue 33: on b45a389 the indices were broadcast to data's
    shape, a result of data's shape)."""
    data = RNG.standard_normal((4, 5, 6)).astype(np.float32)
    shape = [2, 3, 4]
    shape[axis] = 7  # longer than data along the axis itself: allowed
    indices = RNG.integers(-data.shape[axis], data.shape[axis], shape).astype(np.int64)
    compare("GatherElements", {"data": data, "indices": indices}, axis=axis)


@pytest.mark.parametrize("batch_dims", [0, 1, 2])
def test_gather_nd_batch_dims_and_negative_indices(batch_dims: int) -> None:
    data = RNG.standard_normal((3, 4, 5, 2)).astype(np.float32)
    rest = data.shape[batch_dims:]
    depth = 2 if batch_dims < 2 else 1
    indices = np.stack(
        [RNG.integers(-d, d, (*(3, 4, 2)[:batch_dims], 5)) for d in rest[:depth]], -1
    )
    compare(
        "GatherND",
        {"data": data, "indices": indices.astype(np.int64)},
        batch_dims=batch_dims,
    )


# ----------------------------------------------------------------------------- TopK, cumulative


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_top_k_ties_take_the_lower_index_first(largest: int, axis: int) -> None:
    x = RNG.integers(0, 4, (6, 7, 8)).astype(np.float32)  # many ties
    k = np.array([4], np.int64)
    values, _ = compare("TopK", {"x": x}, 2, constants={"k": k}, axis=axis, largest=largest)
    assert len(np.unique(values)) < values.size


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
def test_cumulative_ops(op: str, exclusive: int, reverse: int, axis: int) -> None:
    x = RNG.uniform(0.5, 1.5, (4, 5, 3)).astype(np.float32)
    compare(
        op,
        {"x": x},
        constants={"axis": np.array(axis, np.int64)},
        opset=26 if op == "CumProd" else 18,
        exclusive=exclusive,
        reverse=reverse,
    )


# ----------------------------------------------------------------------------- makers


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_one_hot(axis: int) -> None:
    indices = RNG.integers(-7, 7, (3, 4)).astype(np.int64)  # some outside [-5, 5): all off
    compare(
        "OneHot",
        {"indices": indices},
        constants={"depth": np.array(5, np.int64), "values": np.array([-1.0, 3.0], np.float32)},
        axis=axis,
    )


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [-7, -2, 0, 1, 3, 9])
def test_trilu(upper: int, k: int) -> None:
    x = RNG.standard_normal((2, 4, 6)).astype(np.float32)
    compare("Trilu", {"x": x}, constants={"k": np.array(k, np.int64)}, upper=upper)


@pytest.mark.parametrize("k", [-3, 0, 2, 8])
def test_eye_like(k: int) -> None:
    x = np.zeros((4, 6), np.int32)
    compare("EyeLike", {"x": x}, k=k, dtype=onnx.TensorProto.FLOAT)


# ----------------------------------------------------------------------------- refusals


def _run(op: str, feeds: dict[str, np.ndarray], **kw: Any) -> None:
    outputs = [(f"y{i}", onnx.TensorProto.FLOAT, None) for i in range(2 if op == "TopK" else 1)]
    model = op_model(op, feeds, outputs, **kw)
    for output in model.graph.output:
        output.type.tensor_type.shape.SetInParent()
    backend.prepare(model).run(feeds)


DATA = np.zeros((3, 4), np.float32)
OUT_OF_RANGE = [
    ("GatherND", {"data": DATA}, {"indices": np.array([[1, 4]], np.int64)}),
    ("GatherND", {"data": DATA}, {"indices": np.array([[-4, 0]], np.int64)}),
    (
        "ScatterND",
        {"data": DATA, "updates": np.ones(1, np.float32)},
        {"indices": np.array([[3, 0]], np.int64)},
    ),
    (
        "ScatterElements",
        {"data": DATA, "updates": np.ones((1, 1), np.float32)},
        {"indices": np.array([[-4]], np.int64)},
    ),
]


@pytest.mark.parametrize(("op", "feeds", "indices"), OUT_OF_RANGE)
@pytest.mark.parametrize("fed", [True, False])
def test_indices_out_of_range_are_refused_naming_the_node(
    op: str, feeds: dict[str, np.ndarray], indices: dict[str, np.ndarray], fed: bool
) -> None:
    """Fed indices are checked after the run, constant ones while tracing; never clamped."""
    ordered = {"data": feeds["data"], **indices, **{k: v for k, v in feeds.items() if k != "data"}}
    if fed:
        run = lambda: _run(op, ordered)  # noqa: E731
    else:
        rest = {k: v for k, v in ordered.items() if k == "data"}
        tail = {k: v for k, v in ordered.items() if k != "data"}
        run = lambda: _run(op, rest, constants=tail)  # noqa: E731
    with pytest.raises(ValueError, match=rf"node 'n' \(ai\.onnx\.{op}\).*indices hold -?\d"):
        run()


@pytest.mark.parametrize(
    ("op", "feeds", "constants", "attrs", "message"),
    [
        ("TopK", {"x": DATA}, {"k": np.array([5], np.int64)}, {}, "K is 5"),
        ("TopK", {"x": DATA}, {"k": np.array([-1], np.int64)}, {}, "K is -1"),
        (
            "ScatterElements",
            {"data": DATA, "indices": np.zeros((1, 1), np.int64), "updates": DATA[:1, :1]},
            {},
            {"reduction": "mean"},
            "reduction 'mean'",
        ),
        (
            "ScatterND",
            {"data": DATA, "indices": np.zeros((2, 1), np.int64), "updates": DATA[:1]},
            {},
            {},
            "updates have shape",
        ),
        (
            "OneHot",
            {"indices": np.zeros(3, np.int64)},
            {"depth": np.array(0, np.int64), "values": np.array([0, 1], np.float32)},
            {},
            "depth is 0",
        ),
        ("Trilu", {"x": np.zeros(3, np.float32)}, {}, {}, "needs rank 2"),
        ("CumSum", {"x": DATA}, {"axis": np.array(2, np.int64)}, {}, "axis 2 is out of range"),
        (
            "GatherND",
            {"data": DATA, "indices": np.zeros((1, 3), np.int64)},
            {},
            {},
            "depth 3 cannot index",
        ),
    ],
)
def test_refusals_name_the_node(
    op: str,
    feeds: dict[str, np.ndarray],
    constants: dict[str, np.ndarray],
    attrs: dict[str, Any],
    message: str,
) -> None:
    with pytest.raises(ValueError, match=rf"node 'n' \(ai\.onnx\.{op}\).*{message}"):
        _run(op, feeds, constants=constants, **attrs)


# ----------------------------------------------------------------------------- gradients


def _check_gradient(op: str, feeds: dict[str, np.ndarray], wrt: str, **kw: Any) -> None:
    with jax.enable_x64(True):
        model = op_model(op, feeds, [("y", onnx.TensorProto.DOUBLE, None)], **kw)
        model.graph.output[0].type.tensor_type.shape.SetInParent()
        graph = GraphFunction(model.graph, opsets={"": 18})
        out_shape = np.shape(graph.apply(feeds)[0])
        weights = np.random.default_rng(5).standard_normal(out_shape)

        @jax.jit
        def loss(value: Any) -> Any:
            return (graph.apply({**feeds, wrt: value})[0] * weights).sum()

        x = feeds[wrt]
        grad = np.asarray(jax.grad(loss)(x))
        step = 1e-6
        for flat in range(0, x.size, max(x.size // 5, 1)):
            index = np.unravel_index(flat, x.shape)
            plus, minus = x.copy(), x.copy()
            plus[index] += step
            minus[index] -= step
            expected = (float(loss(plus)) - float(loss(minus))) / (2 * step)
            assert abs(grad[index] - expected) <= 1e-8 + 1e-6 * abs(expected), (index, expected)
        assert np.abs(grad).max() > 1e-3


def test_gradients_match_central_differences() -> None:
    rng = np.random.default_rng(6)
    data = rng.standard_normal((4, 5))
    _check_gradient(
        "CumSum", {"x": data}, "x", constants={"axis": np.array(1, np.int64)}, exclusive=1
    )
    _check_gradient(
        "CumProd", {"x": data}, "x", constants={"axis": np.array(0, np.int64)}, reverse=1
    )
    indices = np.array([[0, 1], [3, -1], [0, 1]], np.int64)
    _check_gradient("GatherND", {"data": data, "indices": indices}, "data")
    feeds = {"data": data, "indices": indices[:2], "updates": rng.standard_normal(2)}
    _check_gradient("ScatterND", feeds, "updates")
    _check_gradient("ScatterND", feeds, "data")
    _check_gradient("ScatterND", feeds, "updates", reduction="add")
