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

import pathlib
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from onnx_optax import backend  # noqa: E402
from tests.test_hostile_nn import NAMED, assert_as_onnxruntime, node_model, theirs  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _x(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("k", [np.array([[1]], np.int64), np.array(1, np.int64)], ids=["2d", "0d"])
def test_top_k_takes_k_as_one_value_in_one_dimension(k: np.ndarray) -> None:
    """The schema's K is a 1-D tensor of one value; onnxruntime refuses other shapes."""
    model = node_model("TopK", {"x": _x(3, 4)}, consts={"k": k}, outputs=(F, I64))
    assert theirs(model, {"x": _x(3, 4)}) is None
    assert_as_onnxruntime(model, {"x": _x(3, 4)})


def _nms(iou: float | None = None, **attrs: int) -> onnx.ModelProto:
    consts = {
        "boxes": np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 5, 1, 6]]], np.float32),
        "scores": np.array([[[0.9, 0.8, 0.7]]], np.float32),
        "max": np.array([3], np.int64),
    }
    if iou is not None:
        consts["iou"] = np.array([iou], np.float32)
    return node_model("NonMaxSuppression", {}, attrs, consts=consts, outputs=(I64,), rank=2)


@pytest.mark.parametrize("iou", [1.5, -0.5, float("nan")])
def test_non_max_suppression_refuses_an_iou_threshold_outside_0_1(iou: float) -> None:
    assert theirs(_nms(iou), {}) is None
    assert_as_onnxruntime(_nms(iou), {})


def test_non_max_suppression_refuses_an_unknown_box_format() -> None:
    assert theirs(_nms(center_point_box=7), {}) is None
    assert_as_onnxruntime(_nms(center_point_box=7), {})


def test_non_max_suppression_within_its_range_still_matches_onnxruntime() -> None:
    for iou in (0.0, 0.5, 1.0):
        assert_as_onnxruntime(_nms(iou), {})
    assert_as_onnxruntime(_nms(0.5, center_point_box=1), {})


def _attention(scale: float) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    feeds = {
        name: rng.standard_normal(shape).astype(np.float32)
        for name, shape in (("q", (1, 2, 3, 4)), ("k", (1, 2, 5, 4)), ("v", (1, 2, 5, 4)))
    }
    return node_model("Attention", feeds, {"scale": scale}, opset=23), feeds


def test_attention_refuses_a_scale_of_zero() -> None:
    """onnxruntime refuses a scale that is not positive (0 made every score equal)."""
    model, feeds = _attention(0.0)
    assert theirs(model, feeds) is None
    assert_as_onnxruntime(model, feeds)


def test_attention_refuses_a_nan_scale() -> None:
    """onnxruntime reads a NaN scale as absent; a NaN given is refused, never NaN outputs."""
    model, feeds = _attention(float("nan"))
    with pytest.raises(ValueError, match=NAMED + ".*scale nan must be positive"):
        backend.prepare(model).run(feeds)


def test_attention_with_a_positive_scale_still_matches_onnxruntime() -> None:
    assert_as_onnxruntime(*_attention(0.7))


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


EMPTY_FED_INDICES = {
    "Gather": ({"x": _x(3, 2), "i": np.zeros(0, np.int64)}, 2),
    "GatherElements": ({"x": _x(3, 2), "i": np.zeros((0, 2), np.int64)}, 2),
    "GatherND": ({"x": _x(3, 2), "i": np.zeros((0, 2), np.int64)}, 1),
    "ScatterElements": (
        {"x": _x(3, 2), "i": np.zeros((0, 2), np.int64), "u": np.zeros((0, 2), np.float32)},
        2,
    ),
}


@pytest.mark.parametrize("op", sorted(EMPTY_FED_INDICES))
def test_indices_fed_empty_are_checked_without_error(op: str) -> None:
    """The run-time index check took the argmax of no flags, a ValueError naming the node
    with numpy's "argmax of an empty sequence" for a legitimate empty index."""
    feeds, rank = EMPTY_FED_INDICES[op]
    assert_as_onnxruntime(node_model(op, feeds, rank=rank), feeds)


def test_rotary_embedding_with_no_positions_fed() -> None:
    rng = np.random.default_rng(2)
    feeds = {
        "x": np.zeros((1, 2, 0, 4), np.float32),
        "cos": rng.standard_normal((5, 2)).astype(np.float32),
        "sin": rng.standard_normal((5, 2)).astype(np.float32),
        "p": np.zeros((1, 0), np.int64),
    }
    assert_as_onnxruntime(node_model("RotaryEmbedding", feeds, opset=23), feeds)


@pytest.mark.parametrize("value", ["no", 0, 1, None])
def test_session_takes_shard_parameters_as_a_bool(value: object) -> None:
    """shard_parameters="no" sharded the parameters (any truthy value did), where remat
    already refused what is not a bool."""
    import jax
    from onnx import helper, numpy_helper

    import onnx_optax
    from onnx_optax import training

    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["logits"])],
        "g",
        [helper.make_tensor_value_info("x", F, ["N", 4])],
        [helper.make_tensor_value_info("logits", F, ["N", 3])],
        initializer=[w],
    )
    inference = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model = training.attach(inference, target="label", optimizer=onnx_optax.adam(0.1))
    with pytest.raises(TypeError, match="shard_parameters must be True or False"):
        training.Session(model, devices=jax.devices(), shard_parameters=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "second",
    [["--inference", "{o}"], ["--log", "{o}"], ["--inference", "{d}/sub/../m.onnx"]],
    ids=["inference", "log", "inference-by-another-path"],
)
def test_train_refuses_two_outputs_in_one_file(
    tmp_path: pathlib.Path, second: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """-o m.onnx --inference m.onnx wrote the trained model, then replaced it with the
    inference model: the training state was lost, exit 0. Now exit 2 before any step."""
    from onnx_optax import cli
    from tests.test_cli import _inference_model, _npz

    _inference_model(tmp_path / "in.onnx")
    assert cli.main(["attach", str(tmp_path / "in.onnx"), "-o", str(tmp_path / "t.onnx")]) == 0
    _npz(tmp_path / "d.npz", x=np.zeros((8, 4), np.float32), target=np.zeros(8, np.int64))
    (tmp_path / "sub").mkdir()
    out = str(tmp_path / "m.onnx")
    extra = [arg.format(o=out, d=tmp_path) for arg in second]
    capsys.readouterr()
    status = cli.main([
        "train", str(tmp_path / "t.onnx"), "--data", str(tmp_path / "d.npz"),
        "--steps", "1", "--batch-size", "4", "-o", out, *extra,
    ])  # fmt: skip
    assert status == 2
    assert "give each output its own file" in capsys.readouterr().err
    assert not (tmp_path / "m.onnx").exists()


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


def test_loop_scan_output_that_changes_shape_is_refused_by_name() -> None:
    """An unrolled Loop (its body reads the iteration number as Range's limit) whose scan
    output grows each iteration ended in jnp.stack's 'All input arrays must have the
    same shape'; onnxruntime refuses it too ('Inconsistent shape in loop output')."""
    from onnx import helper, numpy_helper

    ints = TensorProto.INT64
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["c_in"], ["c_out"]),
            helper.make_node("Identity", ["x_in"], ["x_out"]),
            helper.make_node("Range", ["zero", "i", "one"], ["r"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", ints, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_in", F, [1]),
        ],
        [
            helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_out", F, [1]),
            helper.make_tensor_value_info("r", ints, None),
        ],
        initializer=[
            numpy_helper.from_array(np.array(0, np.int64), "zero"),
            numpy_helper.from_array(np.array(1, np.int64), "one"),
        ],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "x"], ["y", "rs"], name="n", body=body)],
        "g",
        [helper.make_tensor_value_info("x", F, [1])],
        [
            helper.make_tensor_value_info("y", F, ["a"]),
            helper.make_tensor_value_info("rs", ints, ["a", "b"]),
        ],
        initializer=[numpy_helper.from_array(np.array(3, np.int64), "M")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    feeds = {"x": np.array([2.0], np.float32)}
    assert theirs(model, feeds) is None
    with pytest.raises(ValueError, match=r"node 'n' \(ai\.onnx\.Loop\): scan output 'r' differs"):
        backend.prepare(model).run(feeds)
