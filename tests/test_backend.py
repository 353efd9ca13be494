"""The official ONNX backend test runner on onnx_optax.backend, and the backend's own checks."""

from __future__ import annotations

import re
import unittest

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax.backend import OnnxOptaxBackend, UnsupportedOperatorError  # noqa: E402
from tests.onnx_suite import backend_test  # noqa: E402
from tests.optimizers import DOMAIN  # noqa: E402

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
# (one runner, shared with tests/onnx_suite.py, which runs the CPU cases with 64-bit JAX).
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
