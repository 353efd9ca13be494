"""Real exported models (``tests/support/real_models.py``) through onnx_optax.

Each model's forward pass is compared with onnxruntime's, every output; its
gradient with respect to a few weights (one held in a Constant node where the
exporter writes them so) is compared with central finite differences of the
float64 model, evaluated by our own forward pass. onnxruntime cannot be that
oracle: it runs no float64 Conv. Our float64 forward is itself checked against
onnxruntime's float32 run, and a finite difference knows nothing of how the
gradient is computed, so both checks stay independent of the code they test.
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnx_optax import backend
from onnx_optax._src.graph import GraphFunction
from tests.support import real_models
from tests.support.real_models import MODELS, RealModel

# Forward tolerance, float32 against float32. The outputs are reached through
# up to ~60 layers whose reductions are at most a few thousand terms long, summed
# by XLA and by onnxruntime's kernels in different orders (blocked, with FMA): the
# two differ by tens of float32 epsilons (1.2e-7) relative to the outputs' size
# (2e-7 on probabilities, 7e-6 on CRNN logits of size 17, measured). A wrong op
# (BatchNormalization with batch statistics, a pad, an axis) is off by 1e-2 or more.
RTOL, ATOL = 1e-4, 1e-5

# Finite differences in float64: a central difference with step h = 1e-6 * max(1, |w|)
# has a truncation error ~h**2 and a rounding error ~1e-16 * |loss| / h ~ 1e-8 here.
# The checked elements have gradients of 1e-3 or more (tests/support/real_models.py).
FD_STEP, FD_RTOL, FD_ATOL = 1e-6, 1e-5, 1e-8


def _cotangent(shape: tuple[int, ...]) -> np.ndarray:
    """Fixed weights for the differentiated sum: a plain sum of softmax outputs is constant."""
    return np.random.default_rng(1).standard_normal(shape)


class Float64(NamedTuple):
    """A model in float64, its checked Constants lifted to inputs; call with 64-bit JAX on."""

    graph: GraphFunction
    feeds: dict[str, np.ndarray]  # the test batch, float inputs in float64
    weights: dict[str, np.ndarray]  # the checked weights' values, by name
    forward: Callable[[dict[str, Any], dict[str, Any]], tuple[Any, ...]]  # jitted
    loss: Callable[[tuple[Any, ...]], Any]  # the cotangent-weighted sum of grad_output
    grad: Callable[[dict[str, Any]], dict[str, Any]]  # jitted, d loss / d weights


def float64_case(spec: RealModel, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Float64:
    double = real_models.to_float64(model)
    weights = {w.name: real_models.constant_value(double, w.name) for w in spec.weights}
    lifted = {w.name for w in spec.weights if w.constant}
    for name in lifted:
        double = real_models.lift_constant(double, name)
    graph = GraphFunction(double.graph, opsets={o.domain: o.version for o in double.opset_import})
    feeds = {n: v.astype(np.float64) if v.dtype == np.float32 else v for n, v in feeds.items()}
    index = graph.output_names.index(spec.grad_output)
    cotangent = _cotangent(dict(spec.outputs)[spec.grad_output])

    def forward(feeds: dict[str, Any], weights: dict[str, Any]) -> tuple[Any, ...]:
        inputs = {**feeds, **{n: v for n, v in weights.items() if n in lifted}}
        params = {n: v for n, v in weights.items() if n not in lifted}
        return graph.apply(inputs, params)

    def loss(outputs: tuple[Any, ...]) -> Any:
        return jnp.sum(outputs[index] * cotangent)

    def weights_loss(weights: dict[str, Any]) -> Any:
        return loss(forward(feeds, weights))

    return Float64(graph, feeds, weights, jax.jit(forward), loss, jax.jit(jax.grad(weights_loss)))


@dataclasses.dataclass
class Case:
    """One model, loaded and checked once for the module, with what its tests share."""

    spec: RealModel
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]  # onnxruntime, float32

    @functools.cached_property
    def float64(self) -> Float64:
        """Built once, so its compiled forward serves two tests."""
        return float64_case(self.spec, self.model, self.feeds)


@pytest.fixture(scope="module", params=MODELS, ids=lambda spec: spec.name)
def case(request: pytest.FixtureRequest) -> Case:
    spec: RealModel = request.param
    path = real_models.model_path(spec)
    feeds = spec.make_feeds()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    assert names == [name for name, _ in spec.outputs]
    reference = dict(zip(names, session.run(None, feeds), strict=True))
    return Case(spec, onnx.load(str(path)), feeds, reference)


# -- the corpus itself


def test_every_package_of_the_corpus_is_pinned_in_the_test_extra() -> None:
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extra = pyproject["project"]["optional-dependencies"]["test"]
    for spec in MODELS:
        assert spec.pin in extra, f"{spec.pin} is not pinned in the test extra"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"package": "no-such-package-onnx-optax"}, "no-such-package-onnx-optax is not installed"),
        ({"version": "0.0.0"}, "is installed, the corpus pins magika==0.0.0"),
        ({"path": "magika/models/none.onnx"}, "magika==1.0.3 is installed but has no file"),
        ({"sha256": "0" * 64}, "the corpus pins 0000000000000000"),
    ],
)
def test_a_missing_or_different_package_fails_naming_the_pin(
    change: dict[str, str], message: str
) -> None:
    spec = dataclasses.replace(MODELS[0], **change)
    with pytest.raises(AssertionError, match=message) as error:
        real_models.model_path(spec)
    assert "install" in str(error.value)  # says what to do


def test_each_checked_weight_is_where_the_table_says(case: Case) -> None:
    stored = {
        name: (kind, consumers)
        for name, kind, _, consumers in real_models.float_constants(case.model)
    }
    for weight in case.spec.weights:
        kind, consumers = stored[weight.name]
        assert kind == ("Constant" if weight.constant else "initializer"), weight.name
        assert weight.consumer in consumers, (weight.name, consumers)


def test_the_batches_are_deterministic() -> None:
    for spec in MODELS:
        chex.assert_trees_all_equal(spec.make_feeds(), spec.make_feeds())


# -- forward


def test_forward_matches_onnxruntime(case: Case) -> None:
    rep = backend.prepare(case.model)
    outputs = rep.run(case.feeds)
    assert len(outputs) == len(case.spec.outputs)
    for name, shape in case.spec.outputs:
        ours, reference = outputs[name], case.reference[name]
        assert reference.shape == shape and ours.shape == shape, (name, ours.shape, shape)
        assert ours.dtype == reference.dtype == np.float32, name
        # The batch is informative: an output that hardly varied would compare trivially.
        assert np.ptp(reference) > 100 * (ATOL + RTOL * np.abs(reference).max()), name
        chex.assert_trees_all_close(ours, reference, rtol=RTOL, atol=ATOL)


def test_the_float64_model_computes_what_onnxruntime_computes_in_float32(case: Case) -> None:
    """``to_float64`` keeps the model's function: checked before it serves as an oracle."""
    with jax.enable_x64(True):
        double = case.float64
        outputs = double.forward(double.feeds, double.weights)
        for name, ours in zip(double.graph.output_names, outputs, strict=True):
            assert ours.dtype == jnp.float64, name
            chex.assert_trees_all_close(
                np.asarray(ours), case.reference[name].astype(np.float64), rtol=RTOL, atol=ATOL
            )


# -- gradients


def _central_difference(
    loss: Callable[[dict[str, Any]], float],
    weights: dict[str, np.ndarray],
    name: str,
    index: tuple[int, ...],
) -> float:
    step = FD_STEP * max(1.0, abs(float(weights[name][index])))
    plus, minus = dict(weights), dict(weights)
    plus[name], minus[name] = weights[name].copy(), weights[name].copy()
    plus[name][index] += step
    minus[name][index] -= step
    return (loss(plus) - loss(minus)) / (2 * step)


def test_gradient_matches_central_differences(case: Case) -> None:
    with jax.enable_x64(True):
        double = case.float64
        weights = double.weights
        grads = double.grad(weights)

        def loss(weights: dict[str, np.ndarray]) -> float:
            return float(double.loss(double.forward(double.feeds, weights)))

        for weight in case.spec.weights:
            assert grads[weight.name].shape == weights[weight.name].shape
            for index in weight.elements:
                expected = _central_difference(loss, weights, weight.name, index)
                got = float(grads[weight.name][index])
                where = f"{case.spec.name}: d/d {weight.name}{list(index)} ({weight.consumer})"
                assert abs(expected) > 1e3 * FD_ATOL, f"{where}: a vacuous check ({expected})"
                assert abs(got - expected) <= FD_ATOL + FD_RTOL * abs(expected), (
                    f"{where}: jax.grad {got!r}, central difference {expected!r}"
                )


# -- ONNX's light zoo models (generated weights: every one 0.02)

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
# Those with LRN (bvlc_alexnet, inception_v1, zfnet512) run in tests/ops/test_normalization_lrn.py.
LIGHT_ZOO = ("densenet121", "inception_v2", "resnet50", "shufflenet", "squeezenet", "vgg19")


@pytest.mark.parametrize("name", LIGHT_ZOO)
def test_light_zoo_model_matches_onnxruntime(name: str) -> None:
    """The final softmax, against onnxruntime's. SqueezeNet's logits are all about 6.5e9
    and equal: its softmax was NaN (see tests/graph/test_xla_cpu.py)."""
    model = onnx.load(str(LIGHT / f"light_{name}.onnx"))
    initializers = {init.name for init in model.graph.initializer}
    (data,) = [i for i in model.graph.input if i.name not in initializers]
    shape = [d.dim_value for d in data.type.tensor_type.shape.dim]
    feeds = {data.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    got = backend.prepare(model).run(feeds)
    assert len(got) == len(expected) == 1
    assert got[0].shape == expected[0].shape
    np.testing.assert_allclose(got[0], expected[0], rtol=RTOL, atol=ATOL)
