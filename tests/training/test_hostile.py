"""Models from strangers: nothing is read from outside the model, nothing comes back silently.

Hostile training models: check, Session and the CLI end in a result or a clear error.

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
from onnx_optax import interop
from tests.support.external_data import canary_cwd  # noqa: F401 (fixtures)
from tests.support.external_data import make_external as _external
from tests.support.external_data import trained_model as _trained_model

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402

from onnx_optax import training  # noqa: E402
from tests.support.training_models import adagrad_model as _adagrad_model  # noqa: E402
from tests.support.training_models import attached_mse as _attached  # noqa: E402
from tests.support.training_models import gradient_node as _gradient  # noqa: E402
from tests.support.training_models import set_attribute as _set_attribute  # noqa: E402
from tests.support.training_models import set_initializer as _set_initializer  # noqa: E402


@pytest.mark.usefixtures("canary_cwd")
def test_an_external_constant_in_the_count_never_reaches_an_error() -> None:
    """The T + 1 of a training model as a Constant whose value is external data."""
    model = _trained_model()
    algorithm = model.training_info[0].algorithm
    (constant,) = [n for n in algorithm.node if n.op_type == "Constant"]
    _external(constant.attribute[0].t, "canary.bin")
    with pytest.raises(ValueError, match="no folder to read external data from") as info:
        interop.from_model(model)
    assert "CANARY" not in str(info.value)


CLEAR = (ValueError, TypeError, NotImplementedError)


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
