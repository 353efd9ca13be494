"""Hostile attributes against the ops added since the last audit (issue 20, a third audit).

Each test is a finding of the audit of 027012a and fails there: inputs and attributes
onnxruntime refuses that were computed (a 2-D or scalar TopK K, a NonMaxSuppression
iou_threshold outside [0, 1] or center_point_box outside {0, 1}, an Attention scale of 0,
a MatMulInteger zero point that broadcast its input to a larger shape), and a
QuantizeLinear block longer than its axis, which onnxruntime computes as one block and
which ended in an OverflowError. Expected values are onnxruntime's (its refusal, or its
outputs for the same model), or numpy written here.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from onnx_optax import backend  # noqa: E402
from tests.support.audit_inputs import seeded_floats as _x  # noqa: E402
from tests.support.node_models import NAMED, assert_as_onnxruntime, node_model, theirs  # noqa: E402


@pytest.mark.parametrize("block", [4, 5, 2**31, 2**62])
def test_quantize_linear_block_longer_than_its_axis_is_one_block(block: int) -> None:
    """A block_size of 2**62 asked numpy to repeat the scale 2**62 times (OverflowError)."""
    x = (_x(2, 4) * 50).astype(np.float32)
    consts = {"s": np.array([[0.5], [2.0]], np.float32), "z": np.array([[3], [250]], np.uint8)}
    model = node_model(
        "QuantizeLinear",
        {"x": x},
        {"axis": 1, "block_size": block},
        consts=consts,
        outputs=(TensorProto.UINT8,),
    )
    expected = np.clip(np.rint(x / consts["s"]) + consts["z"], 0, 255).astype(np.uint8)
    assert_as_onnxruntime(model, {"x": x}, [expected])


def _matmul_integer(a_zp: np.ndarray) -> onnx.ModelProto:
    return node_model(
        "MatMulInteger",
        {"a": np.array([[1, 2]], np.uint8), "b": np.array([[1], [2]], np.uint8)},
        consts={"za": a_zp},
        outputs=(TensorProto.INT32,),
    )


@pytest.mark.parametrize(
    "a_zp", [np.array([1, 2, 3], np.uint8), np.array([[1], [2]], np.uint8)], ids=["1d", "2d"]
)
def test_matmul_integer_refuses_a_zero_point_that_widens_its_input(a_zp: np.ndarray) -> None:
    """A of one row with three (or two) row zero points gave a [3, 1] (or [2, 1]) product
    where the spec's output is A's [1, 1]; onnxruntime refuses both."""
    feeds = {"a": np.array([[1, 2]], np.uint8), "b": np.array([[1], [2]], np.uint8)}
    assert theirs(_matmul_integer(a_zp), feeds) is None
    with pytest.raises(ValueError, match=NAMED + ".*a_zero_point of shape"):
        backend.prepare(_matmul_integer(a_zp)).run(feeds)


def test_matmul_integer_per_row_zero_points_still_compute() -> None:
    """The spec's per-row zero points (one per row of A), against numpy."""
    a = np.array([[1, 2], [3, 4]], np.uint8)
    b = np.array([[1, 7], [2, 9]], np.uint8)
    za = np.array([1, 2], np.uint8)
    model = node_model(
        "MatMulInteger", {"a": a, "b": b}, consts={"za": za}, outputs=(TensorProto.INT32,)
    )
    (got,) = backend.prepare(model).run({"a": a, "b": b})
    want = (a.astype(np.int32) - za.astype(np.int32)[:, None]) @ b.astype(np.int32)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("elem", "zero"),
    [
        (TensorProto.INT8, np.int8(0)),
        (TensorProto.INT16, np.int16(3)),
        (TensorProto.UINT8, np.uint8(3)),
    ],
    ids=["int8", "int16", "uint8"],
)
@pytest.mark.parametrize("fed", [True, False], ids=["fed", "constant"])
def test_quantize_linear_of_nan_is_the_low_end(elem: int, zero: np.generic, fed: bool) -> None:
    """NaN quantized to 0 (XLA's cast of NaN to int32); onnxruntime and onnx's reference
    give the type's lowest value (-128 for int8), the zero point not added."""
    x = np.array([np.nan, 1.0, -np.inf, np.inf, 2.5], np.float32)
    consts = {"s": np.array(1, np.float32), "z": np.asarray(zero)}
    feeds = {"x": x} if fed else {}
    if not fed:
        consts = {"x": x, **consts}
    model = node_model("QuantizeLinear", feeds, consts=consts, outputs=(elem,), rank=1)
    want = theirs(model, feeds)
    assert want is not None
    low = np.iinfo(np.asarray(zero).dtype).min
    assert want[0][0] == low
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # its cast of NaN
        reference = ReferenceEvaluator(model).run(None, feeds)
    np.testing.assert_array_equal(reference[0][:1], [low])
    assert_as_onnxruntime(model, feeds, want)
