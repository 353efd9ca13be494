"""The official ONNX backend test runner on onnx_optax.backend, and the backend's own checks."""

from __future__ import annotations

import re
import unittest

import jax.numpy as jnp
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax.backend import OnnxOptaxBackend, UnsupportedOperatorError  # noqa: E402
from tests.support.onnx_suite import backend_test  # noqa: E402
from tests.support.optimizers import DOMAIN  # noqa: E402

CASES = (
    "adagrad",
    "adagrad_multiple",
    "adam",
    "adam_multiple",
    "momentum",
    "nesterov_momentum",
    "momentum_multiple",
)
DEVICES = [d for d in ("cpu", "cuda") if OnnxOptaxBackend.supports_device(d.upper())]

PATTERN = re.compile(rf"^test_({'|'.join(CASES)})_({'|'.join(DEVICES)})$")

# The runner's own test functions for the seven optimizer node cases on every device
# (one runner, shared with tests/support/onnx_suite.py, which runs the CPU cases with 64-bit JAX).
_node_tests = backend_test().test_cases["OnnxBackendNodeModelTest"]
OnnxBackendOptimizerNodeTest = type(
    "OnnxBackendOptimizerNodeTest",
    (unittest.TestCase,),
    {name: getattr(_node_tests, name) for name in dir(_node_tests) if PATTERN.match(name)},
)
del _node_tests  # pytest would collect every unittest class left in the module


def test_runner_selected_exactly_the_seven_cases() -> None:
    names = sorted(n for n in dir(OnnxBackendOptimizerNodeTest) if n.startswith("test_"))
    assert names == sorted(f"test_{c}_{d}" for c in CASES for d in DEVICES)


def _adam_step_model() -> onnx.ModelProto:
    """One Adam step plus T + 1, as a training graph would run it."""
    f32, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    nodes = [
        helper.make_node("Adam", ["R", "T", "X", "G", "V", "H"], ["X2", "V2", "H2"], domain=DOMAIN),
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", i64, [], [1])),
        helper.make_node("Add", ["T", "one"], ["T2"]),
        helper.make_node("Identity", ["X2"], ["Xout"]),
    ]
    inputs = [
        helper.make_tensor_value_info("R", f32, []),
        helper.make_tensor_value_info("T", i64, []),
    ]
    inputs += [helper.make_tensor_value_info(n, f32, [3]) for n in "XGVH"]
    outputs = [helper.make_tensor_value_info("Xout", f32, [3])]
    outputs += [helper.make_tensor_value_info(n, f32, [3]) for n in ("V2", "H2")]
    outputs += [helper.make_tensor_value_info("T2", i64, [])]
    graph = helper.make_graph(nodes, "adam_step", inputs, outputs)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)]
    )


def test_prepared_model_runs_adam_and_count() -> None:
    rep = backend.prepare(_adam_step_model())
    x = np.array([1.0, -2.0, 0.5], np.float32)
    g = np.array([0.1, 0.2, -0.3], np.float32)
    zeros = np.zeros(3, np.float32)
    out = rep.run([np.float32(0.01), np.int64(4), x, g, zeros, zeros])
    assert out.T2.dtype == np.int64 and int(out.T2) == 5
    from onnx.reference import ReferenceEvaluator

    expected = ReferenceEvaluator(_adam_step_model()).run(
        None, {"R": np.float32(0.01), "T": np.int64(4), "X": x, "G": g, "V": zeros, "H": zeros}
    )
    for ours, ref in zip(out, expected, strict=True):
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-7)
    by_name = rep.run(
        {"R": np.float32(0.01), "T": np.int64(4), "X": x, "G": g, "V": zeros, "H": zeros}
    )
    np.testing.assert_array_equal(by_name.Xout, out.Xout)


def test_prepared_model_compiles_once() -> None:
    rep = backend.prepare(_adam_step_model())
    feeds = [np.float32(0.01), np.int64(1)] + [np.ones(3, np.float32)] * 4
    rep.run(feeds)
    size = rep.graph.compilations
    for t in range(2, 5):
        rep.run([np.float32(0.02 * t), np.int64(t)] + [np.full(3, t, np.float32)] * 4)
    assert rep.graph.compilations == size == 1


def test_unsupported_op_is_named() -> None:
    f32 = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("ImageDecoder", ["x"], ["y"], name="act")],
        "g",
        [helper.make_tensor_value_info("x", f32, [2])],
        [helper.make_tensor_value_info("y", f32, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(
        UnsupportedOperatorError,
        match=r"node 'act' \(ai.onnx.ImageDecoder\): unsupported op ImageDecoder in domain 'ai.onnx'",
    ):
        backend.prepare(model)
    node = helper.make_node("SGD", ["R", "T", "X", "G"], ["Y"], domain=DOMAIN)
    with pytest.raises(UnsupportedOperatorError, match=rf"unsupported op SGD in domain '{DOMAIN}'"):
        backend.run_node(
            node, [np.float32(0.1), np.int64(0), np.ones(1, np.float32), np.ones(1, np.float32)]
        )


def test_float64_inputs_need_x64() -> None:
    node = helper.make_node("Adagrad", ["R", "T", "X", "G", "H"], ["Y", "H2"], domain=DOMAIN)
    x = np.ones(2)
    with pytest.raises(TypeError, match=r"input 'X' is float64, which needs 64-bit JAX"):
        backend.run_node(node, [np.float64(0.1), np.int64(0), x, x, x])
    import jax

    with jax.enable_x64(True):
        y, h = backend.run_node(node, [np.float64(0.1), np.int64(0), x, x, x])
        assert y.dtype == h.dtype == np.float64


def test_supports_device() -> None:
    assert backend.supports_device("CPU")
    assert isinstance(backend.supports_device("CUDA"), bool)


# ----------------------------------------------------------------------------- feeds as declared
# A feed of another element type, rank or fixed size than its graph input declares is
# refused, as onnxruntime refuses it, rather than traced for the shape it happens to have.


F32 = onnx.TensorProto.FLOAT


def _relu(x_type: object, y_type: object | None = None) -> onnx.ModelProto:
    if y_type is None:  # y declared as x is (the checker wants a shape on outputs)
        y = onnx.ValueInfoProto()
        y.CopyFrom(x_type)  # type: ignore[arg-type]
        y.name = "y"
        if not y.type.tensor_type.elem_type:
            y.type.tensor_type.elem_type = F32
        y.type.tensor_type.shape.SetInParent()
    else:
        y = y_type
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x_type], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _onnxruntime(model: onnx.ModelProto, feed: np.ndarray) -> str | None:
    """onnxruntime's error for the model and feed, or None where it runs them."""
    ort = pytest.importorskip("onnxruntime")
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        session.run(None, {"x": feed})
    except Exception as error:  # onnxruntime's own exception types
        return str(error)
    return None


@pytest.mark.parametrize(
    ("dims", "feed", "error", "match"),
    [
        (
            [3],
            np.ones(3, np.float64),
            TypeError,
            r"input 'x' is float64; the graph declares float32",
        ),
        ([3], np.ones(3, np.int32), TypeError, r"input 'x' is int32"),
        (
            [3],
            np.ones((1, 3), np.float32),
            ValueError,
            r"input 'x' has shape \[1, 3\], of rank 2; the graph declares rank 1",
        ),
        ([1], np.ones((), np.float32), ValueError, r"of rank 0; the graph declares rank 1"),
        (
            [2, 3],
            np.ones((2, 4), np.float32),
            ValueError,
            r"input 'x' has size 4 on axis 1 \(shape \[2, 4\]\); the graph declares 3",
        ),
        ([0], np.ones(1, np.float32), ValueError, r"size 1 on axis 0 .* declares 0"),
        # ml_dtypes' arrays are numpy kind "V": checked all the same (review)
        (
            [3],
            np.ones((2, 2), jnp.bfloat16),
            TypeError,
            r"input 'x' is bfloat16; the graph declares float32",
        ),
    ],
)
def test_a_feed_unlike_its_declared_input_is_refused_as_in_onnxruntime(
    dims: list[int], feed: np.ndarray, error: type[Exception], match: str
) -> None:
    model = _relu(helper.make_tensor_value_info("x", F32, dims))
    assert _onnxruntime(model, feed) is not None
    rep = backend.prepare(model)
    with pytest.raises(error, match=match):
        rep.run({"x": feed})
    with pytest.raises(error, match=match):
        rep.run([feed])


@pytest.mark.parametrize(
    ("dims", "feed"),
    [
        (["N", 3], np.ones((5, 3), np.float32)),  # a symbolic size
        (["N", "N"], np.ones((2, 3), np.float32)),  # one name for two sizes: unchecked there too
        ([-1], np.ones(4, np.float32)),  # a negative size (PaddlePaddle's unknown)
        ([], np.ones((2, 2), np.float32)),  # a shape of no dims
    ],
)
def test_feeds_onnxruntime_runs_still_run(dims: list[object], feed: np.ndarray) -> None:
    model = _relu(helper.make_tensor_value_info("x", F32, dims))
    assert _onnxruntime(model, feed) is None
    (y,) = backend.prepare(model).run({"x": feed})
    np.testing.assert_array_equal(y, np.maximum(feed, 0))


def test_a_jax_array_of_the_32_bit_form_of_a_declared_int64_runs() -> None:
    import jax.numpy as jnp

    model = _relu(
        helper.make_tensor_value_info("x", onnx.TensorProto.INT64, [2]),
        helper.make_tensor_value_info("y", onnx.TensorProto.INT64, [2]),
    )
    (y,) = backend.prepare(model).run({"x": jnp.array([-1, 2])})  # int32 without x64
    np.testing.assert_array_equal(y, [0, 2])


def test_an_input_of_no_type_or_a_tensor_of_element_type_0_is_refused_as_in_onnxruntime() -> None:
    untyped = onnx.ValueInfoProto(name="x")
    cases = [
        (_relu(untyped), "Field 'type' of 'value_info' is required"),  # the checker's
        (
            _relu(helper.make_tensor_value_info("x", 0, [3])),
            "graph input 'x' declares a tensor of element type 0",
        ),
        (
            _relu(
                helper.make_tensor_value_info("x", F32, [3]),
                helper.make_tensor_value_info("y", 0, [3]),
            ),
            "graph output 'y' declares a tensor of element type 0",
        ),
    ]
    for model, match in cases:
        assert _onnxruntime(model, np.ones(3, np.float32)) is not None, match
        with pytest.raises(ValueError, match=match):
            backend.prepare(model)


def test_an_output_declared_a_sequence_that_computes_a_tensor_is_refused_as_in_onnxruntime() -> (
    None
):
    y = helper.make_value_info(
        "y",
        helper.make_sequence_type_proto(helper.make_tensor_type_proto(F32, None)),
    )
    model = _relu(helper.make_tensor_value_info("x", F32, [3]), y)
    feed = np.ones(3, np.float32)
    assert "does not match expected type" in (_onnxruntime(model, feed) or "")
    with pytest.raises(
        TypeError, match="graph output 'y' is declared a sequence but the graph computes a tensor"
    ):
        backend.prepare(model).run({"x": feed})


def test_a_graph_of_no_outputs_is_refused_as_in_onnxruntime() -> None:
    model = _relu(helper.make_tensor_value_info("x", F32, [3]))
    del model.graph.output[:]
    assert "At least one output" in (_onnxruntime(model, np.ones(3, np.float32)) or "")
    with pytest.raises(ValueError, match="graph 'g' has no outputs"):
        backend.prepare(model)
