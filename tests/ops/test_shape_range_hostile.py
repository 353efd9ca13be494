"""Hostile and malformed models against the loading layer, the graph runtime and the backend.

Each test is one finding of the audit of issue 14: what a stranger's model did
to ``backend.prepare``/``run`` and ``backend.run_node``, and the clear refusal
(or the modest run) expected instead.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

from onnx_optax import backend  # noqa: E402
from tests.support.builders import value_info as _vi  # noqa: E402
from tests.support.graph_models import BIG, F32, I64, LIMIT_HINT  # noqa: E402
from tests.support.graph_models import model_with_training as _model  # noqa: E402
from tests.support.graph_models import opset21_model as _graph_model  # noqa: E402
from tests.support.graph_models import run_capped_60s as _outcome  # noqa: E402


def test_int64_shape_arithmetic_stays_exact_under_32_bit_jax() -> None:
    """INT64_MAX as Slice's end ("to the end", as exporters write it) is no error."""
    end = helper.make_tensor("end", I64, [1], [2**63 - 1])
    model = _model(
        [
            helper.make_node("Constant", [], ["start"], value_ints=[1]),
            helper.make_node("Slice", ["x", "start", "end"], ["y"]),
        ],
        [_vi("x", F32, [4])],
        [_vi("y", F32, [3])],
        [end],
    )
    (y,) = backend.prepare(model).run([np.arange(4, dtype=np.float32)])
    np.testing.assert_array_equal(y, [1.0, 2.0, 3.0])
    fed = _model(
        [helper.make_node("Slice", ["x", "start", "end"], ["y"])],
        [_vi("x", F32, [4]), _vi("start", I64, [1]), _vi("end", I64, [1])],
        [_vi("y", F32, [3])],
    )
    x, start, end_value = np.arange(4, dtype=np.float32), np.array([1]), np.array([2**63 - 1])
    (y,) = backend.prepare(fed).run([x, start, end_value])  # fed, read as a shape
    np.testing.assert_array_equal(y, [1.0, 2.0, 3.0])
    const = helper.make_tensor("c", I64, [1], [BIG])
    refused = _model([helper.make_node("Constant", [], ["y"], value=const, name="big")], [], [])
    refused.graph.output.append(_vi("y", I64, [1]))
    with pytest.raises(ValueError, match=r"graph output 'y' of node 'big' \(ai.onnx.Constant\)"):
        backend.prepare(refused).run([])


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(value, name))


def test_constant_of_shape_without_value_fills_float32_zeros() -> None:
    # F4: the default value (a float32 zero) raised IndexError.
    node = helper.make_node("ConstantOfShape", ["shape"], ["y"])
    shape = np.array([2, 3], np.int64)
    (y,) = backend.run_node(node, [shape])
    model = _graph_model([_constant("shape", shape), node], [], [_vi("y", F32, [2, 3])])
    from onnx.reference import ReferenceEvaluator

    (want,) = ReferenceEvaluator(model).run(None, {})
    assert y.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(y, want)
    many = onnx.numpy_helper.from_array(np.ones(2, np.float32), "value")
    wrong = helper.make_node("ConstantOfShape", ["shape"], ["y"], value=many)
    with pytest.raises(ValueError, match=r"ConstantOfShape.*'value' must hold one element, got 2"):
        backend.run_node(wrong, [shape])


def _range_model(limit: float) -> onnx.ModelProto:
    nodes = [
        _constant("start", np.array(0.0, np.float32)),
        _constant("limit", np.array(limit, np.float32)),
        _constant("delta", np.array(1.0, np.float32)),
        helper.make_node("Range", ["start", "limit", "delta"], ["y"], name="r"),
    ]
    return _graph_model(nodes, [], [_vi("y", F32, ["n"])])


@pytest.mark.parametrize("limit", [np.inf, -np.inf, np.nan])
def test_range_with_a_limit_that_is_not_finite_is_refused(limit: float) -> None:
    # F5: an infinite limit raised OverflowError.
    with pytest.raises(
        ValueError, match=r"node 'r' \(ai\.onnx\.Range\).*no finite number of elements"
    ):
        backend.prepare(_range_model(limit)).run([])


def test_range_larger_than_the_tensor_limit_is_refused_before_allocating() -> None:
    # F6: limit 3e9 allocated 22 GiB (MemoryError, or the machine swapping).
    script = """
        import numpy as np
        from onnx_optax import backend
        from tests.ops.test_shape_range_hostile import _range_model

        try:
            backend.prepare(_range_model(3e9)).run([])
            print("RESULT ran")
        except ValueError as error:
            print("RESULT ValueError", error)
    """
    found = _outcome(script)
    assert re.search(rf"RESULT ValueError .*node 'r' \(ai\.onnx\.Range\).*{LIMIT_HINT}", found)
    (y,) = backend.prepare(_range_model(5.0)).run([])
    np.testing.assert_array_equal(y, np.arange(5, dtype=np.float32))
