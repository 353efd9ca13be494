"""``training.check`` and ``onnx-optax check`` report what the first step would refuse.

An algorithm whose inputs leave a size symbolic is traced on stand-in sizes: an
error raised at every stand-in alike (an attribute the op refuses) blocks, as the
step raises it; a model that traces at some stand-in passes, since the step may run
at the sizes it is fed.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import numpy as np
import pytest

import onnx_optax

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import cli, training  # noqa: E402

F32 = TensorProto.FLOAT


def _trainable(
    between: Sequence[onnx.NodeProto],
    *,
    x_dims: Sequence[int | str] = ("N", 4),
    y_dims: Sequence[int | str] = ("N", 8),
    extra: Sequence[onnx.TensorProto] = (),
) -> onnx.ModelProto:
    """``x @ W`` (W [4, 8]) into the nodes ``between`` (from 'h' to 'y'), made trainable
    with an MSE loss and Adam."""
    W = numpy_helper.from_array(np.random.default_rng(0).random((4, 8), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), *between],
        "g",
        [helper.make_tensor_value_info("x", F32, list(x_dims))],
        [helper.make_tensor_value_info("y", F32, list(y_dims))],
        [W, *extra],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return training.attach(model, loss="mse", optimizer=onnx_optax.adam(1e-3))


def _to_4d(name: str = "shape4") -> onnx.TensorProto:
    return numpy_helper.from_array(np.array([-1, 8, 1, 1], np.int64), name)


def _depth_to_space(blocksize: int) -> onnx.ModelProto:
    return _trainable(
        [
            helper.make_node("Reshape", ["h", "shape4"], ["h4"]),
            helper.make_node("DepthToSpace", ["h4"], ["d"], blocksize=blocksize, name="d2s"),
            helper.make_node("Flatten", ["d"], ["y"]),
        ],
        extra=[_to_4d()],
    )


def _feeds(rows: int) -> dict[str, np.ndarray]:
    return {"x": np.ones((rows, 4), np.float32), "target": np.ones((rows, 8), np.float32)}


def test_a_depth_to_space_of_blocksize_0_is_refused_by_check_as_by_the_step(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _depth_to_space(0)
    with pytest.raises(ValueError, match=r"d2s.*blocksize is 0") as step:
        training.Session(model).step(_feeds(2))
    problems = training.check(model)
    assert len(problems) == 1 and problems[0].blocking
    assert str(step.value) in problems[0]
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    assert cli.main(["check", str(path)]) == cli.EXIT_FAILED
    assert "blocksize is 0" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("nodes", "match"),
    [
        # A constant index outside its axis.
        (
            [helper.make_node("Gather", ["h", "index"], ["y"], axis=1, name="g")],
            "g.*indices hold 9",
        ),
        # An axis outside the rank.
        ([helper.make_node("Softmax", ["h"], ["y"], axis=5, name="s")], "s.*axis"),
    ],
)
def test_check_reports_other_attribute_and_constant_errors_the_step_raises(
    nodes: list[onnx.NodeProto], match: str
) -> None:
    index = numpy_helper.from_array(np.array([0, 1, 2, 3, 4, 5, 6, 9], np.int64), "index")
    model = _trainable(nodes, extra=[index])
    with pytest.raises(ValueError, match=match):
        training.Session(model).step(_feeds(2))
    problems = training.check(model)
    assert [p.blocking for p in problems] == [True]
    assert "does not run" in problems[0]


def test_a_valid_blocksize_passes_check_and_steps() -> None:
    model = _depth_to_space(1)
    assert training.check(model) == []
    training.Session(model).step(_feeds(2))


def test_a_model_that_runs_only_at_batch_1_passes_check() -> None:
    """Reshape to [1, 8] runs at N = 1 alone: the first stand-in fails, the next traces."""
    shape = numpy_helper.from_array(np.array([1, 8], np.int64), "row")
    model = _trainable([helper.make_node("Reshape", ["h", "row"], ["y"])], extra=[shape])
    assert training.check(model) == []
    training.Session(model).step(_feeds(1))


def test_a_model_whose_sizes_fail_every_stand_in_differently_is_a_warning() -> None:
    """Reshape to [5, -1] needs N * 8 divisible by 5: no stand-in is, but N = 5 runs."""
    shape = numpy_helper.from_array(np.array([5, -1], np.int64), "five")
    model = _trainable(
        [helper.make_node("Reshape", ["h", "five"], ["y"])], y_dims=(5, "M"), extra=[shape]
    )
    problems = training.check(model)
    assert len(problems) == 1 and not problems[0].blocking, problems
    assert "may still run" in problems[0]
    training.Session(model).step({**_feeds(5), "target": np.ones((5, 8), np.float32)})
