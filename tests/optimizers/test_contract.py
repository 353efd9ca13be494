"""The contract every optimizer keeps, from one table (as optax's alias tests do).

Converges on a quadratic and on Rosenbrock, compiles once, composes with
``optax.chain``, ``optax.inject_hyperparams`` and ``optax.MultiSteps``, keeps
its state dtype (bfloat16, float32, float64), returns updates in the gradient's
dtype, and its counter saturates instead of wrapping.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import onnx_optax
from tests.support.finite_differences import central_difference
from tests.support.optimizers import (
    INT32_MAX,
    NAMES,
    OPTIMIZERS,
    Optimizer,
    f32,
    keyed_rng,
    random_state_tensor,
)


def _make(optimizer: Optimizer, learning_rate: Any = None, **kwargs: Any) -> Any:
    conf = optimizer.convergent
    lr = conf["learning_rate"] if learning_rate is None else learning_rate
    return optimizer.transform(lr, {**conf["attributes"], **kwargs})


def _minimize(tx: Any, loss: Any, params: jax.Array, steps: int) -> jax.Array:
    @jax.jit
    def run(params: jax.Array) -> jax.Array:
        def body(carry: Any, _: None) -> Any:
            p, s = carry
            updates, s = tx.update(jax.grad(loss)(p), s, p)
            return (optax.apply_updates(p, updates), s), None

        (params, _), _ = jax.lax.scan(body, (params, tx.init(params)), None, length=steps)
        return params

    return run(params)


@pytest.mark.parametrize("name", NAMES)
def test_converges_on_quadratic(name: str) -> None:
    optimizer = OPTIMIZERS[name]
    target = jnp.array([1.0, -2.0, 3.0, 0.5])

    def loss(x: jax.Array) -> jax.Array:
        return 0.5 * jnp.sum(jnp.array([1.0, 2.0, 0.5, 4.0]) * (x - target) ** 2)

    x = _minimize(_make(optimizer), loss, jnp.zeros(4), optimizer.convergent["steps"])
    assert float(loss(x)) < 1e-4, (name, x)


@pytest.mark.parametrize("name", NAMES)
def test_converges_on_rosenbrock(name: str) -> None:
    optimizer = OPTIMIZERS[name]

    def rosenbrock(x: jax.Array) -> jax.Array:
        return (1.0 - x[0]) ** 2 + 100.0 * (x[1] - x[0] ** 2) ** 2

    start = jnp.array([-1.0, 1.5])
    x = _minimize(_make(optimizer), rosenbrock, start, 20 * optimizer.convergent["steps"])
    assert float(rosenbrock(x)) < 1e-3, (name, x)
    np.testing.assert_allclose(np.asarray(x), [1.0, 1.0], atol=0.05)


@pytest.mark.parametrize("name", NAMES)
def test_does_not_recompile(name: str) -> None:
    chex.clear_trace_counter()
    tx = _make(OPTIMIZERS[name], norm_coefficient=0.01)
    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(params: Any, state: Any, grads: Any) -> Any:
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    for _ in range(3):
        params, state = step(params, state, grads)


@pytest.mark.parametrize("pack_leaves_below", [0, 100])
@pytest.mark.parametrize("name", NAMES)
def test_init_with_abstract_input(name: str, pack_leaves_below: int) -> None:
    """As optax's own optimizers (``test_init_with_abstract_input`` in its alias tests).

    ``init`` takes ``jax.ShapeDtypeStruct`` leaves (shape planning, sharding)
    and returns the state it returns for arrays of those shapes: arrays, as
    optax's ``init`` does, packed the same way. ``jax.eval_shape(tx.init,
    params)`` gives that state's shapes and dtypes.
    """
    tx = _make(OPTIMIZERS[name], pack_leaves_below=pack_leaves_below)
    abstract = jax.ShapeDtypeStruct((2, 4, 8), jnp.float32)
    state = tx.init(abstract)
    assert all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(state))
    chex.assert_trees_all_equal(state, tx.init(jnp.ones((2, 4, 8))))

    tree = {
        "w": abstract,
        "b": jax.ShapeDtypeStruct((8,), jnp.bfloat16),
        "scale": jax.ShapeDtypeStruct((), jnp.float32),
        "none": None,
    }
    params = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), tree)
    state, expected = tx.init(tree), tx.init(params)
    chex.assert_trees_all_equal(state, expected)
    chex.assert_trees_all_equal_dtypes(state, expected)
    if pack_leaves_below:
        assert isinstance(getattr(state, OPTIMIZERS[name].state_names[0]), onnx_optax.PackedTree)
    shapes = jax.eval_shape(tx.init, tree)
    assert jax.tree.structure(shapes) == jax.tree.structure(expected)
    assert [(s.shape, s.dtype) for s in jax.tree.leaves(shapes)] == [
        (leaf.shape, leaf.dtype) for leaf in jax.tree.leaves(expected)
    ]
    grads = jax.tree.map(jnp.ones_like, params)
    updates, _ = tx.update(grads, state, params)
    chex.assert_trees_all_equal_shapes_and_dtypes(updates, grads)


def test_abstract_init_refuses_what_init_refuses() -> None:
    tx = onnx_optax.adam(0.1)
    with pytest.raises(TypeError, match="only floating-point tensors"):
        tx.init(jax.ShapeDtypeStruct((3,), jnp.int32))
    if not jax.config.read("jax_enable_x64"):
        with pytest.raises(TypeError, match="needs 64-bit JAX"):
            tx.init(jax.ShapeDtypeStruct((3,), jnp.float64))
    with pytest.raises(TypeError, match="not an array"):
        tx.init({"w": "weights"})


@pytest.mark.parametrize("name", NAMES)
def test_in_chain_equals_clipping_by_hand(name: str) -> None:
    optimizer = OPTIMIZERS[name]
    params = {"w": jnp.array([1.0, -1.0, 2.0])}
    grads = {"w": jnp.array([3.0, 4.0, 12.0])}  # global norm 13
    chained = optax.chain(optax.clip_by_global_norm(1.0), _make(optimizer))
    alone = _make(optimizer)
    updates, _ = chained.update(grads, chained.init(params), params)
    expected, _ = alone.update(jax.tree.map(lambda g: g / 13.0, grads), alone.init(params), params)
    chex.assert_trees_all_close(updates, expected, rtol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_inject_hyperparams_gives_the_same_result(name: str) -> None:
    optimizer = OPTIMIZERS[name]
    attributes = optimizer.draw_attributes(np.random.default_rng(3))
    params = {"w": jnp.array([0.5, -1.5, 2.0]), "b": jnp.array(0.25)}
    plain = optimizer.transform(0.05, attributes)
    injected = optax.inject_hyperparams(optimizer.make)(learning_rate=0.05, **attributes)
    s_plain, s_injected = plain.init(params), injected.init(params)
    p_plain = p_injected = params
    for i in range(4):
        grads = jax.tree.map(lambda p, i=i: jnp.cos(p * (i + 1)), p_plain)
        u_plain, s_plain = jax.jit(plain.update)(grads, s_plain, p_plain)
        u_injected, s_injected = jax.jit(injected.update)(grads, s_injected, p_injected)
        p_plain = optax.apply_updates(p_plain, u_plain)
        p_injected = optax.apply_updates(p_injected, u_injected)
    chex.assert_trees_all_equal(p_plain, p_injected)
    assert float(s_injected.hyperparams["learning_rate"]) == pytest.approx(0.05)


@pytest.mark.parametrize("name", NAMES)
def test_inject_hyperparams_learning_rate_can_change(name: str) -> None:
    optimizer = OPTIMIZERS[name]
    tx = optax.inject_hyperparams(optimizer.make)(
        learning_rate=0.1, **optimizer.convergent["attributes"]
    )
    params = jnp.array([1.0, 2.0])
    state = tx.init(params)
    state.hyperparams["learning_rate"] = jnp.asarray(0.0)
    updates, state = tx.update(jnp.array([1.0, -1.0]), state, params)
    chex.assert_trees_all_equal(updates, jnp.zeros(2))


@pytest.mark.parametrize("name", NAMES)
def test_constant_schedule_equals_constant(name: str) -> None:
    optimizer = OPTIMIZERS[name]
    params = jnp.array([1.0, -2.0])
    grads = jnp.array([0.3, 0.7])
    results = []
    for lr in (0.1, optax.constant_schedule(0.1)):
        tx = _make(optimizer, lr)
        state = tx.init(params)
        out = []
        for _ in range(3):
            updates, state = tx.update(grads, state, params)
            out.append(updates)
        results.append(out)
    chex.assert_trees_all_equal(*results)


@pytest.mark.standard_promotion
@pytest.mark.parametrize("name", NAMES)
def test_multi_steps_accumulates_then_updates(name: str) -> None:
    optimizer = OPTIMIZERS[name]
    tx = optax.MultiSteps(_make(optimizer), every_k_schedule=3)
    params = jnp.array([1.0, -2.0])
    state = tx.init(params)
    for i, g in enumerate([jnp.array([1.0, 1.0]), jnp.array([2.0, 0.0]), jnp.array([0.0, 2.0])]):
        updates, state = jax.jit(tx.update)(g, state, params)
        if i < 2:
            chex.assert_trees_all_equal(updates, jnp.zeros(2))
    inner = _make(optimizer)
    expected, _ = inner.update(jnp.array([1.0, 1.0]), inner.init(params), params)
    chex.assert_trees_all_close(updates, expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("param_dtype", "accumulator_dtype", "state_dtype"),
    [
        (jnp.bfloat16, None, jnp.bfloat16),
        (jnp.bfloat16, jnp.float32, jnp.float32),
        (jnp.float32, None, jnp.float32),
        (jnp.float32, jnp.bfloat16, jnp.bfloat16),
    ],
)
@pytest.mark.parametrize("name", NAMES)
def test_state_keeps_its_dtype(
    name: str, param_dtype: Any, accumulator_dtype: Any, state_dtype: Any
) -> None:
    optimizer = OPTIMIZERS[name]
    tx = _make(optimizer, accumulator_dtype=accumulator_dtype, norm_coefficient=0.01)
    params = {"w": jnp.ones((4,), param_dtype), "b": jnp.zeros((2,), param_dtype)}
    state = tx.init(params)
    step = jax.jit(tx.update)
    for _ in range(3):
        grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
        updates, state = step(grads, state, params)
        chex.assert_trees_all_equal_dtypes(updates, grads)
        params = optax.apply_updates(params, updates)
        for name_ in optimizer.state_names:
            for leaf in jax.tree.leaves(getattr(state, name_)):
                assert leaf.dtype == state_dtype
        assert state.count.dtype == jnp.int32
    chex.assert_tree_all_finite(params)


@pytest.mark.parametrize("name", NAMES)
def test_float64_end_to_end(name: str) -> None:
    with jax.enable_x64(True):
        optimizer = OPTIMIZERS[name]
        tx = _make(optimizer, norm_coefficient=0.01)
        params = jnp.array([1.0, 2.0], jnp.float64)
        state = tx.init(params)
        updates, state = jax.jit(tx.update)(jnp.array([0.1, 0.2], jnp.float64), state, params)
        assert updates.dtype == jnp.float64
        for name_ in optimizer.state_names:
            assert getattr(state, name_).dtype == jnp.float64


def test_bfloat16_state_does_not_lose_adam_beta() -> None:
    """0.999 rounds to 1.0 in bfloat16; the formula still runs in float32."""
    tx = onnx_optax.adam(0.1)
    params = jnp.zeros(3, jnp.bfloat16)
    state = tx.init(params)
    _, state = tx.update(jnp.full(3, 2.0, jnp.bfloat16), state)
    # H_new = (1 - 0.999) * 4 = 0.004, not 0 as (1 - bf16(0.999)) * 4 would give.
    np.testing.assert_allclose(np.asarray(state.h, np.float32), 0.004, rtol=1e-2)


@pytest.mark.parametrize("name", NAMES)
def test_count_saturates(name: str) -> None:
    tx = _make(OPTIMIZERS[name], initial_count=INT32_MAX - 1)
    params = jnp.ones(2)
    state = tx.init(params)
    for expected in (INT32_MAX, INT32_MAX, INT32_MAX):
        updates, state = tx.update(jnp.ones(2), state, params)
        assert int(state.count) == expected
        chex.assert_tree_all_finite(updates)


@pytest.mark.parametrize("name", NAMES)
def test_default_initial_count(name: str) -> None:
    optimizer = OPTIMIZERS[name]
    state = _make(optimizer).init(jnp.ones(2))
    assert int(state.count) == optimizer.default_initial_count
    assert state.count.dtype == jnp.int32


@pytest.mark.parametrize("name", NAMES)
def test_params_not_needed_without_regularization(name: str) -> None:
    tx = _make(OPTIMIZERS[name], norm_coefficient=0.0)
    updates, _ = tx.update(jnp.ones(2), tx.init(jnp.ones(2)), None)
    chex.assert_tree_all_finite(updates)


def test_empty_and_scalar_leaves() -> None:
    for name in NAMES:
        tx = _make(OPTIMIZERS[name])
        params = {"empty": jnp.zeros((0, 3)), "scalar": jnp.array(1.0), "none": None}
        state = tx.init(params)
        grads = {"empty": jnp.zeros((0, 3)), "scalar": jnp.array(0.5), "none": None}
        updates, _ = jax.jit(tx.update)(grads, state, params)
        assert updates["empty"].shape == (0, 3)
        assert updates["none"] is None
        assert updates["scalar"].shape == ()


# ------------------------------------------------------------------ derivatives
# jax.grad and jax.jvp of every op and transformation with respect to R, X, G and
# each state tensor (V, H) equal float64 central differences of the oracle.
# Attributes are drawn per case with every optional X term non-zero, so that X
# enters every formula.

_SHAPE = (2, 3)


def _derivative_case(name: str, t: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    optimizer = OPTIMIZERS[name]
    rng = keyed_rng("derivatives", name, t)
    attributes = optimizer.draw_attributes(rng)
    for optional in ("norm_coefficient", "norm_coefficient_post"):
        if optional in attributes:
            attributes[optional] = f32(rng.uniform(0.01, 0.1))
    values = {
        "R": np.float64(rng.uniform(0.05, 0.5)),
        "X": rng.standard_normal(_SHAPE),
        "G": rng.standard_normal(_SHAPE),
    }
    for state in optimizer.state_names:
        # H away from 0, where sqrt's derivative is finite and smooth.
        values[state.upper()] = random_state_tensor(rng, state, _SHAPE, np.float64) + (
            0.5 if state == "h" else 0.0
        )
    return attributes, values


def _oracle_outputs(
    name: str, t: int, attributes: dict[str, Any], values: dict[str, np.ndarray]
) -> tuple[np.ndarray, ...]:
    """(X_new, *new state) of the float64 oracle."""
    optimizer = OPTIMIZERS[name]
    states = [values[s.upper()] for s in optimizer.state_names]
    return optimizer.oracle(float(values["R"]), t, values["X"], values["G"], *states, **attributes)


def _ours(name: str, t: int, attributes: dict[str, Any], face: str) -> Any:
    """(X_new, *new state) as a JAX function of the values, through the op or the
    transformation (whose update is X_new - X)."""
    optimizer = OPTIMIZERS[name]
    fields = optimizer.state_names

    def op(values: dict[str, Any]) -> tuple[Any, ...]:
        states = [values[s.upper()] for s in fields]
        return tuple(optimizer.op(values["R"], t, values["X"], values["G"], *states, **attributes))

    def transformation(values: dict[str, Any]) -> tuple[Any, ...]:
        tx = optimizer.transform(values["R"], attributes)
        state = optimizer.state(jnp.int32(t), [values[s.upper()] for s in fields])
        updates, state = tx.update(values["G"], state, values["X"])
        return (values["X"] + updates, *(getattr(state, s) for s in fields))

    return op if face == "op" else transformation


def _weights(outputs: tuple[np.ndarray, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    return [rng.standard_normal(np.shape(o)) for o in outputs]


@pytest.mark.parametrize("face", ["op", "transformation"])
@pytest.mark.parametrize("t", [0, 3])
@pytest.mark.parametrize("name", NAMES)
def test_grad_equals_central_differences_of_the_oracle(name: str, t: int, face: str) -> None:
    attributes, values = _derivative_case(name, t)
    weights = _weights(_oracle_outputs(name, t, attributes, values))

    def oracle_loss(point: dict[str, np.ndarray]) -> float:
        outputs = _oracle_outputs(name, t, attributes, point)
        return float(sum(np.sum(w * o) for w, o in zip(weights, outputs, strict=True)))

    with jax.enable_x64(True):
        ours = _ours(name, t, attributes, face)

        def loss(point: dict[str, Any]) -> Any:
            return sum(jnp.sum(w * o) for w, o in zip(weights, ours(point), strict=True))

        grads = jax.grad(loss)({k: jnp.asarray(v) for k, v in values.items()})
    for key, value in values.items():
        value = np.asarray(value, np.float64)

        def along(v: np.ndarray, key: str = key) -> float:
            return oracle_loss({**values, key: v.reshape(np.shape(values[key]))})

        expected = central_difference(along, value)
        assert np.abs(expected).max() > 1e-3, key  # the derivative is not trivially zero
        np.testing.assert_allclose(
            np.asarray(grads[key]), expected, rtol=1e-6, atol=1e-8, err_msg=f"d/d{key}"
        )


@pytest.mark.parametrize("face", ["op", "transformation"])
@pytest.mark.parametrize("name", NAMES)
def test_jvp_equals_central_differences_of_the_oracle(name: str, face: str) -> None:
    t = 3
    attributes, values = _derivative_case(name, t)
    rng = np.random.default_rng(12)
    direction = {k: rng.standard_normal(np.shape(v)) for k, v in values.items()}
    h = 1e-6
    plus = _oracle_outputs(
        name, t, attributes, {k: v + h * direction[k] for k, v in values.items()}
    )
    minus = _oracle_outputs(
        name, t, attributes, {k: v - h * direction[k] for k, v in values.items()}
    )
    with jax.enable_x64(True):
        ours = _ours(name, t, attributes, face)
        point = {k: jnp.asarray(v) for k, v in values.items()}
        tangent = {k: jnp.asarray(v) for k, v in direction.items()}
        outputs, tangents = jax.jvp(ours, (point,), (tangent,))
    for k, (out, p, m, got) in enumerate(zip(outputs, plus, minus, tangents, strict=True)):
        np.testing.assert_allclose(np.asarray(out), _oracle_outputs(name, t, attributes, values)[k])
        expected = (p - m) / (2 * h)
        assert np.abs(expected).max() > 1e-3, k
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", NAMES)
def test_grad_through_a_packed_state_and_two_updates(name: str) -> None:
    """Learning-rate tuning by gradient: d(params after two updates)/dR, with the state
    of small leaves packed into one buffer, equals the oracle's central difference."""
    optimizer = OPTIMIZERS[name]
    attributes, _ = _derivative_case(name, 1)
    rng = np.random.default_rng(13)
    params = {"a": rng.standard_normal(3), "b": rng.standard_normal((2, 2))}
    grads = [{k: rng.standard_normal(np.shape(v)) for k, v in params.items()} for _ in range(2)]
    t0 = optimizer.default_initial_count

    def oracle_loss(r: np.ndarray) -> float:
        total = 0.0
        for key, x in params.items():
            states = [np.zeros_like(x) for _ in optimizer.state_names]
            for t, g in enumerate(grads, start=t0):
                x, *states = optimizer.oracle(float(r[0]), t, x, g[key], *states, **attributes)
            total += float(np.sum(x))
        return total

    with jax.enable_x64(True):

        def loss(r: Any) -> Any:
            tx = optimizer.transform(r, attributes, pack_leaves_below=100)
            p = jax.tree.map(jnp.asarray, params)
            state = tx.init(p)
            for g in grads:
                updates, state = tx.update(g, state, p)
                p = optax.apply_updates(p, updates)
            return sum(jnp.sum(leaf) for leaf in jax.tree.leaves(p))

        got = jax.grad(loss)(jnp.float64(0.2))
    expected = central_difference(oracle_loss, np.array([0.2]))
    assert abs(expected[0]) > 1e-3
    np.testing.assert_allclose(float(got), expected[0], rtol=1e-6)
