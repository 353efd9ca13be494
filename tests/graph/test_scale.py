"""Work that grows with a graph grows linearly: counted, not timed.

``benchmarks/graph_scale.py`` times chains of up to 100,000 nodes, nested
Gradients and thousands of training_info entries; these tests count the work
behind those times on small sizes (node runs while tracing, op calls, XLA
compiles, main-graph nodes indexed), so a return of repeated or multiplied work
fails here. Each fails on a1b1782 (checked there): prepare and the first run
traced the graph twice, every node called its op, Relu lowered to a call XLA
had to inline, nested Gradients were neither counted nor refused (2,000 levels
raised RecursionError), and each training_info entry indexed the whole main
graph, was traced five times and compiled on its own.

Each dimension of a graph (inputs, outputs, initializers, value_info, nodes, node
inputs, subgraphs, Gemms to batch, Gradients to fuse) is read in work linear in its
size: counted as the hashes and comparisons of names (``_Name``), which a list or
tuple membership test per element makes quadratic. Errors about many names say how
many and name the first few. A Gradient's chain is refused past
``Limits.gradient_depth`` before anything is traced, and its backward is cut into
fusions of a bounded depth (20,000 Sin ended the process in XLA).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import backend, training  # noqa: E402
from onnx_optax._src import graph as graph_module  # noqa: E402
from onnx_optax._src.graph import steps as step_module  # noqa: E402
from onnx_optax._src.ops import REGISTRY  # noqa: E402

DOMAIN = "ai.onnx.preview.training"
F32, I64 = TensorProto.FLOAT, TensorProto.INT64
SHAPE = [4]
X = np.full(SHAPE, 0.5, np.float32)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any]) -> Any:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)],
        ir_version=8,
    )


def chain(n: int) -> onnx.ModelProto:
    """Add, Mul, Relu alternating, ``n`` nodes, on a 4-element tensor."""
    nodes, h = [], "x"
    for i in range(n):
        op = ("Add", "Mul", "Relu")[i % 3]
        inputs = [h] if op == "Relu" else [h, "w_add" if op == "Add" else "w_mul"]
        nodes.append(helper.make_node(op, inputs, [f"h{i}"]))
        h = f"h{i}"
    inits = [
        numpy_helper.from_array(np.full(SHAPE, 0.1, np.float32), "w_add"),
        numpy_helper.from_array(np.full(SHAPE, 0.9, np.float32), "w_mul"),
    ]
    vi = helper.make_tensor_value_info
    return _model(nodes, [vi("x", F32, SHAPE)], [vi(h, F32, SHAPE)], inits)


def nested(depth: int) -> onnx.ModelProto:
    """A Gradient of a Gradient ... ``depth`` deep of sin(x) * w, with respect to x."""
    nodes = [helper.make_node("Sin", ["x"], ["s"]), helper.make_node("Mul", ["s", "w"], ["g0"])]
    for level in range(1, depth + 1):
        nodes.append(
            helper.make_node(
                "Gradient", ["x"], [f"g{level}"], domain=DOMAIN, xs=["x"], y=f"g{level - 1}"
            )
        )
    vi = helper.make_tensor_value_info
    w = numpy_helper.from_array(np.full(SHAPE, 0.5, np.float32), "w")
    return _model(nodes, [vi("x", F32, SHAPE)], [vi(f"g{depth}", F32, SHAPE)], [w])


def entries(n: int, main_nodes: int = 0) -> onnx.ModelProto:
    """A model whose training_info holds ``n`` entries, each counting its own T.

    The main graph is a chain of ``main_nodes`` nodes that no entry reads.
    """
    model = chain(max(main_nodes, 1))
    model.graph.initializer.extend(
        [numpy_helper.from_array(np.asarray(0, np.int64), f"T{i}") for i in range(n)]
        + [numpy_helper.from_array(np.asarray(1, np.int64), "one")]
    )
    for i in range(n):
        algorithm = helper.make_graph(
            [helper.make_node("Add", [f"T{i}", "one"], [f"T{i}.next"], name=f"count{i}")],
            f"count{i}",
            [],
            [helper.make_tensor_value_info(f"T{i}.next", I64, [])],
        )
        model.training_info.append(
            helper.make_training_info(algorithm, [(f"T{i}", f"T{i}.next")], None, None)
        )
    return model


@pytest.fixture
def node_runs(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """How many times each node ran (while tracing, or eagerly), by node name or op type."""
    counts: collections.Counter[str] = collections.Counter()
    for cls in (step_module.StandardStep, step_module.GradientStep):
        original = cls.run

        def run(self: Any, env: Any, original: Any = original) -> None:
            counts[self.node.name or self.node.op_type] += 1
            original(self, env)

        monkeypatch.setattr(cls, "run", run)
    return counts


@pytest.fixture
def compiles() -> Iterator[list[str]]:
    """The XLA compilations made while the test runs."""
    events: list[str] = []

    def listener(event: str, duration: float, **kwargs: Any) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    yield events
    jax.monitoring.unregister_event_duration_listener(listener)


# ----------------------------------------------------------------------------- the runtime


def test_prepare_and_the_first_run_trace_the_graph_once(
    node_runs: collections.Counter[str],
) -> None:
    rep = backend.prepare(chain(30))  # traces on the declared shapes, to fail early
    rep.run([X])
    rep.run([X])
    assert sum(node_runs.values()) == 30


def test_a_repeated_op_call_is_traced_once_and_replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: collections.Counter[str] = collections.Counter()
    for name in ("Add", "Mul", "Relu"):
        op = REGISTRY[""][name]

        def fn(node: Any, *args: Any, op: Any = op, name: str = name) -> Any:
            calls[name] += 1
            return op.fn(node, *args)

        monkeypatch.setitem(REGISTRY[""], name, dataclasses.replace(op, fn=fn))
    model = chain(300)
    got = backend.prepare(model).run([X])[0]
    # Each op: called on its first node, traced on its second, replayed on the other 98.
    assert max(calls.values()) <= 2, calls
    h = X
    for i in range(300):
        h = (h + np.float32(0.1), h * np.float32(0.9), np.maximum(h, 0))[i % 3]
    np.testing.assert_allclose(got, h, rtol=1e-5)


@pytest.mark.parametrize("bad", [0, 2, 5])
def test_a_replayed_op_still_checks_its_indices_in_its_own_name(bad: int) -> None:
    """Gather checks its indices at run time: each of six alike nodes, replay or not,
    must report an index out of range under its own name."""
    nodes, inputs = [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])]
    previous = "x"
    for k in range(6):
        inputs.append(helper.make_tensor_value_info(f"i{k}", TensorProto.INT64, [3]))
        nodes += [
            helper.make_node("Gather", [previous, f"i{k}"], [f"g{k}"], name=f"gather{k}"),
            helper.make_node("Add", [f"g{k}", "x"], [f"a{k}"], name=f"add{k}"),
        ]
        previous = f"a{k}"
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [3])]
    )
    rep = backend.prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    feeds = {"x": np.ones(3, np.float32), **{f"i{k}": np.arange(3) for k in range(6)}}
    np.testing.assert_array_equal(rep.run(feeds)[0], [7.0, 7.0, 7.0])
    feeds[f"i{bad}"] = np.array([0, 7, 1])
    with pytest.raises(ValueError, match=rf"'gather{bad}'.*hold 7, outside \[-3, 3\)"):
        rep.run(feeds)


def test_compiled_graphs_reach_xla_without_calls() -> None:
    """Relu's custom_jvp wraps a jit: one MLIR call per node, which XLA inlined one by one."""

    def f(x: jax.Array) -> jax.Array:
        for _ in range(5):
            x = jax.nn.relu(x) + jnp.linalg.norm(x)
        return x

    assert "call @" in jax.jit(f).lower(X).as_text()
    flat = jax.jit(graph_module.flattened(f))
    assert "call @" not in flat.lower(X).as_text()
    np.testing.assert_allclose(flat(X), jax.jit(f)(X), rtol=1e-6)


def test_a_relu_inside_a_gradient_keeps_its_derivative_at_zero() -> None:
    """Replayed and flattened traces keep custom derivative rules where they are needed."""
    nodes = [helper.make_node("Relu", ["x"], [f"r{i}"]) for i in range(4)]
    nodes.append(helper.make_node("Sum", [f"r{i}" for i in range(4)], ["y"]))
    nodes.append(helper.make_node("Gradient", ["x"], ["g"], domain=DOMAIN, xs=["x"], y="y"))
    vi = helper.make_tensor_value_info
    model = _model(nodes, [vi("x", F32, SHAPE)], [vi("g", F32, SHAPE)], [])
    (g,) = backend.prepare(model).run([np.asarray([-1.0, 0.0, 0.0, 2.0], np.float32)])
    np.testing.assert_array_equal(g, [0.0, 0.0, 0.0, 4.0])  # jax.nn.relu'(0) = 0


def test_the_traced_work_limit_counts_node_runs() -> None:
    limits = backend.Limits(traced_nodes=50)
    assert backend.prepare(chain(50), limits=limits).graph.work == 50
    with pytest.raises(ValueError, match=r"runs 51 nodes.*limit of 50.*traced_nodes=\.\.\."):
        backend.prepare(chain(51), limits=limits)


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_nested_gradient_work_bounds_the_traced_equations(depth: int) -> None:
    """Each level of Gradient counts 3x its inside: an upper bound on what JAX traces."""
    rep = backend.prepare(nested(depth))
    expected = 2  # Sin, Mul
    for _ in range(depth):
        expected = 1 + 3 * expected
    assert rep.graph.work == expected
    jaxpr = jax.make_jaxpr(rep.graph.apply)({"x": X})

    def equations(jaxpr: Any) -> int:
        return sum(
            1 + sum(equations(sub) for sub in jax.extend.core.jaxprs_in_params(e.params))
            for e in jaxpr.eqns
        )

    assert equations(jaxpr.jaxpr) <= 3 * rep.graph.work  # <= 3 equations a node (Mul: 1)


def test_nested_gradients_past_the_limit_are_refused_before_tracing(
    node_runs: collections.Counter[str],
) -> None:
    """13 levels of a 2-node function trace over 3**13 nodes: refused by the limit, untraced."""
    with pytest.raises(ValueError, match=r"Gradient.*more than the limit of 1000000.*traced_nodes"):
        backend.prepare(nested(13))
    assert not node_runs
    # Raised, it runs (3**12 * 2 node runs are within a limit of 2 million).
    limits = backend.Limits(traced_nodes=2_000_000)
    assert backend.prepare(nested(12), limits=limits).graph.work > 1_000_000


def test_deeply_nested_gradients_are_refused_not_a_recursion_error() -> None:
    with pytest.raises(ValueError, match=r"Gradients nested in its y.*traced_nodes"):
        backend.prepare(nested(2000))


# ----------------------------------------------------------------------------- training


def test_training_entries_compile_once(compiles: list[str]) -> None:
    session = training.Session(entries(20))
    compiles.clear()  # JAX's own, when the state is put on the device
    for _ in range(3):
        session.step({"x": X})
    assert session.initializers["T7"] == 3
    assert len(compiles) == 1  # one step function for all 20 entries


def test_each_training_entry_is_traced_a_bounded_number_of_times(
    node_runs: collections.Counter[str],
) -> None:
    session = training.Session(entries(20))  # check traces each algorithm on declared shapes
    session.step({"x": X})
    session.step({"x": X})
    counts = [node_runs[f"count{i}"] for i in range(20)]
    assert max(counts) <= 2, counts  # check's trace, the step's trace
    assert sum(node_runs[op] for op in ("Add", "Mul", "Relu")) == 0  # the main graph is unread


def test_training_entries_index_the_main_graph_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each entry's graph holds what it reads, not a copy of the whole main graph."""
    indexed: list[int] = []
    original = graph_module.GraphFunction.__init__

    def init(self: Any, graph: Any, **kwargs: Any) -> None:
        indexed.append(len(graph.node))
        original(self, graph, **kwargs)

    monkeypatch.setattr(graph_module.GraphFunction, "__init__", init)
    model = entries(20, main_nodes=200)
    assert not training.check(model)
    session = training.Session(model)
    session.step({"x": X})
    assert sum(indexed) <= 2 * 20  # check builds each entry once (1 node), Session reuses them


def test_an_entry_reads_what_its_outputs_name_directly() -> None:
    """An entry takes only the bound initializers it reads, outputs named as they are included."""
    model = entries(1)
    w = numpy_helper.from_array(np.ones(SHAPE, np.float32), "W")
    model.graph.initializer.append(w)
    info = model.training_info[0]
    info.algorithm.output.append(helper.make_tensor_value_info("W", F32, SHAPE))
    info.update_binding.append(onnx.StringStringEntryProto(key="W", value="W"))
    assert not training.check(model)
    session = training.Session(model)
    session.step({"x": X})
    assert session.initializers["T0"] == 1
    np.testing.assert_array_equal(session.initializers["W"], np.ones(SHAPE, np.float32))


# ----------------------------------------------------------------------------- each dimension


class _Name(str):
    """A tensor name that counts the work done with it: each hash and each comparison.

    A set or dict looks a name up in about one of each; a list or tuple membership
    test compares it with the elements in turn, so a test per element of a model's
    dimension counts the square of its size.
    """

    work = 0

    def __eq__(self, other: object) -> bool:
        _Name.work += 1
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        _Name.work += 1
        return str.__ne__(self, other)

    def __hash__(self) -> int:
        _Name.work += 1
        return str.__hash__(self)


class _Counted:
    """A graph proto, or one of its values or nodes, read with counting names (``_Name``).

    Everything else (types, attributes, tensors) is the proto's own.
    """

    def __init__(self, proto: Any) -> None:
        self._proto = proto

    def __getattr__(self, field: str) -> Any:
        value = getattr(self._proto, field)
        if field == "name":
            return _Name(value)
        if field in ("input", "output", "value_info", "node"):
            return [_Name(v) if isinstance(v, str) else _Counted(v) for v in value]
        return value


def _graph(dimension: str, n: int) -> Any:
    """A small graph with ``n`` of one dimension: inputs, outputs, initializers, ..."""
    vi = helper.make_tensor_value_info
    inputs, outputs = [vi("x", F32, SHAPE)], [vi("y", F32, SHAPE)]
    nodes, inits, value_info = [helper.make_node("Neg", ["x"], ["y"])], [], []
    w = [numpy_helper.from_array(np.ones(SHAPE, np.float32), f"w{i}") for i in range(n)]
    if dimension == "inputs":
        inputs += [vi(f"u{i}", F32, [1]) for i in range(n)]
    elif dimension == "outputs":
        nodes += [helper.make_node("Neg", ["x"], [f"o{i}"]) for i in range(n)]
        outputs += [vi(f"o{i}", F32, SHAPE) for i in range(n)]
    elif dimension == "initializers":  # read by nodes, and unread
        inits = w
        nodes += [helper.make_node("Add", ["x", f"w{i}"], [f"o{i}"]) for i in range(0, n, 2)]
        outputs += [vi(f"o{i}", F32, SHAPE) for i in range(0, n, 2)]
    elif dimension == "initializer inputs":  # graph inputs that are also initializers
        inits = w
        inputs += [vi(f"w{i}", F32, SHAPE) for i in range(n)]
    elif dimension == "value_info":
        value_info = [vi(f"v{i}", F32, SHAPE) for i in range(n)]
    elif dimension == "nodes":
        nodes = [
            helper.make_node("Neg", ["x" if i == 0 else f"h{i - 1}"], [f"h{i}"]) for i in range(n)
        ]
        nodes.append(helper.make_node("Neg", [f"h{n - 1}"], ["y"]))
    elif dimension == "unread nodes":
        nodes += [helper.make_node("Neg", ["x"], [f"d{i}"]) for i in range(n)]
    elif dimension == "node inputs":
        nodes = [helper.make_node("Sum", ["x"] * n, ["y"])]
    elif dimension == "Gemm pairs":  # each pair of one B: batched into one product
        inputs += [vi("a", F32, [1, 4])]
        inits = [numpy_helper.from_array(np.ones((4, 4), np.float32), f"b{i}") for i in range(n)]
        for i in range(n):
            nodes += [helper.make_node("Gemm", [a, f"b{i}"], [f"{a}{i}"]) for a in ("x", "a")]
            outputs += [vi(f"{a}{i}", F32, [1, 4]) for a in ("x", "a")]
        inputs[0] = vi("x", F32, [1, 4])
        nodes[0], outputs[0] = helper.make_node("Neg", ["a"], ["y"]), vi("y", F32, [1, 4])
    elif dimension == "Gradients":  # each fused with the Sin it differentiates
        for i in range(n):
            nodes.append(helper.make_node("Sin", ["x"], [f"s{i}"]))
            nodes.append(
                helper.make_node("Gradient", ["x"], [f"g{i}"], domain=DOMAIN, xs=["x"], y=f"s{i}")
            )
            outputs += [vi(f"s{i}", F32, SHAPE), vi(f"g{i}", F32, SHAPE)]
    elif dimension == "subgraphs":  # If nodes, each branch reading x from around it
        inits = [numpy_helper.from_array(np.asarray(True), "c")]
        for i in range(n):
            branches = {
                f"{branch}_branch": helper.make_graph(
                    [helper.make_node(op, ["x"], [f"{branch}{i}"])],
                    f"{branch}{i}",
                    [],
                    [vi(f"{branch}{i}", F32, SHAPE)],
                )
                for branch, op in (("then", "Neg"), ("else", "Abs"))
            }
            nodes.append(helper.make_node("If", ["c"], [f"o{i}"], **branches))
        outputs += [vi(f"o{i}", F32, SHAPE) for i in range(n)]
    return helper.make_graph(nodes, "g", inputs, outputs, inits, value_info=value_info)


def _work(dimension: str, n: int) -> int:
    graph = _Counted(_graph(dimension, n))
    _Name.work = 0
    graph_module.GraphFunction(graph, check_shapes=False)
    return _Name.work


@pytest.mark.parametrize(
    "dimension",
    [
        "inputs",
        "outputs",
        "initializers",
        "initializer inputs",
        "value_info",
        "nodes",
        "unread nodes",
        "node inputs",
        "subgraphs",
        "Gemm pairs",
        "Gradients",
    ],
)
def test_a_graph_is_read_in_work_linear_in_each_dimension(dimension: str) -> None:
    """Twice the inputs (outputs, ...) take about twice the hashes and comparisons of
    names, not four times. Each graph input was looked up in the tuple of all of them
    (10**6 inputs: an hour of prepare); each node with subgraphs copied every name of
    its graph into their scope; each pair of Gemms to batch, and each Gradient to fuse,
    looked over every step of the graph."""
    small, large = _work(dimension, 500), _work(dimension, 1000)
    assert large <= 2.3 * small, (small, large)
    if dimension in ("Gemm pairs", "Gradients"):  # still each pair one product, each fused
        function = graph_module.GraphFunction(_graph(dimension, 1000), check_shapes=False)
        assert len(function.schedule) == 1 + 1000


def _inputs_model(n: int) -> onnx.ModelProto:
    """x and ``n`` more inputs of unknown size (prepare traces nothing)."""
    vi = helper.make_tensor_value_info
    inputs = [vi("x", F32, SHAPE)] + [vi(f"u{i}", F32, ["N"]) for i in range(n)]
    nodes = [helper.make_node("Neg", ["x"], ["y"])]
    return _model(nodes, inputs, [vi("y", F32, SHAPE)], [])


def test_feeds_are_checked_in_work_linear_in_their_number() -> None:
    """Each unknown feed was looked up in the tuple of the graph's inputs."""

    def work(n: int) -> int:
        rep = backend.prepare(_inputs_model(n))
        feeds: dict[str, Any] = {_Name(f"u{i}"): X for i in range(n)}
        feeds.update({_Name(f"q{i}"): X for i in range(n)})
        feeds[_Name("x")] = X
        _Name.work = 0
        with pytest.raises(ValueError, match=r"unknown input\(s\)"):
            rep.run(feeds)
        return _Name.work

    small, large = work(1000), work(2000)
    assert large <= 2.3 * small, (small, large)


def test_errors_about_many_inputs_say_how_many_and_name_a_few() -> None:
    """A run missing 20,000 inputs said every name, twice (the 1.9 MB message of 10**6)."""
    rep = backend.prepare(_inputs_model(20_000))
    with pytest.raises(ValueError) as missing:
        rep.run({"x": X})
    message = str(missing.value)
    assert len(message) < 400, len(message)
    assert "missing input(s) 20,000 names, the first 5: ['u0', 'u1', 'u2', 'u3', 'u4']" in message
    assert "the graph takes 20,001 names, the first 5: ['x', 'u0'," in message
    with pytest.raises(ValueError) as unknown:
        rep.run({**{f"u{i}": X for i in range(20_000)}, "x": X, **{f"q{i}": X for i in range(9)}})
    message = str(unknown.value)
    assert len(message) < 400, len(message)
    assert "unknown input(s) 9 names, the first 5: ['q0', 'q1', 'q2', 'q3', 'q4']" in message
    with pytest.raises(ValueError) as count:
        rep.run([X] * 3)
    assert len(str(count.value)) < 400


# ----------------------------------------------------------------------------- deep chains


def sin_gradient(n: int) -> onnx.ModelProto:
    """The gradient of a chain of ``n`` Sin nodes, with respect to its input."""
    nodes = [helper.make_node("Sin", ["x" if i == 0 else f"s{i - 1}"], [f"s{i}"]) for i in range(n)]
    nodes.append(helper.make_node("Gradient", ["x"], ["g"], domain=DOMAIN, xs=["x"], y=f"s{n - 1}"))
    vi = helper.make_tensor_value_info
    return _model(nodes, [vi("x", F32, SHAPE)], [vi("g", F32, SHAPE)], [])


def _sin_chain_derivative(n: int) -> np.ndarray:
    h, g = X.astype(np.float64), np.ones(SHAPE)
    for _ in range(n):
        g, h = g * np.cos(h), np.sin(h)
    return g


def test_a_backward_pass_is_cut_into_fusions_of_bounded_depth() -> None:
    """XLA fused a backward chain whole: 1,250 Sin failed to compile, 20,000 crashed."""
    from onnx_optax._src.graph.remat import BARRIER_DEPTH

    rep = backend.prepare(sin_gradient(100))
    jaxpr = jax.make_jaxpr(rep.graph.apply)({"x": X})
    names = [e.primitive.name for e in jaxpr.jaxpr.eqns]
    assert names.count("optimization_barrier") >= 2 * (100 // BARRIER_DEPTH), names
    np.testing.assert_allclose(rep.run([X])[0], _sin_chain_derivative(100), rtol=1e-4)


def test_a_gradient_past_the_depth_limit_is_refused_before_tracing(
    node_runs: collections.Counter[str],
) -> None:
    limits = backend.Limits(gradient_depth=40)
    got = backend.prepare(sin_gradient(40), limits=limits).run([X])[0]
    np.testing.assert_allclose(got, _sin_chain_derivative(40), rtol=1e-5)
    node_runs.clear()
    message = r"Gradient.*41 nodes, more than the limit of 40.*Limits\(gradient_depth=\.\.\.\)"
    with pytest.raises(ValueError, match=message):
        backend.prepare(sin_gradient(41), limits=limits)
    default = backend.Limits().gradient_depth
    with pytest.raises(ValueError, match=rf"{default + 1} nodes, more than the limit of {default}"):
        backend.prepare(sin_gradient(default + 1))
    assert not node_runs


def test_a_nested_gradient_counts_its_forward_and_backward_in_the_depth() -> None:
    """A Gradient of a Gradient of 10 Sin: the inner one's chain is 10 deep, traced twice."""
    nodes = [
        helper.make_node("Sin", ["x" if i == 0 else f"s{i - 1}"], [f"s{i}"]) for i in range(10)
    ]
    nodes.append(helper.make_node("Gradient", ["x"], ["g1"], domain=DOMAIN, xs=["x"], y="s9"))
    nodes.append(helper.make_node("Gradient", ["x"], ["g2"], domain=DOMAIN, xs=["x"], y="g1"))
    vi = helper.make_tensor_value_info
    model = _model(nodes, [vi("x", F32, SHAPE)], [vi("g2", F32, SHAPE)], [])
    backend.prepare(model, limits=backend.Limits(gradient_depth=20))
    with pytest.raises(ValueError, match=r"holds 20 nodes, more than the limit of 19"):
        backend.prepare(model, limits=backend.Limits(gradient_depth=19))


def test_attach_errors_about_many_names_say_how_many_and_name_a_few() -> None:
    """trainable= naming 10,000 unknown tensors, a model of 10,000 outputs: each error
    listed them all."""
    import onnx_optax

    optimizer = onnx_optax.adagrad(0.1)
    with pytest.raises(ValueError) as unknown:
        training.attach(
            chain(3), loss="mse", optimizer=optimizer, trainable=[f"q{i}" for i in range(10_000)]
        )
    assert "trainable ['q0', 'q1'" not in str(unknown.value)
    assert "10,000 names, the first 5: ['q0', 'q1', 'q2', 'q3', 'q4']" in str(unknown.value)
    assert len(str(unknown.value)) < 1000
    model = chain(3)
    vi = helper.make_tensor_value_info
    model.graph.node.extend(helper.make_node("Neg", ["x"], [f"o{i}"]) for i in range(10_000))
    model.graph.output.extend(vi(f"o{i}", F32, SHAPE) for i in range(10_000))
    for output in (None, "nowhere"):
        with pytest.raises(ValueError) as outputs:
            training.attach(model, loss="mse", optimizer=optimizer, output=output)
        assert "and 9,996 more" in str(outputs.value)
        assert len(str(outputs.value)) < 1000


def test_a_subgraph_runs_on_what_it_reads_not_a_copy_of_every_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each If's branch copied every value of the graph around it when it ran."""
    held: list[int] = []
    original = step_module.StandardStep.run

    def run(self: Any, env: Any) -> None:
        if self.node.name.startswith("branch"):
            held.append(len(env))
        original(self, env)

    monkeypatch.setattr(step_module.StandardStep, "run", run)

    def values(n: int) -> int:
        vi = helper.make_tensor_value_info
        nodes, h = [], "x"
        for i in range(n):
            branches = {
                f"{b}_branch": helper.make_graph(
                    [helper.make_node(op, [h], [f"{b}{i}"], name=f"branch{b}{i}")],
                    f"{b}{i}",
                    [],
                    [vi(f"{b}{i}", F32, SHAPE)],
                )
                for b, op in (("then", "Neg"), ("else", "Abs"))
            }
            nodes.append(helper.make_node("If", ["c"], [f"o{i}"], **branches))
            h = f"o{i}"
        inits = [numpy_helper.from_array(np.asarray(True), "c")]
        model = _model(nodes, [vi("x", F32, SHAPE)], [vi(h, F32, SHAPE)], inits)
        held.clear()
        got = backend.prepare(model).run([X])[0]
        np.testing.assert_array_equal(got, X * (-1) ** n)
        return sum(held)

    small, large = values(100), values(200)
    assert large <= 2.3 * small, (small, large)


def test_a_gradient_counts_the_chains_inside_the_subgraphs_it_differentiates() -> None:
    """An If whose branch is a chain of 30 Sin: 31 deep for a Gradient around it."""
    vi = helper.make_tensor_value_info
    chain_nodes = [
        helper.make_node("Sin", ["x" if i == 0 else f"s{i - 1}"], [f"s{i}"]) for i in range(30)
    ]
    then = helper.make_graph(chain_nodes, "then", [], [vi("s29", F32, SHAPE)])
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", F32, SHAPE)]
    )
    nodes = [
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
        helper.make_node("Gradient", ["x", "c"], ["g"], domain=DOMAIN, xs=["x"], zs=["c"], y="y"),
    ]
    inputs = [vi("x", F32, SHAPE), vi("c", TensorProto.BOOL, [])]
    model = _model(nodes, inputs, [vi("g", F32, SHAPE)], [])
    rep = backend.prepare(model, limits=backend.Limits(gradient_depth=31))
    got = rep.run([X, np.asarray(True)])[0]
    np.testing.assert_allclose(got, _sin_chain_derivative(30), rtol=1e-5)
    with pytest.raises(ValueError, match=r"holds 31 nodes, more than the limit of 30"):
        backend.prepare(model, limits=backend.Limits(gradient_depth=30))


def test_an_error_about_many_unsupported_ops_names_a_few() -> None:
    """10,000 custom op types: the error listed every one."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node(f"Op{i}", ["x"], [f"o{i}"], domain="custom") for i in range(10_000)]
    nodes.append(helper.make_node("Sum", [f"o{i}" for i in range(3)], ["y"]))
    nodes[0].op_type = "Op" + "x" * 100_000
    graph = helper.make_graph(nodes, "g", [vi("x", F32, SHAPE)], [vi("y", F32, SHAPE)])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    with pytest.raises(backend.UnsupportedOperatorError) as error:
        backend.prepare(model, limits=backend.Limits(nodes=20_000))
    assert "the graph needs 10000 unsupported op(s)" in str(error.value)
    assert "and 9,995 more" in str(error.value)
    assert len(str(error.value)) < 2000, len(str(error.value))


def test_run_node_says_how_many_values_are_missing_and_names_a_few() -> None:
    names = [f"w{i}" for i in range(10_000)]
    inputs = ["R", "T", *names, *(f"{n}.grad" for n in names), *(f"{n}.h" for n in names)]
    outputs = [f"{n}.new" for n in names] + [f"{n}.h.new" for n in names]
    node = helper.make_node("Adagrad", inputs, outputs, domain=DOMAIN)
    with pytest.raises(ValueError) as error:
        backend.run_node(node, {"R": np.float32(0.1)})
    message = str(error.value)
    assert "input(s) 30,001 names, the first 5: ['T', 'w0', 'w1', 'w2', 'w3']" in message
    assert len(message) < 500, len(message)


def test_a_chain_through_an_unrolled_loop_is_cut_into_fusions_of_bounded_depth() -> None:
    """A Loop unrolled while tracing (its body slices at the iteration number) runs its
    body once per iteration: the chain runs on through the calls, barred as one."""
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [
            helper.make_node("Sin", ["v"], ["v_next"]),
            helper.make_node("Unsqueeze", ["i", "axes"], ["start"]),
            helper.make_node("Add", ["start", "one"], ["end"]),
            helper.make_node("Slice", ["data", "start", "end"], ["piece"]),
            helper.make_node("Identity", ["c"], ["c_next"]),
        ],
        "body",
        [vi("i", I64, []), vi("c", TensorProto.BOOL, []), vi("v", F32, SHAPE)],
        [vi("c_next", TensorProto.BOOL, []), vi("v_next", F32, SHAPE), vi("piece", F32, [1])],
    )
    inits = [
        numpy_helper.from_array(np.asarray(64, np.int64), "M"),
        numpy_helper.from_array(np.arange(64, dtype=np.float32), "data"),
        numpy_helper.from_array(np.asarray([0], np.int64), "axes"),
        numpy_helper.from_array(np.asarray([1], np.int64), "one"),
    ]
    nodes = [
        helper.make_node("Loop", ["M", "", "x"], ["y", "pieces"], body=body),
        helper.make_node("Gradient", ["x"], ["g"], domain=DOMAIN, xs=["x"], y="y"),
    ]
    model = _model(nodes, [vi("x", F32, SHAPE)], [vi("g", F32, SHAPE)], inits)
    rep = backend.prepare(model)
    jaxpr = jax.make_jaxpr(rep.graph.apply)({"x": X})
    names = [e.primitive.name for e in jaxpr.jaxpr.eqns]
    assert names.count("sin") >= 64, names  # unrolled
    assert names.count("optimization_barrier") >= 2 * (64 // 16 - 1), names
    np.testing.assert_allclose(rep.run([X])[0], _sin_chain_derivative(64), rtol=1e-4)


def test_no_optimization_barrier_outside_a_gradient() -> None:
    """The barriers cut a backward pass's fusions; a forward that nothing differentiates,
    an If's branch of 40 Sin included, is compiled as XLA fuses it (review of issue 33)."""
    chain = [helper.make_node("Sin", [f"s{i}"], [f"s{i + 1}"]) for i in range(40)]
    branch = helper.make_graph(chain, "b", [], [helper.make_tensor_value_info("s40", F32, [2])])
    other = helper.make_graph(
        [helper.make_node("Identity", ["s0"], ["o"])],
        "o",
        [],
        [helper.make_tensor_value_info("o", F32, [2])],
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s0", F32, [2]),
        ],
        [helper.make_tensor_value_info("y", F32, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rep = backend.prepare(model)
    feeds = {"c": np.array(True), "s0": np.ones(2, np.float32)}
    text = jax.jit(lambda f: rep.graph.apply(f)).lower(feeds).as_text()
    assert "optimization_barrier" not in text
    np.testing.assert_allclose(rep.run(feeds)[0], np.ones(2) * _sin40(1.0), rtol=1e-5)


def _sin40(x: float) -> float:
    for _ in range(40):
        x = float(np.sin(np.float32(x)))
    return x
