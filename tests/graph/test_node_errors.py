"""The graph runtime's one error boundary: whatever a node raises ends in a promised error.

docs/security.md ("Models from strangers") promises that every entry point ends in a
result or a ValueError, TypeError or NotImplementedError naming the node at
fault. An op's arithmetic on a model's numbers can raise anything
(ZeroDivisionError, IndexError, KeyError, OverflowError, MemoryError): the
runtime turns any such exception raised while running a node into a
ValueError naming the node, the original kept as ``__cause__``. Each op's own
root cause is fixed in its op module; these tests hold whatever the op raises.
On a1b1782 the reproducers raised ZeroDivisionError and IndexError, and
``run_node`` with a dict lacking an input a KeyError.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import backend, training  # noqa: E402
from onnx_optax._src.adam import adam  # noqa: E402
from onnx_optax._src.ops import REGISTRY  # noqa: E402

DOMAIN = "ai.onnx.preview.training"
F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)]
    )


def _vi(name: str, elem: int = F32, shape: list[Any] | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, ["d"] if shape is None else shape)


def _ints(name: str, values: Sequence[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


X4 = np.ones((1, 4, 2, 2), np.float32)

# Reproducers of the audit: each ran into Python arithmetic on a model's attribute or shape.
REPRODUCERS: dict[str, tuple[onnx.ModelProto, list[np.ndarray], str]] = {
    "DepthToSpace blocksize 0": (
        _model(
            [helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=0, name="d2s")],
            [_vi("x", F32, [1, 4, 2, 2])],
            [_vi("y")],
        ),
        [X4],
        "node 'd2s' (ai.onnx.DepthToSpace)",
    ),
    "SpaceToDepth blocksize 0": (
        _model(
            [helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=0, name="s2d")],
            [_vi("x", F32, [1, 4, 2, 2])],
            [_vi("y")],
        ),
        [X4],
        "node 's2d' (ai.onnx.SpaceToDepth)",
    ),
    "Split num_outputs 0": (
        _model(
            [helper.make_node("Split", ["x"], ["y"], num_outputs=0, name="split")],
            [_vi("x", F32, [4])],
            [_vi("y")],
        ),
        [np.ones(4, np.float32)],
        "node 'split' (ai.onnx.Split)",
    ),
    "Reshape allowzero [0, -1]": (
        _model(
            [helper.make_node("Reshape", ["x", "s"], ["y"], allowzero=1, name="reshape")],
            [_vi("x", F32, [2, 3])],
            [_vi("y")],
            [_ints("s", [0, -1])],
        ),
        [np.ones((2, 3), np.float32)],
        "node 'reshape' (ai.onnx.Reshape)",
    ),
    "Reshape 0 beyond the rank": (
        _model(
            [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")],
            [_vi("x", F32, [6])],
            [_vi("y")],
            [_ints("s", [2, 0, 3])],
        ),
        [np.ones(6, np.float32)],
        "node 'reshape' (ai.onnx.Reshape)",
    ),
    "Gather on a Shape out of range": (
        _model(
            [
                helper.make_node("Shape", ["x"], ["s"], name="shape"),
                helper.make_node("Gather", ["s", "i"], ["y"], name="gather"),
            ],
            [_vi("x", F32, [2, 3])],
            [_vi("y", I64, [])],
            [_ints("i", 5)],
        ),
        [np.ones((2, 3), np.float32)],
        "node 'gather' (ai.onnx.Gather)",
    ),
}


@pytest.mark.parametrize("case", list(REPRODUCERS))
def test_reproducers_end_in_a_value_error_naming_the_node(case: str) -> None:
    model, feeds, where = REPRODUCERS[case]
    with pytest.raises(ValueError) as caught:  # at prepare (declared shapes) or at run
        backend.prepare(model).run(feeds)
    assert where in str(caught.value)


def _failing(monkeypatch: pytest.MonkeyPatch, op: str, error: BaseException) -> None:
    """Makes the ai.onnx op ``op`` raise ``error`` whenever it runs."""

    def fn(node: Any, *args: Any) -> Any:
        raise error

    monkeypatch.setitem(REGISTRY[""], op, dataclasses.replace(REGISTRY[""][op], fn=fn))


def _relu_model(name: str = "act") -> onnx.ModelProto:
    return _model(
        [helper.make_node("Relu", ["x"], ["y"], name=name)], [_vi("x", F32, [3])], [_vi("y")]
    )


@pytest.mark.parametrize(
    "error",
    [
        ZeroDivisionError("integer division or modulo by zero"),
        IndexError("tuple index out of range"),
        KeyError("axis"),
        OverflowError("Python int too large to convert to C long"),
        RecursionError("maximum recursion depth exceeded"),
        AssertionError("unreachable"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_any_other_exception_becomes_a_value_error_naming_the_node(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    _failing(monkeypatch, "Relu", error)
    with pytest.raises(ValueError, match=r"node 'act' \(ai\.onnx\.Relu\)") as caught:
        backend.prepare(_relu_model()).run([np.ones(3, np.float32)])
    assert caught.value.__cause__ is error
    assert type(error).__name__ in str(caught.value)


def test_memory_error_becomes_a_value_error_naming_the_node_and_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The model chose the size that failed: the caller gets the node and the limit to lower."""
    error = MemoryError()
    _failing(monkeypatch, "Relu", error)
    with pytest.raises(ValueError, match=r"node 'act'.*out of host memory.*tensor_bytes") as c:
        backend.prepare(_relu_model()).run([np.ones(3, np.float32)])
    assert c.value.__cause__ is error


def test_keyboard_interrupt_passes_through(monkeypatch: pytest.MonkeyPatch) -> None:
    _failing(monkeypatch, "Relu", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        backend.prepare(_relu_model()).run([np.ones(3, np.float32)])


def test_promised_errors_keep_their_type_and_gain_the_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for error in (TypeError("bad dtype"), NotImplementedError("no such mode")):
        _failing(monkeypatch, "Relu", error)
        with pytest.raises(type(error), match=r"^node 'act' \(ai\.onnx\.Relu\): "):
            backend.prepare(_relu_model()).run([np.ones(3, np.float32)])


def test_a_node_inside_a_gradient_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    _failing(monkeypatch, "Tanh", ZeroDivisionError("division by zero"))
    model = _model(
        [
            helper.make_node("Tanh", ["x"], ["t"], name="inner"),
            helper.make_node("Gradient", ["x"], ["g"], domain=DOMAIN, xs=["x"], y="t", name="d"),
        ],
        [_vi("x", F32, [3])],
        [_vi("g")],
    )
    with pytest.raises(ValueError, match=r"node 'inner' \(ai\.onnx\.Tanh\): cannot run it"):
        backend.prepare(model).run([np.ones(3, np.float32)])


def test_an_optimizer_node_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from onnx_optax._src import onnx_nodes

    def boom(self: Any, *args: Any) -> Any:
        raise OverflowError("math range error")

    monkeypatch.setattr(onnx_nodes.OptimizerNode, "run", boom)
    node = helper.make_node(
        "Momentum",
        ["R", "T", "X", "G", "V"],
        ["X_new", "V_new"],
        domain=DOMAIN,
        alpha=0.9,
        beta=1.0,
        mode="standard",
        norm_coefficient=0.0,
        name="opt",
    )
    one = np.ones(2, np.float32)
    with pytest.raises(ValueError, match=r"node 'opt' \(ai\.onnx\.preview\.training\.Momentum\)"):
        backend.run_node(node, [np.float32(0.1), np.int64(0), one, one, one])


def test_run_node_with_a_dict_lacking_an_input_names_it() -> None:
    node = helper.make_node("Add", ["a", "b"], ["c"], name="plus")
    with pytest.raises(ValueError, match=r"node 'plus' \(ai\.onnx\.Add\).*\['b'\]"):
        backend.run_node(node, {"a": np.ones(2, np.float32)})


def test_a_training_step_names_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """Session's steps run the same boundary (its check traces the algorithm first)."""
    _failing(monkeypatch, "Relu", IndexError("list index out of range"))
    w = numpy_helper.from_array(np.ones(3, np.float32), "w")
    model = _model(
        [helper.make_node("Mul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        [_vi("x", F32, [3])],
        [_vi("y", F32, [3])],
        [w],
    )
    trained = training.attach(model, loss="mse", optimizer=adam(1e-3), trainable=["w"])
    assert any("(ai.onnx.Relu): cannot run it: IndexError" in p for p in training.check(trained))
    with pytest.raises(training.TrainingModelError, match=r"\(ai\.onnx\.Relu\): cannot run it"):
        training.Session(trained)
