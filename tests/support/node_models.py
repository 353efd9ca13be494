"""Helpers shared by the tests split out of tests/test_hostile_nn.py (issue 34)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import backend  # noqa: E402

NAMED = r"node 'n' \(ai\.onnx\.\w+\)"


def node_model(
    op: str,
    feeds: Mapping[str, np.ndarray | tuple[list[int], int]],
    attrs: Mapping[str, Any] | None = None,
    *,
    consts: Mapping[str, np.ndarray] | None = None,
    opset: int = 21,
    outputs: tuple[int, ...] = (TensorProto.FLOAT,),
    rank: int | None = None,
) -> onnx.ModelProto:
    """One node named 'n' over graph inputs (arrays or declared (shape, type)) and initializers.

    Its outputs are declared of the given types and of ``rank`` symbolic dimensions
    (the first input's rank by default).
    """
    consts = dict(consts or {})
    inputs = []
    for name, value in feeds.items():
        shape, elem = (
            (list(value.shape), helper.np_dtype_to_tensor_dtype(value.dtype))
            if isinstance(value, np.ndarray)
            else value
        )
        inputs.append(helper.make_tensor_value_info(name, elem, shape))
    if rank is None:
        first = next(iter(feeds.values()), None) if feeds else next(iter(consts.values()))
        rank = np.ndim(first) if isinstance(first, np.ndarray) else len(first[0])  # type: ignore[index]
    names = [f"y{i}" for i in range(len(outputs))]
    node = helper.make_node(op, [*feeds, *consts], names, name="n", **dict(attrs or {}))
    graph = helper.make_graph(
        [node],
        "g",
        inputs,
        [
            helper.make_tensor_value_info(y, elem, [f"{y}_{i}" for i in range(rank)])
            for y, elem in zip(names, outputs, strict=True)
        ],
        initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def theirs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[Any] | None:
    """onnxruntime's outputs, or None where it refuses the model."""
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        return list(session.run(None, dict(feeds)))
    except Exception:  # onnxruntime's own error types
        return None


def assert_as_onnxruntime(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], expected: list[Any] | None = None
) -> None:
    """Our outcome is onnxruntime's: its outputs (shape, dtype, values), or a ValueError or
    TypeError naming the node where onnxruntime refuses the model."""
    expected = theirs(model, feeds) if expected is None else expected
    if expected is None:
        with pytest.raises((ValueError, TypeError), match=NAMED):
            backend.prepare(model).run(dict(feeds))
        return
    got = backend.prepare(model).run(dict(feeds))
    assert len(got) == len(expected)
    for ours, want in zip(got, expected, strict=True):
        ours = np.asarray(ours)
        assert ours.shape == want.shape, (ours.shape, want.shape)
        assert ours.dtype == want.dtype
        np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)


def random_floats(rng: np.random.Generator, shape: list[int]) -> np.ndarray:
    """float32 standard normals of ``shape`` from ``rng``."""
    return rng.standard_normal(shape).astype(np.float32)


# ----------------------------------------------------------------------------- 2. memory


def folded_model(
    op: str, shapes: list[list[int]], attrs: Mapping[str, Any] | None = None, **consts: np.ndarray
) -> onnx.ModelProto:
    """A few hundred bytes: ``op`` (node 'n') over ConstantOfShape fills of ``shapes`` (ones,
    trace-time constants) and integer initializers ``consts`` (also trace-time)."""
    nodes, names = [], []
    for i, shape in enumerate(shapes):
        nodes.append(helper.make_node("Constant", [], [f"s{i}"], value_ints=shape))
        one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
        nodes.append(helper.make_node("ConstantOfShape", [f"s{i}"], [f"c{i}"], value=one))
        names.append(f"c{i}")
    nodes.append(helper.make_node(op, [*names, *consts], ["y"], name="n", **dict(attrs or {})))
    graph = helper.make_graph(
        nodes,
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])],
        initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


FOLDED = """
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    import numpy as np
    from onnx_optax import backend
    from tests.support.node_models import folded_model

    try:
        rep = backend.prepare(folded_model({args}), limits=backend.Limits(tensor_bytes={limit}))
        print("RESULT prepared")
        rep.run({{}})
        print("RESULT ran")
    except ValueError as error:
        print("RESULT ValueError", error)
"""

# ----------------------------------------------------------------------------- 6. silent results

F = TensorProto.FLOAT
