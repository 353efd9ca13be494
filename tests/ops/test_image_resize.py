"""Resize against onnxruntime on random inputs, its gradient against central differences.

ONNX's node cases (tests/support/onnx_suite.py) hold one input each; these run every
mode with every coordinate transformation on random 4-D inputs, up and down,
from scales and from sizes, and opset 10's form. align_corners and
tf_crop_and_resize divide by the unrounded output length (onnx's reference);
onnxruntime divides by the rounded one, so they are compared where the two agree
(a whole ``scale * length``, or sizes).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax._src.graph import GraphFunction  # noqa: E402

COORDINATES = [
    "half_pixel",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
    "half_pixel_symmetric",
]


def resize_model(
    shape: tuple[int, ...],
    *,
    scales: list[float] | None = None,
    sizes: list[int] | None = None,
    roi: list[float] | None = None,
    opset: int = 19,
    elem: int = TensorProto.FLOAT,
    **attrs: Any,
) -> Any:
    """A Resize of input x with its roi, scales and sizes as initializers."""
    inits = []
    if opset < 11:
        inputs = ["x", "scales"]
        inits.append(numpy_helper.from_array(np.asarray(scales, np.float32), "scales"))
    else:
        inputs = ["x", "roi" if roi is not None else "", "scales" if scales is not None else ""]
        if roi is not None:
            inits.append(numpy_helper.from_array(np.asarray(roi, np.float32), "roi"))
        if scales is not None:
            inits.append(numpy_helper.from_array(np.asarray(scales, np.float32), "scales"))
        if sizes is not None:
            inputs.append("sizes")
            inits.append(numpy_helper.from_array(np.asarray(sizes, np.int64), "sizes"))
    node = helper.make_node("Resize", inputs, ["y"], name="r", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", elem, list(shape))],
        [helper.make_tensor_value_info("y", elem, [f"d{i}" for i in range(len(shape))])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def both(model: Any, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    (got,) = backend.prepare(model).run({"x": x})
    return np.asarray(got), expected


X = np.random.default_rng(0).standard_normal((2, 3, 5, 7)).astype(np.float32)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("coordinates", COORDINATES)
@pytest.mark.parametrize(
    "how",
    [
        {"scales": [1.0, 1.0, 2.0, 1.0 / 7 * 3]},  # 5 -> 10, 7 -> 3 (floor 3.0000...)
        {"scales": [1.0, 1.0, 0.6, 2.0]},  # 5 -> 3, 7 -> 14
        {"sizes": [2, 3, 9, 4]},
        {"sizes": [2, 3, 1, 1]},  # one output pixel
    ],
)
def test_modes_and_coordinates_match_onnxruntime(
    mode: str, coordinates: str, how: dict[str, Any]
) -> None:
    attrs: dict[str, Any] = {"mode": mode, "coordinate_transformation_mode": coordinates}
    if coordinates == "tf_crop_and_resize":
        attrs["roi"] = [0, 0, 0.2, 0.1, 1, 1, 0.9, 0.7]
        attrs["extrapolation_value"] = 7.5
    if mode == "nearest" and coordinates == "tf_crop_and_resize" and "sizes" in how:
        attrs["roi"] = [0, 0, -0.3, 0.1, 1, 1, 1.4, 0.8]  # some outputs extrapolate
    roi = attrs.pop("roi", None)
    if coordinates == "pytorch_half_pixel" and how.get("sizes") == [2, 3, 1, 1]:
        pytest.skip("onnx's reference and onnxruntime differ on one output pixel (-0.5 vs 0)")
    model = resize_model(X.shape, roi=roi, **how, **attrs)
    got, expected = both(model, X)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
)
@pytest.mark.parametrize("coordinates", ["half_pixel", "asymmetric", "align_corners"])
def test_nearest_modes_match_onnxruntime(nearest_mode: str, coordinates: str) -> None:
    model = resize_model(
        X.shape,
        sizes=[2, 3, 8, 12],
        mode="nearest",
        nearest_mode=nearest_mode,
        coordinate_transformation_mode=coordinates,
    )
    got, expected = both(model, X)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    "attrs",
    [
        {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1},
        {"mode": "cubic", "cubic_coeff_a": -0.6},
        {"mode": "linear", "antialias": 1},
        {"mode": "cubic", "antialias": 1},
        {"mode": "cubic", "antialias": 1, "exclude_outside": 1},
    ],
)
def test_cubic_options_and_antialias_match_onnxruntime(attrs: dict[str, Any]) -> None:
    x = np.random.default_rng(1).standard_normal((1, 2, 16, 13)).astype(np.float32)
    for how in ({"scales": [1.0, 1.0, 0.5, 0.4]}, {"sizes": [1, 2, 6, 20]}):
        got, expected = both(resize_model(x.shape, **how, **attrs), x)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("axes", [[2, 3], [3, 2], [3], [-1, -2]])
def test_axes_and_aspect_ratio_policy_match_onnxruntime(policy: str, axes: list[int]) -> None:
    if policy != "stretch" and min(axes) < 0:
        pytest.skip(
            "onnxruntime 1.32 ignores the policy on negative axes; onnx's reference fails on them"
        )
    sizes = [9, 4][: len(axes)]
    model = resize_model(
        X.shape, sizes=sizes, axes=axes, keep_aspect_ratio_policy=policy, mode="linear"
    )
    got, expected = both(model, X)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1.0, 1.0, 2.0, 3.0], [1.0, 1.0, 0.6, 0.5]])
def test_opset_10_matches_onnxruntime(mode: str, scales: list[float]) -> None:
    got, expected = both(resize_model(X.shape, scales=scales, opset=10, mode=mode), X)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_uint8_nearest_matches_onnxruntime() -> None:
    x = np.random.default_rng(2).integers(0, 256, (1, 3, 4, 5), dtype=np.uint8)
    model = resize_model(x.shape, scales=[1.0, 1.0, 2.5, 1.5], elem=TensorProto.UINT8)
    got, expected = both(model, x)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    ("mode", "coordinates"),
    [("linear", "half_pixel"), ("cubic", "align_corners"), ("linear", "tf_crop_and_resize")],
)
def test_gradient_matches_central_differences(mode: str, coordinates: str) -> None:
    shape = (1, 2, 4, 5)
    with jax.enable_x64(True):
        model = resize_model(
            shape,
            sizes=[1, 2, 7, 3],
            roi=[0, 0, 0.1, 0.2, 1, 1, 0.8, 0.9] if coordinates == "tf_crop_and_resize" else None,
            elem=TensorProto.DOUBLE,
            mode=mode,
            coordinate_transformation_mode=coordinates,
        )
        graph = GraphFunction(model.graph, opsets={"": 19})
        x = np.random.default_rng(3).standard_normal(shape)
        weights = np.random.default_rng(4).standard_normal((1, 2, 7, 3))

        @jax.jit
        def loss(x: Any) -> Any:
            return (graph.apply({"x": x})[0] * weights).sum()

        grad = np.asarray(jax.grad(loss)(x))
        step = 1e-6
        for index in [(0, 0, 0, 0), (0, 1, 2, 3), (0, 1, 3, 4), (0, 0, 1, 2)]:
            plus, minus = x.copy(), x.copy()
            plus[index] += step
            minus[index] -= step
            expected = (float(loss(plus)) - float(loss(minus))) / (2 * step)
            assert abs(grad[index] - expected) <= 1e-8 + 1e-6 * abs(expected), index
        assert np.abs(grad).max() > 1e-2


def test_scales_computed_from_fed_values_are_refused() -> None:
    """Resize's output shape is the graph's: scales that depend on data cannot compile."""
    nodes = [
        helper.make_node("Abs", ["s"], ["scales"]),
        helper.make_node("Resize", ["x", "", "scales"], ["y"], name="r"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2]),
            # a length left open: not a small source read as a compile-time value
            helper.make_tensor_value_info("s", TensorProto.FLOAT, ["k"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c", "d"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    with pytest.raises(ValueError, match=r"node 'r' \(ai\.onnx\.Resize\).*static shapes"):
        backend.prepare(model).run(
            {"x": np.ones((1, 1, 2, 2), np.float32), "s": np.full(4, 2.0, np.float32)}
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scales": [1.0, 1.0, 2.0, 2.0], "mode": "bilinear"}, "mode 'bilinear' is not one of"),
        (
            {"scales": [1.0, 1.0, 2.0, 2.0], "coordinate_transformation_mode": "centre"},
            "coordinate_transformation_mode 'centre'",
        ),
        ({"scales": [1.0, 2.0, 2.0]}, "scales hold 3 values for 4 axes"),
        ({"scales": [1.0, 1.0, 0.0, 2.0]}, "must be positive"),
        ({"sizes": [1, 1, -2, 2]}, "negative size"),
        (
            {"scales": [1.0, 1.0, 2.0, 2.0], "sizes": [1, 1, 4, 4]},
            "exactly one of scales and sizes",
        ),
        (
            {
                "scales": [1.0, 1.0, 2.0, 2.0],
                "coordinate_transformation_mode": "tf_crop_and_resize",
            },
            "needs roi",
        ),
        (
            {
                "scales": [1.0, 1.0, 2.0, 2.0],
                "roi": [0, 1],
                "coordinate_transformation_mode": "tf_crop_and_resize",
            },
            "roi holds 2 values",
        ),
        ({"scales": [1.0, 1.0, 1e9, 1e9]}, "over the limit"),
    ],
)
def test_refusals_name_the_node(kwargs: dict[str, Any], message: str) -> None:
    model = resize_model((1, 1, 2, 2), **kwargs)
    with pytest.raises(ValueError, match=rf"node 'r' \(ai\.onnx\.Resize\).*{message}"):
        backend.prepare(model).run({"x": np.ones((1, 1, 2, 2), np.float32)})
