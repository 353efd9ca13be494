"""Import and export: ONNX nodes and models <-> optax transformations."""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import onnx_optax
from tests.support.optimizers import DOMAIN, OPTIMIZERS, keyed_rng, random_state_tensor, tolerance

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from onnx_optax import backend, interop  # noqa: E402
from onnx_optax._src.graph import GraphFunction  # noqa: E402
from onnx_optax._src.onnx_nodes import make_node, read_node  # noqa: E402
from onnx_optax.interop._to_onnx import leaf_names  # noqa: E402

NAMES = list(OPTIMIZERS)


def _transformation(name: str, rng: np.random.Generator, **kwargs: Any) -> Any:
    attributes = OPTIMIZERS[name].draw_attributes(rng)
    return OPTIMIZERS[name].transform(
        float(np.float32(rng.uniform(0.01, 0.3))), attributes, **kwargs
    )


def _params(rng: np.random.Generator, dtype: str, several: bool) -> dict[str, Any]:
    if not several:
        return {"w": jnp.asarray(rng.standard_normal((3, 2)), dtype)}
    return {
        "dense": {"w": jnp.asarray(rng.standard_normal((3, 2)), dtype), "b": jnp.zeros(2, dtype)},
        "scale": jnp.asarray(rng.standard_normal(()), dtype),
    }


def _state_after_steps(tx: Any, params: Any, steps: int) -> Any:
    state = tx.init(params)
    for i in range(steps):
        grads = jax.tree.map(lambda p, i=i: jnp.sin(p + i), params)
        _, state = tx.update(grads, state, params)
    return state


# ------------------------------------------------------------------ from_node


@pytest.mark.parametrize("name", NAMES)
def test_from_node_keeps_float32_attributes(name: str) -> None:
    rng = keyed_rng("node", name)
    attributes = OPTIMIZERS[name].draw_attributes(rng)
    # Not float32-representable on purpose: the node stores float32.
    attributes = {k: v + 1e-9 if v else v for k, v in attributes.items()}
    if name in ("momentum", "nesterov"):
        attributes["mode"] = "standard" if name == "momentum" else "nesterov"
    op_type = {"adagrad": "Adagrad", "adam": "Adam"}.get(name, "Momentum")
    node = make_node(op_type, attributes, ["w"])
    tx = interop.from_node(node, 0.1)
    for key, value in attributes.items():
        expected = value if isinstance(value, str) else float(np.float32(value))
        assert tx.hyperparameters._asdict()[key] == expected
    # And it computes what the op computes with the node's attributes.
    x, g = jnp.array([0.5, -1.0]), jnp.array([0.25, 0.75])
    state = tx.init(x)
    updates, state = jax.jit(tx.update)(g, state, x)
    spec = read_node(node)
    zeros = [np.zeros(2, np.float32)] * (len(spec.state_groups))
    outputs = spec.run(np.float32(0.1), int(tx.init(x).count), x, g, *zeros)
    np.testing.assert_allclose(optax.apply_updates(x, updates), outputs[0], **tolerance("float32"))


def test_from_node_uses_schema_defaults() -> None:
    node = helper.make_node(
        "Adam", ["R", "T", "X", "G", "V", "H"], ["X2", "V2", "H2"], domain=DOMAIN
    )
    attributes = interop.from_node(node, 0.1).hyperparameters._asdict()
    assert attributes == {
        "alpha": float(np.float32(0.9)),
        "beta": float(np.float32(0.999)),
        "epsilon": float(np.float32(1e-6)),
        "norm_coefficient": 0.0,
        "norm_coefficient_post": 0.0,
    }


NODE_ERRORS = [
    (
        "another op",
        helper.make_node("Relu", ["x"], ["y"], name="r"),
        interop.UnsupportedOperatorError,
        r"node 'r' \(ai.onnx.Relu\): unsupported op Relu",
    ),
    (
        "another domain",
        helper.make_node(
            "Adam", ["R", "T", "X", "G", "V", "H"], ["a", "b", "c"], domain="com.example"
        ),
        interop.UnsupportedOperatorError,
        r"unsupported op Adam in domain 'com.example'",
    ),
    (
        "too few inputs",
        helper.make_node("Adam", ["R", "T", "X", "G", "V"], ["a", "b", "c"], domain=DOMAIN),
        ValueError,
        r"has 5 inputs; Adam takes R, T and 4\*n tensors",
    ),
    (
        "wrong output count",
        helper.make_node("Adagrad", ["R", "T", "X", "G", "H"], ["a"], domain=DOMAIN),
        ValueError,
        r"has 1 outputs; with 1 optimized tensor\(s\) Adagrad produces 2",
    ),
    (
        "missing Momentum attribute",
        helper.make_node(
            "Momentum",
            ["R", "T", "X", "G", "V"],
            ["a", "b"],
            domain=DOMAIN,
            alpha=0.9,
            beta=1.0,
            mode="standard",
        ),
        ValueError,
        r"missing required attribute\(s\) norm_coefficient",
    ),
    (
        "unknown attribute",
        helper.make_node(
            "Adagrad", ["R", "T", "X", "G", "H"], ["a", "b"], domain=DOMAIN, lr_decay=0.1
        ),
        ValueError,
        r"unknown attribute 'lr_decay'",
    ),
    (
        "attribute of the wrong type",
        helper.make_node(
            "Adagrad", ["R", "T", "X", "G", "H"], ["a", "b"], domain=DOMAIN, epsilon=1
        ),
        TypeError,
        r"attribute 'epsilon' must be of type FLOAT, got INT",
    ),
    (
        "bad mode",
        helper.make_node(
            "Momentum",
            ["R", "T", "X", "G", "V"],
            ["a", "b"],
            domain=DOMAIN,
            alpha=0.9,
            beta=1.0,
            norm_coefficient=0.0,
            mode="sgd",
        ),
        ValueError,
        r"attribute mode must be 'standard' or 'nesterov', got 'sgd'",
    ),
    (
        "negative epsilon",
        helper.make_node(
            "Adam", ["R", "T", "X", "G", "V", "H"], ["a", "b", "c"], domain=DOMAIN, epsilon=-1.0
        ),
        ValueError,
        r"epsilon must be >= 0",
    ),
]


@pytest.mark.parametrize(
    ("label", "node", "error", "pattern"), NODE_ERRORS, ids=[e[0] for e in NODE_ERRORS]
)
def test_from_node_bad_node(label: str, node: Any, error: type[Exception], pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        interop.from_node(node, 0.1)


def test_backend_run_node_names_the_node_on_mismatched_inputs() -> None:
    node = helper.make_node(
        "Adagrad", ["R", "T", "X", "G", "H"], ["a", "b"], domain=DOMAIN, name="opt"
    )
    x = np.ones(3, np.float32)
    with pytest.raises(
        ValueError, match=r"node 'opt' \(ai.onnx.preview.training.Adagrad\): .*input G has shape"
    ):
        backend.run_node(node, [np.float32(0.1), np.int64(0), x, np.ones(2, np.float32), x])
    with pytest.raises(TypeError, match=r"node 'opt' .*input H has dtype float16"):
        backend.run_node(node, [np.float32(0.1), np.int64(0), x, x, x.astype(np.float16)])


# ------------------------------------------------------------ export / import


@pytest.mark.parametrize("several", [False, True], ids=["one", "several"])
@pytest.mark.parametrize("name", NAMES)
def test_round_trip(name: str, several: bool, dtype: str) -> None:
    rng = keyed_rng("round", name, several, dtype)
    tx = _transformation(name, rng)
    params = _params(rng, dtype, several)
    state = _state_after_steps(tx, params, steps=3)
    model = interop.to_model(tx, params, state)
    onnx.checker.check_model(model)
    imported = interop.from_model(model)
    chex.assert_trees_all_equal(imported.params, params)
    chex.assert_trees_all_equal(imported.state, state)
    assert imported.T == int(state.count)
    assert imported.R == float(np.asarray(tx.learning_rate, dtype))
    for key, value in tx.hyperparameters._asdict().items():
        expected = value if isinstance(value, str) else float(np.float32(value))
        assert imported.transformation.hyperparameters._asdict()[key] == expected
    # The imported optimizer continues exactly where the original would.
    grads = jax.tree.map(jnp.cos, params)
    original = tx.update(grads, state, params)
    resumed = imported.transformation.update(grads, imported.state, imported.params)
    chex.assert_trees_all_close(original, resumed, rtol=8 * float(np.finfo(np.float32).eps))


@pytest.mark.parametrize("name", NAMES)
def test_exported_training_step_runs_like_the_transformation(name: str) -> None:
    """The model's training algorithm, run on XLA, is one update of the transformation."""
    rng = keyed_rng("algo", name)
    tx = _transformation(name, rng)
    params = _params(rng, "float32", several=True)
    state = _state_after_steps(tx, params, steps=2)
    model = interop.to_model(tx, params, state)
    info = model.training_info[0]
    initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    grads = jax.tree.map(jnp.cos, params)
    names = leaf_names(params)[0]
    feeds = {f"{n}.grad": np.asarray(g) for n, g in zip(names, jax.tree.leaves(grads), strict=True)}
    outputs = GraphFunction(info.algorithm, outer_values=initializers)(feeds)
    values = dict(zip((o.name for o in info.algorithm.output), outputs, strict=True))
    new_initializers = {k: values[v] for k, v in ((b.key, b.value) for b in info.update_binding)}

    updates, new_state = jax.jit(tx.update)(grads, state, params)
    new_params = optax.apply_updates(params, updates)
    eps = float(np.finfo(np.float32).eps)
    for n, p in zip(names, jax.tree.leaves(new_params), strict=True):
        np.testing.assert_allclose(new_initializers[n], p, rtol=2 * eps, atol=2 * eps)
    assert int(new_initializers["T"]) == int(new_state.count)
    for group in OPTIMIZERS[name].state_names:
        for n, s in zip(names, jax.tree.leaves(getattr(new_state, group)), strict=True):
            np.testing.assert_array_equal(new_initializers[f"{n}.{group}"], s)


@pytest.mark.parametrize("several", [False, True], ids=["one", "several"])
@pytest.mark.parametrize("name", NAMES)
def test_step_model_runs_on_reference_and_backend(name: str, several: bool, dtype: str) -> None:
    rng = keyed_rng("step", name, several, dtype)
    optimizer = OPTIMIZERS[name]
    tx = _transformation(name, rng)
    params = _params(rng, dtype, several)
    model = interop.step_model(tx, params)
    onnx.checker.check_model(model)
    _, leaves, _ = leaf_names(params)
    grads = [np.asarray(rng.standard_normal(np.shape(p)), dtype) for p in leaves]
    states = [
        [random_state_tensor(rng, s, np.shape(p), dtype) for p in leaves]
        for s in optimizer.state_names
    ]
    T = 3
    R = np.asarray(tx.learning_rate, dtype)
    feeds = [R, np.int64(T), *map(np.asarray, leaves), *grads, *(t for s in states for t in s)]
    ours = backend.prepare(model).run(feeds)
    reference = ReferenceEvaluator(model).run(
        None, dict(zip([i.name for i in model.graph.input], feeds, strict=True))
    )

    # The transformation, from the same state at count T:
    state = optimizer.state(
        jnp.asarray(T, jnp.int32),
        [jax.tree.unflatten(jax.tree.structure(params), s) for s in states],
    )
    grads_tree = jax.tree.unflatten(jax.tree.structure(params), grads)
    updates, new_state = jax.jit(tx.update)(grads_tree, state, params)
    expected = jax.tree.leaves(optax.apply_updates(params, updates))
    expected += [
        leaf for s in optimizer.state_names for leaf in jax.tree.leaves(getattr(new_state, s))
    ]
    eps = float(np.finfo(dtype).eps)
    for out, exp in zip(ours, expected, strict=True):
        np.testing.assert_allclose(out, exp, rtol=2 * eps, atol=2 * eps)
    compare = tolerance("float32")  # the reference rounds some Adam terms to float32
    for ref, exp in zip(reference, expected, strict=True):
        np.testing.assert_allclose(
            np.asarray(ref, np.float64), np.asarray(exp, np.float64), **compare
        )


# ------------------------------------------------------- checking the bindings


def _model(name: str = "adam") -> Any:
    rng = keyed_rng("bind", name)
    tx = _transformation(name, rng)
    params = _params(rng, "float32", several=True)
    return interop.to_model(tx, params, tx.init(params))


def _rebind(model: Any, **changes: str | None) -> Any:
    model = onnx.ModelProto.FromString(model.SerializeToString())
    binding = {b.key: b.value for b in model.training_info[0].update_binding}
    for key, value in changes.items():
        key = key.replace("__", ".").replace("_", "/")
        if value is None:
            binding.pop(key)
        else:
            binding[key] = value
    del model.training_info[0].update_binding[:]
    for key, value in binding.items():
        entry = model.training_info[0].update_binding.add()
        entry.key, entry.value = key, value
    return model


BINDING_ERRORS = [
    (
        "key is not an initializer",
        {"nothing": "T.new"},
        r"update_binding\['nothing'\] = 'T.new': 'nothing' is not an initializer",
    ),
    (
        "value is not an output",
        {"T": "T.next"},
        r"update_binding\['T'\] = 'T.next': 'T.next' is not an output of the training algorithm",
    ),
    (
        "X bound to its V",
        {"scale": "scale.v.new"},
        r"update_binding\['scale'\] should be 'scale.new' \(the Adam node's new value of 'scale'\), but it is 'scale.v.new'",
    ),
    (
        "state binding missing",
        {"scale__h": None},
        r"update_binding\['scale.h'\] should be 'scale.h.new' \(the Adam node's new H of 'scale'\), but it is missing",
    ),
    (
        "T not advanced",
        {"T": None},
        r"T \('T'\) is stored as an initializer but update_binding does not update it",
    ),
]


@pytest.mark.parametrize(
    ("label", "changes", "pattern"), BINDING_ERRORS, ids=[e[0] for e in BINDING_ERRORS]
)
def test_from_model_checks_bindings(
    label: str, changes: dict[str, str | None], pattern: str
) -> None:
    with pytest.raises(ValueError, match=pattern):
        interop.from_model(_rebind(_model(), **changes))


def test_from_model_T_must_advance_by_one() -> None:
    model = _model()
    add = next(n for n in model.training_info[0].algorithm.node if n.op_type == "Add")
    add.op_type = "Sub"
    with pytest.raises(ValueError, match=r"computes 0 from T = 1; it must be T \+ 1"):
        interop.from_model(model)


def _without_initializer(model: Any, name: str) -> Any:
    kept = [i for i in model.graph.initializer if i.name != name]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


def test_from_model_needs_stored_parameters() -> None:
    model = _without_initializer(_model(), "scale")
    with pytest.raises(
        ValueError, match=r"its X input 'scale' is not an initializer of the model's graph"
    ):
        interop.from_model(model)


def test_from_model_needs_training_info_and_one_optimizer() -> None:
    model = _model()
    bare = onnx.ModelProto.FromString(model.SerializeToString())
    del bare.training_info[:]
    with pytest.raises(ValueError, match=r"no training_info"):
        interop.from_model(bare)
    double = onnx.ModelProto.FromString(model.SerializeToString())
    double.training_info.append(double.training_info[0])
    with pytest.raises(ValueError, match=r"holds 2 nodes of 'ai.onnx.preview.training'"):
        interop.from_model(double)


def test_from_model_learning_rate_input() -> None:
    model = _without_initializer(_model(), "R")
    with pytest.raises(
        ValueError,
        match=r"R \('R'\) is a graph input, not stored in the model; pass learning_rate=",
    ):
        interop.from_model(model)
    imported = interop.from_model(model, learning_rate=0.5)
    assert imported.R is None and imported.transformation.learning_rate == 0.5


def test_export_errors() -> None:
    params = {"w": jnp.ones(2)}
    with pytest.raises(TypeError, match=r"built by onnx_optax"):
        interop.to_node(optax.adam(0.1), ["w"])
    tx = onnx_optax.adam(optax.linear_schedule(0.1, 0.0, 10))
    with pytest.raises(TypeError, match=r"learning rate is a schedule.*pass learning_rate="):
        interop.to_model(tx, params, tx.init(params))
    assert interop.to_model(tx, params, tx.init(params), learning_rate=0.1).training_info
    tx = onnx_optax.adam(0.1)
    with pytest.raises(TypeError, match=r"ONNX optimizers take float or double"):
        interop.step_model(tx, {"w": jnp.ones(2, jnp.bfloat16)})
    with pytest.raises(TypeError, match=r"state must be the AdamState"):
        interop.to_model(tx, params, onnx_optax.adagrad(0.1).init(params))
    tx = onnx_optax.adam(0.1, accumulator_dtype=jnp.bfloat16)
    with pytest.raises(TypeError, match=r"ONNX needs the parameter's type float32"):
        interop.to_model(tx, params, tx.init(params))
