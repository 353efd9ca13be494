"""Hostile training models: check, Session and the CLI end in a result or a clear error.

Each model is a sound one (attached by ``training.attach`` or written by
``interop.to_model``) with one field broken by hand; the expected outcome is a
``ValueError``/``TypeError``/``NotImplementedError`` or a ``check`` problem
naming the node, tensor or binding, never an AttributeError, IndexError or an
opaque numpy message.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import onnx_optax

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402

from onnx_optax import cli, interop, training  # noqa: E402
from tests.test_training import mlp  # noqa: E402

CLEAR = (ValueError, TypeError, NotImplementedError)


def _attached() -> onnx.ModelProto:
    return training.attach(mlp(), loss="mse", target="t", optimizer=onnx_optax.adam(0.1))


def _gradient(model: onnx.ModelProto) -> onnx.NodeProto:
    (node,) = [n for n in model.training_info[0].algorithm.node if n.op_type == "Gradient"]
    return node


def _set_attribute(node: onnx.NodeProto, attribute: onnx.AttributeProto) -> None:
    kept = [a for a in node.attribute if a.name != attribute.name]
    del node.attribute[:]
    node.attribute.extend([*kept, attribute])


def _adagrad_model() -> onnx.ModelProto:
    tx = onnx_optax.adagrad(0.1)
    params = {"w": np.ones(3, np.float32)}
    return interop.to_model(tx, params, tx.init(params))


def _set_initializer(model: onnx.ModelProto, tensor: onnx.TensorProto) -> None:
    (found,) = [i for i in model.graph.initializer if i.name == tensor.name]
    found.CopyFrom(tensor)


def _set_binding(model: onnx.ModelProto, key: str, value: str) -> None:
    (entry,) = [e for e in model.training_info[0].update_binding if e.key == key]
    entry.value = value


def _check_and_session(model: onnx.ModelProto, *words: str) -> None:
    """``check`` lists a problem naming ``words`` (or the loader refuses the model with
    one); ``Session`` refuses with the same."""
    try:
        problems = training.check(model)
    except CLEAR as error:
        problems = [str(error)]
    assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)
    assert any(all(w in p for w in words) for p in problems), problems
    with pytest.raises(CLEAR) as error:
        training.Session(model)
    assert all(w in str(error.value) for w in words), error.value


def _cli(
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    model: onnx.ModelProto,
    command: str,
) -> tuple[int, str]:
    """The CLI's exit status and what it printed (problems on stdout, errors on stderr)."""
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    argv = [command, str(path)]
    if command == "train":
        np.savez(tmp_path / "d.npz", x=np.zeros((4, 4), np.float32))
        argv += ["--data", str(tmp_path / "d.npz"), "--steps", "1", "-o", str(tmp_path / "o.onnx")]
    capsys.readouterr()
    status = cli.main(argv)
    captured = capsys.readouterr()
    return status, captured.out + captured.err


# ----------------------------------------------------------------------------- F3: Gradient attributes


def test_gradient_xs_of_ints_is_a_clear_problem() -> None:
    model = _attached()
    _set_attribute(_gradient(model), helper.make_attribute("xs", [1, 2]))
    _check_and_session(model, "Gradient", "xs")


def test_gradient_y_of_invalid_utf8_is_a_clear_problem() -> None:
    model = _attached()
    _set_attribute(_gradient(model), helper.make_attribute("y", b"\xff\xfe"))
    _check_and_session(model, "Gradient", "y")


def test_gradient_y_of_a_float_is_a_clear_problem() -> None:
    model = _attached()
    _set_attribute(_gradient(model), helper.make_attribute("y", 1.5))
    _check_and_session(model, "Gradient", "y")


# ----------------------------------------------------------------------------- F7, F8: T


def test_a_stored_T_that_is_not_a_scalar_is_a_clear_problem() -> None:
    model = _adagrad_model()
    _set_initializer(model, numpy_helper.from_array(np.array([1, 1], np.int64), "T"))
    _check_and_session(model, "'T'", "scalar")


def test_a_stored_T_bound_to_an_input_of_the_algorithm_is_a_clear_problem() -> None:
    model = _adagrad_model()
    _set_binding(model, "T", "w")
    _check_and_session(model, "update_binding['T']", "'w'")


# ----------------------------------------------------------------------------- F12: the CLI


@pytest.mark.parametrize("command", ["check", "train"])
def test_the_cli_turns_a_non_scalar_T_into_one_line(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    model = _adagrad_model()
    _set_initializer(model, numpy_helper.from_array(np.array([1, 1], np.int64), "T"))
    status, text = _cli(tmp_path, capsys, model, command)
    assert status in (1, 2)
    assert "'T'" in text


@pytest.mark.parametrize("command", ["check", "train"])
def test_the_cli_turns_a_bad_gradient_attribute_into_an_error(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    model = _attached()
    _set_attribute(_gradient(model), helper.make_attribute("xs", [1, 2]))
    status, text = _cli(tmp_path, capsys, model, command)
    assert status in (1, 2)
    assert "xs" in text


@pytest.mark.parametrize("command", ["check", "train"])
@pytest.mark.parametrize("error", [TypeError, ValueError, NotImplementedError])
def test_the_cli_turns_an_error_of_check_or_session_into_exit_2(
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    error: type[Exception],
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise error("node 'n': refused by the test")

    monkeypatch.setattr(training, "check" if command == "check" else "Session", refuse)
    status, text = _cli(tmp_path, capsys, _attached(), command)
    assert status == 2
    assert text.strip().splitlines() == [
        f"onnx-optax {command}: {tmp_path / 'm.onnx'}: node 'n': refused by the test"
    ]


@pytest.mark.parametrize("content", [b"not a zip file", None])
def test_train_on_data_that_is_not_an_npz_exits_2(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], content: bytes | None
) -> None:
    (tmp_path / "m.onnx").write_bytes(_attached().SerializeToString())
    data = tmp_path / "d.npz"
    if content is None:
        with data.open("wb") as file:
            np.save(file, np.zeros((4, 4), np.float32))
    else:
        data.write_bytes(content)
    capsys.readouterr()
    argv = ["train", str(tmp_path / "m.onnx"), "--data", str(data), "--steps", "1"]
    status = cli.main([*argv, "-o", str(tmp_path / "o.onnx")])
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith(f"onnx-optax train: cannot read the data {str(data)!r}")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name", [b"wQ", b"wQ.new", b"wQ.h"])
def test_names_that_are_not_utf8_are_refused_by_name(name: bytes) -> None:
    tx = onnx_optax.adagrad(0.1)
    params = {"wQ": np.ones(3, np.float32)}
    serialized = interop.to_model(tx, params, tx.init(params)).SerializeToString()
    hostile = serialized.replace(name, name.replace(b"Q", b"\xff"))
    assert hostile != serialized
    for entry in (training.check, training.Session, interop.from_model):
        with pytest.raises(ValueError, match="not valid UTF-8"):
            entry(hostile)


def _identity_chain(length: int) -> onnx.ModelProto:
    """w -> Identity x length -> MatMul(x, .) -> y."""
    w = numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    nodes = [
        helper.make_node("Identity", [f"w{i}" if i else "w"], [f"w{i + 1}"]) for i in range(length)
    ]
    nodes.append(helper.make_node("MatMul", ["x", f"w{length}"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 2])],
        initializer=[w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_a_long_identity_chain_does_not_exhaust_the_stack() -> None:
    """Following a weight through 3,000 Identity nodes was recursive (a RecursionError)."""
    model = training.attach(
        _identity_chain(3_000), loss="mse", target="t", optimizer=onnx_optax.adam(0.1)
    )
    (gradient,) = [n for n in model.training_info[0].algorithm.node if n.op_type == "Gradient"]
    assert next(a for a in gradient.attribute if a.name == "xs").strings == [b"w"]


def test_attach_reads_a_path_through_the_loading_layer(tmp_path: pathlib.Path) -> None:
    """attach takes a path like every entry point, with its external data from the model's folder."""
    model = _identity_chain(1)
    onnx.save(
        model,
        str(tmp_path / "m.onnx"),
        save_as_external_data=True,
        location="m.data",
        size_threshold=0,
    )
    attached = training.attach(
        str(tmp_path / "m.onnx"), loss="mse", target="t", optimizer=onnx_optax.adam(0.1)
    )
    (w,) = [i for i in attached.graph.initializer if i.name == "w"]
    np.testing.assert_array_equal(numpy_helper.to_array(w), np.ones((2, 2), np.float32))
