"""The ONNX backend node cases and a differential test against onnx.reference.

The seven node cases that ship with ``onnx`` (test_adagrad, test_adagrad_multiple,
test_adam, test_adam_multiple, test_momentum, test_nesterov_momentum,
test_momentum_multiple) run through ``onnx_optax.ops`` within their own
tolerances. They all use float32 and T = 0, so a randomized differential test
against ``onnx.reference.ReferenceEvaluator`` covers T > 0, decay, both
dtypes and several tensors; where the reference deviates from the written
formulas, the deviation is asserted explicitly and we follow the formulas.
"""

from __future__ import annotations

import functools
import warnings
import zlib
from typing import Any

import numpy as np
import pytest

import onnx_optax
from tests.support.onnx_suite import OPTIMIZER_CASES
from tests.support.optimizers import (
    DOMAIN,
    OPTIMIZERS,
    assert_close_to_oracle,
    random_state_tensor,
    tolerance,
)

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

OPS = {
    "Adagrad": onnx_optax.ops.adagrad,
    "Adam": onnx_optax.ops.adam,
    "Momentum": onnx_optax.ops.momentum,
}
CASE_NAMES = list(OPTIMIZER_CASES)


@functools.cache
def _node_cases() -> dict[str, Any]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        # Generating the whole node-case collection warns about unrelated ops.
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    return {c.name: c for c in cases if c.name in CASE_NAMES}


def _attributes(node: Any) -> dict[str, Any]:
    """The node's attributes, with the schema defaults for those it omits."""
    schema = onnx.defs.get_schema(node.op_type, 1, node.domain)
    values = {
        name: helper.get_attribute_value(attr.default_value)
        for name, attr in schema.attributes.items()
        if attr.default_value.type
    }
    values.update({a.name: helper.get_attribute_value(a) for a in node.attribute})
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}


def test_all_seven_cases_are_collected() -> None:
    assert sorted(_node_cases()) == sorted(CASE_NAMES)


@pytest.mark.parametrize("case_name", CASE_NAMES)
def test_onnx_backend_node_case(case_name: str) -> None:
    case = _node_cases()[case_name]
    (node,) = case.model.graph.node
    assert node.domain == DOMAIN
    op = OPS[node.op_type]
    for inputs, expected in case.data_sets:
        outputs = op(*inputs, **_attributes(node))
        assert len(outputs) == len(expected)
        for out, exp in zip(outputs, expected, strict=True):
            assert np.asarray(out).dtype == exp.dtype
            np.testing.assert_allclose(np.asarray(out), exp, rtol=case.rtol, atol=case.atol)


# --------------------------------------------------------------------------
# Randomized differential test against onnx.reference
# --------------------------------------------------------------------------

OP_TYPES = {"adagrad": "Adagrad", "adam": "Adam", "momentum": "Momentum", "nesterov": "Momentum"}


def _make_node(name: str, n: int, attributes: dict[str, Any]) -> Any:
    optimizer = OPTIMIZERS[name]
    groups = ["X", "G", *(s.upper() for s in optimizer.state_names)]
    inputs = ["R", "T"] + [f"{g}{i}" for g in groups for i in range(n)]
    outputs = [f"{g}{i}_new" for g in ["X", *groups[2:]] for i in range(n)]
    extra = {}
    if OP_TYPES[name] == "Momentum":
        extra["mode"] = "standard" if name == "momentum" else "nesterov"
    node = helper.make_node(OP_TYPES[name], inputs, outputs, domain=DOMAIN, **attributes, **extra)
    return node, inputs


@pytest.mark.parametrize("n_tensors", [1, 3])
@pytest.mark.parametrize("T", [0, 1, 5, 100])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_matches_onnx_reference(name: str, T: int, n_tensors: int, dtype: str) -> None:
    optimizer = OPTIMIZERS[name]
    rng = np.random.default_rng(zlib.crc32(repr(("ref", name, T, n_tensors, dtype)).encode()))
    attributes = optimizer.draw_attributes(rng)
    if name == "adagrad":  # the node cases never decay; make sure we do
        attributes["decay_factor"] = float(np.float32(rng.uniform(0.05, 0.5)))
    shapes = [tuple(rng.integers(1, 4, size=rng.integers(0, 3))) for _ in range(n_tensors)]
    xs = [rng.standard_normal(s).astype(dtype) for s in shapes]
    gs = [rng.standard_normal(s).astype(dtype) for s in shapes]
    states = [
        [random_state_tensor(rng, k, s, dtype) for s in shapes] for k in optimizer.state_names
    ]
    R = np.asarray(rng.uniform(0.01, 0.5), dtype=dtype)
    tensors = [*xs, *gs, *(t for s in states for t in s)]

    node, input_names = _make_node(name, n_tensors, attributes)
    reference = ReferenceEvaluator(node).run(
        None, dict(zip(input_names, [R, np.array(T, np.int64), *tensors], strict=True))
    )
    ours = optimizer.op(R, T, *tensors, **attributes)
    assert len(ours) == len(reference)

    # The reference's deviations from the formulas (onnx 1.23), asserted so that
    # a fix upstream shows up here:
    reference_dtypes = {np.asarray(r).dtype for r in reference}
    if name == "adam" and n_tensors > 1:
        # Multi-tensor Adam casts every output to float32, even for double.
        assert reference_dtypes == {np.dtype(np.float32)}
    elif name == "adam" and dtype == "float32" and T > 0:
        # Single-tensor Adam promotes X_new to float64 through the bias factor.
        assert np.asarray(reference[0]).dtype == np.float64
    else:
        assert reference_dtypes == {np.dtype(dtype)}
    if name == "adam" and dtype == "float64" and n_tensors == 1:
        # Its attributes are numpy float32 scalars, so 1 - alpha is rounded to
        # float32 even for double tensors: V_new = alpha V + f32(1 - alpha) G_r.
        alpha = np.float32(attributes["alpha"])
        g_r = attributes["norm_coefficient"] * xs[0] + gs[0]
        quirk_v = np.float64(alpha) * states[0][0] + np.float64(np.float32(1) - alpha) * g_r
        np.testing.assert_allclose(reference[1], quirk_v, rtol=1e-15, atol=1e-15)
    # We follow the formulas: every output keeps the input type.
    assert {np.asarray(o).dtype for o in ours} == {np.dtype(dtype)}

    scale = max([1.0] + [float(np.max(np.abs(t))) for t in tensors if t.size])
    # A float32 cast or float32 attribute arithmetic on the reference's side
    # limits the comparison to float32.
    compare_dtype = "float32" if name == "adam" else dtype
    for out, ref in zip(ours, reference, strict=True):
        assert_close_to_oracle(out, np.asarray(ref, np.float64), compare_dtype, scale=scale)


def test_reference_accepts_any_mode_but_we_reject_it() -> None:
    """onnx.reference treats every mode other than "standard" as Nesterov."""
    x, g, v = (np.array([1.0, 2.0], np.float32) for _ in range(3))
    node = helper.make_node(
        "Momentum",
        ["R", "T", "X", "G", "V"],
        ["X_new", "V_new"],
        domain=DOMAIN,
        alpha=0.9,
        beta=0.5,
        norm_coefficient=0.0,
        mode="sgd",
    )
    feeds = {"R": np.float32(0.1), "T": np.int64(1), "X": x, "G": g, "V": v}
    reference = ReferenceEvaluator(node).run(None, feeds)
    nesterov = onnx_optax.ops.momentum(
        np.float32(0.1), 1, x, g, v, alpha=0.9, beta=0.5, norm_coefficient=0.0, mode="nesterov"
    )
    np.testing.assert_allclose(reference[0], nesterov[0], **tolerance("float32"))
    with pytest.raises(ValueError, match="mode must be 'standard' or 'nesterov'"):
        onnx_optax.ops.momentum(
            np.float32(0.1), 1, x, g, v, alpha=0.9, beta=0.5, norm_coefficient=0.0, mode="sgd"
        )


def test_adam_epsilon_default_is_the_schema_value() -> None:
    """The Chinese Adam page says epsilon defaults to 0.0; the schema says 1e-6."""
    schema = onnx.defs.get_schema("Adam", 1, DOMAIN)
    default = helper.get_attribute_value(schema.attributes["epsilon"].default_value)
    assert default == pytest.approx(1e-6, rel=1e-6)
    x = np.zeros(3, np.float32)
    # With G = V = H = 0 and epsilon = 0 the step is 0/0: the default must not be 0.
    outputs = onnx_optax.ops.adam(np.float32(0.1), 0, x, x, x, x)
    assert np.all(np.isfinite(np.asarray(outputs[0])))
    node = helper.make_node(
        "Adam", ["R", "T", "X", "G", "V", "H"], ["Y", "V2", "H2"], domain=DOMAIN
    )
    reference = ReferenceEvaluator(node).run(
        None, {"R": np.float32(0.1), "T": np.int64(0), "X": x, "G": x, "V": x, "H": x}
    )
    np.testing.assert_array_equal(reference[0], np.asarray(outputs[0]))
