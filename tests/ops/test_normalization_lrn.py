"""LRN (local response normalization) against onnxruntime, the spec's formula and FD.

onnxruntime runs LRN on 4-D inputs with an odd ``size`` only: those cases are
compared with it. Even sizes and other ranks, which the spec allows, are
compared with the spec's formula written out in numpy, channel by channel. The
three "light" zoo models of the onnx wheel that hold LRN (AlexNet, Inception v1,
ZFNet512) run against onnxruntime, their LRN outputs compared as well as the
final one (their weights are all 0.02, so the final softmax is uniform).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax._src.graph import GraphFunction  # noqa: E402


def lrn_model(shape: tuple[int, ...], elem: int = TensorProto.FLOAT, **attrs: Any) -> Any:
    node = helper.make_node("LRN", ["x"], ["y"], name="n", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", elem, list(shape))],
        [helper.make_tensor_value_info("y", elem, list(shape))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def spec_lrn(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """The operator's definition, one channel at a time."""
    y = np.empty_like(x)
    channels = x.shape[1]
    for c in range(channels):
        lo = max(0, c - math.floor((size - 1) / 2))
        hi = min(channels - 1, c + math.ceil((size - 1) / 2))
        square_sum = np.sum(x[:, lo : hi + 1] ** 2, axis=1)
        y[:, c] = x[:, c] / (bias + alpha / size * square_sum) ** beta
    return y


@pytest.mark.parametrize(
    "attrs",
    [
        {"size": 1},
        {"size": 3, "alpha": 0.5, "beta": 0.6, "bias": 1.5},
        {"size": 5},  # the defaults: alpha 1e-4, beta 0.75, bias 1
        {"size": 9, "alpha": 2.0, "beta": 1.0, "bias": 2.0},  # wider than the 7 channels
    ],
)
def test_matches_onnxruntime(attrs: dict[str, Any]) -> None:
    x = np.random.default_rng(0).standard_normal((2, 7, 5, 4)).astype(np.float32) * 3
    model = lrn_model(x.shape, **attrs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    (got,) = backend.prepare(model).run({"x": x})
    assert got.dtype == np.float32 and got.shape == x.shape
    assert np.abs(expected - x).max() > 1e-3  # the normalization did something
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("shape", "size"),
    [((3, 6), 4), ((2, 6, 5), 2), ((1, 5, 3, 2, 2), 6), ((2, 3, 4, 4), 1000)],
)
def test_even_sizes_and_other_ranks_follow_the_spec(shape: tuple[int, ...], size: int) -> None:
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32) * 2
    attrs = {"alpha": 0.7, "beta": 0.8, "bias": 1.2}
    (got,) = backend.prepare(lrn_model(shape, size=size, **attrs)).run({"x": x})
    expected = spec_lrn(x.astype(np.float64), size, **attrs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_gradient_matches_central_differences() -> None:
    shape = (1, 5, 3, 2)
    with jax.enable_x64(True):
        model = lrn_model(shape, TensorProto.DOUBLE, size=3, alpha=0.9, beta=0.7, bias=1.1)
        graph = GraphFunction(model.graph, opsets={"": 13})
        x = np.random.default_rng(2).standard_normal(shape)
        weights = np.random.default_rng(3).standard_normal(shape)

        @jax.jit
        def loss(x: Any) -> Any:
            return (graph.apply({"x": x})[0] * weights).sum()

        grad = np.asarray(jax.grad(loss)(x))
        step = 1e-6
        for index in [(0, 0, 0, 0), (0, 2, 1, 1), (0, 4, 2, 0)]:
            plus, minus = x.copy(), x.copy()
            plus[index] += step
            minus[index] -= step
            expected = (float(loss(plus)) - float(loss(minus))) / (2 * step)
            assert abs(expected) > 1e-3
            assert abs(grad[index] - expected) <= 1e-8 + 1e-6 * abs(expected), index


@pytest.mark.parametrize(
    ("shape", "size", "message"),
    [((2, 3, 4), 0, "size must be at least 1"), ((4,), 3, "has no channel axis")],
)
def test_refusals_name_the_node(shape: tuple[int, ...], size: int, message: str) -> None:
    x = np.ones(shape, np.float32)
    with pytest.raises(ValueError, match=rf"node 'n' \(ai\.onnx\.LRN\).*{message}"):
        backend.prepare(lrn_model(shape, size=size)).run({"x": x})


LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@pytest.mark.parametrize("name", ["bvlc_alexnet", "inception_v1", "zfnet512"])
def test_light_zoo_models_match_onnxruntime(name: str) -> None:
    model = onnx.load(str(LIGHT / f"light_{name}.onnx"))
    lrns = [node.output[0] for node in model.graph.node if node.op_type == "LRN"]
    assert len(lrns) == 2
    model.graph.output.extend(
        helper.make_tensor_value_info(n, TensorProto.FLOAT, list("nchw")) for n in lrns
    )
    initializers = {init.name for init in model.graph.initializer}
    (data,) = [i.name for i in model.graph.input if i.name not in initializers]
    feeds = {data: np.random.default_rng(4).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    got = backend.prepare(model).run(feeds)
    assert len(got) == len(expected) == 3
    for ours, want in zip(got, expected, strict=True):
        assert ours.shape == want.shape
        scale = np.abs(want).max()
        np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-5 * scale)
    assert np.ptp(expected[1]) > 1e-2 * np.abs(expected[1]).max()  # the LRN output varies
