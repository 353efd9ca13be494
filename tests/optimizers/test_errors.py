"""Bad input fails at trace time with a clear TypeError/ValueError naming the argument.

The catalogue below is one row per bad input: a label, the call, the exception
type and a pattern the message must contain. Every row runs eagerly; rows whose
inputs are arrays also run under ``jax.jit``, where the same Python error must
come out of tracing (never an XLA error, never a silently wrong number).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import onnx_optax
from onnx_optax import ops

f32 = np.float32
X = np.ones((3,), f32)
X2 = np.ones((2, 2), f32)
R = f32(0.1)
MOMENTUM = {"alpha": 0.9, "beta": 1.0, "norm_coefficient": 0.0, "mode": "standard"}


def _raises(fn: Callable[[], Any], error: type[Exception], pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        fn()


# (label, call, exception, pattern, also under jit)
OP_CASES: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    ("adagrad: no tensors", lambda: ops.adagrad(R, 0), TypeError, r"3\*n tensors.*got 0"),
    ("adagrad: 4 tensors", lambda: ops.adagrad(R, 0, X, X, X, X), TypeError, r"got 4"),
    ("adam: 5 tensors", lambda: ops.adam(R, 0, X, X, X, X, X), TypeError, r"4\*n tensors.*got 5"),
    ("momentum: 2 tensors", lambda: ops.momentum(R, 0, X, X, **MOMENTUM), TypeError, r"got 2"),
    ("G shape differs", lambda: ops.adagrad(R, 0, X, X2, X), ValueError, r"input G has shape"),
    (
        "H_2 shape differs",
        lambda: ops.adam(R, 0, X, X2, X, X2, X, X2, X, X),
        ValueError,
        r"input H_2 has shape \(3,\) but X_2 has shape \(2, 2\)",
    ),
    (
        "integer X",
        lambda: ops.adagrad(R, 0, np.ones(3, np.int32), X, X),
        TypeError,
        r"input X has dtype int32.*floating point",
    ),
    (
        "bool G",
        lambda: ops.adagrad(R, 0, X, np.ones(3, bool), X),
        TypeError,
        r"input G has dtype bool",
    ),
    (
        "complex V",
        lambda: ops.momentum(R, 0, X, X, X.astype(np.complex64), **MOMENTUM),
        TypeError,
        r"input V has dtype complex64",
    ),
    (
        "mixed float dtypes",
        lambda: ops.adagrad(R, 0, X, X.astype(np.float16), X),
        TypeError,
        r"input G has dtype float16 but X has float32",
    ),
    ("string tensor", lambda: ops.adagrad(R, 0, "x", X, X), TypeError, r"input X must be a tensor"),
    (
        "float64 tensors without 64-bit JAX",
        lambda: ops.adagrad(R, 0, X.astype(np.float64), X.astype(np.float64), X.astype(np.float64)),
        TypeError,
        r"onnx_optax.ops.adagrad: input X is float64, which needs 64-bit JAX",
    ),
    ("None tensor", lambda: ops.adagrad(R, 0, X, None, X), TypeError, r"input G must be a tensor"),
    (
        "R not scalar",
        lambda: ops.adagrad(np.ones(1, f32), 0, X, X, X),
        ValueError,
        r"R must be a scalar",
    ),
    (
        "R integer array",
        lambda: ops.adagrad(np.int32(1), 0, X, X, X),
        TypeError,
        r"R must be a floating",
    ),
    ("R bool", lambda: ops.adagrad(True, 0, X, X, X), TypeError, r"R must be a floating"),
    ("R string", lambda: ops.adagrad("0.1", 0, X, X, X), TypeError, r"input R must be a tensor"),
    (
        "T not scalar",
        lambda: ops.adagrad(R, np.zeros(2, np.int64), X, X, X),
        ValueError,
        r"T must be a scalar",
    ),
    ("T float", lambda: ops.adagrad(R, 1.0, X, X, X), TypeError, r"T must be an integer"),
    ("T float array", lambda: ops.adagrad(R, f32(1), X, X, X), TypeError, r"T must be an integer"),
    ("T bool", lambda: ops.adagrad(R, True, X, X, X), TypeError, r"T must be an integer"),
    (
        "T negative",
        lambda: ops.adam(R, -1, X, X, X, X),
        ValueError,
        r"T is an update count and must be >= 0",
    ),
    (
        "T too large for int32",
        lambda: ops.adam(R, 2**31, X, X, X, X),
        ValueError,
        r"enable 64-bit JAX",
    ),
    (
        "unknown mode",
        lambda: ops.momentum(R, 0, X, X, X, **{**MOMENTUM, "mode": "nestrov"}),
        ValueError,
        r"mode must be 'standard' or 'nesterov', got 'nestrov'",
    ),
    (
        "mode not a string",
        lambda: ops.momentum(R, 0, X, X, X, **{**MOMENTUM, "mode": 1}),
        TypeError,
        r"mode must be the string",
    ),
    (
        "negative epsilon",
        lambda: ops.adagrad(R, 0, X, X, X, epsilon=-1e-6),
        ValueError,
        r"epsilon must be >= 0",
    ),
    (
        "NaN epsilon",
        lambda: ops.adam(R, 0, X, X, X, X, epsilon=float("nan")),
        ValueError,
        r"epsilon must be finite",
    ),
    (
        "inf epsilon",
        lambda: ops.adagrad(R, 0, X, X, X, epsilon=float("inf")),
        ValueError,
        r"epsilon must be finite",
    ),
    (
        "adam alpha > 1",
        lambda: ops.adam(R, 1, X, X, X, X, alpha=1.5),
        ValueError,
        r"alpha must be <= 1",
    ),
    (
        "adam beta < 0",
        lambda: ops.adam(R, 1, X, X, X, X, beta=-0.1),
        ValueError,
        r"beta must be >= 0",
    ),
    (
        "negative decay",
        lambda: ops.adagrad(R, 1, X, X, X, decay_factor=-0.1),
        ValueError,
        r"decay_factor must be >= 0",
    ),
    (
        "attribute string",
        lambda: ops.adagrad(R, 0, X, X, X, epsilon="1e-6"),
        TypeError,
        r"attribute epsilon must be a real number",
    ),
    (
        "attribute bool",
        lambda: ops.adam(R, 0, X, X, X, X, alpha=True),
        TypeError,
        r"attribute alpha must be a real number",
    ),
    (
        "unknown attribute",
        lambda: ops.adagrad(R, 0, X, X, X, learning_rate=0.1),
        TypeError,
        r"unexpected keyword argument 'learning_rate'",
    ),
    (
        "missing required momentum attribute",
        lambda: ops.momentum(R, 0, X, X, X, alpha=0.9, beta=1.0, mode="standard"),
        TypeError,
        r"missing 1 required keyword-only argument: 'norm_coefficient'",
    ),
]


@pytest.mark.parametrize(
    ("label", "call", "error", "pattern"), OP_CASES, ids=[c[0] for c in OP_CASES]
)
def test_op_bad_input(
    label: str, call: Callable[[], Any], error: type[Exception], pattern: str
) -> None:
    _raises(call, error, pattern)


def test_op_errors_under_jit() -> None:
    """The checks run on abstract values too: the same errors come out of tracing."""
    _raises(
        lambda: jax.jit(lambda x, g: ops.adagrad(R, 0, x, g, x))(X, X2),
        ValueError,
        r"input G has shape",
    )
    _raises(
        lambda: jax.jit(lambda t: ops.adagrad(R, t, X, X, X))(1.0),
        TypeError,
        r"T must be an integer",
    )
    _raises(
        lambda: jax.jit(lambda r: ops.adagrad(r, 0, X, X, X))(np.ones(2, f32)),
        ValueError,
        r"R must be a scalar",
    )
    _raises(
        lambda: jax.jit(lambda e: ops.adagrad(R, 0, X, X, X, epsilon=e))(1e-6),
        TypeError,
        r"attribute epsilon must be a constant",
    )


def test_op_accepts_traced_R_and_T() -> None:
    out = jax.jit(lambda r, t: ops.adam(r, t, X, X, X, X))(R, 3)
    assert out[0].shape == (3,)


def test_large_T_works_with_x64() -> None:
    with jax.enable_x64(True):
        x_new, _, _ = ops.adam(R, 2**40, X, X, X, X)
        assert np.all(np.isfinite(np.asarray(x_new)))


PARAMS = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
GRADS = jax.tree.map(jnp.ones_like, PARAMS)
FACTORIES: dict[str, Callable[..., Any]] = {
    "adagrad": onnx_optax.adagrad,
    "adam": onnx_optax.adam,
    "momentum": lambda lr, **kw: onnx_optax.momentum(
        lr, **{"alpha": 0.9, "beta": 1.0, "norm_coefficient": 0.0, **kw}
    ),
    "nesterov": lambda lr, **kw: onnx_optax.nesterov(
        lr, **{"alpha": 0.9, "beta": 1.0, "norm_coefficient": 0.0, **kw}
    ),
}

TRANSFORM_CASES: list[tuple[str, Callable[[Callable[..., Any]], Any], type[Exception], str]] = [
    (
        "params missing when norm_coefficient reads X",
        lambda make: make(0.1, norm_coefficient=0.01).update(
            GRADS, make(0.1, norm_coefficient=0.01).init(PARAMS)
        ),
        ValueError,
        r"norm_coefficient.*needs the parameters",
    ),
    (
        "updates and state trees differ",
        lambda make: make(0.1).update({"w": GRADS["w"]}, make(0.1).init(PARAMS)),
        ValueError,
        r"updates \(gradients\) and state\.\w+ have different tree structures",
    ),
    (
        "params tree differs",
        lambda make: make(0.1, norm_coefficient=0.1).update(
            GRADS, make(0.1).init(PARAMS), {"w": PARAMS["w"]}
        ),
        ValueError,
        r"updates \(gradients\) and params have different tree structures",
    ),
    (
        "update leaf shape differs from state",
        lambda make: make(0.1).update({**GRADS, "b": jnp.zeros(4)}, make(0.1).init(PARAMS)),
        ValueError,
        r"updates\['b'\] has shape \(4,\) but state\.\w+\['b'\] has shape \(3,\)",
    ),
    (
        "integer params at init",
        lambda make: make(0.1).init({"w": jnp.ones(3, jnp.int32)}),
        TypeError,
        r"params\['w'\] has dtype int32",
    ),
    (
        "integer gradient",
        lambda make: make(0.1).update(
            {**GRADS, "b": jnp.zeros(3, jnp.int32)}, make(0.1).init(PARAMS)
        ),
        TypeError,
        r"updates\['b'\] must be a floating-point array",
    ),
    (
        "state of another optimizer",
        lambda make: make(0.1).update(GRADS, optax.sgd(0.1).init(PARAMS)),
        TypeError,
        r"state must be a",
    ),
    (
        "learning rate not scalar",
        lambda make: make(jnp.ones(2)),
        ValueError,
        r"learning_rate must be a scalar",
    ),
    (
        "learning rate string",
        lambda make: make("0.1"),
        TypeError,
        r"learning_rate must be a real number",
    ),
    (
        "negative initial_count",
        lambda make: make(0.1, initial_count=-1),
        ValueError,
        r"initial_count must be in",
    ),
    (
        "float initial_count",
        lambda make: make(0.1, initial_count=1.0),
        TypeError,
        r"initial_count must be an integer",
    ),
    (
        "initial_count over int32",
        lambda make: make(0.1, initial_count=2**31),
        ValueError,
        r"initial_count must be in",
    ),
    (
        "integer accumulator dtype",
        lambda make: make(0.1, accumulator_dtype=jnp.int32),
        TypeError,
        r"accumulator_dtype must be a floating dtype",
    ),
    (
        "unknown accumulator dtype",
        lambda make: make(0.1, accumulator_dtype="float33"),
        TypeError,
        r"accumulator_dtype must be a floating dtype",
    ),
    (
        "schedule returns a vector",
        lambda make: make(lambda count: jnp.ones(2)).update(GRADS, make(0.1).init(PARAMS)),
        ValueError,
        r"schedule returned shape \(2,\)",
    ),
    (
        "unknown hyperparameter",
        lambda make: make(0.1, learning_rate_decay=0.1),
        TypeError,
        r"unexpected keyword argument",
    ),
]


@pytest.mark.parametrize("optimizer", list(FACTORIES))
@pytest.mark.parametrize(
    ("label", "call", "error", "pattern"), TRANSFORM_CASES, ids=[c[0] for c in TRANSFORM_CASES]
)
def test_transform_bad_input(
    optimizer: str, label: str, call: Callable[..., Any], error: type[Exception], pattern: str
) -> None:
    _raises(lambda: call(FACTORIES[optimizer]), error, pattern)


HYPERPARAMETER_CASES = [
    (
        onnx_optax.adagrad,
        {"epsilon": -1.0},
        ValueError,
        r"onnx_optax.adagrad: epsilon must be >= 0",
    ),
    (onnx_optax.adagrad, {"decay_factor": -0.5}, ValueError, r"decay_factor must be >= 0"),
    (
        onnx_optax.adagrad,
        {"initial_accumulator_value": float("nan")},
        ValueError,
        r"initial_accumulator_value must be finite",
    ),
    (
        onnx_optax.adam,
        {"epsilon": float("inf")},
        ValueError,
        r"onnx_optax.adam: epsilon must be finite",
    ),
    (onnx_optax.adam, {"alpha": 1.01}, ValueError, r"alpha must be <= 1"),
    (onnx_optax.adam, {"beta": -0.01}, ValueError, r"beta must be >= 0"),
    (
        onnx_optax.adam,
        {"norm_coefficient_post": "0.1"},
        TypeError,
        r"norm_coefficient_post must be a real number",
    ),
    (
        onnx_optax.momentum,
        {"alpha": float("nan"), "beta": 1.0, "norm_coefficient": 0.0},
        ValueError,
        r"onnx_optax.momentum: alpha must be finite",
    ),
    (
        onnx_optax.nesterov,
        {"alpha": 0.9, "beta": jnp.ones(2), "norm_coefficient": 0.0},
        ValueError,
        r"onnx_optax.nesterov: beta must be a scalar, got shape \(2,\)",
    ),
]


@pytest.mark.parametrize(("factory", "kwargs", "error", "pattern"), HYPERPARAMETER_CASES)
def test_hyperparameter_out_of_range(
    factory: Callable[..., Any], kwargs: dict[str, Any], error: type[Exception], pattern: str
) -> None:
    _raises(lambda: factory(0.1, **kwargs), error, pattern)


def test_transform_errors_under_jit() -> None:
    tx = onnx_optax.adam(0.1, norm_coefficient=0.01)
    state = tx.init(PARAMS)
    _raises(lambda: jax.jit(tx.update)(GRADS, state), ValueError, r"needs the parameters")


def test_momentum_mode_errors() -> None:
    _raises(
        lambda: onnx_optax.momentum(
            0.1, alpha=0.9, beta=1.0, norm_coefficient=0.0, mode="Nesterov"
        ),
        ValueError,
        r"mode must be 'standard' or 'nesterov', got 'Nesterov'",
    )
    _raises(
        lambda: onnx_optax.momentum(0.1, alpha=0.9, beta=1.0, norm_coefficient=0.0, mode=None),
        TypeError,
        r"mode must be the string",
    )
    _raises(lambda: onnx_optax.momentum(0.1, alpha=0.9, beta=1.0), TypeError, r"norm_coefficient")


def test_traced_norm_coefficient_needs_params() -> None:
    """Under inject_hyperparams the coefficient is data: params are required."""
    tx = optax.inject_hyperparams(onnx_optax.adagrad)(learning_rate=0.1)
    state = tx.init(PARAMS)
    _raises(lambda: jax.jit(tx.update)(GRADS, state), ValueError, r"needs the parameters")
    updates, _ = jax.jit(tx.update)(GRADS, state, PARAMS)
    assert jax.tree.structure(updates) == jax.tree.structure(PARAMS)


# ----------------------------------------------------------------------------
# Adversarial use of every other public entry point: wrong types, wrong trees,
# wrong counts. Each row: (label, call, exception, pattern).
# ----------------------------------------------------------------------------

ADAM = onnx_optax.adam(0.1)
ADAM_STATE = ADAM.init(PARAMS)

ENTRY_POINT_CASES: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    (
        "learning rate None",
        lambda: onnx_optax.adam(None),
        TypeError,
        r"learning_rate must be a real number",
    ),
    (
        "learning rate list",
        lambda: onnx_optax.adagrad([0.1]),
        TypeError,
        r"learning_rate must be a real number",
    ),
    (
        "learning rate bool",
        lambda: onnx_optax.adam(True),
        TypeError,
        r"learning_rate must be a real number",
    ),
    (
        "alpha string",
        lambda: onnx_optax.momentum(0.1, alpha="0.9", beta=1.0, norm_coefficient=0.0),
        TypeError,
        r"alpha must be a real number",
    ),
    (
        "initial_count bool",
        lambda: onnx_optax.adam(0.1, initial_count=True),
        TypeError,
        r"initial_count must be an integer",
    ),
    (
        "accumulator dtype object",
        lambda: onnx_optax.adam(0.1, accumulator_dtype=object),
        TypeError,
        r"accumulator_dtype must be a floating dtype",
    ),
    (
        "pack_leaves_below string",
        lambda: onnx_optax.adam(0.1, pack_leaves_below="10"),
        TypeError,
        r"pack_leaves_below must be an integer",
    ),
    (
        "nesterov given a mode",
        lambda: onnx_optax.nesterov(
            0.1, alpha=0.9, beta=1.0, norm_coefficient=0.0, mode="standard"
        ),
        TypeError,
        r"unexpected keyword argument 'mode'",
    ),
    (
        "init with a string",
        lambda: ADAM.init("params"),
        TypeError,
        r"params is a str, not an array",
    ),
    (
        "init with Python numbers",
        lambda: ADAM.init({"w": [1.0, 2.0]}),
        TypeError,
        r"params\['w'\]\[0\] is a float, not an array",
    ),
    (
        "update with state None",
        lambda: ADAM.update(PARAMS, None),
        TypeError,
        r"state must be an AdamState, got NoneType",
    ),
    (
        "update with a tuple state",
        lambda: ADAM.update(PARAMS, tuple(ADAM_STATE)),
        TypeError,
        r"state must be an AdamState, got tuple",
    ),
    (
        "update with updates None",
        lambda: ADAM.update(None, ADAM_STATE),
        ValueError,
        r"different tree structures",
    ),
    (
        "update with a list of the leaves",
        lambda: ADAM.update(jax.tree.leaves(PARAMS), ADAM_STATE),
        ValueError,
        r"different tree structures",
    ),
    (
        "update with string leaves",
        lambda: ADAM.update({"b": "x", "w": "y"}, ADAM_STATE),
        TypeError,
        r"updates\['b'\] must be a floating-point array, got str",
    ),
    (
        "op: R None",
        lambda: ops.adam(None, 0, X, X, X, X),
        TypeError,
        r"input R must be a tensor, got NoneType",
    ),
    ("op: T None", lambda: ops.adam(R, None, X, X, X, X), TypeError, r"input T must be an integer"),
    (
        "op: T string",
        lambda: ops.adam(R, "1", X, X, X, X),
        TypeError,
        r"input T must be an integer",
    ),
    (
        "op: a dict as a tensor",
        lambda: ops.adagrad(R, 0, {"x": X}, X, X),
        TypeError,
        r"input X must be a tensor",
    ),
    (
        "op: mode bytes",
        lambda: ops.momentum(R, 0, X, X, X, **{**MOMENTUM, "mode": b"standard"}),
        TypeError,
        r"mode must be the string",
    ),
]


@pytest.mark.parametrize(
    ("label", "call", "error", "pattern"), ENTRY_POINT_CASES, ids=[c[0] for c in ENTRY_POINT_CASES]
)
def test_entry_point_bad_input(
    label: str, call: Callable[[], Any], error: type[Exception], pattern: str
) -> None:
    _raises(call, error, pattern)


def _onnx_cases() -> list[tuple[str, Callable[[], Any], type[Exception], str]]:
    onnx = pytest.importorskip("onnx")
    from onnx import helper

    from onnx_optax import backend, interop

    node = helper.make_node(
        "Adagrad",
        ["R", "T", "X", "G", "H"],
        ["Y", "H2"],
        domain="ai.onnx.preview.training",
        name="opt",
    )
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [3])
            for n in ("R", "T", "X", "G", "H")
        ],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [3]) for n in ("Y", "H2")],
    )
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 21),
            helper.make_opsetid("ai.onnx.preview.training", 1),
        ],
    )
    feeds = [R, np.int64(0), X, X, X]
    # B is an initializer that is also a graph input: onnxruntime lets a feed override it
    overridable = helper.make_model(
        helper.make_graph(
            [helper.make_node("Add", ["A", "B"], ["C"])],
            "g",
            [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [3]) for n in "AB"],
            [helper.make_tensor_value_info("C", onnx.TensorProto.FLOAT, [3])],
            [onnx.numpy_helper.from_array(X, "B")],
        ),
        opset_imports=[helper.make_opsetid("", 21)],
    )
    return [
        (
            "run_node: not a node",
            lambda: backend.run_node("Adagrad", feeds),
            TypeError,
            r"run_node needs an onnx.NodeProto, got str",
        ),
        (
            "run_node: too few inputs",
            lambda: backend.run_node(node, feeds[:4]),
            ValueError,
            r"node has 5 inputs, got 4 values",
        ),
        (
            "run_node: T a float",
            lambda: backend.run_node(node, [R, np.float32(0), X, X, X]),
            TypeError,
            r"node 'opt' .*T must be an integer",
        ),
        (
            "prepare: not a model",
            lambda: backend.prepare(graph),
            TypeError,
            r"prepare needs an onnx.ModelProto, got GraphProto",
        ),
        (
            "run: wrong count",
            lambda: backend.prepare(model).run(feeds[:3]),
            ValueError,
            r"got 3 input\(s\); the graph takes 5",
        ),
        (
            "run: missing name",
            lambda: backend.prepare(model).run({"R": R}),
            ValueError,
            r"missing input\(s\) \['T', 'X', 'G', 'H'\]",
        ),
        (
            "run: unknown name (a typo is not dropped)",
            lambda: backend.prepare(model).run(dict(zip("RTXGH", feeds, strict=True), h=X)),
            ValueError,
            r"unknown input\(s\) \['h'\]; the graph takes \('R', 'T', 'X', 'G', 'H'\)",
        ),
        (
            "run: a feed overriding an initializer (refused, never ignored)",
            lambda: backend.prepare(overridable).run({"A": X, "B": 2 * X}),
            ValueError,
            r"input\(s\) \['B'\] name initializers that are also graph inputs",
        ),
        (
            "run: an overriding feed and a typo (both named)",
            lambda: backend.prepare(overridable).run({"A": X, "B": X, "q": X}),
            ValueError,
            r"input\(s\) \['B'\] name initializers .*; unknown input\(s\) \['q'\]; the graph "
            r"takes \('A',\)",
        ),
        ("supports_device: unknown", lambda: backend.supports_device("TPU:0"), Exception, r""),
        (
            "prepare: unknown device",
            lambda: backend.prepare(model, "TPU"),
            ValueError,
            r"unknown device 'TPU'",
        ),
        (
            "prepare: device id beyond",
            lambda: backend.prepare(model, "CPU:7"),
            ValueError,
            r"JAX sees 1 cpu device",
        ),
        (
            "from_node: not a node",
            lambda: interop.from_node("Adam", 0.1),
            TypeError,
            r"expected an onnx.NodeProto, got str",
        ),
        (
            "from_node: bad learning rate",
            lambda: interop.from_node(node, "0.1"),
            TypeError,
            r"learning_rate must be a real number",
        ),
        (
            "from_model: not a model",
            lambda: interop.from_model(node),
            TypeError,
            r"from_model needs an onnx.ModelProto, got NodeProto",
        ),
        (
            "from_model: no training_info",
            lambda: interop.from_model(model),
            ValueError,
            r"no training_info",
        ),
        (
            "to_node: an optax transformation",
            lambda: interop.to_node(optax.adam(0.1), ["w"]),
            TypeError,
            r"built by onnx_optax",
        ),
        (
            "to_node: duplicate names",
            lambda: interop.to_node(ADAM, ["w", "w"]),
            ValueError,
            r"must be distinct",
        ),
        (
            "to_node: a name clashes with R",
            lambda: interop.to_node(ADAM, ["R"]),
            ValueError,
            r"clash with the inputs R and T",
        ),
        (
            "to_node: a chain",
            lambda: interop.to_node(optax.chain(ADAM), ["w"]),
            TypeError,
            r"wrappers such as optax.chain",
        ),
        (
            "step_model: mixed dtypes",
            lambda: interop.step_model(
                ADAM, {"a": np.ones(2, np.float32), "b": np.ones(2, np.float16)}
            ),
            TypeError,
            r"share one type",
        ),
        (
            "to_model: a state of another optimizer",
            lambda: interop.to_model(ADAM, PARAMS, optax.adam(0.1).init(PARAMS)),
            TypeError,
            r"state must be the AdamState",
        ),
        (
            "to_model: a state for other params",
            lambda: interop.to_model(ADAM, {"w": PARAMS["w"]}, ADAM_STATE),
            ValueError,
            r"state.v is not shaped like params",
        ),
    ]


def test_onnx_entry_points_bad_input() -> None:
    cases = _onnx_cases()
    for label, call, error, pattern in cases:
        if label == "supports_device: unknown":
            # Not an error: an unknown device is simply not supported.
            assert call() is False, label
            continue
        with pytest.raises(error, match=pattern):
            call()
