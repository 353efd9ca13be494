"""GridSample, AffineGrid, CenterCropPad, Col2Im, DeformConv and RoiAlign beyond ONNX's node cases.

Values against onnx's reference evaluator (``onnx.reference``) on random inputs
over every mode and attribute; gradients of GridSample, DeformConv and RoiAlign
(avg) against float64 central differences; refusals of bad attributes and
shapes, each naming the node.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax._src.graph import GraphFunction  # noqa: E402

RNG = np.random.default_rng(0)


def node_model(
    op: str,
    feeds: dict[str, np.ndarray],
    inits: dict[str, np.ndarray] | None = None,
    opset: int = 22,
    rank: int = 4,
    **attrs: Any,
) -> Any:
    """One node ``n`` of ``op`` with an output of ``rank``: fed inputs, then initializers."""
    inits = inits or {}
    names = [*feeds, *inits]
    node = helper.make_node(op, names, ["y"], name="n", **attrs)
    elem = helper.np_dtype_to_tensor_dtype(next(iter(feeds.values())).dtype)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in feeds.items()
        ],
        [helper.make_tensor_value_info("y", elem, [f"d{i}" for i in range(rank)])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check_against_reference(model: Any, feeds: dict[str, np.ndarray], tol: float = 1e-5) -> None:
    with np.errstate(divide="ignore"):  # AffineGrid's reference divides by an axis of 1 - 1
        (expected,) = ReferenceEvaluator(model).run(None, feeds)
    (got,) = backend.prepare(model).run(feeds)
    assert np.asarray(got).shape == expected.shape
    np.testing.assert_allclose(np.asarray(got), expected, rtol=tol, atol=tol)


def check_gradient(
    model: Any, feeds: dict[str, np.ndarray], wrt: list[str], points: int = 8
) -> None:
    """jax.grad of a random weighting of the output against central differences (float64)."""
    with jax.enable_x64(True):
        graph = GraphFunction(model.graph, opsets={"": model.opset_import[0].version})
        out = np.asarray(backend.prepare(model).run(feeds)[0])
        weights = np.random.default_rng(1).standard_normal(out.shape)

        @jax.jit
        def loss(values: dict[str, Any]) -> Any:
            return (graph.apply({**feeds, **values})[0] * weights).sum()

        values = {k: feeds[k] for k in wrt}
        grads = jax.grad(loss)(values)
        step = 1e-6
        pick = np.random.default_rng(2)
        for name in wrt:
            grad = np.asarray(grads[name])
            assert np.abs(grad).max() > 1e-3, name
            for flat in pick.choice(grad.size, min(points, grad.size), replace=False):
                index = np.unravel_index(flat, grad.shape)
                plus, minus = values[name].copy(), values[name].copy()
                plus[index] += step
                minus[index] -= step
                expected = (
                    float(loss({**values, name: plus})) - float(loss({**values, name: minus}))
                ) / (2 * step)
                assert abs(grad[index] - expected) <= 1e-6 + 1e-5 * abs(expected), (name, index)


# ----------------------------------------------------------------------------- GridSample


def grid_feeds(spatial: tuple[int, ...], out: tuple[int, ...], dtype: Any = np.float32) -> dict:
    x = RNG.standard_normal((2, 3, *spatial)).astype(dtype)
    shape = (2, *out, len(spatial))
    far = np.where(RNG.uniform(size=shape) < 0.3, 3.0, 1.0)  # some points bounce twice or more
    grid = (RNG.uniform(-1.3, 1.3, shape) * far).astype(dtype)
    return {"x": x, "grid": grid}


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_matches_reference(mode: str, padding: str, align: int) -> None:
    """Cubic with border padding against onnxruntime (and PyTorch): the taps clamped, not the
    coordinate, which onnx's reference clamps too."""
    feeds = grid_feeds((4, 5), (3, 4))
    model = node_model("GridSample", feeds, mode=mode, padding_mode=padding, align_corners=align)
    if (mode, padding) != ("cubic", "border"):
        check_against_reference(model, feeds)
        return
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, feeds)
    (got,) = backend.prepare(model).run(feeds)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "reflection"])
def test_grid_sample_5d_matches_reference(mode: str, padding: str) -> None:
    feeds = grid_feeds((3, 4, 5), (2, 1, 3))
    model = node_model(
        "GridSample", feeds, rank=5, mode=mode, padding_mode=padding, align_corners=1
    )
    check_against_reference(model, feeds)


def test_grid_sample_opset_16_names() -> None:
    feeds = grid_feeds((4, 5), (3, 4))
    for old, new in (("bilinear", "linear"), ("bicubic", "cubic")):
        got = backend.prepare(node_model("GridSample", feeds, opset=16, mode=old)).run(feeds)
        want = backend.prepare(node_model("GridSample", feeds, mode=new)).run(feeds)
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    check_against_reference(node_model("GridSample", feeds, mode="linear"), feeds)


def test_grid_sample_nearest_picks_integers_exactly() -> None:
    x = (np.arange(2 * 20).reshape(1, 2, 4, 5) + 2**40).astype(np.int64)
    grid = RNG.uniform(-1, 1, (1, 3, 3, 2)).astype(np.float32)
    feeds = {"x": x, "grid": grid}
    model = node_model("GridSample", feeds, mode="nearest")
    with jax.enable_x64(True):
        (got,) = backend.prepare(model).run(feeds)
    (expected,) = ReferenceEvaluator(model).run(None, feeds)
    np.testing.assert_array_equal(np.asarray(got), expected)


@pytest.mark.parametrize(
    ("mode", "padding", "align"),
    [("linear", "zeros", 0), ("cubic", "border", 1), ("linear", "reflection", 0)],
)
def test_grid_sample_gradient(mode: str, padding: str, align: int) -> None:
    feeds = grid_feeds((4, 5), (3, 4), np.float64)
    model = node_model("GridSample", feeds, mode=mode, padding_mode=padding, align_corners=align)
    check_gradient(model, feeds, ["x", "grid"])


# ----------------------------------------------------------------------------- AffineGrid


@pytest.mark.parametrize("size", [[2, 3, 4, 5], [2, 1, 3, 4, 2], [2, 1, 1, 3]])
@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid_matches_reference(size: list[int], align: int) -> None:
    rank = len(size) - 2
    feeds = {"theta": RNG.standard_normal((2, rank, rank + 1)).astype(np.float32)}
    model = node_model(
        "AffineGrid",
        feeds,
        {"size": np.asarray(size, np.int64)},
        rank=rank + 2,
        align_corners=align,
    )
    check_against_reference(model, feeds)


# ----------------------------------------------------------------------------- CenterCropPad


@pytest.mark.parametrize(
    ("shape", "target", "axes"),
    [
        ((5, 6, 3), [2, 9, 3], None),
        ((5, 6, 3), [8, 3], [0, 1]),
        ((4, 7, 2), [5, 2], [-1, 0]),
        ((3, 3), [0, 6], None),
        ((), [], None),
    ],
)
def test_center_crop_pad_matches_reference(
    shape: tuple[int, ...], target: list[int], axes: list[int] | None
) -> None:
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    attrs = {} if axes is None else {"axes": axes}
    inits = {"shape": np.asarray(target, np.int64)}
    model = node_model("CenterCropPad", feeds, inits, rank=len(shape), **attrs)
    check_against_reference(model, feeds)


# ----------------------------------------------------------------------------- Col2Im


@pytest.mark.parametrize(
    ("image", "block", "attrs"),
    [
        ([5, 6], [2, 3], {}),
        ([6, 5], [3, 2], {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}),
        ([4, 3, 5], [2, 1, 2], {"strides": [1, 2, 2], "pads": [0, 1, 1, 1, 0, 0]}),
    ],
)
def test_col2im_matches_reference(image: list[int], block: list[int], attrs: dict) -> None:
    rank = len(image)
    strides = attrs.get("strides", [1] * rank)
    dilations = attrs.get("dilations", [1] * rank)
    pads = attrs.get("pads", [0] * 2 * rank)
    counts = [
        (image[i] + pads[i] + pads[i + rank] - (block[i] - 1) * dilations[i] - 1) // strides[i] + 1
        for i in range(rank)
    ]
    x = RNG.standard_normal((2, 3 * int(np.prod(block)), int(np.prod(counts))))
    feeds = {"x": x.astype(np.float32)}
    inits = {"image": np.asarray(image, np.int64), "block": np.asarray(block, np.int64)}
    check_against_reference(node_model("Col2Im", feeds, inits, rank=2 + rank, **attrs), feeds)


# ----------------------------------------------------------------------------- DeformConv


def deform_feeds(
    dtype: Any, group: int, offset_group: int, masked: bool, out: tuple[int, int]
) -> dict[str, np.ndarray]:
    feeds = {
        "x": RNG.standard_normal((2, 4, 5, 6)),
        "w": RNG.standard_normal((4, 4 // group, 2, 3)),
        "offset": RNG.uniform(-1.5, 1.5, (2, offset_group * 2 * 6, *out)),
        "b": RNG.standard_normal(4),
    }
    if masked:
        feeds["mask"] = RNG.uniform(0, 1, (2, offset_group * 6, *out))
    return {k: v.astype(dtype) for k, v in feeds.items()}


@pytest.mark.parametrize(
    ("group", "offset_group", "masked", "attrs", "out"),
    [
        (1, 1, False, {}, (4, 4)),
        (2, 2, True, {"pads": [1, 0, 1, 2], "strides": [2, 1]}, (3, 6)),
        (1, 4, True, {"dilations": [2, 1], "pads": [1, 1, 1, 1]}, (5, 6)),
    ],
)
def test_deform_conv_matches_reference(
    group: int, offset_group: int, masked: bool, attrs: dict, out: tuple[int, int]
) -> None:
    feeds = deform_feeds(np.float32, group, offset_group, masked, out)
    model = node_model(
        "DeformConv", feeds, group=group, offset_group=offset_group, kernel_shape=[2, 3], **attrs
    )
    check_against_reference(model, feeds, tol=1e-4)


@pytest.mark.parametrize(
    ("spatial", "kernel", "attrs"),
    [
        ((7,), (3,), {"pads": [1, 2], "strides": [2]}),
        ((4, 5, 3), (2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1], "dilations": [1, 1, 2]}),
    ],
)
def test_deform_conv_without_offsets_is_onnxruntime_conv(
    spatial: tuple[int, ...], kernel: tuple[int, ...], attrs: dict
) -> None:
    """1-D and 3-D (onnx's reference has 2-D alone): zero offsets are a Conv."""
    ort = pytest.importorskip("onnxruntime")
    out = [
        (n + attrs["pads"][i] + attrs["pads"][i + len(spatial)] - (k - 1) * d - 1) // s + 1
        for i, (n, k, d, s) in enumerate(
            zip(
                spatial,
                kernel,
                attrs.get("dilations", [1] * len(spatial)),
                attrs.get("strides", [1] * len(spatial)),
                strict=True,
            )
        )
    ]
    x = RNG.standard_normal((2, 4, *spatial)).astype(np.float32)
    w = RNG.standard_normal((6, 2, *kernel)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    offset = np.zeros((2, 2 * int(np.prod(kernel)) * len(kernel), *out), np.float32)
    feeds = {"x": x, "w": w, "offset": offset, "b": b}
    rank = 2 + len(spatial)
    model = node_model("DeformConv", feeds, rank=rank, group=2, offset_group=2, **attrs)
    (got,) = backend.prepare(model).run(feeds)
    conv = node_model("Conv", {"x": x, "w": w, "b": b}, rank=rank, opset=18, group=2, **attrs)
    session = ort.InferenceSession(conv.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x, "w": w, "b": b})
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


def test_deform_conv_gradient() -> None:
    feeds = deform_feeds(np.float64, 2, 2, True, (3, 6))
    model = node_model(
        "DeformConv", feeds, group=2, offset_group=2, pads=[1, 0, 1, 2], strides=[2, 1]
    )
    check_gradient(model, feeds, ["x", "w", "offset", "mask", "b"])


# ----------------------------------------------------------------------------- RoiAlign


def roi_feeds(dtype: Any = np.float32) -> dict[str, np.ndarray]:
    x = RNG.standard_normal((2, 3, 8, 10))
    corners = RNG.uniform(0, 1, (5, 2, 2)) * np.array([20.0, 16.0])  # x in [0, 20), y in [0, 16)
    rois = np.concatenate([corners.min(axis=1), corners.max(axis=1)], axis=1)
    return {"x": x.astype(dtype), "rois": rois.astype(dtype)}


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("coordinates", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("ratio", [0, 2])
def test_roi_align_matches_reference(mode: str, coordinates: str, ratio: int) -> None:
    feeds = {**roi_feeds(), "batch": np.array([0, 1, 1, 0, 1], np.int64)}
    model = node_model(
        "RoiAlign",
        feeds,
        mode=mode,
        coordinate_transformation_mode=coordinates,
        output_height=3,
        output_width=2,
        sampling_ratio=ratio,
        spatial_scale=0.5,
    )
    check_against_reference(model, feeds)


def test_roi_align_many_points_per_bin() -> None:
    """Traced rois up to all of a 40 x 40 X in 2 x 2 bins: up to 20 x 20 points per bin, averaged
    through the rows and columns of X (no gather of every point)."""
    x = RNG.standard_normal((2, 3, 40, 40)).astype(np.float32)
    rois = np.array([[0, 0, 40, 40], [3.5, 1.2, 30.1, 38.7], [10, 20, 12, 21]], np.float32)
    feeds = {"x": x, "rois": rois, "batch": np.array([1, 0, 1], np.int64)}
    for ctm in ("half_pixel", "output_half_pixel"):
        model = node_model(
            "RoiAlign", feeds, output_height=2, output_width=2, coordinate_transformation_mode=ctm
        )
        check_against_reference(model, feeds)


def test_roi_align_known_rois() -> None:
    """rois of a Constant: the points per bin counted while tracing (rois beyond X too)."""
    feeds = roi_feeds()
    x = {"x": feeds["x"]}
    rois = numpy_helper.from_array(feeds["rois"] * 3, "rois")
    inits = {"batch": np.array([1, 0, 1, 1, 0], np.int64)}
    model = node_model("RoiAlign", x, inits, output_height=2, output_width=4)
    model.graph.node[0].input.insert(1, "rois")
    model.graph.node.insert(0, helper.make_node("Constant", [], ["rois"], value=rois))
    check_against_reference(model, x)


def test_roi_align_opset_10_is_output_half_pixel() -> None:
    """Opset 10 has no coordinate_transformation_mode: onnxruntime reads output_half_pixel
    (onnx's reference evaluator, half_pixel)."""
    ort = pytest.importorskip("onnxruntime")
    feeds = {**roi_feeds(), "batch": np.array([0, 1, 1, 0, 1], np.int64)}
    model = node_model(
        "RoiAlign", feeds, opset=10, output_height=2, output_width=3, spatial_scale=0.5
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, feeds)
    (got,) = backend.prepare(model).run(feeds)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)


def test_roi_align_gradient() -> None:
    feeds = {**roi_feeds(np.float64), "batch": np.array([0, 1, 1, 0, 1], np.int64)}
    model = node_model("RoiAlign", feeds, output_height=3, output_width=2, spatial_scale=0.5)
    check_gradient(model, feeds, ["x", "rois"])


# ----------------------------------------------------------------------------- refusals


def refused(model: Any, feeds: dict[str, np.ndarray], message: str) -> None:
    op = model.graph.node[0].op_type
    with pytest.raises(ValueError, match=rf"node 'n' \(ai\.onnx\.{op}\).*{message}"):
        backend.prepare(model).run(feeds)


def test_grid_sample_refusals_name_the_node() -> None:
    feeds = grid_feeds((4, 5), (3, 4))
    refused(node_model("GridSample", feeds, mode="bilinear"), feeds, "mode 'bilinear'")
    refused(node_model("GridSample", feeds, padding_mode="wrap"), feeds, "padding_mode 'wrap'")
    five = grid_feeds((3, 4, 5), (2, 2, 3))
    refused(node_model("GridSample", five, opset=16, rank=5), five, "4-D X; N-D needs opset 20")
    bad = {"x": feeds["x"], "grid": feeds["grid"][..., :1]}
    refused(node_model("GridSample", bad), bad, "must end in 2 coordinates")


def test_affine_grid_and_center_crop_pad_refusals_name_the_node() -> None:
    theta = {"theta": np.zeros((2, 2, 3), np.float32)}
    size = {"size": np.asarray([3, 1, 4, 4], np.int64)}
    refused(node_model("AffineGrid", theta, size), theta, r"theta of shape \[2, 2, 3\]")
    x = {"x": np.zeros((3, 4), np.float32)}
    refused(
        node_model("CenterCropPad", x, {"shape": np.asarray([2], np.int64)}, rank=2),
        x,
        "holds 1 sizes for 2 axes",
    )


def test_col2im_and_deform_conv_refusals_name_the_node() -> None:
    x = {"x": np.zeros((1, 6, 11), np.float32)}
    inits = {"image": np.asarray([4, 5], np.int64), "block": np.asarray([2, 3], np.int64)}
    refused(node_model("Col2Im", x, inits), x, r"must be \(N, C x 6, 9\)")
    feeds = deform_feeds(np.float32, 1, 1, False, (4, 4))
    feeds["offset"] = feeds["offset"][:, :6]
    refused(node_model("DeformConv", feeds), feeds, "offset of shape")
    feeds = deform_feeds(np.float32, 1, 1, False, (4, 4))
    refused(node_model("DeformConv", feeds, offset_group=3), feeds, "offset_group 3")


def test_roi_align_refusals_name_the_node() -> None:
    feeds = {**roi_feeds(), "batch": np.array([0, 1, 1, 0, 1], np.int64)}
    refused(node_model("RoiAlign", feeds, mode="sum"), feeds, "mode 'sum'")
    outside = {**feeds, "batch": np.array([0, 1, 2, 0, 1], np.int64)}
    refused(node_model("RoiAlign", outside), outside, r"batch_indices hold 2, outside \[0, 2\)")
    huge = {**feeds, "rois": feeds["rois"] * 10}
    refused(node_model("RoiAlign", huge), huge, "set sampling_ratio")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("ratio", [0, 2])
@pytest.mark.parametrize("known", [False, True])
def test_roi_align_refuses_rois_that_are_not_finite(bad: float, ratio: int, known: bool) -> None:
    """onnxruntime: "All 'rois' values must be finite"; a NaN or infinite corner was a result
    of NaN (issue 33), fed or a Constant, with or without sampling_ratio."""
    ort = pytest.importorskip("onnxruntime")
    feeds = {**roi_feeds(), "batch": np.array([0, 1, 1, 0, 1], np.int64)}
    feeds["rois"][3, 2] = bad
    inits = {}
    if known:
        inits = {"rois": feeds.pop("rois"), "batch": feeds.pop("batch")}
    model = node_model("RoiAlign", feeds, inits, opset=16, sampling_ratio=ratio)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="must be finite"):
        session.run(None, feeds)
    refused(model, feeds, f"rois hold {bad}, not finite")


# ----------------------------------------------------------------------------- training


def test_training_through_deform_conv_grid_sample_and_roi_align() -> None:
    """Conv -> offsets -> DeformConv -> GridSample -> RoiAlign (avg) trains: the loss falls."""
    import onnx_optax
    from onnx_optax import training

    rng = np.random.default_rng(5)
    f32 = onnx.TensorProto.FLOAT
    weights = {
        "w_offset": rng.normal(0, 0.1, (8, 2, 3, 3)),
        "w": rng.normal(0, 0.3, (3, 2, 2, 2)),
        "b": np.zeros(3),
        "grid": rng.uniform(-1, 1, (1, 5, 5, 2)),
    }
    constants = {"rois": np.array([[0.0, 0.0, 4.0, 4.0]]), "batch": np.zeros(1, np.int64)}
    nodes = [
        helper.make_node("Conv", ["x", "w_offset"], ["offset"], pads=[1, 1, 1, 1]),
        helper.make_node("DeformConv", ["x", "w", "offset", "b"], ["d"], pads=[1, 1, 0, 0]),
        helper.make_node("GridSample", ["d", "grid"], ["g"], mode="cubic"),
        helper.make_node(
            "RoiAlign", ["g", "rois", "batch"], ["r"], output_height=2, output_width=2
        ),
        helper.make_node("Flatten", ["r"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "spatial",
        [helper.make_tensor_value_info("x", f32, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("y", f32, [1, 12])],
        initializer=[
            numpy_helper.from_array(np.asarray(v, np.int64 if k == "batch" else np.float32), k)
            for k, v in {**weights, **constants}.items()
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    trainable = ["w_offset", "w", "b", "grid"]
    model = training.attach(
        model,
        loss="mse",
        target="t",
        optimizer=onnx_optax.adam(0.03),
        trainable=trainable,
    )
    session = training.Session(model)
    batch = {
        "x": rng.standard_normal((1, 2, 6, 6)).astype(np.float32),
        "t": rng.standard_normal((1, 12)).astype(np.float32),
    }
    losses = [float(session.step(batch)["loss"]) for _ in range(30)]
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.5 * losses[0], losses


def test_half_precision_inputs_are_computed_in_float32() -> None:
    feeds = grid_feeds((4, 5), (3, 4))
    half = {k: v.astype(np.float16) for k, v in feeds.items()}
    model = node_model("GridSample", half, mode="cubic", padding_mode="reflection")
    (got,) = backend.prepare(model).run(half)
    wide = {k: v.astype(np.float32) for k, v in half.items()}
    reference = node_model("GridSample", wide, mode="cubic", padding_mode="reflection")
    (expected,) = ReferenceEvaluator(reference).run(None, wide)
    assert np.asarray(got).dtype == np.float16
    np.testing.assert_allclose(np.asarray(got, np.float32), expected, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize(
    ("op", "feeds", "shape"),
    [
        (
            "DeformConv",
            {"x": (0, 1, 3, 3), "w": (1, 1, 1, 1), "offset": (0, 2, 3, 3)},
            (0, 1, 3, 3),
        ),
        (
            "DeformConv",
            {"x": (1, 0, 3, 3), "w": (2, 0, 1, 1), "offset": (1, 2, 3, 3)},
            (1, 2, 3, 3),
        ),
        ("GridSample", {"x": (0, 2, 3, 3), "grid": (0, 2, 2, 2)}, (0, 2, 2, 2)),
        ("GridSample", {"x": (1, 2, 0, 3), "grid": (1, 2, 2, 2)}, (1, 2, 2, 2)),
        ("RoiAlign", {"x": (1, 2, 3, 3), "rois": (0, 4), "b": (0,)}, (0, 2, 1, 1)),
    ],
)
def test_empty_inputs_give_zeros(op: str, feeds: dict, shape: tuple[int, ...]) -> None:
    """An empty batch or channel axis, or a point sampled from an empty X, reads 0."""
    values = {k: np.zeros(s, np.int64 if k == "b" else np.float32) for k, s in feeds.items()}
    (got,) = backend.prepare(node_model(op, values)).run(values)
    assert np.asarray(got).shape == shape
    assert not np.asarray(got).any()
