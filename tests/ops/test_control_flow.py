"""If, Loop and Scan: values against onnxruntime, gradients against central differences.

Each model is small and built here with ``onnx.helper``; its subgraphs read names
of the enclosing graph. Expected values are onnxruntime's on the same model;
gradients (jax.grad of the graph, and ONNX Gradient nodes) are compared with
central finite differences of the float64 model's forward pass. Refusals
(branches of different shapes under a run-time condition, a loop whose scan
outputs would have a run-time length, nesting past the limit) name the node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax._src.graph import GraphFunction  # noqa: E402
from onnx_optax._src.limits import MAX_SUBGRAPH_DEPTH  # noqa: E402
from tests.support.finite_differences import central_difference  # noqa: E402

F32, F64, I64, BOOL = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.BOOL
TRAINING = "ai.onnx.preview.training"
vi = helper.make_tensor_value_info


def make_model(
    nodes: Sequence[Any],
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    initializers: Mapping[str, np.ndarray] | None = None,
    opset: int = 17,
) -> Any:
    graph = helper.make_graph(
        list(nodes),
        "g",
        list(inputs),
        list(outputs),
        initializer=[numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
    )
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(TRAINING, 1)]
    return helper.make_model(graph, opset_imports=opsets)


def body(name: str, nodes: Sequence[Any], inputs: Sequence[Any], outputs: Sequence[Any]) -> Any:
    return helper.make_graph(list(nodes), name, list(inputs), list(outputs))


def assert_as_onnxruntime(model: Any, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, dict(feeds))
    got = backend.prepare(model).run(dict(feeds))
    assert len(got) == len(expected)
    for ours, want in zip(got, expected, strict=True):
        assert ours.shape == want.shape and ours.dtype == want.dtype, (ours, want)
        np.testing.assert_allclose(ours, want, rtol=1e-6, atol=1e-6)
    return list(got)


def assert_gradient_matches(model: Any, feeds: dict[str, np.ndarray], wrt: str) -> None:
    """jax.grad of sum(weights * first output) w.r.t. input ``wrt`` equals FD (float64)."""
    with jax.enable_x64(True):
        graph = GraphFunction(model.graph, opsets={"": 17})
        shape = graph.apply(feeds)[0].shape
        weights = np.random.default_rng(7).standard_normal(shape)

        @jax.jit
        def loss(x: Any) -> Any:
            return (graph.apply({**feeds, wrt: x})[0] * weights).sum()

        got = np.asarray(jax.grad(loss)(feeds[wrt]))
        expected = central_difference(lambda x: float(loss(x)), feeds[wrt])
    assert np.abs(expected).max() > 1e-2  # not a vacuous comparison
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------- If


def if_model(
    elem: int = F32, then_shape: Sequence[int] = (3,), out_shape: Sequence[int] = (3,)
) -> Any:
    """y = If(c) then x * w + 1 else sin(x) * w: both branches read x and w from outside."""
    one = np.ones(then_shape, helper.tensor_dtype_to_np_dtype(elem))
    widen = (
        helper.make_node("Add", ["xw", "one"], ["t"])
        if tuple(then_shape) == (3,)
        else helper.make_node("Expand", ["xw", "wide"], ["t"])
    )
    then_branch = body(
        "then",
        [helper.make_node("Mul", ["x", "w"], ["xw"]), widen],
        [],
        [vi("t", elem, list(then_shape))],
    )
    else_branch = body(
        "else",
        [helper.make_node("Sin", ["x"], ["s"]), helper.make_node("Mul", ["s", "w"], ["e"])],
        [],
        [vi("e", elem, [3])],
    )
    node = helper.make_node(
        "If", ["c"], ["y"], name="if", then_branch=then_branch, else_branch=else_branch
    )
    return make_model(
        [node],
        [vi("c", BOOL, []), vi("x", elem, [3]), vi("w", elem, [3])],
        [vi("y", elem, list(out_shape))],
        {"one": one, "wide": np.array([2, 3], np.int64)},
    )


@pytest.mark.parametrize("cond", [True, False])
def test_if_on_a_fed_condition_matches_onnxruntime(cond: bool) -> None:
    feeds = {
        "c": np.array(cond),
        "x": np.array([0.5, -1.0, 2.0], np.float32),
        "w": np.array([3.0, 2.0, -1.0], np.float32),
    }
    (y,) = assert_as_onnxruntime(if_model(), feeds)
    assert (y == feeds["x"] * feeds["w"] + 1).all() == cond


def test_if_branches_of_different_shapes_need_a_condition_known_at_compile_time() -> None:
    model = if_model(then_shape=(2, 3))
    feeds = {"x": np.array([0.5, -1.0, 2.0], np.float32), "w": np.ones(3, np.float32)}
    with pytest.raises(
        ValueError, match=r"node 'if' \(ai\.onnx\.If\): output 0 is float32\[2, 3\]"
    ):
        backend.prepare(model).run({**feeds, "c": np.array(True)})
    # The condition as a constant: the branch is taken while tracing, as onnxruntime does.
    for cond in (True, False):
        value = numpy_helper.from_array(np.array(cond), "c")
        constant = helper.make_node("Constant", [], ["c"], value=value)
        declared = if_model(then_shape=(2, 3), out_shape=(2, 3) if cond else (3,))
        fixed = make_model(
            [constant, *declared.graph.node],
            declared.graph.input[1:],
            declared.graph.output,
            {"one": np.ones((2, 3), np.float32), "wide": np.array([2, 3], np.int64)},
        )
        (y,) = assert_as_onnxruntime(fixed, feeds)
        assert y.shape == ((2, 3) if cond else (3,))


@pytest.mark.parametrize("cond", [True, False])
def test_gradient_through_if_matches_central_differences(cond: bool) -> None:
    feeds = {"c": np.array(cond), "x": np.array([0.5, -1.0, 2.0]), "w": np.array([3.0, 2.0, -1.0])}
    assert_gradient_matches(if_model(F64), feeds, "x")


# ----------------------------------------------------------------------------- Loop


def loop_model(trip: np.ndarray | None, cond_from_body: bool, scan_output: bool = True) -> Any:
    """Carries s; each iteration s = s * w + i (w from outside), scanning out s.

    ``cond_from_body``: the body's condition is sum(s) < 50 (a value known at run time).
    """
    nodes = [
        helper.make_node("Cast", ["i"], ["i_f"], to=F64 if trip is None else F32),
        helper.make_node("Mul", ["s_in", "w"], ["sw"]),
        helper.make_node("Add", ["sw", "i_f"], ["s_out"]),
        helper.make_node("Identity", ["s_out"], ["scanned"]),
    ]
    elem = F64 if trip is None else F32
    if cond_from_body:
        nodes += [
            helper.make_node("ReduceSum", ["s_out"], ["total"], keepdims=0),
            helper.make_node("Less", ["total", "limit"], ["c_out"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    outputs = [vi("c_out", BOOL, []), vi("s_out", elem, [2])]
    if scan_output:
        outputs.append(vi("scanned", elem, [2]))
    loop_body = body(
        "body", nodes, [vi("i", I64, []), vi("c_in", BOOL, []), vi("s_in", elem, [2])], outputs
    )
    node = helper.make_node(
        "Loop",
        ["M" if trip is not None else "", "c", "s0"],
        ["s_final", *(["all"] if scan_output else [])],
        name="loop",
        body=loop_body,
    )
    np_elem = helper.tensor_dtype_to_np_dtype(elem)
    inits: dict[str, np.ndarray] = {"c": np.array(True), "limit": np.array(50, np_elem)}
    if trip is not None:
        inits["M"] = trip
    return make_model(
        [node],
        [vi("s0", elem, [2]), vi("w", elem, [2])],
        [vi("s_final", elem, [2]), *([vi("all", elem, ["n", 2])] if scan_output else [])],
        inits,
    )


LOOP_FEEDS = {"s0": np.array([1.0, -0.5], np.float32), "w": np.array([1.5, 0.5], np.float32)}


@pytest.mark.parametrize("trip", [0, 1, 5])
def test_loop_of_a_known_trip_count_matches_onnxruntime(trip: int) -> None:
    model = loop_model(np.array(trip, np.int64), cond_from_body=False)
    _, scanned = assert_as_onnxruntime(model, LOOP_FEEDS)
    assert scanned.shape == (trip, 2)


def test_loop_while_a_condition_holds_matches_onnxruntime() -> None:
    """Both the trip count (an upper bound) and a condition the body computes: while_loop."""
    model = loop_model(np.array(100, np.int64), cond_from_body=True, scan_output=False)
    (s_final,) = assert_as_onnxruntime(model, LOOP_FEEDS)
    assert s_final.sum() >= 50  # stopped by the condition, not after 100 iterations
    no_trip = loop_model(None, cond_from_body=True, scan_output=False)
    feeds = {k: v.astype(np.float64) for k, v in LOOP_FEEDS.items()}
    with jax.enable_x64(True):
        assert_as_onnxruntime(no_trip, feeds)


def test_loop_scan_outputs_of_a_run_time_length_are_refused_naming_the_node() -> None:
    model = loop_model(np.array(100, np.int64), cond_from_body=True)
    with pytest.raises(ValueError, match=r"node 'loop' \(ai\.onnx\.Loop\): its 1 scan output"):
        backend.prepare(model).run(LOOP_FEEDS)


def test_gradient_through_a_fixed_loop_matches_central_differences() -> None:
    model = loop_model(np.array(4, np.int64), cond_from_body=False)
    feeds = {"s0": np.array([1.0, -0.5]), "w": np.array([1.5, 0.5])}
    # as float64: the body and the graph's declared types
    double = onnx.ModelProto()
    double.CopyFrom(model)
    for info in [*double.graph.input, *double.graph.output]:
        info.type.tensor_type.elem_type = F64
    loop = double.graph.node[0]
    for info in [*loop.attribute[0].g.input[2:], *loop.attribute[0].g.output[1:]]:
        info.type.tensor_type.elem_type = F64
    loop.attribute[0].g.node[0].attribute[0].i = F64
    double.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array(50.0), "limit"))
    assert_gradient_matches(double, feeds, "w")
    assert_gradient_matches(double, feeds, "s0")


def test_a_loop_body_reading_its_iteration_as_a_shape_is_unrolled() -> None:
    """Slice's starts from the iteration number (as ONNX's test_loop11): onnxruntime's values."""
    nodes = [
        helper.make_node("Unsqueeze", ["i", "zero"], ["start"]),
        helper.make_node("Add", ["start", "one"], ["end"]),
        helper.make_node("Slice", ["table", "start", "end"], ["row"]),
        helper.make_node("Add", ["s_in", "row"], ["s_out"]),
        helper.make_node("Identity", ["c_in"], ["c_out"]),
    ]
    loop_body = body(
        "body",
        nodes,
        [vi("i", I64, []), vi("c_in", BOOL, []), vi("s_in", F32, [1])],
        [vi("c_out", BOOL, []), vi("s_out", F32, [1]), vi("row", F32, [1])],
    )
    node = helper.make_node("Loop", ["M", "", "s0"], ["s", "rows"], name="loop", body=loop_body)
    model = make_model(
        [node],
        [vi("M", I64, []), vi("s0", F32, [1]), vi("table", F32, [6])],
        [vi("s", F32, [1]), vi("rows", F32, ["n", 1])],
        {"zero": np.array([0], np.int64), "one": np.array([1], np.int64)},
    )
    table = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0], np.float32)
    feeds = {"M": np.array(4, np.int64), "s0": np.array([0.5], np.float32), "table": table}
    _, rows = assert_as_onnxruntime(model, feeds)
    assert rows.shape == (4, 1)
    # The body (5 nodes) counts once in the graph's work (6); 3 more unrolled iterations
    # add 15 node runs, which must fit in the traced-work limit.
    assert backend.prepare(model).graph.work == 6
    backend.prepare(model, limits=backend.Limits(traced_nodes=21)).run(feeds)
    with pytest.raises(ValueError, match=r"node 'loop' \(ai\.onnx\.Loop\).*unrolling 4 iter"):
        backend.prepare(model, limits=backend.Limits(traced_nodes=20)).run(feeds)


def test_a_run_time_check_inside_a_loop_body_fails_naming_its_node() -> None:
    """An index out of range read inside the scanned body: onnxruntime refuses it too."""
    nodes = [
        helper.make_node("Gather", ["data", "k"], ["picked"], name="gather"),
        helper.make_node("Add", ["s_in", "picked"], ["s_out"]),
        helper.make_node("Identity", ["c_in"], ["c_out"]),
    ]
    loop_body = body(
        "body",
        nodes,
        [vi("i", I64, []), vi("c_in", BOOL, []), vi("s_in", F32, [])],
        [vi("c_out", BOOL, []), vi("s_out", F32, [])],
    )
    node = helper.make_node("Loop", ["M", "", "s0"], ["s"], name="loop", body=loop_body)
    model = make_model(
        [node],
        [vi("s0", F32, []), vi("data", F32, [3]), vi("k", I64, [])],
        [vi("s", F32, [])],
        {"M": np.array(3, np.int64)},
    )
    feeds = {"s0": np.array(1.0, np.float32), "data": np.arange(3, dtype=np.float32)}
    assert_as_onnxruntime(model, {**feeds, "k": np.array(2, np.int64)})
    with pytest.raises(ValueError, match=r"node 'gather' \(ai\.onnx\.Gather\)"):
        backend.prepare(model).run({**feeds, "k": np.array(7, np.int64)})


# ----------------------------------------------------------------------------- Scan


def scan_model(elem: int = F32) -> Any:
    """A running sum over axis 1 of x, reversed, times w (outside); scanned out on axis 1."""
    nodes = [
        helper.make_node("Mul", ["x_t", "w"], ["xw"]),
        helper.make_node("Add", ["acc_in", "xw"], ["acc_out"]),
        helper.make_node("Tanh", ["acc_out"], ["y_t"]),
    ]
    scan_body = body(
        "body",
        nodes,
        [vi("acc_in", elem, [2]), vi("x_t", elem, [2])],
        [vi("acc_out", elem, [2]), vi("y_t", elem, [2])],
    )
    node = helper.make_node(
        "Scan",
        ["acc0", "x"],
        ["acc", "y"],
        name="scan",
        body=scan_body,
        num_scan_inputs=1,
        scan_input_axes=[1],
        scan_input_directions=[1],
        scan_output_axes=[-1],
        scan_output_directions=[1],
    )
    return make_model(
        [node],
        [vi("acc0", elem, [2]), vi("x", elem, [2, 4]), vi("w", elem, [2])],
        [vi("y", elem, [2, 4]), vi("acc", elem, [2])],
    )


def test_scan_with_axes_and_directions_matches_onnxruntime() -> None:
    rng = np.random.default_rng(0)
    feeds = {
        "acc0": np.array([0.1, -0.2], np.float32),
        "x": rng.standard_normal((2, 4)).astype(np.float32),
        "w": np.array([0.7, -1.3], np.float32),
    }
    y, _ = assert_as_onnxruntime(scan_model(), feeds)
    assert y.shape == (2, 4)


def test_gradient_through_scan_matches_central_differences() -> None:
    rng = np.random.default_rng(1)
    feeds = {"acc0": np.array([0.1, -0.2]), "x": rng.standard_normal((2, 4)), "w": np.ones(2)}
    assert_gradient_matches(scan_model(F64), feeds, "x")
    assert_gradient_matches(scan_model(F64), feeds, "w")


# ----------------------------------------------------------------------------- Gradient nodes


def test_gradient_nodes_differentiate_through_if_and_loop() -> None:
    """ONNX Gradient of a loss computed by a Loop whose body holds an If."""
    then_branch = body(
        "then", [helper.make_node("Mul", ["s_in", "w"], ["t"])], [], [vi("t", F64, [2])]
    )
    else_branch = body("else", [helper.make_node("Sin", ["s_in"], ["e"])], [], [vi("e", F64, [2])])
    nodes = [
        helper.make_node(
            "If", ["flag"], ["s_out"], then_branch=then_branch, else_branch=else_branch
        ),
        helper.make_node("Identity", ["c_in"], ["c_out"]),
    ]
    loop_body = body(
        "body",
        nodes,
        [vi("i", I64, []), vi("c_in", BOOL, []), vi("s_in", F64, [2])],
        [vi("c_out", BOOL, []), vi("s_out", F64, [2])],
    )
    graph_nodes = [
        helper.make_node("Loop", ["M", "", "s0"], ["s"], body=loop_body),
        helper.make_node("ReduceSum", ["s"], ["loss"], keepdims=0),
        helper.make_node("Gradient", ["w"], ["dw"], domain=TRAINING, xs=["w"], y="loss"),
    ]
    model = make_model(
        graph_nodes,
        [vi("s0", F64, [2]), vi("w", F64, [2]), vi("flag", BOOL, [])],
        [vi("loss", F64, []), vi("dw", F64, [2])],
        {"M": np.array(3, np.int64)},
    )
    s0, w = np.array([0.3, -0.8]), np.array([1.2, 0.6])
    with jax.enable_x64(True):
        rep = backend.prepare(model)
        for flag in (True, False):
            feeds = {"s0": s0, "flag": np.array(flag)}

            def loss(w: np.ndarray, feeds: dict[str, Any] = feeds) -> float:
                return float(rep.run({**feeds, "w": w})[0])

            (_, dw) = rep.run({**feeds, "w": w})
            expected = central_difference(loss, w)
            np.testing.assert_allclose(dw, expected, rtol=1e-6, atol=1e-9)
            assert (np.abs(expected) > 1e-2).all() == flag  # w is read only by then_branch


# ----------------------------------------------------------------------------- limits


def nested_ifs(depth: int) -> Any:
    """An If whose then_branch holds an If ..., depth deep; the innermost reads x from outside,
    each else_branch is Identity(x)."""
    inner = body("b0", [helper.make_node("Neg", ["x"], ["y0"])], [], [vi("y0", F32, [2])])
    other = body("other", [helper.make_node("Identity", ["x"], ["z"])], [], [vi("z", F32, [2])])
    for level in range(1, depth):
        node = helper.make_node(
            "If", ["c"], [f"y{level}"], name=f"if{level}", then_branch=inner, else_branch=other
        )
        inner = body(f"b{level}", [node], [], [vi(f"y{level}", F32, [2])])
    top = helper.make_node("If", ["c"], ["y"], name="top", then_branch=inner, else_branch=other)
    return make_model([top], [vi("c", BOOL, []), vi("x", F32, [2])], [vi("y", F32, [2])])


def test_nested_subgraphs_read_the_outermost_scope() -> None:
    feeds = {"c": np.array(True), "x": np.array([1.0, -2.0], np.float32)}
    (y,) = assert_as_onnxruntime(nested_ifs(4), feeds)
    np.testing.assert_array_equal(y, [-1.0, 2.0])


def test_nesting_counts_each_body_once_and_is_bounded() -> None:
    # Each If counts 1 plus its branches' nodes (each traced once): 2 a level, 1 for Neg.
    assert backend.prepare(nested_ifs(3)).graph.work == 7
    with pytest.raises(ValueError, match=r"node 'top' \(ai\.onnx\.If\).*runs 7 nodes.*limit of 6"):
        backend.prepare(nested_ifs(3), limits=backend.Limits(traced_nodes=6))
    with pytest.raises(ValueError, match=rf"node 'if\d+' \(ai\.onnx\.If\).*{MAX_SUBGRAPH_DEPTH}"):
        backend.prepare(nested_ifs(MAX_SUBGRAPH_DEPTH + 2))


# ----------------------------------------------------------------------------- training


def test_attach_trains_weights_read_inside_a_loop_body() -> None:
    """out = three steps of h = tanh(h @ W + b) in a Loop body reading W and b from outside;
    attach's steps equal optax on the same function written in JAX."""
    import jax.numpy as jnp
    import optax

    import onnx_optax
    from onnx_optax import training

    loop_body = body(
        "body",
        [
            helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
            helper.make_node("Add", ["hw", "b"], ["hb"]),
            helper.make_node("Tanh", ["hb"], ["h_out"]),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        [vi("i", I64, []), vi("c_in", BOOL, []), vi("h_in", F32, ["N", 3])],
        [vi("c_out", BOOL, []), vi("h_out", F32, ["N", 3])],
    )
    params = {
        "W": (np.random.default_rng(0).normal(size=(3, 3)) / 2).astype(np.float32),
        "b": np.full(3, 0.1, np.float32),
    }
    model = make_model(
        [helper.make_node("Loop", ["M", "", "x"], ["out"], body=loop_body)],
        [vi("x", F32, ["N", 3])],
        [vi("out", F32, ["N", 3])],
        {**params, "M": np.array(3, np.int64)},
    )
    trained = training.attach(model, loss="l1", target="t", optimizer=onnx_optax.adam(0.05))
    assert training.check(trained) == []
    session = training.Session(trained)
    rng = np.random.default_rng(1)
    batches = [(rng.normal(size=(8, 3)), rng.normal(size=(8, 3))) for _ in range(3)]
    batches = [(x.astype(np.float32), t.astype(np.float32)) for x, t in batches]
    losses = [float(session.step({"x": x, "t": t})["loss"]) for x, t in batches]

    def loss_fn(p: dict[str, Any], x: Any, t: Any) -> Any:
        h = x
        for _ in range(3):
            h = jnp.tanh(h @ p["W"] + p["b"][None, :])
        return jnp.mean(jnp.abs(h - t))

    p = {k: jnp.asarray(v) for k, v in params.items()}
    tx = onnx_optax.adam(0.05)
    state = tx.init(p)
    expected = []
    for x, t in batches:
        value, grads = jax.value_and_grad(loss_fn)(p, x, t)
        updates, state = tx.update(grads, state, p)
        p = optax.apply_updates(p, updates)
        expected.append(float(value))
    np.testing.assert_allclose(losses, expected, rtol=2e-6)
    for name in params:
        np.testing.assert_allclose(session.initializers[name], p[name], rtol=1e-5, atol=1e-6)
        assert not np.array_equal(session.initializers[name], params[name])


@pytest.mark.parametrize("size", [1, 64])
def test_a_trip_count_computed_from_a_small_input_is_a_compile_time_value(size: int) -> None:
    """M = Cast(ReduceMax(n)): from a small input (at most 16 elements) a compile-time value,
    so the loop scans (a scan output allowed); from a larger one it stays a run-time value
    (a while loop, without scan outputs)."""
    scans = size == 1
    body_nodes = [
        helper.make_node("Cast", ["i"], ["i_f"], to=F32),
        helper.make_node("Add", ["s_in", "i_f"], ["s_out"]),
        helper.make_node("Identity", ["c_in"], ["c_out"]),
        helper.make_node("Identity", ["s_out"], ["scanned"]),
    ]
    body_outputs = [vi("c_out", BOOL, []), vi("s_out", F32, [])]
    loop_outputs = ["s"]
    outputs = [vi("s", F32, [])]
    if scans:
        body_outputs.append(vi("scanned", F32, []))
        loop_outputs.append("all")
        outputs.append(vi("all", F32, ["k"]))
    loop_body = body(
        "body",
        body_nodes,
        [vi("i", I64, []), vi("c_in", BOOL, []), vi("s_in", F32, [])],
        body_outputs,
    )
    nodes = [
        helper.make_node("ReduceMax", ["n"], ["top"], keepdims=0),
        helper.make_node("Cast", ["top"], ["M"], to=I64),
        helper.make_node("Loop", ["M", "", "s0"], loop_outputs, body=loop_body),
    ]
    model = make_model(nodes, [vi("n", F32, [size]), vi("s0", F32, [])], outputs)
    n = np.full(size, 5.0, np.float32)
    assert_as_onnxruntime(model, {"n": n, "s0": np.array(0.5, np.float32)})
    assert backend.prepare(model).graph.static_inputs == (("n",) if scans else ())


# ----------------------------------------------------------------------------- signatures


def _branch(name: str, outputs: int, elem: int = F32, inputs: Sequence[Any] = ()) -> Any:
    nodes = [
        helper.make_node("Neg", ["x"], [f"{name}0"]),
        helper.make_node("Abs", ["x"], [f"{name}1"]),
    ]
    if elem != F32:
        nodes = [helper.make_node("Cast", ["x"], [f"{name}{k}"], to=elem) for k in range(2)]
    return body(name, nodes, list(inputs), [vi(f"{name}{k}", elem, [2]) for k in range(outputs)])


def _if_signature(case: str) -> Any:
    """An If whose branches disagree with it (or each other), under a constant condition."""
    then_outputs, node_outputs, else_elem, then_inputs = 1, 1, F32, ()
    if case == "more_branch_outputs":
        then_outputs = 2
    elif case == "fewer_branch_outputs":
        node_outputs = 2
    elif case == "branch_types":
        else_elem = F64
    elif case == "branch_inputs":
        then_inputs = (vi("q", F32, [2]),)
    then_branch = _branch("t", then_outputs, F32, then_inputs)
    else_branch = _branch("e", then_outputs, else_elem)
    cond = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(False)))
    node = helper.make_node(
        "If",
        ["c"],
        ["y", "z"][:node_outputs],
        name="if",
        then_branch=then_branch,
        else_branch=else_branch,
    )
    return make_model([cond, node], [vi("x", F32, [2])], [vi("y", F32, [2])])


def _loop_signature(case: str) -> Any:
    """s = -s, M times, scanning out s; the node or the body's declarations disagree."""
    outputs = [vi("c_out", BOOL, []), vi("s_out", F32, [2]), vi("scanned", F32, [2])]
    inputs = [vi("i", I64, []), vi("c_in", BOOL, []), vi("s_in", F32, [2])]
    node_outputs = ["f", "all"]
    if case == "more_body_outputs":
        node_outputs = ["f"]
    elif case == "fewer_body_outputs":
        node_outputs = ["f", "all", "extra"]
    elif case == "iteration_type":
        inputs[0] = vi("i", TensorProto.INT32, [])
    elif case == "condition_type":
        inputs[1] = vi("c_in", F32, [])
    elif case == "carried_type":
        inputs[2] = vi("s_in", I64, [2])
    nodes = [
        helper.make_node("Identity", ["c_in"], ["c_out"]),
        helper.make_node("Neg", ["s_in"], ["s_out"]),
        helper.make_node("Identity", ["s_in"], ["scanned"]),
    ]
    loop = helper.make_node(
        "Loop", ["M", "", "s0"], node_outputs, name="loop", body=body("b", nodes, inputs, outputs)
    )
    return make_model(
        [loop], [vi("s0", F32, [2])], [vi("f", F32, [2])], {"M": np.array(3, np.int64)}
    )


def _scan_signature(case: str) -> Any:
    """A running sum; the node or the body's declarations disagree."""
    elem = I64 if case == "scan_input_type" else F32
    nodes = [
        helper.make_node("Add", ["s_in", "e"], ["s_out"]),
        helper.make_node("Identity", ["s_out"], ["y"]),
    ]
    scan_body = body(
        "b",
        nodes,
        [vi("s_in", elem, [2]), vi("e", elem, [2])],
        [vi("s_out", elem, [2]), vi("y", elem, [2])],
    )
    node_outputs = {"more_body_outputs": ["f"], "fewer_body_outputs": ["f", "ys", "zs"]}
    scan = helper.make_node(
        "Scan",
        ["s0", "xs"],
        node_outputs.get(case, ["f", "ys"]),
        name="scan",
        body=scan_body,
        num_scan_inputs=1,
    )
    return make_model([scan], [vi("s0", F32, [2]), vi("xs", F32, [3, 2])], [vi("f", F32, [2])])


SIGNATURES = {
    "if_more_branch_outputs": (_if_signature, r"then_branch gives 2 outputs .*node has 1"),
    "if_fewer_branch_outputs": (_if_signature, r"then_branch gives 1 outputs .*node has 2"),
    "if_branch_types": (_if_signature, r"output 0 .*float\) in then_branch .*double\) in else_b"),
    "if_branch_inputs": (_if_signature, r"then_branch takes 1 inputs; it must take none"),
    "loop_more_body_outputs": (_loop_signature, r"body gives 3 outputs .*node has 1"),
    "loop_fewer_body_outputs": (_loop_signature, r"body gives 3 outputs .*node has 3"),
    "loop_iteration_type": (_loop_signature, r"body input 'i' is declared tensor\(int32\).*int64"),
    "loop_condition_type": (
        _loop_signature,
        r"body input 'c_in' is declared tensor\(float\).*bool",
    ),
    "loop_carried_type": (_loop_signature, r"body input 's_in' is declared tensor\(int64\).*float"),
    "scan_more_body_outputs": (_scan_signature, r"body gives 2 outputs .*node has 1"),
    "scan_fewer_body_outputs": (_scan_signature, r"body gives 2 outputs .*node has 3"),
    "scan_scan_input_type": (
        _scan_signature,
        r"body input 's_in' is declared tensor\(int64\).*float",
    ),
}


@pytest.mark.parametrize("case", sorted(SIGNATURES))
def test_a_body_that_does_not_fit_its_node_is_refused_as_in_onnxruntime(case: str) -> None:
    build, pattern = SIGNATURES[case]
    model = build(case.split("_", 1)[1])
    feeds = {"x": np.ones(2, np.float32), "s0": np.ones(2, np.float32)}
    feeds["xs"] = np.ones((3, 2), np.float32)
    names = {i.name for i in model.graph.input}
    feeds = {k: v for k, v in feeds.items() if k in names}
    with pytest.raises(Exception, match=r"Type|type|outputs|inputs"):  # onnxruntime's own types
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    node = model.graph.node[-1]
    with pytest.raises(ValueError, match=rf"node '{node.name}' \(ai\.onnx\.{node.op_type}\): "):
        backend.prepare(model).run(feeds)
    with pytest.raises(ValueError, match=pattern):
        backend.prepare(model).run(feeds)


def _negating_body(s_out_type: int = F32) -> Any:
    """A Loop body: s = -s, the condition passed on; s_out declared ``s_out_type``."""
    nodes = [
        helper.make_node("Identity", ["c_in"], ["c_out"]),
        helper.make_node("Neg", ["s_in"], ["s_out"]),
    ]
    return body(
        "b",
        nodes,
        [vi("i", I64, []), vi("c_in", BOOL, []), vi("s_in", F32, [2])],
        [vi("c_out", BOOL, []), vi("s_out", s_out_type, [2])],
    )


def _loop_fed_condition(cond_shape: list[int]) -> Any:
    """s = -s, M times, the condition fed: the body declares it a scalar."""
    loop = helper.make_node("Loop", ["M", "c", "s0"], ["f"], name="loop", body=_negating_body())
    return make_model(
        [loop],
        [vi("M", I64, []), vi("c", BOOL, cond_shape), vi("s0", F32, [2])],
        [vi("f", F32, [2])],
    )


def _scan_declaring(element: list[int]) -> Any:
    """A running sum over xs [3, 2] whose body declares its scan input ``element``."""
    nodes = [
        helper.make_node("Add", ["s_in", "e"], ["s_out"]),
        helper.make_node("Identity", ["s_out"], ["y"]),
    ]
    scan_body = body(
        "b",
        nodes,
        [vi("s_in", F32, [2]), vi("e", F32, element)],
        [vi("s_out", F32, [2]), vi("y", F32, [2])],
    )
    scan = helper.make_node(
        "Scan", ["s0", "xs"], ["f", "ys"], name="scan", body=scan_body, num_scan_inputs=1
    )
    return make_model([scan], [vi("s0", F32, [2]), vi("xs", F32, [3, 2])], [vi("f", F32, [2])])


@pytest.mark.parametrize(
    ("model", "feeds", "pattern"),
    [
        (
            _loop_fed_condition([1]),
            {"M": np.array(2, np.int64), "c": np.array([True]), "s0": np.ones(2, np.float32)},
            r"node 'loop' .*body input 'c_in' is declared of shape \[\] but is given \[1\]",
        ),
        (
            _scan_declaring([2, 1]),
            {"s0": np.ones(2, np.float32), "xs": np.ones((3, 2), np.float32)},
            r"node 'scan' .*body input 'e' is declared of shape \[2, 1\] but is given \[2\]",
        ),
    ],
    ids=["loop_condition_rank", "scan_input_rank"],
)
def test_a_body_declaring_another_rank_than_given_is_refused_as_in_onnxruntime(
    model: Any, feeds: dict[str, np.ndarray], pattern: str
) -> None:
    with pytest.raises(Exception, match=r"ShapeInferenceError"):  # onnxruntime's own types
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(ValueError, match=pattern):
        backend.prepare(model).run(feeds)
    # the same models declaring no shapes run
    for graph in (a.g for n in model.graph.node for a in n.attribute):
        for value in graph.input:
            value.type.tensor_type.ClearField("shape")
    backend.prepare(model).run(feeds)


def _declaring_int64_output(op: str) -> tuple[Any, dict[str, np.ndarray]]:
    """A node whose subgraph declares its float output int64 (the outer output is float)."""
    x = np.ones(2, np.float32)
    if op == "If":
        then_branch = body("t", [helper.make_node("Neg", ["x"], ["a"])], [], [vi("a", I64, [2])])
        else_branch = body("e", [helper.make_node("Abs", ["x"], ["b"])], [], [vi("b", I64, [2])])
        node = helper.make_node(
            "If", ["c"], ["y"], name="if", then_branch=then_branch, else_branch=else_branch
        )
        inputs = [vi("c", BOOL, []), vi("x", F32, [2])]
        return make_model([node], inputs, [vi("y", F32, [2])]), {"c": np.array(True), "x": x}
    if op == "Loop":
        loop_body = _negating_body(I64)
        node = helper.make_node("Loop", ["M", "", "s0"], ["f"], name="loop", body=loop_body)
        inputs = [vi("M", I64, []), vi("s0", F32, [2])]
        return make_model([node], inputs, [vi("f", F32, [2])]), {"M": np.array(2), "s0": x}
    nodes = [
        helper.make_node("Add", ["s_in", "e"], ["s_out"]),
        helper.make_node("Identity", ["s_out"], ["y"]),
    ]
    scan_body = body(
        "b",
        nodes,
        [vi("s_in", F32, [2]), vi("e", F32, [2])],
        [vi("s_out", F32, [2]), vi("y", I64, [2])],
    )
    node = helper.make_node(
        "Scan", ["s0", "xs"], ["f", "ys"], name="scan", body=scan_body, num_scan_inputs=1
    )
    inputs = [vi("s0", F32, [2]), vi("xs", F32, [3, 2])]
    return make_model([node], inputs, [vi("f", F32, [2])]), {
        "s0": x,
        "xs": np.ones((3, 2), np.float32),
    }


@pytest.mark.parametrize("op", ["If", "Loop", "Scan"])
def test_a_body_computing_another_type_than_it_declares_is_refused_as_in_onnxruntime(
    op: str,
) -> None:
    model, feeds = _declaring_int64_output(op)
    with pytest.raises(Exception, match=r"does not match|Mismatched|mismatch"):  # its own types
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    node = model.graph.node[0].name
    pattern = rf"node '{node}' .*output '\w+' is declared int64 but computes float\b"
    with pytest.raises(ValueError, match=pattern):
        backend.prepare(model).run(feeds)


def test_a_loop_body_giving_its_condition_as_one_element_runs_as_in_onnxruntime() -> None:
    """onnxruntime reads a body's condition output of shape [1] as its one bool."""
    nodes = [
        helper.make_node("Constant", [], ["ax"], value=numpy_helper.from_array(np.array([0]))),
        helper.make_node("ReduceSum", ["s_in"], ["total"], keepdims=0),
        helper.make_node("Less", ["total", "limit"], ["below"]),
        helper.make_node("Unsqueeze", ["below", "ax"], ["c_out"]),
        helper.make_node("Add", ["s_in", "s_in"], ["s_out"]),
    ]
    loop_body = body(
        "b",
        nodes,
        [vi("i", I64, []), vi("c_in", BOOL, []), vi("s_in", F32, [2])],
        [vi("c_out", BOOL, [1]), vi("s_out", F32, [2])],
    )
    loop = helper.make_node("Loop", ["M", "c", "s0"], ["f"], name="loop", body=loop_body)
    model = make_model(
        [loop],
        [vi("M", I64, []), vi("c", BOOL, []), vi("s0", F32, [2])],
        [vi("f", F32, [2])],
        {"limit": np.array(40, np.float32)},
    )
    feeds = {"M": np.array(10), "c": np.array(True), "s0": np.array([1.0, 2.0], np.float32)}
    (f,) = assert_as_onnxruntime(model, feeds)
    assert f.sum() > 40


def test_a_body_input_naming_its_own_initializer_is_no_input_of_the_node() -> None:
    """A subgraph input that is also its initializer (IR 3 style) is a default, as
    onnxruntime reads it: the body still fits a Scan of one state and one scan input."""
    nodes = [
        helper.make_node("Add", ["s_in", "e"], ["t"]),
        helper.make_node("Mul", ["t", "k"], ["s_out"]),
        helper.make_node("Identity", ["s_out"], ["y"]),
    ]
    scan_body = helper.make_graph(
        nodes,
        "b",
        [vi("s_in", F32, [2]), vi("e", F32, [2]), vi("k", F32, [])],
        [vi("s_out", F32, [2]), vi("y", F32, [2])],
        initializer=[numpy_helper.from_array(np.array(0.5, np.float32), "k")],
    )
    scan = helper.make_node(
        "Scan", ["s0", "xs"], ["f", "ys"], name="scan", body=scan_body, num_scan_inputs=1
    )
    model = make_model(
        [scan],
        [vi("s0", F32, [2]), vi("xs", F32, [3, 2])],
        [vi("f", F32, [2]), vi("ys", F32, [3, 2])],
    )
    feeds = {"s0": np.ones(2, np.float32), "xs": np.arange(6, dtype=np.float32).reshape(3, 2)}
    assert_as_onnxruntime(model, feeds)


def test_a_body_declaring_the_sizes_it_was_exported_with_runs_on_others() -> None:
    """A Loop body declaring its carried value [3] runs on the [5] a symbolic graph input
    is fed, as in onnxruntime (which can compare the sizes only where they are known
    while it loads the model, and warns); the rank is still checked."""
    nodes = [
        helper.make_node("Identity", ["c_in"], ["c_out"]),
        helper.make_node("Neg", ["v"], ["w"]),
    ]
    loop_body = body(
        "b",
        nodes,
        [vi("i", I64, []), vi("c_in", BOOL, []), vi("v", F32, [3])],
        [vi("c_out", BOOL, []), vi("w", F32, [3])],
    )
    loop = helper.make_node("Loop", ["M", "", "x"], ["y"], name="loop", body=loop_body)
    model = make_model([loop], [vi("M", I64, []), vi("x", F32, ["N"])], [vi("y", F32, ["N"])])
    feeds = {"M": np.array(1, np.int64), "x": np.arange(5, dtype=np.float32)}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, feeds)
    (got,) = backend.prepare(model).run(feeds)
    np.testing.assert_array_equal(got, want)
