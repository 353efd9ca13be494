"""Whole graphs on onnx_optax.backend: Gradient, pruning, old opset forms, bad input, safety.

Expected values come from hand-written JAX (``jax.grad`` of the same function) or
from ``onnx.reference.ReferenceEvaluator``; never from onnx_optax itself.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax._src.onnx_tensors import read_tensor  # noqa: E402
from onnx_optax.backend import UnsupportedOperatorError  # noqa: E402
from tests.support.builders import value_info as _vi  # noqa: E402

TRAINING = "ai.onnx.preview.training"
F32, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(11)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    *,
    opset: int = 21,
    initializers: list[onnx.TensorProto] | None = None,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers or [])
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(TRAINING, 1)]
    )


def _grad(
    xs: list[str], y: str, outs: list[str], zs: list[str] | None = None, **kw: str
) -> onnx.NodeProto:
    if zs:
        kw = {**kw, "zs": zs}  # type: ignore[dict-item]
    return helper.make_node("Gradient", [*xs, *(zs or [])], outs, domain=TRAINING, xs=xs, y=y, **kw)


# ----------------------------------------------------------------------------- Gradient


def _mlp_loss_model(gradient_first: bool) -> onnx.ModelProto:
    """loss = ReduceSum(Tanh(X @ W + B) ** 2); Gradient(xs=[W, B], zs=[X], y=loss)."""
    forward = [
        helper.make_node("MatMul", ["X", "W"], ["XW"]),
        helper.make_node("Add", ["XW", "B"], ["H"]),
        helper.make_node("Tanh", ["H"], ["A"]),
        helper.make_node("Mul", ["A", "A"], ["A2"]),
        helper.make_node("ReduceSum", ["A2"], ["loss"], keepdims=0),
    ]
    grad = _grad(["W", "B"], "loss", ["dW", "dB"], zs=["X"])
    nodes = [grad, *forward] if gradient_first else [*forward, grad]
    return _model(
        nodes,
        [_vi("X", shape=[4, 3]), _vi("W", shape=[3, 2]), _vi("B", shape=[2])],
        [_vi("loss", shape=[]), _vi("dW", shape=[3, 2]), _vi("dB", shape=[2])],
    )


def _mlp_loss(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.sum(jnp.tanh(x @ w + b[None, :]) ** 2)


@pytest.mark.parametrize("gradient_first", [False, True], ids=["graph-order", "gradient-first"])
def test_gradient_matches_jax_grad(gradient_first: bool) -> None:
    x, w, b = (RNG.normal(size=s).astype(np.float32) for s in [(4, 3), (3, 2), (2,)])
    out = backend.prepare(_mlp_loss_model(gradient_first)).run([x, w, b])
    dw, db = jax.grad(_mlp_loss, argnums=(1, 2))(x, w, b)
    np.testing.assert_allclose(out.loss, _mlp_loss(x, w, b), rtol=1e-6)
    np.testing.assert_allclose(out.dW, dw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.dB, db, rtol=1e-5, atol=1e-6)


def test_gradient_with_respect_to_an_intermediate() -> None:
    """dy/dH where H = X * W is computed by a node: y = sum(sin(H) * Z)."""
    nodes = [
        helper.make_node("Mul", ["X", "W"], ["H"]),
        helper.make_node("Sin", ["H"], ["S"]),
        helper.make_node("Mul", ["S", "Z"], ["P"]),
        helper.make_node("ReduceSum", ["P"], ["y"], keepdims=0),
        _grad(["H", "Z"], "y", ["dH", "dZ"]),
    ]
    model = _model(
        nodes, [_vi(n, shape=[3]) for n in "XWZ"], [_vi("dH", shape=[3]), _vi("dZ", shape=[3])]
    )
    x, w, z = (RNG.normal(size=3).astype(np.float32) for _ in range(3))
    out = backend.prepare(model).run([x, w, z])
    dh, dz = jax.grad(lambda h, z: jnp.sum(jnp.sin(h) * z), argnums=(0, 1))(x * w, z)
    np.testing.assert_allclose(out.dH, dh, rtol=1e-6)
    np.testing.assert_allclose(out.dZ, dz, rtol=1e-6)


def test_second_order_gradient() -> None:
    """Gradient of a Gradient: y = sum(x**3 * c); g = dy/dx; d(sum g)/dx = 6 x c."""
    nodes = [
        _grad(["X"], "g_sum", ["H"], zs=["C"]),  # listed first on purpose
        helper.make_node("Mul", ["X", "X"], ["X2"]),
        helper.make_node("Mul", ["X2", "X"], ["X3"]),
        helper.make_node("Mul", ["X3", "C"], ["P"]),
        helper.make_node("ReduceSum", ["P"], ["y"], keepdims=0),
        _grad(["X"], "y", ["G"], zs=["C"]),
        helper.make_node("ReduceSum", ["G"], ["g_sum"], keepdims=0),
    ]
    model = _model(
        nodes,
        [_vi("X", shape=[3]), _vi("C", shape=[3])],
        [_vi("G", shape=[3]), _vi("H", shape=[3])],
    )
    x, c = RNG.normal(size=3).astype(np.float32), RNG.normal(size=3).astype(np.float32)
    out = backend.prepare(model).run([x, c])

    def y(x: jax.Array) -> jax.Array:
        return jnp.sum(x**3 * c)

    np.testing.assert_allclose(out.G, jax.grad(y)(x), rtol=1e-5)
    np.testing.assert_allclose(out.H, jax.grad(lambda x: jnp.sum(jax.grad(y)(x)))(x), rtol=1e-5)


def test_non_scalar_y_is_seeded_with_ones() -> None:
    nodes = [helper.make_node("Mul", ["X", "X"], ["Y"]), _grad(["X"], "Y", ["dX"])]
    model = _model(nodes, [_vi("X", shape=[2, 2])], [_vi("dX", shape=[2, 2])])
    x = RNG.normal(size=(2, 2)).astype(np.float32)
    (dx,) = backend.prepare(model).run([x])
    np.testing.assert_allclose(dx, jax.grad(lambda x: jnp.sum(x * x))(x), rtol=1e-6)


def test_jax_grad_through_a_prepared_graph() -> None:
    """The prepared graph is a differentiable JAX function of its inputs and initializers."""
    w0 = RNG.normal(size=(3, 2)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["X", "W"], ["H"], transB=0),
        helper.make_node("Relu", ["H"], ["A"]),
        helper.make_node("ReduceMean", ["A"], ["loss"], keepdims=0),
    ]
    model = _model(
        nodes,
        [_vi("X", shape=[5, 3])],
        [_vi("loss", shape=[])],
        initializers=[numpy_helper.from_array(w0, "W")],
    )
    rep = backend.prepare(model)
    x = RNG.normal(size=(5, 3)).astype(np.float32)

    def through_graph(w: jax.Array) -> jax.Array:
        return rep.graph.apply({"X": x}, {"W": w})[0]

    def by_hand(w: jax.Array) -> jax.Array:
        return jnp.mean(jax.nn.relu(x @ w))

    np.testing.assert_allclose(
        jax.jit(jax.grad(through_graph))(w0), jax.grad(by_hand)(w0), rtol=1e-6
    )


def test_gradient_feeds_adam_in_one_graph() -> None:
    """A training step as ONNX writes it: loss, Gradient, Adam, in one computation."""
    nodes = [
        _grad(["W"], "loss", ["dW"], zs=["X", "Y"]),  # before y's nodes: y is an attribute
        helper.make_node("MatMul", ["X", "W"], ["P"]),
        helper.make_node("Sub", ["P", "Y"], ["E"]),
        helper.make_node("Mul", ["E", "E"], ["E2"]),
        helper.make_node("ReduceMean", ["E2"], ["loss"], keepdims=0),
        helper.make_node(
            "Adam", ["R", "T", "W", "dW", "V", "H"], ["W2", "V2", "H2"], domain=TRAINING
        ),
    ]
    shapes = {"X": [4, 3], "W": [3, 1], "Y": [4, 1], "V": [3, 1], "H": [3, 1]}
    inputs = [_vi("R", shape=[]), _vi("T", I64, [])] + [_vi(n, shape=s) for n, s in shapes.items()]
    model = _model(nodes, inputs, [_vi(n, shape=[3, 1]) for n in ("W2", "V2", "H2")])
    x, w, y = (RNG.normal(size=shapes[n]).astype(np.float32) for n in "XWY")
    zeros = np.zeros((3, 1), np.float32)
    out = backend.prepare(model).run([np.float32(0.1), np.int64(1), x, w, y, zeros, zeros])
    grad = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    adam = helper.make_node(
        "Adam", ["R", "T", "W", "G", "V", "H"], ["W2", "V2", "H2"], domain=TRAINING
    )
    expected = ReferenceEvaluator(adam).run(
        None,
        {
            "R": np.float32(0.1),
            "T": np.int64(1),
            "W": w,
            "G": np.asarray(grad),
            "V": zeros,
            "H": zeros,
        },
    )
    for ours, ref in zip(out, expected, strict=True):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("opset", range(7, 24))
def test_models_of_opsets_7_to_23_load(opset: int) -> None:
    nodes = [
        helper.make_node("Relu", ["X"], ["A"]),
        helper.make_node("Add", ["A", "X"], ["B"]),
        helper.make_node("ReduceSum" if opset >= 13 else "ReduceMean", ["B"], ["Y"], keepdims=0),
    ]
    model = _model(nodes, [_vi("X", shape=[2, 2])], [_vi("Y", shape=[])], opset=opset)
    x = np.array([[1, -2], [3, -4]], np.float32)
    y = backend.prepare(model).run([x]).Y
    assert float(y) == (2.0 if opset >= 13 else 0.5)


# ----------------------------------------------------------------------------- compiling


def test_shape_arithmetic_folds_into_one_computation() -> None:
    """Shape -> Gather -> Concat -> Reshape leaves only the reshape in the traced program."""
    const = helper.make_tensor("m1", I64, [1], [-1])
    nodes = [
        helper.make_node("Shape", ["X"], ["s"]),
        helper.make_node("Constant", [], ["i0"], value=helper.make_tensor("i0", I64, [1], [0])),
        helper.make_node("Gather", ["s", "i0"], ["n"]),
        helper.make_node("Constant", [], ["m1"], value=const),
        helper.make_node("Concat", ["n", "m1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["X", "shape"], ["Y"]),
    ]
    rep = backend.prepare(_model(nodes, [_vi("X", shape=[2, 3, 4])], [_vi("Y", shape=[2, 12])]))
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(rep.run([x]).Y, x.reshape(2, 12))
    jaxpr = jax.make_jaxpr(rep.graph.apply)({"X": x})
    assert [e.primitive.name for e in jaxpr.eqns] == ["reshape"]


def test_unsupported_op_off_the_needed_path_is_not_an_error() -> None:
    nodes = [
        helper.make_node("Relu", ["X"], ["Y"]),
        helper.make_node("ImageDecoder", ["X"], ["unused"]),  # not registered
    ]
    rep = backend.prepare(_model(nodes, [_vi("X", shape=[2])], [_vi("Y", shape=[2])]))
    np.testing.assert_array_equal(rep.run([np.array([-1, 2], np.float32)]).Y, [0, 2])


def test_unsupported_ops_are_listed_in_one_error() -> None:
    nodes = [
        helper.make_node("Relu", ["X"], ["A"]),
        helper.make_node("ImageDecoder", ["A"], ["B"], name="dec"),
        helper.make_node("StringNormalizer", ["B"], ["Y"]),
        helper.make_node("Foo", ["X"], ["Z"], domain="com.example"),
    ]
    model = _model(nodes, [_vi("X", shape=[2, 2])], [_vi("Y", shape=[2, 2])])
    model.opset_import.append(helper.make_opsetid("com.example", 3))
    with pytest.raises(UnsupportedOperatorError) as info:
        backend.prepare(model)
    message = str(info.value)
    assert "node 'dec' (ai.onnx.ImageDecoder)" in message
    for listed in [
        "ai.onnx.StringNormalizer (opset 21)",
        "ai.onnx.ImageDecoder (opset 21)",
        "com.example.Foo (opset 3)",
    ]:
        assert listed in message


# ----------------------------------------------------------------------------- old opset forms


def _compare_with_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    ours = backend.OnnxOptaxRep(model, "CPU").run(feeds)  # outputs have no shapes: no checker
    expected = ReferenceEvaluator(model).run(None, feeds)
    for a, b in zip(ours, expected, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


X3 = RNG.normal(size=(2, 3, 4)).astype(np.float32)
OLD_FORMS = [
    ("Softmax opset 13 (axis=-1)", 13, helper.make_node("Softmax", ["X"], ["Y"]), []),
    ("LogSoftmax opset 11 axis=2", 11, helper.make_node("LogSoftmax", ["X"], ["Y"], axis=2), []),
    ("ReduceMean axes attribute", 13, helper.make_node("ReduceMean", ["X"], ["Y"], axes=[1]), []),
    ("ReduceMean axes input", 18, helper.make_node("ReduceMean", ["X", "axes"], ["Y"]), ["axes"]),
    (
        "ReduceSum noop empty axes",
        13,
        helper.make_node("ReduceSum", ["X"], ["Y"], noop_with_empty_axes=1),
        [],
    ),
    (
        "ReduceL2 attr opset 11",
        11,
        helper.make_node("ReduceL2", ["X"], ["Y"], axes=[0, 2], keepdims=0),
        [],
    ),
    ("Clip attributes opset 6", 6, helper.make_node("Clip", ["X"], ["Y"], min=-0.5, max=0.25), []),
    (
        "Squeeze/Unsqueeze attributes opset 11",
        11,
        helper.make_node("Unsqueeze", ["X"], ["Y"], axes=[0, 4]),
        [],
    ),
    (
        "Unsqueeze axes input opset 13",
        13,
        helper.make_node("Unsqueeze", ["X", "uaxes"], ["Y"]),
        ["uaxes"],
    ),
    (
        "Split attribute opset 11",
        11,
        helper.make_node("Split", ["X"], ["Y", "Y2"], axis=2, split=[1, 3]),
        [],
    ),
    (
        "Split input opset 13",
        13,
        helper.make_node("Split", ["X", "sizes"], ["Y", "Y2"], axis=2),
        ["sizes"],
    ),
    (
        "Slice attributes opset 9",
        9,
        helper.make_node("Slice", ["X"], ["Y"], starts=[0, 1], ends=[1, 100], axes=[0, 2]),
        [],
    ),
    (
        "Pad attributes opset 9",
        9,
        helper.make_node("Pad", ["X"], ["Y"], pads=[0, 1, 0, 0, 2, 1], value=1.5),
        [],
    ),
    (
        "Dropout ratio attribute opset 9",
        9,
        helper.make_node("Dropout", ["X"], ["Y"], ratio=0.3),
        [],
    ),
    (
        "Cast reads 'to' by name",
        21,
        helper.make_node("Cast", ["X"], ["Y"], saturate=1, to=TensorProto.INT32),
        [],
    ),
]
CONSTANTS = {
    "axes": np.array([0, 2], np.int64),
    "uaxes": np.array([0, -1], np.int64),
    "sizes": np.array([1, 3], np.int64),
}


@pytest.mark.parametrize(
    ("label", "opset", "node", "constants"), OLD_FORMS, ids=[c[0] for c in OLD_FORMS]
)
def test_forms_of_older_opsets_match_the_reference(
    label: str, opset: int, node: onnx.NodeProto, constants: list[str]
) -> None:
    del label
    inits = [numpy_helper.from_array(CONSTANTS[n], n) for n in constants]
    elem = TensorProto.INT32 if node.op_type == "Cast" else F32
    outputs = [_vi(n, elem) for n in node.output]
    model = _model([node], [_vi("X", shape=[2, 3, 4])], outputs, opset=opset, initializers=inits)
    model.opset_import.pop()  # the reference evaluator needs only ai.onnx
    _compare_with_reference(model, {"X": X3})


def test_softmax_before_opset_13_normalises_the_flattened_rows() -> None:
    """Opset < 13 coerces to 2-D at axis (default 1). onnx.reference ignores this (it
    normalises along axis 1 alone), so the expected values are written out here."""
    for op, fn in [("Softmax", jax.nn.softmax), ("LogSoftmax", jax.nn.log_softmax)]:
        node = helper.make_node(op, ["X"], ["Y"])
        model = _model([node], [_vi("X", shape=[2, 3, 4])], [_vi("Y", shape=[2, 3, 4])], opset=11)
        (y,) = backend.prepare(model).run([X3])
        np.testing.assert_allclose(
            y, fn(X3.reshape(2, 12), axis=1).reshape(2, 3, 4), rtol=1e-5, atol=1e-6
        )


# ----------------------------------------------------------------------------- bad input

A = _vi("a", shape=[2])


def _bad(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto] | None = None,
    outputs: list[str] | None = None,
) -> onnx.ModelProto:
    return _model(nodes, [A] if inputs is None else inputs, [_vi(n) for n in outputs or ["y"]])


BAD_MODELS = [
    (
        "cycle",
        _bad(
            [
                helper.make_node("Add", ["a", "c"], ["b"], name="n1"),
                helper.make_node("Neg", ["b"], ["c"]),
                helper.make_node("Neg", ["c"], ["y"]),
            ]
        ),
        ValueError,
        r"cycle",
    ),
    (
        "undefined input",
        _bad([helper.make_node("Add", ["a", "nope"], ["y"], name="adder")]),
        ValueError,
        r"node 'adder'.*input 'nope' is not a graph input",
    ),
    (
        "gradient y names nothing",
        _bad([_grad(["a"], "nothing", ["y"], name="g")]),
        ValueError,
        r"node 'g'.*y names 'nothing'",
    ),
    (
        "gradient xs names nothing",
        _bad(
            [
                helper.make_node("Neg", ["a"], ["n"]),
                helper.make_node(
                    "Gradient", ["a"], ["y"], domain=TRAINING, xs=["ghost"], y="n", name="g"
                ),
            ]
        ),
        ValueError,
        r"node 'g'.*xs names 'ghost'",
    ),
    (
        "gradient y depends on the gradient itself",
        _bad(
            [
                helper.make_node("Mul", ["a", "g"], ["s"]),
                helper.make_node(
                    "Gradient", ["a"], ["g"], domain=TRAINING, xs=["a"], y="s", name="gg"
                ),
                helper.make_node("Neg", ["g"], ["y"]),
            ]
        ),
        ValueError,
        r"node 'gg'.*(y depends on the node itself|cycle)",
    ),
    (
        "gradient inputs do not match xs + zs",
        _bad(
            [
                helper.make_node("Neg", ["a"], ["n"]),
                helper.make_node(
                    "Gradient", ["a", "a"], ["y"], domain=TRAINING, xs=["a"], y="n", name="g"
                ),
            ]
        ),
        ValueError,
        r"node 'g'.*2 inputs.*xs \['a'\] and zs \[\] name 1",
    ),
    (
        "attribute of the wrong type",
        _bad([helper.make_node("LeakyRelu", ["a"], ["y"], alpha=2, name="lr")]),
        TypeError,
        r"node 'lr'.*'alpha' must be FLOAT, got INT",
    ),
    (
        "unknown attribute",
        _bad([helper.make_node("Relu", ["a"], ["y"], gain=2.0, name="r")]),
        ValueError,
        r"node 'r'.*unknown attribute 'gain'",
    ),
    (
        "shapes that do not broadcast",
        _bad([helper.make_node("Add", ["a", "b"], ["y"], name="plus")], [A, _vi("b", shape=[3])]),
        ValueError,
        r"node 'plus'.*shapes \[\[2\], \[3\]\] do not broadcast",
    ),
    (
        "matmul shapes",
        _bad(
            [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
            [_vi("a", shape=[2, 3]), _vi("b", shape=[2, 3])],
        ),
        ValueError,
        r"node 'mm'.*MatMul of shapes \[2, 3\] and \[2, 3\]",
    ),
    (
        "shape input fed at run time",
        _bad(
            [
                helper.make_node("Neg", ["s"], ["s2"]),
                helper.make_node("Reshape", ["a", "s2"], ["y"], name="rs"),
            ],
            [A, _vi("s", I64, [17])],  # more than a small source (graph.SMALL_SOURCE)
        ),
        ValueError,
        r"node 'rs'.*input 's2' must be known when the graph is compiled",
    ),
    (
        "output nobody computes",
        _bad([helper.make_node("Neg", ["a"], ["b"])]),
        ValueError,
        r"graph output 'y' is produced by no node",
    ),
]


@pytest.mark.parametrize(
    ("label", "model", "error", "pattern"), BAD_MODELS, ids=[c[0] for c in BAD_MODELS]
)
def test_bad_models_fail_at_prepare(
    label: str, model: onnx.ModelProto, error: type[Exception], pattern: str
) -> None:
    del label
    from onnx_optax._src.graph import GraphFunction

    opsets = {o.domain: o.version for o in model.opset_import}
    with pytest.raises(error, match=pattern):
        GraphFunction(model.graph, opsets=opsets)  # backend.prepare also runs onnx.checker


def test_broadcast_error_at_run_time_names_the_node() -> None:
    """Without declared shapes the check happens when the shapes arrive, still no XLA error."""
    model = _bad(
        [helper.make_node("Mul", ["a", "b"], ["y"], name="times")],
        [_vi("a", shape=["n"]), _vi("b", shape=["m"])],
    )
    rep = backend.OnnxOptaxRep(model, "CPU")
    with pytest.raises(ValueError, match=r"node 'times'.*do not broadcast"):
        rep.run([np.ones(2, np.float32), np.ones(3, np.float32)])


def test_gradient_of_an_integer_is_refused() -> None:
    nodes = [
        helper.make_node("Neg", ["a"], ["n"]),
        helper.make_node("Cast", ["n"], ["f"], to=F32),
        _grad(["a"], "f", ["y"], name="g"),
    ]
    model = _model(nodes, [_vi("a", TensorProto.INT32, [2])], [_vi("y", TensorProto.INT32, [2])])
    with pytest.raises(TypeError, match=r"node 'g'.*cannot differentiate with respect to 'a'"):
        backend.prepare(model)


# ----------------------------------------------------------------------------- safety


def test_external_data_is_refused(tmp_path: Path) -> None:
    tensor = numpy_helper.from_array(np.ones(4, np.float32), "W")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.ClearField("raw_data")
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "../../etc/passwd"
    with pytest.raises(ValueError, match=r"tensor 'W' keeps its data in an external file"):
        read_tensor(tensor, "initializer")


def test_raw_data_size_is_checked() -> None:
    tensor = numpy_helper.from_array(np.ones(4, np.float32), "W")
    tensor.dims[:] = [1000, 1000]
    with pytest.raises(
        ValueError, match=r"tensor 'W': raw_data holds 16 bytes, but dims \[1000, 1000\]"
    ):
        read_tensor(tensor, "initializer")


def test_constant_tensor_goes_through_the_reader() -> None:
    value = numpy_helper.from_array(np.ones(2, np.float32), "v")
    value.dims[:] = [3]
    model = _bad([helper.make_node("Constant", [], ["y"], value=value, name="k")], [])
    from onnx_optax._src.graph import GraphFunction

    with pytest.raises(ValueError, match=r"node 'k'.*attribute 'value'.*raw_data holds 8 bytes"):
        GraphFunction(model.graph)  # onnx.checker, in backend.prepare, would stop it first


def test_large_int64_needs_x64() -> None:
    big = numpy_helper.from_array(np.full(5000, 2**40, np.int64), "big")  # fed, not static
    model = _model(
        [helper.make_node("Identity", ["big"], ["y"])],
        [],
        [_vi("y", I64, [5000])],
        initializers=[big],
    )
    rep = backend.prepare(model)
    with pytest.raises(ValueError, match=r"int64 values beyond int32; enable 64-bit JAX"):
        rep.run([])
    with jax.enable_x64(True):
        assert int(backend.prepare(model).run([]).y[0]) == 2**40


# ----------------------------------------------------------------------------- docs


def test_ops_document_lists_the_registry() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "onnx-ops.md").read_text()
    sections = re.split(r"^## ", doc, flags=re.MULTILINE)[1:]
    listed = {
        section.split()[0]: set(re.findall(r"^\| `(\w+)` \|", section, flags=re.MULTILINE))
        for section in sections
    }
    assert listed == {name: set(ops) for name, ops in backend.supported_ops().items()}
    for section in sections:
        count = re.match(r"\S+ \((\d+) ops\)", section)
        if count:
            assert int(count.group(1)) == len(listed[section.split()[0]])


def test_a_shape_computed_from_a_small_graph_input_compiles_per_value() -> None:
    """Reshape's shape from Neg of a declared 2-element input: the input is read as a
    compile-time value (graph.SMALL_SOURCE), so each value gives its own shape."""
    model = _model(
        [
            helper.make_node("Neg", ["s"], ["s2"]),
            helper.make_node("Reshape", ["a", "s2"], ["y"], name="rs"),
        ],
        [_vi("a", F32, [2, 3]), _vi("s", I64, [2])],
        [_vi("y", F32, ["m", "n"])],
    )
    prepared = backend.prepare(model)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    for shape in ([3, 2], [1, 6], [6, 1]):
        (y,) = prepared.run({"a": a, "s": -np.array(shape, np.int64)})
        np.testing.assert_array_equal(y, a.reshape(shape))


def test_a_small_input_seen_only_through_shape_stays_data() -> None:
    """A shape read through Shape depends on no value: the small input b stays traced data
    (a trained parameter of 8 channels must not become a compile-time value)."""
    from onnx_optax._src.graph import GraphFunction

    model = _model(
        [
            helper.make_node("Shape", ["b"], ["s"]),
            helper.make_node("Reshape", ["a", "s"], ["r"]),
            helper.make_node("Add", ["r", "b"], ["y"]),
        ],
        [_vi("a", F32, [2, 4]), _vi("b", F32, [8])],
        [_vi("y", F32, [8])],
    )
    graph = GraphFunction(model.graph, opsets={"": 21})
    assert graph.static_inputs == ()
    a, b = np.arange(8, dtype=np.float32).reshape(2, 4), np.ones(8, np.float32)
    (y,) = backend.prepare(model).run({"a": a, "b": b})
    np.testing.assert_array_equal(y, a.reshape(8) + 1)
