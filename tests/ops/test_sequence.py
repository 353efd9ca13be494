"""Sequences and optionals: values against onnx.reference, and the refusals that name a node.

Each model is small and built here with ``onnx.helper``; expected values are
``onnx.reference.ReferenceEvaluator``'s on the same model and feeds (lists for
sequences, None for an empty optional), or numpy written here. ONNX's own node
cases of these ops run in tests/conformance/test_onnx_suite.py; these add what they do not
reach: graph inputs and outputs of sequence type through ``backend.prepare().run``,
a Loop carrying a sequence (growing: unrolled; of fixed length: one scan), a
position known only at run time, and the refusals (a length that would depend on
the values fed, branches that disagree under a run-time condition, a Gradient
through a sequence op, wrong types).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from onnx_optax import backend  # noqa: E402

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
TRAINING = "ai.onnx.preview.training"
vi = helper.make_tensor_value_info


def seq_vi(name: str, elem: int = F32) -> Any:
    return helper.make_tensor_sequence_value_info(name, elem, None)


def opt_vi(name: str, inner: Any) -> Any:
    return helper.make_value_info(name, helper.make_optional_type_proto(inner))


def make_model(
    nodes: Sequence[Any], inputs: Sequence[Any], outputs: Sequence[Any], opset: int = 18
) -> Any:
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs))
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(TRAINING, 1)]
    return helper.make_model(graph, opset_imports=opsets)


def assert_same(ours: Any, want: Any) -> None:
    """Equal values of one type: lists element by element, None for None."""
    if want is None:
        assert ours is None
    elif isinstance(want, list):
        assert isinstance(ours, list) and len(ours) == len(want), (ours, want)
        for a, b in zip(ours, want, strict=True):
            assert_same(a, b)
    else:
        assert ours.shape == want.shape and ours.dtype == want.dtype, (ours, want)
        np.testing.assert_allclose(ours, want, rtol=1e-6)


def assert_as_reference(model: Any, feeds: Mapping[str, Any]) -> list[Any]:
    want = ReferenceEvaluator(model).run(None, dict(feeds))
    got = list(backend.prepare(model).run(dict(feeds)))
    assert len(got) == len(want)
    for ours, expected in zip(got, want, strict=True):
        assert_same(ours, expected)
    return got


RNG = np.random.default_rng(0)


def floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# ----------------------------------------------------------------------------- values


def test_sequence_graph_input_and_output_are_lists() -> None:
    """A sequence fed as a list comes back as a list (Identity, then each op on it)."""
    nodes = [
        helper.make_node("Constant", [], ["minus_one"], value_int=-1),
        helper.make_node("Constant", [], ["minus_two"], value_int=-2),
        helper.make_node("Constant", [], ["zero"], value_int=0),
        helper.make_node("Identity", ["s"], ["same"]),
        helper.make_node("SequenceLength", ["s"], ["n"]),
        helper.make_node("SequenceAt", ["s", "minus_one"], ["last"]),
        helper.make_node("SequenceErase", ["s", "zero"], ["rest"]),
        helper.make_node("SequenceInsert", ["s", "x", "minus_two"], ["more"]),
    ]
    model = make_model(
        nodes,
        [seq_vi("s"), vi("x", F32, [3])],
        [seq_vi("same"), vi("n", I64, []), vi("last", F32, [4]), seq_vi("rest"), seq_vi("more")],
    )
    feeds = {"s": [floats(3), floats(2), floats(4)], "x": floats(3)}
    same, n, last, rest, more = assert_as_reference(model, feeds)
    np.testing.assert_array_equal(last, feeds["s"][-1])
    assert int(n) == 3 and len(more) == 4 and len(rest) == 2
    np.testing.assert_array_equal(same[1], feeds["s"][1])  # by hand, too
    np.testing.assert_array_equal(more[1], feeds["x"])  # before the second from the end


def test_construct_split_concat() -> None:
    """SequenceConstruct, SplitToSequence (a scalar split with a remainder), ConcatFromSequence
    (joined and stacked, a negative axis)."""
    nodes = [
        helper.make_node("Constant", [], ["two"], value_int=2),
        helper.make_node("SplitToSequence", ["x", "two"], ["parts"], axis=1),
        helper.make_node("ConcatFromSequence", ["parts"], ["joined"], axis=-1),
        helper.make_node("SequenceConstruct", ["a", "b"], ["pair"]),
        helper.make_node("ConcatFromSequence", ["pair"], ["stacked"], axis=-1, new_axis=1),
    ]
    model = make_model(
        nodes,
        [vi("x", F32, [2, 5]), vi("a", F32, [2, 3]), vi("b", F32, [2, 3])],
        [seq_vi("parts"), vi("joined", F32, [2, 5]), vi("stacked", F32, [2, 3, 2])],
    )
    feeds = {"x": floats(2, 5), "a": floats(2, 3), "b": floats(2, 3)}
    parts, joined, stacked = assert_as_reference(model, feeds)
    assert [p.shape for p in parts] == [(2, 2), (2, 2), (2, 1)]
    np.testing.assert_array_equal(joined, feeds["x"])
    np.testing.assert_array_equal(stacked, np.stack([feeds["a"], feeds["b"]], -1))


def test_empty_sequence_and_optionals() -> None:
    """SequenceEmpty grows by SequenceInsert; an empty optional comes back as None."""
    seq_type = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F32, None))
    nodes = [
        helper.make_node("SequenceEmpty", [], ["e"], dtype=F32),
        helper.make_node("SequenceInsert", ["e", "x"], ["one"]),
        helper.make_node("Optional", [], ["none"], type=seq_type),
        helper.make_node("Optional", ["one"], ["some"]),
        helper.make_node("OptionalHasElement", ["none"], ["has_none"]),
        helper.make_node("OptionalHasElement", ["some"], ["has_some"]),
        helper.make_node("OptionalGetElement", ["some"], ["got"]),
    ]
    model = make_model(
        nodes,
        [vi("x", F32, [2])],
        [
            opt_vi("none", seq_type),
            vi("has_none", BOOL, []),
            vi("has_some", BOOL, []),
            seq_vi("got"),
        ],
    )
    x = floats(2)
    none, has_none, has_some, got = backend.prepare(model).run({"x": x})
    assert none is None and not has_none and has_some  # by hand
    assert_same(got, [x])
    # (onnx.reference holds the empty optional of a sequence type as [None], which it
    # then says has an element; the spec says it has none.)
    assert bool(ReferenceEvaluator(model).run(["has_some"], {"x": x})[0])


def test_empty_optional_graph_input() -> None:
    """An optional graph input fed None is empty; fed a tensor it holds it."""
    inner = helper.make_tensor_type_proto(F32, [2])
    model = make_model(
        [helper.make_node("OptionalHasElement", ["o"], ["has"])],
        [opt_vi("o", inner)],
        [vi("has", BOOL, [])],
    )
    rep = backend.prepare(model)
    assert not rep.run({"o": None})[0] and rep.run({"o": floats(2)})[0]


def test_position_known_only_at_run_time() -> None:
    """SequenceAt of a position computed from the values fed, over elements of one shape;
    outside the range it fails after the run, naming the node."""
    nodes = [
        helper.make_node("Constant", [], ["three"], value_int=3),
        helper.make_node("ArgMax", ["v"], ["i"], keepdims=0),
        helper.make_node("Sub", ["i", "three"], ["position"]),
        helper.make_node("SequenceAt", ["s", "position"], ["y"], name="at"),
    ]
    # v larger than a Loop's small sources (read while tracing): known at run time only
    model = make_model(nodes, [seq_vi("s"), vi("v", F32, [20])], [vi("y", F32, [3])])
    s = [floats(3), floats(3), floats(3)]
    for top in (5, 3, 1):  # positions 2, 0, -2
        v = np.zeros(20, np.float32)
        v[top] = 1
        (y,) = assert_as_reference(model, {"s": s, "v": v})
        np.testing.assert_array_equal(y, s[top - 3])  # by hand, too
    v = np.zeros(20, np.float32)
    v[6] = 1  # position 3
    with pytest.raises(ValueError, match=r"node 'at' \(ai\.onnx\.SequenceAt\): position"):
        backend.prepare(model).run({"s": s, "v": v})


def test_sequence_map_over_elements_of_different_shapes() -> None:
    """SequenceMap's body runs per element: here a reduction of each (shapes differ) plus
    a tensor given whole."""
    body = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["e"], ["total"], keepdims=0),
            helper.make_node("Add", ["total", "t"], ["out"]),
        ],
        "body",
        [vi("e", F32, None), vi("t", F32, [])],
        [vi("out", F32, [])],
    )
    model = make_model(
        [helper.make_node("SequenceMap", ["s", "t"], ["sums"], body=body)],
        [seq_vi("s"), vi("t", F32, [])],
        [seq_vi("sums")],
    )
    s = [floats(2), floats(3, 2), floats(1)]
    (sums,) = assert_as_reference(model, {"s": s, "t": np.float32(1.5)})
    np.testing.assert_allclose([float(v) for v in sums], [x.sum() + 1.5 for x in s], rtol=1e-6)


# ----------------------------------------------------------------------------- control flow


def growing_loop(trip_count: str = "M") -> Any:
    """A Loop appending x * i to a carried sequence each iteration."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["c"], ["c_out"]),
            helper.make_node("Cast", ["i"], ["fi"], to=F32),
            helper.make_node("Mul", ["x", "fi"], ["xi"]),
            helper.make_node("SequenceInsert", ["s", "xi"], ["s_out"]),
        ],
        "body",
        [vi("i", I64, []), vi("c", BOOL, []), seq_vi("s")],
        [vi("c_out", BOOL, []), seq_vi("s_out")],
    )
    return [
        helper.make_node("SequenceEmpty", [], ["empty"], dtype=F32),
        helper.make_node("Constant", [], ["true"], value=helper.make_tensor("t", BOOL, [], [1])),
        helper.make_node("Loop", [trip_count, "true", "empty"], ["out"], body=body, name="loop"),
    ]


def test_loop_growing_a_sequence_unrolls() -> None:
    """A carried sequence one longer each iteration: the trip count is known while tracing
    (a graph input read as a compile-time value), so the loop unrolls."""
    model = make_model(growing_loop(), [vi("M", I64, []), vi("x", F32, [2])], [seq_vi("out")])
    x = floats(2)
    (out,) = assert_as_reference(model, {"M": np.int64(4), "x": x})
    assert len(out) == 4
    np.testing.assert_allclose(out[3], 3 * x)


def test_loop_growing_a_sequence_needs_a_known_trip_count() -> None:
    """The trip count computed from the values fed: the length would depend on them, refused
    when the graph is prepared, naming the node and why."""
    nodes = [
        helper.make_node("ReduceSum", ["v"], ["total"], keepdims=0),
        helper.make_node("Cast", ["total"], ["M"], to=I64),
        *growing_loop(),
    ]
    # v larger than a Loop's small sources (read while tracing): known at run time only
    model = make_model(nodes, [vi("v", F32, [20]), vi("x", F32, [2])], [seq_vi("out")])
    with pytest.raises(
        ValueError,
        match=r"node 'loop' \(ai\.onnx\.Loop\): its loop-carried value 's_out' is a sequence "
        r"of 0 \(\) on entry but a sequence of 1 \(float32\[2\]\).*trip count M and the "
        r"condition must be known while tracing",
    ):
        backend.prepare(model)


def test_loop_carrying_a_sequence_of_fixed_length_scans() -> None:
    """A sequence of fixed length carried through a run-time trip count (lax.while_loop):
    each iteration replaces its first element by the sum of both, at the back."""
    body = helper.make_graph(
        [
            helper.make_node("Constant", [], ["zero"], value_int=0),
            helper.make_node("Constant", [], ["one"], value_int=1),
            helper.make_node("Identity", ["c"], ["c_out"]),
            helper.make_node("SequenceAt", ["s", "zero"], ["a"]),
            helper.make_node("SequenceAt", ["s", "one"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["ab"]),
            helper.make_node("SequenceErase", ["s", "zero"], ["rest"]),
            helper.make_node("SequenceInsert", ["rest", "ab"], ["s_out"]),
        ],
        "body",
        [vi("i", I64, []), vi("c", BOOL, []), seq_vi("s")],
        [vi("c_out", BOOL, []), seq_vi("s_out")],
    )
    nodes = [
        helper.make_node("ReduceSum", ["v"], ["total"], keepdims=0),
        helper.make_node("Cast", ["total"], ["M"], to=I64),  # known only at run time
        helper.make_node("Constant", [], ["true"], value=helper.make_tensor("t", BOOL, [], [1])),
        helper.make_node("Loop", ["M", "true", "s"], ["out"], body=body),
    ]
    # v larger than a Loop's small sources (read while tracing): known at run time only
    model = make_model(nodes, [vi("v", F32, [20]), seq_vi("s")], [seq_vi("out")])
    s = [floats(3), floats(3)]
    v = np.zeros(20, np.float32)
    v[:2] = [2, 3]
    (out,) = assert_as_reference(model, {"v": v, "s": s})
    a, b = s
    for _ in range(5):  # by hand: Fibonacci in pairs
        a, b = b, a + b
    np.testing.assert_allclose(out[0], a, rtol=1e-5)
    np.testing.assert_allclose(out[1], b, rtol=1e-5)


def test_loop_with_an_empty_optional_and_a_branch_inside() -> None:
    """ONNX's test_loop16_seq_none model on an empty optional and on a filled one (its own
    case's expected values cannot be compared by onnx's runner: see tests/support/onnx_suite.py)."""
    from onnx.backend.test.loader import load_node_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # generating the node cases warns for unrelated ops
        (case,) = [c for c in load_node_model_tests() if c.name == "test_loop16_seq_none"]
    ((inputs, expected),) = case.data_sets
    got = backend.prepare(case.model).run(inputs)
    assert_same(list(got), list(expected))
    trip, cond, _ = inputs
    assert_as_reference(case.model, {"trip_count": trip, "cond": cond, "opt_seq": None})


def test_if_on_a_run_time_condition_carries_sequences_of_one_length() -> None:
    """Branches giving sequences of one length under a computed condition: one lax.cond;
    of different lengths: refused naming the node."""

    def model(else_count: int) -> Any:
        then = helper.make_graph(
            [helper.make_node("SequenceConstruct", ["x", "x"], ["t"])],
            "then",
            [],
            [seq_vi("t")],
        )
        other = helper.make_graph(
            [helper.make_node("SequenceConstruct", ["y"] * else_count, ["e"])],
            "else",
            [],
            [seq_vi("e")],
        )
        nodes = [
            helper.make_node("Constant", [], ["zero"], value_float=0.0),
            helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
            helper.make_node("Greater", ["total", "zero"], ["c"]),
            helper.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other, name="if"),
        ]
        # x larger than the small sources read while tracing: c known at run time only
        return make_model(nodes, [vi("x", F32, [20]), vi("y", F32, [20])], [seq_vi("out")])

    for x in (np.ones(20, np.float32), -np.ones(20, np.float32)):
        assert_as_reference(model(2), {"x": x, "y": floats(20)})
    with pytest.raises(
        ValueError, match=r"node 'if' \(ai\.onnx\.If\): output 0 is a sequence of 2"
    ):
        backend.prepare(model(3))


# ----------------------------------------------------------------------------- refusals


def test_length_from_run_time_values_is_refused_at_prepare() -> None:
    """SplitToSequence's split and SequenceInsert's position set a length or an order: computed
    from the values fed, they are refused when the graph is prepared, naming the node."""
    split = make_model(
        [
            helper.make_node("ArgMax", ["v"], ["k"], keepdims=0),
            helper.make_node("SplitToSequence", ["x", "k"], ["parts"], name="split"),
        ],
        [vi("x", F32, [6]), vi("v", F32, [20])],  # v: more than a small source
        [seq_vi("parts")],
    )
    with pytest.raises(
        ValueError,
        match=r"node 'split' \(ai\.onnx\.SplitToSequence\): input 'k' must be known when the "
        r"graph is compiled",
    ):
        backend.prepare(split)
    insert = make_model(
        [
            helper.make_node("ArgMax", ["v"], ["k"], keepdims=0),
            helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
            helper.make_node("SequenceInsert", ["s", "x", "k"], ["out"], name="insert"),
        ],
        [vi("x", F32, [6]), vi("v", F32, [20])],  # v: more than a small source
        [seq_vi("out")],
    )
    with pytest.raises(ValueError, match=r"node 'insert' \(ai\.onnx\.SequenceInsert\): input 'k'"):
        backend.prepare(insert)


def test_position_of_differently_shaped_elements_must_be_known() -> None:
    model = make_model(
        [
            helper.make_node("Constant", [], ["two"], value_int=2),
            helper.make_node("ArgMax", ["v"], ["k"], keepdims=0),
            helper.make_node("SplitToSequence", ["x", "two"], ["parts"]),
            helper.make_node("SequenceAt", ["parts", "k"], ["y"], name="at"),
        ],
        [vi("x", F32, [5]), vi("v", F32, [20])],
        [vi("y", F32, ["n"])],
    )
    with pytest.raises(
        ValueError, match=r"node 'at' \(ai\.onnx\.SequenceAt\): its position depends on the values"
    ):
        backend.prepare(model)


def test_types_are_checked_against_the_schema() -> None:
    """A tensor where a sequence is needed, a sequence of the wrong dtype, an element of the
    wrong dtype, and an empty optional read: each refused naming the node."""
    at = make_model(
        [
            helper.make_node("Constant", [], ["zero"], value_int=0),
            helper.make_node("SequenceAt", ["x", "zero"], ["y"], name="at"),
        ],
        [vi("x", F32, [2])],
        [vi("y", F32, [2])],
    )
    with pytest.raises(TypeError, match=r"node 'at' .*input 'x' has type float32; it must be"):
        backend.prepare(at)
    insert = make_model(
        [helper.make_node("SequenceInsert", ["s", "x"], ["out"], name="insert")],
        [seq_vi("s"), vi("x", TensorProto.INT32, [2])],
        [seq_vi("out")],
    )
    with pytest.raises(TypeError, match=r"node 'insert' .*int32 but the sequence holds float32"):
        backend.prepare(insert).run({"s": [floats(2)], "x": np.arange(2, dtype=np.int32)})
    inner = helper.make_tensor_type_proto(F32, [2])
    get = make_model(
        [helper.make_node("OptionalGetElement", ["o"], ["y"], name="get")],
        [opt_vi("o", inner)],
        [vi("y", F32, [2])],
    )
    with pytest.raises(ValueError, match=r"node 'get' .*the optional is empty"):
        backend.prepare(get).run({"o": None})
    add = make_model(
        [helper.make_node("Add", ["o", "o"], ["y"], name="add")],
        [opt_vi("o", inner)],
        [vi("y", F32, [2])],
    )
    with pytest.raises(
        TypeError, match=r"node 'add' .*input 'o' has no value \(an empty optional\); it must be"
    ):
        backend.prepare(add).run({"o": None})
    with pytest.raises(TypeError, match=r"input 's' is a sequence: feed a list of tensors"):
        backend.prepare(insert).run({"s": floats(2), "x": np.arange(2, dtype=np.int32)})


def test_a_sequence_of_strings_is_refused_by_name() -> None:
    model = make_model(
        [helper.make_node("SequenceLength", ["s"], ["n"], name="len")],
        [seq_vi("s", TensorProto.STRING)],
        [vi("n", I64, [])],
    )
    with pytest.raises(TypeError, match=r"node 'len' .*its input 's' is a string tensor"):
        backend.prepare(model)


def test_gradient_through_a_sequence_op_is_refused() -> None:
    """Gradients do not flow through sequences: a Gradient whose path crosses one is refused
    naming the Gradient and the sequence node, when the graph is prepared."""
    nodes = [
        helper.make_node("SequenceConstruct", ["w", "w"], ["s"], name="pack"),
        helper.make_node("ConcatFromSequence", ["s"], ["joined"], axis=0),
        helper.make_node("ReduceSum", ["joined"], ["loss"], keepdims=0),
        helper.make_node("Gradient", ["w"], ["dw"], domain=TRAINING, xs=["w"], y="loss", name="g"),
    ]
    model = make_model(nodes, [vi("w", F32, [2])], [vi("dw", F32, [2])])
    with pytest.raises(
        ValueError,
        match=r"node 'g' \(ai\.onnx\.preview\.training\.Gradient\): the path to y 'loss' crosses "
        r"node 'pack' \(ai\.onnx\.SequenceConstruct\)",
    ):
        backend.prepare(model)


def _sequence_map(body_outputs: int, node_outputs: int, elem: int = F32) -> Any:
    """SequenceMap of a body giving -e and |e| (the first ``body_outputs``) over [x, x]."""
    body = helper.make_graph(
        [helper.make_node("Neg", ["e"], ["a"]), helper.make_node("Abs", ["e"], ["b"])],
        "body",
        [vi("e", elem, None)],
        [vi("a", elem, None), vi("b", elem, None)][:body_outputs],
    )
    names = ["r", "q"][:node_outputs]
    return make_model(
        [
            helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
            helper.make_node("SequenceMap", ["s"], names, body=body, name="map"),
        ],
        [vi("x", F32, [2])],
        [seq_vi(name) for name in names],
    )


@pytest.mark.parametrize(
    ("body_outputs", "node_outputs", "elem", "pattern"),
    [
        (2, 1, F32, r"body gives 2 outputs but the node has 1"),
        (1, 2, F32, r"body gives 1 outputs but the node has 2"),
        (1, 1, TensorProto.INT64, r"body input 'e' is declared tensor\(int64\) .*float"),
    ],
    ids=["more_body_outputs", "fewer_body_outputs", "element_type"],
)
def test_a_sequence_map_body_that_does_not_fit_is_refused_as_in_onnxruntime(
    body_outputs: int, node_outputs: int, elem: int, pattern: str
) -> None:
    ort = pytest.importorskip("onnxruntime")
    model = _sequence_map(body_outputs, node_outputs, elem)
    with pytest.raises(Exception, match=r"TypeInferenceError"):  # onnxruntime's own types
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.ones(2, np.float32)
    with pytest.raises(ValueError, match=rf"node 'map' \(ai\.onnx\.SequenceMap\): {pattern}"):
        backend.prepare(model).run({"x": x})
