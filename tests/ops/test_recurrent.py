"""RNN, GRU and LSTM: values against onnxruntime, gradients against central differences.

One table runs each op in each direction and layout, with its optional inputs
omitted or given (B, sequence_lens shorter than the sequence, initial states,
LSTM's peepholes) and with non-default activations, their alphas and betas, and
clip; onnxruntime computes the expected outputs. Gradients of float64 models
are compared with central differences, and ``training.attach`` trains an LSTM.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax._src.graph import GraphFunction  # noqa: E402
from tests.support.builders import onnxruntime_outputs as run_onnxruntime  # noqa: E402

F32, F64, I32 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 3


def recurrent_model(
    op: str,
    feeds: dict[str, np.ndarray],
    elem: int = F32,
    opset: int = 14,
    outputs: tuple[str, ...] = ("Y", "Y_h", "Y_c"),
    prefix: str = "",
    **attrs: Any,
) -> Any:
    """One ``op`` node reading the inputs named in ``feeds`` (graph inputs), '' for the rest;
    its inputs and outputs named with ``prefix``."""
    order = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    if op != "LSTM":
        order = order[:6]
        outputs = tuple(o for o in outputs if o != "Y_c")
    names = [name if name in feeds else "" for name in order]
    while names[-1] == "":
        names.pop()
    node = helper.make_node(
        op,
        [prefix + name if name else "" for name in names],
        [prefix + name if name else "" for name in outputs],
        name=prefix + "rec",
        hidden_size=HIDDEN,
        **attrs,
    )

    def vi(name: str, value: np.ndarray) -> Any:
        kind = I32 if value.dtype == np.int32 else elem
        return helper.make_tensor_value_info(prefix + name, kind, list(value.shape))

    d, layout = feeds["W"].shape[0], attrs.get("layout", 0)
    seq, batch = feeds["X"].shape[:2][:: -1 if layout else 1]
    state = [batch, d, HIDDEN] if layout else [d, batch, HIDDEN]
    shapes = {"Y": [batch, seq, d, HIDDEN] if layout else [seq, d, batch, HIDDEN]}
    graph = helper.make_graph(
        [node],
        "g",
        [vi(name, feeds[name]) for name in names if name],
        [
            helper.make_tensor_value_info(prefix + name, elem, shapes.get(name, state))
            for name in outputs
            if name
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def merged(models: list[Any]) -> Any:
    """The nodes of ``models`` (inputs and outputs named apart) in one graph: one compile."""
    graph = helper.make_graph(
        [n for m in models for n in m.graph.node],
        "g",
        [i for m in models for i in m.graph.input],
        [o for m in models for o in m.graph.output],
    )
    return helper.make_model(graph, opset_imports=list(models[0].opset_import))


def make_feeds(
    op: str,
    directions: int,
    layout: int,
    given: set[str],
    dtype: Any = np.float32,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    gates = GATES[op]

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(dtype)

    x_shape = (BATCH, SEQ, INPUT) if layout else (SEQ, BATCH, INPUT)
    feeds = {
        "X": normal(*x_shape),
        "W": normal(directions, gates * HIDDEN, INPUT) * 0.6,
        "R": normal(directions, gates * HIDDEN, HIDDEN) * 0.6,
    }
    state_shape = (BATCH, directions, HIDDEN) if layout else (directions, BATCH, HIDDEN)
    if "B" in given:
        feeds["B"] = normal(directions, 2 * gates * HIDDEN) * 0.5
    if "sequence_lens" in given:
        feeds["sequence_lens"] = np.array([SEQ, 2, 0 if given == ALL else 4], np.int32)
    if "initial_h" in given:
        feeds["initial_h"] = normal(*state_shape)
    if "initial_c" in given and op == "LSTM":
        feeds["initial_c"] = normal(*state_shape)
    if "P" in given and op == "LSTM":
        feeds["P"] = normal(directions, 3 * HIDDEN) * 0.5
    return feeds


ALL = {"B", "sequence_lens", "initial_h", "initial_c", "P"}
# variant -> (inputs given, attributes per op)
VARIANTS: dict[str, tuple[set[str], dict[str, dict[str, Any]]]] = {
    "bare": (set(), {}),
    "all_inputs": (ALL, {}),
    "initial_states": ({"initial_h", "initial_c"}, {}),
    "lengths_only": ({"sequence_lens"}, {}),
    "activations_clip": (
        {"B", "initial_h"},
        {
            "RNN": {"activations": ["LeakyRelu"], "activation_alpha": [0.3], "clip": 1.5},
            "GRU": {
                "activations": ["HardSigmoid", "ScaledTanh"],
                "activation_alpha": [0.3, 0.8],
                "activation_beta": [0.4, 1.3],
                "clip": 1.0,
                "linear_before_reset": 1,
            },
            "LSTM": {
                "activations": ["HardSigmoid", "Softsign", "ScaledTanh"],
                "activation_alpha": [0.25, 1.1],
                "activation_beta": [0.45, 0.9],
                "clip": 0.8,
                "input_forget": 1,
            },
        },
    ),
}


def to_layout_0(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Batch-first feeds (layout 1) as sequence-first ones (layout 0)."""
    moved = ("X", "initial_h", "initial_c")  # (prefixed) names of batch-first inputs
    return {
        k: np.swapaxes(v, 0, 1) if any(k == m or k.endswith("_" + m) for m in moved) else v
        for k, v in feeds.items()
    }


def table_case(op: str, layout: int) -> tuple[Any, Any, dict[str, np.ndarray]]:
    """One node per variant and direction in one model (one compile), at ``layout``, and the
    same at layout 0, which is all onnxruntime runs (it refuses batch-first recurrent ops);
    the feeds of both."""
    models, models_0, feeds = [], [], {}
    for seed, (variant, direction) in enumerate(
        itertools.product(VARIANTS, ["forward", "reverse", "bidirectional"])
    ):
        given, attrs_by_op = VARIANTS[variant]
        directions = 2 if direction == "bidirectional" else 1
        node_feeds = make_feeds(op, directions, layout, given, seed=seed)
        attrs = dict(attrs_by_op.get(op, {}))
        names = attrs.get("activations")
        if names and directions == 2:  # the second direction's own; alphas and betas go on
            attrs["activations"] = names * 2
            for key in ("activation_alpha", "activation_beta"):
                if key in attrs:
                    attrs[key] = attrs[key] + [v * 1.5 for v in attrs[key]]
        prefix = f"{variant}_{direction}_"
        models.append(
            recurrent_model(
                op, node_feeds, prefix=prefix, direction=direction, layout=layout, **attrs
            )
        )
        at_0 = to_layout_0(node_feeds) if layout else node_feeds
        models_0.append(recurrent_model(op, at_0, prefix=prefix, direction=direction, **attrs))
        feeds.update({prefix + k: v for k, v in node_feeds.items()})
    return merged(models), merged(models_0), feeds


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_matches_onnxruntime(op: str, layout: int) -> None:
    """Each variant of VARIANTS in each direction: Y, Y_h (and Y_c) as onnxruntime's."""
    model, model_0, feeds = table_case(op, layout)
    expected = run_onnxruntime(model_0, to_layout_0(feeds) if layout else feeds)
    outputs = [o.name for o in model.graph.output]
    if layout:  # back to batch first: Y [batch, seq, directions, hidden], states [batch, ...]
        expected = [
            np.transpose(e, (2, 0, 1, 3) if name.endswith("_Y") else (1, 0, 2))
            for name, e in zip(outputs, expected, strict=True)
        ]
    got = backend.prepare(model).run(feeds)
    assert len(got) == len(expected) == len(VARIANTS) * 3 * (3 if op == "LSTM" else 2)
    for name, ours, want in zip(outputs, got, expected, strict=True):
        assert ours.shape == want.shape and ours.dtype == want.dtype, name
        np.testing.assert_allclose(ours, want, rtol=2e-5, atol=2e-6, err_msg=name)
        assert np.abs(want).max() > 1e-2, name  # not a vacuous comparison


# ----------------------------------------------------------------------------- activations


# Each activation with its parameters given (onnxruntime's defaults differ from the spec's for
# some: see test_activation_defaults_follow_the_onnx_ops).
ACTIVATIONS = [
    ("Relu", [], []),
    ("Tanh", [], []),
    ("Sigmoid", [], []),
    ("Affine", [0.7], [0.2]),
    ("LeakyRelu", [0.2], []),
    ("ThresholdedRelu", [0.3], []),
    ("ScaledTanh", [1.4], [0.6]),
    ("HardSigmoid", [0.3], [0.4]),
    ("Elu", [0.8], []),
    ("Softsign", [], []),
    ("Softplus", [], []),
]


def test_each_activation_matches_onnxruntime() -> None:
    """An RNN node per activation (with clip on half of them), in both directions, whose
    second direction takes the parameters that follow the first's."""
    models, feeds = [], {}
    for seed, (name, alpha, beta) in enumerate(ACTIVATIONS):
        node_feeds = make_feeds("RNN", 2, 0, {"B", "initial_h"}, seed=seed)
        attrs: dict[str, Any] = {"activations": [name, name]}
        if alpha:
            attrs["activation_alpha"] = [*alpha, alpha[0] * 0.5]
        if beta:
            attrs["activation_beta"] = [*beta, beta[0] * 2]
        if seed % 2:
            attrs["clip"] = 0.9
        prefix = name + "_"
        models.append(
            recurrent_model("RNN", node_feeds, prefix=prefix, direction="bidirectional", **attrs)
        )
        feeds.update({prefix + k: v for k, v in node_feeds.items()})
    model = merged(models)
    expected = run_onnxruntime(model, feeds)
    got = backend.prepare(model).run(feeds)
    for output, ours, want in zip(model.graph.output, got, expected, strict=True):
        np.testing.assert_allclose(ours, want, rtol=2e-5, atol=2e-6, err_msg=output.name)
        assert np.abs(want).max() > 1e-2, output.name


@pytest.mark.parametrize(
    ("name", "formula"),
    [
        ("LeakyRelu", lambda v: np.where(v >= 0, v, 0.01 * v)),
        ("ThresholdedRelu", lambda v: np.where(v > 1.0, v, 0.0)),
        ("HardSigmoid", lambda v: np.clip(0.2 * v + 0.5, 0, 1)),
        ("Elu", lambda v: np.where(v >= 0, v, np.expm1(v))),
        ("Affine", lambda v: v),  # alpha 1, beta 0
        ("ScaledTanh", np.tanh),  # alpha 1, beta 1
    ],
)
def test_activation_defaults_follow_the_onnx_ops(name: str, formula: Callable[..., Any]) -> None:
    """Without activation_alpha/beta, an activation takes the defaults of the ONNX op of its
    name, as the spec says (ThresholdedRelu's alpha 1; Affine and ScaledTanh, which have no
    op today, as the identity and tanh). onnxruntime takes 0 for those three, so the
    expected values are the spec's formula on one step: Y = f(X W^T + Wb + Rb)."""
    feeds = make_feeds("RNN", 1, 0, {"B"})
    feeds["X"] = feeds["X"][:1] * 2
    model = recurrent_model("RNN", feeds, activations=[name])
    y, y_h = backend.prepare(model).run(feeds)
    pre = feeds["X"][0] @ feeds["W"][0].T + feeds["B"][0, :HIDDEN] + feeds["B"][0, HIDDEN:]
    np.testing.assert_allclose(y_h[0], formula(pre), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(y[0], y_h)


# ----------------------------------------------------------------------------- other forms


@pytest.mark.parametrize(
    "outputs", [("", "Y_h"), ("Y",), ("", "", "Y_c"), ("Y", "", "Y_c")], ids=str
)
def test_optional_outputs_match_onnxruntime(outputs: tuple[str, ...]) -> None:
    feeds = make_feeds("LSTM", 2, 0, {"B", "sequence_lens", "initial_h"})
    model = recurrent_model("LSTM", feeds, outputs=outputs, direction="bidirectional")
    expected = run_onnxruntime(model, feeds)
    got = backend.prepare(model).run(feeds)
    assert len(got) == len(expected) == len([o for o in outputs if o])
    for ours, want in zip(got, expected, strict=True):
        np.testing.assert_allclose(ours, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("opset", [7, 14, 22])
def test_each_opset_matches_onnxruntime(opset: int) -> None:
    """The three ops, bidirectional with every input, in one model at each opset."""
    models, feeds = [], {}
    for op in ("RNN", "GRU", "LSTM"):
        attrs = {"linear_before_reset": 1} if op == "GRU" else {}
        node_feeds = make_feeds(op, 2, 0, ALL)
        prefix = op + "_"
        models.append(
            recurrent_model(
                op, node_feeds, opset=opset, prefix=prefix, direction="bidirectional", **attrs
            )
        )
        feeds.update({prefix + k: v for k, v in node_feeds.items()})
    model = merged(models)
    expected = run_onnxruntime(model, feeds)
    got = backend.prepare(model).run(feeds)
    for output, ours, want in zip(model.graph.output, got, expected, strict=True):
        np.testing.assert_allclose(ours, want, rtol=2e-5, atol=2e-6, err_msg=output.name)


@pytest.mark.parametrize("lengths", [[SEQ, SEQ, SEQ], [1, SEQ, 3]], ids=["full", "short"])
def test_sequence_lens_from_an_initializer_match_onnxruntime(lengths: list[int]) -> None:
    """sequence_lens known while tracing (an initializer), as exporters write it."""
    feeds = make_feeds("GRU", 2, 0, {"B", "initial_h"})
    feeds["sequence_lens"] = np.array(lengths, np.int32)
    model = recurrent_model("GRU", feeds, direction="bidirectional")
    graph = model.graph
    (lens,) = [i for i in graph.input if i.name == "sequence_lens"]
    graph.input.remove(lens)
    graph.initializer.append(numpy_helper.from_array(feeds.pop("sequence_lens"), "sequence_lens"))
    expected = run_onnxruntime(model, feeds)
    got = backend.prepare(model).run(feeds)
    for ours, want in zip(got, expected, strict=True):
        np.testing.assert_allclose(ours, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize(
    ("attrs", "change", "message"),
    [
        ({"activations": ["Tanh", "Relu", "Tanh"]}, {}, r"3 activations given; 1 per direction"),
        ({"activations": ["Swish"]}, {}, r"unknown activation 'Swish'"),
        ({"direction": "sideways"}, {}, r"direction 'sideways'"),
        ({}, {"W": np.zeros((1, 3, 5), np.float32)}, r"W has shape \[1, 3, 5\], \[1, 3, 4\]"),
        ({}, {"sequence_lens": np.array([1, 9, 2], np.int32)}, r"sequence_lens holds 9"),
    ],
)
def test_mistakes_are_refused_naming_the_node(
    attrs: dict[str, Any], change: dict[str, np.ndarray], message: str
) -> None:
    feeds = make_feeds("RNN", 1, 0, {"sequence_lens"} if "sequence_lens" in change else set())
    feeds.update(change)
    # Declared as fed (a feed unlike its declared input is refused before any node runs).
    model = recurrent_model("RNN", feeds, **attrs)
    with pytest.raises(ValueError, match=r"node 'rec' \(ai\.onnx\.RNN\).*" + message):
        backend.prepare(model).run(feeds)


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("LSTM", {"direction": "bidirectional", "input_forget": 1, "clip": 2.0}),
        ("GRU", {"direction": "bidirectional", "linear_before_reset": 1, "layout": 1}),
    ],
)
def test_gradients_match_central_differences(op: str, attrs: dict[str, Any]) -> None:
    """jax.grad of a weighted sum of every output, w.r.t. each float input, along random
    directions, equals central differences of the float64 graph (sequence_lens short, so
    the masking is crossed)."""
    directions = 2 if attrs["direction"] == "bidirectional" else 1
    feeds = make_feeds(op, directions, attrs.get("layout", 0), ALL, dtype=np.float64)
    model = recurrent_model(op, feeds, elem=F64, **attrs)
    floats = {k: v for k, v in feeds.items() if v.dtype == np.float64}
    with jax.enable_x64(True):
        graph = GraphFunction(model.graph, opsets={"": 14})
        rng = np.random.default_rng(7)
        weights = [rng.standard_normal(np.shape(y)) for y in graph.apply(feeds)]

        @jax.jit
        def loss(values: dict[str, Any]) -> Any:
            outs = graph.apply({**feeds, **values})
            return sum((y * w).sum() for y, w in zip(outs, weights, strict=True))

        grads = jax.grad(loss)(floats)
        for wrt, x in floats.items():  # along a random direction v: d loss(x + t v) / dt
            v = rng.standard_normal(x.shape)
            step = 1e-6 * max(1.0, float(np.abs(x).max()))
            plus, minus = loss({**floats, wrt: x + step * v}), loss({**floats, wrt: x - step * v})
            fd = float(plus - minus) / (2 * step)
            assert abs(fd) > 1e-2, wrt  # not a vacuous comparison
            got = float((np.asarray(grads[wrt]) * v).sum())
            np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8, err_msg=wrt)


# ----------------------------------------------------------------------------- training


def test_attach_trains_an_lstm() -> None:
    """A PyTorch-shaped LSTM (W, R, B initializers, no initial states) under a linear head,
    trained by attach on a fixed task: the loss falls, and W, R and B all move."""
    import onnx_optax
    from onnx_optax import training

    rng = np.random.default_rng(0)
    params = {
        "W": (rng.standard_normal((1, 4 * HIDDEN, INPUT)) * 0.3).astype(np.float32),
        "R": (rng.standard_normal((1, 4 * HIDDEN, HIDDEN)) * 0.3).astype(np.float32),
        "B": np.zeros((1, 8 * HIDDEN), np.float32),
        "head": (rng.standard_normal((HIDDEN, 1)) * 0.3).astype(np.float32),
    }
    nodes = [
        helper.make_node("LSTM", ["X", "W", "R", "B"], ["", "Y_h"], hidden_size=HIDDEN),
        helper.make_node("Reshape", ["Y_h", "flat"], ["h"]),
        helper.make_node("MatMul", ["h", "head"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", F32, [SEQ, 8, INPUT])],
        [helper.make_tensor_value_info("out", F32, [8, 1])],
        initializer=[
            *(numpy_helper.from_array(v, k) for k, v in params.items()),
            numpy_helper.from_array(np.array([8, HIDDEN], np.int64), "flat"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    trained = training.attach(model, loss="mse", target="t", optimizer=onnx_optax.adam(0.05))
    assert training.check(trained) == []
    session = training.Session(trained)
    x = rng.standard_normal((SEQ, 8, INPUT)).astype(np.float32)
    t = np.tanh(x.sum(axis=(0, 2)))[:, None].astype(np.float32)  # depends on every step
    losses = [float(session.step({"X": x, "t": t})["loss"]) for _ in range(40)]
    assert losses[-1] < 0.2 * losses[0], losses
    for name in ("W", "R", "B"):
        assert not np.allclose(session.initializers[name], params[name]), name
