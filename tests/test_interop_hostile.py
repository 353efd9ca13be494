"""interop.from_model refuses what it cannot represent exactly (issue 14).

Models are built by hand here with onnx.helper (independent of to_model), then
altered one thing at a time. Each refusal names what is wrong; a refusal of a
valid model beyond from_model says that onnx_optax.training.Session runs it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import onnx_optax

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import interop  # noqa: E402

DOMAIN = "ai.onnx.preview.training"
SESSION = r"onnx_optax\.training\.Session runs"
STATE = {"Adagrad": ("h",), "Adam": ("v", "h"), "Momentum": ("v",)}
ATTRIBUTES: dict[str, dict[str, Any]] = {
    "Adagrad": {},
    "Adam": {},
    "Momentum": {"alpha": 0.9, "beta": 0.1, "norm_coefficient": 0.0, "mode": "standard"},
}


def _value(name: str, k: int, shape: Sequence[int]) -> np.ndarray:
    """A distinct float32 value for tensor ``name`` of parameter ``k`` (written by hand)."""
    size = int(np.prod(shape))
    offset = {"x": 0.0, "v": 0.25, "h": 0.5}[name]
    return (np.arange(size, dtype=np.float32) + k + offset).reshape(shape)


def _model(
    names: Sequence[str] = ("w", "b"),
    *,
    op: str = "Adam",
    shapes: Sequence[Sequence[int]] | None = None,
    T: np.ndarray | None = None,
    R: np.ndarray | None = None,
    paths: Any = None,
    gradient: bool = False,
) -> Any:
    """A training model: stored X, state, T and R; the optimizer node, T + 1, bindings.

    ``gradient=True`` computes G with a Gradient node of a loss (sum of the
    squared parameters, reported as the output 'loss') instead of feeding it.
    """
    shapes = [(2, 3)] * len(names) if shapes is None else shapes
    fields = STATE[op]
    stored = [
        numpy_helper.from_array(_value("x", k, s), n)
        for k, (n, s) in enumerate(zip(names, shapes, strict=True))
    ]
    for field in fields:
        stored += [
            numpy_helper.from_array(_value(field, k, s), f"{n}.{field}")
            for k, (n, s) in enumerate(zip(names, shapes, strict=True))
        ]
    stored.append(numpy_helper.from_array(np.asarray(3, np.int64) if T is None else T, "T"))
    stored.append(numpy_helper.from_array(np.asarray(0.125, np.float32) if R is None else R, "R"))
    main = helper.make_graph(
        [helper.make_node("Identity", [n], [f"{n}.value"]) for n in names],
        "parameters",
        [],
        [helper.make_tensor_value_info(f"{n}.value", TensorProto.FLOAT, None) for n in names],
        initializer=stored,
    )
    grads = [f"{n}.grad" for n in names]
    optimizer = helper.make_node(
        op,
        ["R", "T", *names, *grads, *(f"{n}.{f}" for f in fields for n in names)],
        [f"{n}.new" for n in names] + [f"{n}.{f}.new" for f in fields for n in names],
        name="opt",
        domain=DOMAIN,
        **ATTRIBUTES[op],
    )
    nodes = [
        optimizer,
        helper.make_node(
            "Constant", [], ["T.one"], value=helper.make_tensor("T.one", TensorProto.INT64, [], [1])
        ),
        helper.make_node("Add", ["T", "T.one"], ["T.new"], name="count"),
    ]
    inputs = [helper.make_tensor_value_info(g, TensorProto.FLOAT, None) for g in grads]
    outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in optimizer.output]
    outputs.append(helper.make_tensor_value_info("T.new", TensorProto.INT64, []))
    if gradient:
        squares = [f"{n}.squared" for n in names]
        loss_nodes = [
            helper.make_node("Mul", [n, n], [s]) for n, s in zip(names, squares, strict=True)
        ]
        loss_nodes += [
            helper.make_node("ReduceSum", [s], [f"{s}.sum"], keepdims=0) for s in squares
        ]
        loss_nodes.append(helper.make_node("Sum", [f"{s}.sum" for s in squares], ["objective"]))
        loss_nodes.append(
            helper.make_node(
                "Gradient",
                list(names),
                grads,
                name="grad",
                domain=DOMAIN,
                xs=list(names),
                y="objective",
            )
        )
        loss_nodes.append(helper.make_node("Identity", ["objective"], ["loss"]))
        nodes = loss_nodes + nodes
        inputs = []
        outputs.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    algorithm = helper.make_graph(nodes, "step", inputs, outputs)
    binding = [(n, f"{n}.new") for n in names]
    binding += [(f"{n}.{f}", f"{n}.{f}.new") for f in fields for n in names]
    binding.append(("T", "T.new"))
    model = helper.make_model(
        main, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)]
    )
    model.training_info.append(helper.make_training_info(algorithm, binding, None, None))
    if paths is not None:
        helper.set_model_props(
            model, {"onnx_optax.params": paths if isinstance(paths, str) else json.dumps(paths)}
        )
    return model


def _algorithm(model: Any) -> Any:
    return model.training_info[0].algorithm


def _node(model: Any, name: str) -> Any:
    return next(n for n in _algorithm(model).node if n.name == name)


def _refused(model: Any, pattern: str, error: Any = (ValueError, TypeError)) -> None:
    with pytest.raises(error, match=pattern):
        interop.from_model(model)


# ---------------------------------------------------------- what a valid model gives


def test_a_hand_built_model_imports_exactly() -> None:
    imported = interop.from_model(_model(paths=[["w"], ["b"]]))
    assert imported.T == 3
    assert imported.R == float(np.float32(0.125))
    for k, name in enumerate(["w", "b"]):
        np.testing.assert_array_equal(imported.params[name], _value("x", k, (2, 3)))
        np.testing.assert_array_equal(imported.state.v[name], _value("v", k, (2, 3)))
        np.testing.assert_array_equal(imported.state.h[name], _value("h", k, (2, 3)))
    assert int(imported.state.count) == 3


def test_gradient_outputs_and_a_reported_loss_are_accepted() -> None:
    imported = interop.from_model(_model(gradient=True))
    np.testing.assert_array_equal(imported.params["b"], _value("x", 1, (2, 3)))


@pytest.mark.parametrize("form", ["Add(1, T)", "Sub(T, -1)", "initializer"])
def test_other_exact_forms_of_T_plus_one_are_accepted(form: str) -> None:
    model = _model()
    count, one = (
        _node(model, "count"),
        next(n for n in _algorithm(model).node if n.op_type == "Constant"),
    )
    if form == "Add(1, T)":
        count.input[:] = ["T.one", "T"]
    elif form == "Sub(T, -1)":
        count.op_type = "Sub"
        one.attribute[0].t.CopyFrom(helper.make_tensor("T.one", TensorProto.INT64, [], [-1]))
    else:
        _algorithm(model).node.remove(one)
        _algorithm(model).initializer.append(
            numpy_helper.from_array(np.asarray(1, np.int64), "T.one")
        )
    assert interop.from_model(model).T == 3


def test_models_written_by_to_model_still_import() -> None:
    tx = onnx_optax.adam(0.05, beta=0.99)
    params = {"dense": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}, "scale": jnp.asarray(2.0)}
    state = tx.init(params)
    _, state = tx.update(jax.tree.map(jnp.cos, params), state, params)
    imported = interop.from_model(interop.to_model(tx, params, state))
    assert imported.T == int(state.count) == 2  # Adam counts from 1
    for got, want in zip(jax.tree.leaves(imported.params), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(jax.tree.leaves(imported.state), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_single_array_written_by_to_model_still_imports() -> None:
    tx = onnx_optax.adagrad(0.1)
    params = jnp.arange(3.0)
    imported = interop.from_model(interop.to_model(tx, params, tx.init(params)))
    np.testing.assert_array_equal(imported.params["x"], [0.0, 1.0, 2.0])


def test_models_written_by_training_attach_still_import() -> None:
    training = pytest.importorskip("onnx_optax.training")
    weight = np.arange(6, dtype=np.float32).reshape(3, 2)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        initializer=[numpy_helper.from_array(weight, "W")],
    )
    inference = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model = training.attach(inference, loss="mse", target="t", optimizer=onnx_optax.adam(0.1))
    imported = interop.from_model(model)
    np.testing.assert_array_equal(imported.params["W"], weight)
    assert imported.T == 1 and imported.R == float(np.float32(0.1))


# ------------------------------------ finding 1: nodes, bindings, versions it ignored


def test_an_unknown_domain_op_in_the_algorithm_is_refused() -> None:
    model = _model()
    _algorithm(model).node.append(
        helper.make_node("Frobnicate", ["w.grad"], ["noise"], name="evil", domain="com.evil")
    )
    model.opset_import.append(helper.make_opsetid("com.evil", 1))
    _refused(model, r"node 'evil' \(com\.evil\.Frobnicate\).*no op of domain 'com\.evil'")


@pytest.mark.parametrize("gradient", [False, True], ids=["fed G", "Gradient output"])
def test_a_node_between_the_gradient_and_the_optimizer_is_refused(gradient: bool) -> None:
    model = _model(gradient=gradient)
    algorithm = _algorithm(model)
    opt = _node(model, "opt")
    opt.input[list(opt.input).index("w.grad")] = "w.grad.scaled"
    algorithm.node.insert(
        list(algorithm.node).index(opt),
        helper.make_node("Mul", ["w.grad", "minus"], ["w.grad.scaled"], name="scale"),
    )
    algorithm.initializer.append(numpy_helper.from_array(np.asarray(-1000, np.float32), "minus"))
    _refused(
        model,
        rf"its G input 'w\.grad\.scaled' \(the gradient of 'w'\) is computed by node 'scale' "
        rf"\(ai\.onnx\.Mul\).*{SESSION}",
    )


def test_a_gradient_with_respect_to_another_tensor_is_refused() -> None:
    model = _model(gradient=True)
    opt = _node(model, "opt")
    opt.input[2:4] = ["w", "b"]
    opt.input[4:6] = ["b.grad", "w.grad"]  # w's update gets b's gradient
    _refused(model, r"its G input 'b\.grad' \(the gradient of 'w'\) is output 1 of node 'grad'")


def test_a_stored_gradient_is_refused() -> None:
    model = _model()
    model.graph.initializer.append(numpy_helper.from_array(np.ones((2, 3), np.float32), "w.grad"))
    _refused(model, r"its G input 'w\.grad' \(the gradient of 'w'\) is a stored tensor")


def test_a_learning_rate_schedule_is_refused() -> None:
    model = _model()
    opt = _node(model, "opt")
    opt.input[0] = "R.decayed"
    _algorithm(model).node.insert(
        0, helper.make_node("Mul", ["R", "R"], ["R.decayed"], name="decay")
    )
    pattern = rf"R \('R\.decayed'\) is computed by node 'decay' .*schedule.*{SESSION}"
    _refused(model, pattern)
    with pytest.raises(ValueError, match=pattern):  # a learning rate given does not hide it
        interop.from_model(model, learning_rate=0.1)


def test_a_constant_T_is_refused() -> None:
    model = _model()
    opt = _node(model, "opt")
    opt.input[1] = "T.fixed"
    algorithm = _algorithm(model)
    algorithm.initializer.append(numpy_helper.from_array(np.asarray(5, np.int64), "T.fixed"))
    algorithm.node.remove(_node(model, "count"))
    kept = [(b.key, b.value) for b in model.training_info[0].update_binding if b.key != "T"]
    del model.training_info[0].update_binding[:]
    for key, value in kept:
        model.training_info[0].update_binding.add(key=key, value=value)
    _refused(model, rf"T \('T\.fixed'\) is a constant of the model.*{SESSION}")


def test_an_extra_binding_is_refused() -> None:
    model = _model()
    model.training_info[0].update_binding.add(key="R", value="w.new")
    _refused(model, rf"update_binding\['R'\] = 'w\.new' writes 'R'.*{SESSION}")


def test_a_key_bound_twice_is_refused() -> None:
    model = _model()
    bindings = model.training_info[0].update_binding
    entries = [(b.key, b.value) for b in bindings]
    del bindings[:]
    for key, value in [("w", "w.v.new"), *entries]:
        bindings.add(key=key, value=value)
    _refused(model, r"update_binding binds 'w' twice \(to 'w\.v\.new' and 'w\.new'\)")


def test_a_second_entry_or_an_initialization_graph_is_refused() -> None:
    model = _model()
    second = helper.make_training_info(
        helper.make_graph(
            [helper.make_node("Identity", ["T"], ["T.copy"])],
            "more",
            [],
            [helper.make_tensor_value_info("T.copy", TensorProto.INT64, [])],
        ),
        [],
        None,
        None,
    )
    model.training_info.append(second)
    _refused(model, rf"2 training_info entries.*{SESSION}")
    model = _model()
    info = model.training_info[0]
    info.initialization.CopyFrom(
        helper.make_graph(
            [
                helper.make_node(
                    "Constant",
                    [],
                    ["R.init"],
                    value=numpy_helper.from_array(np.asarray(9.0, np.float32)),
                )
            ],
            "init",
            [],
            [helper.make_tensor_value_info("R.init", TensorProto.FLOAT, [])],
        )
    )
    info.initialization_binding.add(key="R", value="R.init")
    _refused(model, rf"has an initialization graph.*{SESSION}")


def test_repeated_inputs_of_the_optimizer_are_refused() -> None:
    model = _model()
    opt = _node(model, "opt")
    opt.input[5] = "w.grad"  # b's gradient is w's
    _refused(model, r"names \['w\.grad'\] more than once among its inputs")


def _set_opset(domain: str, version: int) -> Callable[[Any], None]:
    def change(model: Any) -> None:
        (opset,) = [o for o in model.opset_import if o.domain == domain]
        opset.version = version

    return change


def _set_ir(version: int) -> Callable[[Any], None]:
    def change(model: Any) -> None:
        model.ir_version = version

    return change


def _drop_training_opset(model: Any) -> None:
    kept = [o for o in model.opset_import if o.domain != DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(kept)


def _duplicate_opset(model: Any) -> None:
    model.opset_import.append(helper.make_opsetid("ai.onnx", 13))


VERSIONS = [
    (
        "training opset 2",
        _set_opset(DOMAIN, 2),
        r"'ai\.onnx\.preview\.training' opset 2; only version 1",
    ),
    ("training opset 10**9", _set_opset(DOMAIN, 10**9), r"opset 1000000000; only version 1"),
    (
        "ai.onnx opset 10**9",
        _set_opset("", 10**9),
        r"'ai\.onnx' opset 1000000000; the installed onnx",
    ),
    ("ai.onnx opset 0", _set_opset("", 0), r"'ai\.onnx' opset 0; versions start at 1"),
    ("IR 10**9", _set_ir(10**9), r"IR version 1000000000 is newer than the installed onnx"),
    ("IR 3", _set_ir(3), r"IR version is 3; training_info needs IR version 7"),
    (
        "no training opset",
        _drop_training_opset,
        r"imports no opset of 'ai\.onnx\.preview\.training'",
    ),
    ("ai.onnx twice", _duplicate_opset, r"imports an opset of 'ai\.onnx' more than once"),
]


@pytest.mark.parametrize(("label", "change", "pattern"), VERSIONS, ids=[v[0] for v in VERSIONS])
def test_versions_beyond_the_installed_onnx_are_refused(
    label: str, change: Callable[[Any], None], pattern: str
) -> None:
    model = _model()
    change(model)
    _refused(model, pattern, ValueError)


# ------------------------------------------- finding 2: parameter paths that collide


@pytest.mark.parametrize(
    ("names", "paths"),
    [(["a/b", "a"], [["a", "b"], ["a"]]), (["a", "a/b"], [["a"], ["a", "b"]])],
    ids=["prefix second", "prefix first"],
)
def test_colliding_parameter_paths_are_refused(names: list[str], paths: list[list[str]]) -> None:
    _refused(
        _model(names, paths=paths),
        r"metadata 'onnx_optax\.params' nests tensors .* at the same key \['a'\]",
        ValueError,
    )


def test_malformed_parameter_paths_are_refused() -> None:
    _refused(_model(paths='[["w"], '), r"metadata 'onnx_optax\.params' is not JSON", ValueError)
    # JSON nested past the interpreter's stack (json raises RecursionError): issue 33.
    deep = "[" * 100_000 + "]" * 100_000
    _refused(_model(paths=deep), r"metadata 'onnx_optax\.params' nests too deep", ValueError)
    _refused(
        _model(paths=[["w"], [1]]),
        r"metadata 'onnx_optax\.params' must be a list of lists of strings",
        ValueError,
    )


def test_parameter_paths_nest_when_they_do_not_collide() -> None:
    imported = interop.from_model(_model(["a/b", "c"], paths=[["a", "b"], ["c"]]))
    assert set(imported.params) == {"a", "c"} and set(imported.params["a"]) == {"b"}
    np.testing.assert_array_equal(imported.params["a"]["b"], _value("x", 0, (2, 3)))
    np.testing.assert_array_equal(imported.state.h["c"], _value("h", 1, (2, 3)))


# ----------------------------------------------- finding 3: T, R and X of other types


def _string(name: str, values: Sequence[bytes], dims: Sequence[int] = ()) -> Any:
    return helper.make_tensor(name, TensorProto.STRING, list(dims), list(values))  # type: ignore[arg-type]


def _replace(model: Any, tensor: Any) -> Any:
    (index,) = [k for k, t in enumerate(model.graph.initializer) if t.name == tensor.name]
    model.graph.initializer[index].CopyFrom(tensor)
    return model


STORED = [
    (
        "T float 2.7",
        numpy_helper.from_array(np.asarray(2.7, np.float32), "T"),
        r"T \('T'\) is float32\[\]; ONNX's T is an int64 scalar",
    ),
    ("T string '12'", _string("T", [b"12"]), r"tensor 'T': element type STRING"),
    ("T int32", numpy_helper.from_array(np.asarray(3, np.int32), "T"), r"T \('T'\) is int32\[\]"),
    (
        "T float NaN",
        numpy_helper.from_array(np.asarray(np.nan, np.float32), "T"),
        r"T \('T'\) is float32\[\]",
    ),
    (
        "T not a scalar",
        numpy_helper.from_array(np.asarray([3], np.int64), "T"),
        r"T \('T'\) is int64\[1\]",
    ),
    (
        "T negative",
        numpy_helper.from_array(np.asarray(-3, np.int64), "T"),
        r"T \('T'\) is -3; an update count is never negative",
    ),
    ("R string '0.1'", _string("R", [b"0.1"]), r"tensor 'R': element type STRING"),
    (
        "R int64",
        numpy_helper.from_array(np.asarray(1, np.int64), "R"),
        r"R \('R'\) is int64\[\]; ONNX's R is a float or double scalar",
    ),
    (
        "R not a scalar",
        numpy_helper.from_array(np.asarray([0.1], np.float32), "R"),
        r"R \('R'\) is float32\[1\]",
    ),
    (
        "R NaN",
        numpy_helper.from_array(np.asarray(np.nan, np.float32), "R"),
        r"R \('R'\) is nan; a learning rate must be finite",
    ),
    ("R inf", numpy_helper.from_array(np.asarray(np.inf, np.float32), "R"), r"R \('R'\) is inf"),
    ("X string", _string("w", [b"1"] * 6, (2, 3)), r"tensor 'w': element type STRING"),
    (
        "X int32",
        numpy_helper.from_array(np.ones((2, 3), np.int32), "w"),
        r"X 'w' is int32; ONNX optimizers take float or double",
    ),
    (
        "V shaped unlike X",
        numpy_helper.from_array(np.ones(6, np.float32), "w.v"),
        r"V 'w\.v' is float32\[6\] but X 'w' is float32\[2, 3\]",
    ),
    (
        "X of two types",
        numpy_helper.from_array(np.ones((2, 3), np.float64), "b"),
        r"X 'b' is float64\[2, 3\] but X 'w' is float32\[2, 3\]",
    ),
]


@pytest.mark.parametrize(("label", "tensor", "pattern"), STORED, ids=[s[0] for s in STORED])
def test_stored_tensors_of_the_wrong_type_or_value_are_refused(
    label: str, tensor: Any, pattern: str
) -> None:
    _refused(_replace(_model(), tensor), pattern)


def test_double_tensors_need_64_bit_jax() -> None:
    model = _model()
    for k, tensor in enumerate(list(model.graph.initializer)):
        if tensor.data_type == TensorProto.FLOAT and tensor.dims:
            array = numpy_helper.to_array(tensor).astype(np.float64)
            model.graph.initializer[k].CopyFrom(numpy_helper.from_array(array, tensor.name))
    with jax.enable_x64(False):
        _refused(model, r"the tensors are float64, which needs 64-bit JAX", TypeError)
    with jax.enable_x64(True):
        imported = interop.from_model(model)
        assert imported.params["w"].dtype == np.float64


# ---------------------------------------------------- finding 4: exactly T + 1


def _count_constant(value: Any) -> Callable[[Any], None]:
    def change(model: Any) -> None:
        one = next(n for n in _algorithm(model).node if n.op_type == "Constant")
        one.attribute[0].t.CopyFrom(value)

    return change


def _count_op(op: str, inputs: Sequence[str]) -> Callable[[Any], None]:
    def change(model: Any) -> None:
        count = _node(model, "count")
        count.op_type = op
        count.input[:] = list(inputs)

    return change


def _int64(value: int, dims: Sequence[int] = ()) -> Any:
    return helper.make_tensor("T.one", TensorProto.INT64, list(dims), [value])


def _both(*changes: Callable[[Any], None]) -> Callable[[Any], None]:
    def change(model: Any) -> None:
        for each in changes:
            each(model)

    return change


# (label, stored T, change, message). At T = 1, T * 2 and T + T equal T + 1; at T = 0,
# so does 1 - T: a count checked by its value at today's T would let them pass.
INCREMENTS = [
    (
        "T + (2**32 + 1)",
        3,
        _count_constant(_int64(2**32 + 1)),
        r"is T \+ 4294967297, which computes 4294967300 from T = 3; it must be T \+ 1",
    ),
    (
        "T * 2 at T = 1",
        1,
        _both(_count_constant(_int64(2)), _count_op("Mul", ["T", "T.one"])),
        r"is computed by node 'count' \(ai\.onnx\.Mul\)",
    ),
    (
        "T + T at T = 1",
        1,
        _count_op("Add", ["T", "T"]),
        r"is node 'count' \(ai\.onnx\.Add\) of \['T', 'T'\]",
    ),
    (
        "1 - T at T = 0",
        0,
        _count_op("Sub", ["T.one", "T"]),
        r"is 1 - T, which computes 1 from T = 0; it must be T \+ 1",
    ),
    (
        "T + [1]",
        3,
        _count_constant(_int64(1, [1])),
        r"is node 'count' \(ai\.onnx\.Add\) of T and 'T\.one', a int64\[1\] tensor",
    ),
    (
        "T + 1.0",
        3,
        _count_constant(helper.make_tensor("T.one", TensorProto.FLOAT, [], [1.0])),
        r"is node 'count' \(ai\.onnx\.Add\) of T and 'T\.one', a float32\[\] tensor",
    ),
    (
        "T + a fed value",
        3,
        _count_op("Add", ["T", "w.grad"]),
        r"is node 'count' \(ai\.onnx\.Add\) of T and 'w\.grad', which is not a constant",
    ),
]


@pytest.mark.parametrize(
    ("label", "T", "change", "pattern"), INCREMENTS, ids=[i[0] for i in INCREMENTS]
)
def test_only_exactly_T_plus_one_counts(
    label: str, T: int, change: Callable[[Any], None], pattern: str
) -> None:
    model = _model(T=np.asarray(T, np.int64))
    change(model)
    _refused(model, r"update_binding\['T'\] = 'T\.new' " + pattern, ValueError)


def test_training_check_shares_the_exact_count() -> None:
    training = pytest.importorskip("onnx_optax.training")
    model = _model()
    _count_constant(_int64(2**32 + 1))(model)
    problems = training.check(model)
    assert any("is not T + 1" in p and "4294967297" in p for p in problems), problems


# -------------------------------------------- finding 5: many tensors, read linearly


def test_eight_thousand_parameters_import_correctly() -> None:
    n = 8000
    names = [f"layer{k}/w" for k in range(n)]
    shapes = [(2,)] * n
    model = _model(names, op="Adagrad", shapes=shapes, paths=[n.split("/") for n in names])
    assert len(model.graph.initializer) == 2 * n + 2
    imported = interop.from_model(model)
    assert imported.T == 3 and len(imported.params) == n
    for k in range(n):
        np.testing.assert_array_equal(imported.params[f"layer{k}"]["w"], [k, k + 1])
        np.testing.assert_array_equal(imported.state.h[f"layer{k}"]["w"], [k + 0.5, k + 1.5])
