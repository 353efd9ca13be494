"""A MatMul of a one-hot (Cast of Equal with a constant range) runs as a gather (issue 21).

tf2onnx's export of jax2tf's ``one_hot`` followed by an einsum (magika's embedding)
multiplies a [N, L, K] one-hot by a [K, M] table. The graph runs such a MatMul as the
rows the ids pick (``graph._OneHotProductStep``). Expected values here are the product
itself, computed in float64 numpy term by term (so 0 x inf is NaN, as in the product),
and gradients the product's transpose written by hand.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax._src.graph.passes import one_hot as graph_module  # noqa: E402

TRAINING = "ai.onnx.preview.training"
K, M = 6, 4


def _model(
    span: np.ndarray,
    *,
    expand: bool = False,
    swapped: bool = False,
    extra: Any = (),
    gradient_shape: tuple[int, ...] = (),
) -> onnx.ModelProto:
    """Y = MatMul(Cast(Equal(ids, span), FLOAT), W): ids [2, 5, 1] int64, W [K, M] a feed."""
    nodes = []
    ids = "ids"
    if expand:
        nodes.append(helper.make_node("Expand", ["ids", "shape"], ["wide"]))
        ids = "wide"
    pair = ["span", ids] if swapped else [ids, "span"]
    nodes += [
        helper.make_node("Equal", pair, ["hot"]),
        helper.make_node("Cast", ["hot"], ["one_hot"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["one_hot", "w"], ["y"]),
        *extra,
    ]
    inits = [numpy_helper.from_array(span.astype(np.int64), "span")]
    if expand:
        inits.append(numpy_helper.from_array(np.array([2, 5, span.shape[-1]], np.int64), "shape"))
    inputs = [
        helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5, 1]),
        helper.make_tensor_value_info("w", TensorProto.FLOAT, [span.shape[-1], M]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, M])]
    if extra:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 5, M]))
        outputs.append(helper.make_tensor_value_info("dw", TensorProto.FLOAT, list(gradient_shape)))
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(TRAINING, 1)]
    )


def _product(ids: np.ndarray, span: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The MatMul term by term in float64: sum over k of one_hot[..., k] * W[k, :]."""
    one_hot = (ids == span).astype(np.float64)  # [2, 5, K]
    with np.errstate(invalid="ignore"):
        return (one_hot[..., :, None] * w.astype(np.float64)).sum(axis=-2)


def _ids() -> np.ndarray:
    ids = np.random.default_rng(0).integers(0, K, (2, 5, 1)).astype(np.int64)
    ids[0, 1, 0], ids[1, 3, 0] = -1, K  # outside the range: a row of zeros
    return ids


def _table() -> np.ndarray:
    w = np.random.default_rng(1).standard_normal((K, M)).astype(np.float32)
    w[2, 1] = np.inf  # column 1: NaN but where id 2 picks it (inf there)
    w[4, 3] = np.nan  # column 3: NaN everywhere
    return w


@pytest.fixture
def gathers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the one-hot products run as gathers."""
    calls: list[int] = []
    real = graph_module.one_hot_product

    def counted(ids: Any, table: Any) -> Any:
        calls.append(1)
        return real(ids, table)

    monkeypatch.setattr(graph_module, "one_hot_product", counted)
    return calls


SPAN = np.arange(K).reshape(1, 1, K)


@pytest.mark.parametrize(
    "expand, swapped",
    [(False, False), (True, False), (False, True)],
    ids=["plain", "expand", "swapped"],
)
def test_a_one_hot_product_is_the_product(gathers: list[int], expand: bool, swapped: bool) -> None:
    ids, w = _ids(), _table()
    prepared = backend.prepare(_model(SPAN, expand=expand, swapped=swapped))
    (got,) = prepared.run({"ids": ids, "w": w})
    want = _product(ids, SPAN, w)
    assert gathers == [1]
    assert np.isinf(want[ids[..., 0] == 2][:, 1]).all() and np.isnan(want[..., 3]).all()
    np.testing.assert_array_equal(np.asarray(got), want.astype(np.float32))


@pytest.mark.parametrize(
    "span, ids_shape",
    [(np.array([[[0, 2, 1, 3, 4, 5]]]), (2, 5, 1)), (SPAN, (2, 5, K))],
    ids=["not a range", "ids already one per column"],
)
def test_other_equal_products_run_as_products(
    gathers: list[int], span: np.ndarray, ids_shape: tuple[int, ...]
) -> None:
    ids = np.random.default_rng(2).integers(0, K, ids_shape).astype(np.int64)
    w = np.random.default_rng(3).standard_normal((K, M)).astype(np.float32)
    model = _model(span)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = ids_shape[2]
    (got,) = backend.prepare(model).run({"ids": ids, "w": w})
    assert gathers == []
    np.testing.assert_allclose(np.asarray(got), _product(ids, span, w), rtol=1e-6, atol=1e-6)


def _gradient_model(wrt: str) -> onnx.ModelProto:
    """loss = sum(Y * R), and its Gradient with respect to ``wrt`` (W, or the one-hot)."""
    extra = [
        helper.make_node("Mul", ["y", "r"], ["yr"]),
        helper.make_node("ReduceSum", ["yr"], ["loss"], keepdims=0),
        helper.make_node("Gradient", [wrt], ["dw"], domain=TRAINING, xs=[wrt], y="loss"),
    ]
    return _model(SPAN, extra=extra, gradient_shape=(K, M) if wrt == "w" else (2, 5, K))


def test_its_gradient_with_respect_to_the_table_is_the_products(gathers: list[int]) -> None:
    ids = _ids()
    w = np.random.default_rng(4).standard_normal((K, M)).astype(np.float32)
    r = np.random.default_rng(5).standard_normal((2, 5, M)).astype(np.float32)
    _, dw = backend.prepare(_gradient_model("w")).run({"ids": ids, "w": w, "r": r})
    one_hot = (ids == SPAN).astype(np.float64)
    want = np.einsum("blk,blm->km", one_hot, r.astype(np.float64))  # one_hot^T R
    assert gathers  # the forward and its gradient ran as a gather
    np.testing.assert_allclose(np.asarray(dw), want, rtol=1e-6, atol=1e-6)


def test_a_one_hot_a_gradient_differentiates_stays_a_product(gathers: list[int]) -> None:
    ids = _ids()
    w = np.random.default_rng(6).standard_normal((K, M)).astype(np.float32)
    r = np.random.default_rng(7).standard_normal((2, 5, M)).astype(np.float32)
    _, d_one_hot = backend.prepare(_gradient_model("one_hot")).run({"ids": ids, "w": w, "r": r})
    assert gathers == []
    want = np.einsum("blm,km->blk", r.astype(np.float64), w.astype(np.float64))  # R W^T
    np.testing.assert_allclose(np.asarray(d_one_hot), want, rtol=1e-6, atol=1e-6)


def test_ids_known_while_tracing_make_a_product(gathers: list[int]) -> None:
    """An initializer's ids (int64, beyond int32 too): the graph computes the one-hot on the
    host, never narrowing the ids to JAX's 32-bit integers."""
    ids = _ids()
    ids[1, 4, 0] = 2**40 + 1  # a 32-bit integer would wrap to 1
    model = _model(SPAN)
    model.graph.initializer.append(numpy_helper.from_array(ids, "ids"))
    del model.graph.input[0]
    w = np.random.default_rng(8).standard_normal((K, M)).astype(np.float32)
    (got,) = backend.prepare(model).run({"w": w})
    assert gathers == []
    np.testing.assert_allclose(np.asarray(got), _product(ids, SPAN, w), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype, k", [(np.uint8, 256), (np.int8, 128)])
def test_ids_of_a_narrow_type_pick_every_row_of_the_table(
    gathers: list[int], dtype: Any, k: int
) -> None:
    """K is one past the ids' type's largest value: K itself would wrap in that type."""
    span = np.arange(k).astype(dtype)
    nodes = [
        helper.make_node("Equal", ["ids", "span"], ["hot"]),
        helper.make_node("Cast", ["hot"], ["one_hot"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["one_hot", "w"], ["y"]),
    ]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("ids", elem, [4, 1]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [k, M]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, M])],
        initializer=[numpy_helper.from_array(span, "span")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    ids = np.array([[0], [1], [5], [k - 1]], dtype)
    w = np.random.default_rng(9).standard_normal((k, M)).astype(np.float32)
    (got,) = backend.prepare(model).run({"ids": ids, "w": w})
    assert gathers == [1]
    np.testing.assert_array_equal(np.asarray(got), _product(ids, span, w).astype(np.float32))


def test_a_table_of_no_rows_gives_zeros(gathers: list[int]) -> None:
    span = np.zeros((1, 1, 0), np.int64)
    model = _model(span)
    ids = _ids()
    (got,) = backend.prepare(model).run({"ids": ids, "w": np.zeros((0, M), np.float32)})
    assert gathers == []
    np.testing.assert_array_equal(np.asarray(got), np.zeros((2, 5, M), np.float32))
