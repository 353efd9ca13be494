"""onnx_optax in the optax and Flax toolbox, and checkpoints with orbax."""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.support.optimizers import NAMES, OPTIMIZERS

PARAMS = {
    "dense": {"kernel": jnp.array([[0.5, -1.0], [2.0, 0.25]]), "bias": jnp.array([0.1, -0.2])},
    "out": {"kernel": jnp.array([[1.0], [-0.5]]), "bias": jnp.array([0.0])},
}


def _grads(params: Any, i: int) -> Any:
    return jax.tree.map(lambda p: jnp.cos(p * (i + 1)), params)


def _make(name: str, **kwargs: Any) -> Any:
    optimizer = OPTIMIZERS[name]
    attributes = {**optimizer.convergent["attributes"], **kwargs}
    return optimizer.transform(kwargs.pop("learning_rate", 0.05), attributes)


def _run(tx: Any, params: Any, steps: int = 3) -> tuple[Any, Any]:
    state = tx.init(params)
    update = jax.jit(tx.update)
    for i in range(steps):
        updates, state = update(_grads(params, i), state, params)
        params = optax.apply_updates(params, updates)
    return params, state


# ------------------------------------------------------------------- optax


@pytest.mark.parametrize("name", NAMES)
def test_masked_leaves_biases_unregularized(name: str) -> None:
    """optax.masked: norm_coefficient on kernels only; biases by a plain copy."""
    is_kernel = jax.tree_util.tree_map_with_path(lambda p, _: p[-1].key == "kernel", PARAMS)
    is_bias = jax.tree.map(lambda k: not k, is_kernel)
    tx = optax.chain(
        optax.masked(_make(name, norm_coefficient=0.1), is_kernel),
        optax.masked(_make(name), is_bias),
    )
    params, _ = _run(tx, PARAMS)
    kernels, _ = _run(_make(name, norm_coefficient=0.1), PARAMS)
    plain, _ = _run(_make(name), PARAMS)
    chex.assert_trees_all_close(params["dense"]["kernel"], kernels["dense"]["kernel"], rtol=1e-6)
    chex.assert_trees_all_close(params["out"]["bias"], plain["out"]["bias"], rtol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_multi_transform(name: str) -> None:
    labels = {
        "dense": {"kernel": "onnx", "bias": "frozen"},
        "out": {"kernel": "onnx", "bias": "onnx"},
    }
    tx = optax.multi_transform({"onnx": _make(name), "frozen": optax.set_to_zero()}, labels)
    params, _ = _run(tx, PARAMS)
    chex.assert_trees_all_equal(params["dense"]["bias"], PARAMS["dense"]["bias"])
    alone, _ = _run(_make(name), PARAMS)
    chex.assert_trees_all_close(params["out"], alone["out"], rtol=1e-6)


@pytest.mark.standard_promotion
@pytest.mark.parametrize("name", NAMES)
def test_inject_hyperparams_change_and_read_learning_rate(name: str) -> None:
    make = OPTIMIZERS[name].make
    attributes = OPTIMIZERS[name].convergent["attributes"]
    tx = optax.inject_hyperparams(make)(learning_rate=0.05, **attributes)
    state = tx.init(PARAMS)
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(0.05)
    updates, state = tx.update(_grads(PARAMS, 0), state, PARAMS)
    chex.assert_tree_all_finite(updates)
    state.hyperparams["learning_rate"] = jnp.asarray(0.0)
    frozen, state = tx.update(_grads(PARAMS, 1), state, PARAMS)
    chex.assert_trees_all_equal(frozen, jax.tree.map(jnp.zeros_like, PARAMS))
    assert float(state.hyperparams["learning_rate"]) == 0.0
    # A schedule, evaluated by inject_hyperparams at each step and readable.
    tx = optax.inject_hyperparams(make)(
        learning_rate=optax.linear_schedule(0.1, 0.0, 4), **attributes
    )
    state = tx.init(PARAMS)
    seen = []
    for i in range(4):
        _, state = tx.update(_grads(PARAMS, i), state, PARAMS)
        seen.append(float(state.hyperparams["learning_rate"]))
    np.testing.assert_allclose(seen, [0.1, 0.075, 0.05, 0.025], rtol=1e-6)


@pytest.mark.standard_promotion
@pytest.mark.parametrize("name", NAMES)
def test_apply_if_finite_skips_non_finite_steps(name: str) -> None:
    tx = optax.apply_if_finite(_make(name), max_consecutive_errors=3)
    state = tx.init(PARAMS)
    bad = jax.tree.map(lambda g: g.at[0].set(jnp.nan), _grads(PARAMS, 0))
    updates, state = jax.jit(tx.update)(bad, state, PARAMS)
    chex.assert_trees_all_equal(updates, jax.tree.map(jnp.zeros_like, PARAMS))
    assert int(state.notfinite_count) == 1
    # The inner state (count included) was not advanced by the skipped step.
    assert int(state.inner_state.count) == OPTIMIZERS[name].default_initial_count
    updates, state = jax.jit(tx.update)(_grads(PARAMS, 0), state, PARAMS)
    chex.assert_tree_all_finite(updates)
    assert int(state.notfinite_count) == 0


@pytest.mark.standard_promotion
@pytest.mark.parametrize("name", NAMES)
def test_reduce_on_plateau(name: str) -> None:
    tx = optax.chain(
        _make(name),
        optax.contrib.reduce_on_plateau(factor=0.5, patience=1, cooldown=0, accumulation_size=1),
    )
    state = tx.init(PARAMS)
    for i in range(4):
        updates, state = tx.update(_grads(PARAMS, i), state, PARAMS, value=jnp.asarray(1.0))
    assert float(state[1].scale) < 1.0  # the loss never improved: the scale dropped
    chex.assert_tree_all_finite(updates)


# -------------------------------------------------------------------- Flax


@pytest.mark.parametrize("name", NAMES)
def test_flax_nnx_optimizer(name: str) -> None:
    nnx = pytest.importorskip("flax.nnx")
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, _make(name, norm_coefficient=0.01), wrt=nnx.Param)
    x, y = jnp.ones((4, 3)), jnp.zeros((4, 2))

    @nnx.jit
    def step(model: Any, optimizer: Any) -> jax.Array:
        loss, grads = nnx.value_and_grad(lambda m: ((m(x) - y) ** 2).mean())(model)
        optimizer.update(model, grads)
        return loss

    losses = [float(step(model, optimizer)) for _ in range(30)]
    assert losses[-1] < losses[0]
    assert int(optimizer.opt_state.count[...]) == OPTIMIZERS[name].default_initial_count + 30


@pytest.mark.parametrize("name", NAMES)
def test_flax_linen_train_state(name: str) -> None:
    linen = pytest.importorskip("flax.linen")
    from flax.training import train_state

    module = linen.Dense(2)
    params = module.init(jax.random.key(0), jnp.ones((1, 3)))["params"]
    state = train_state.TrainState.create(apply_fn=module.apply, params=params, tx=_make(name))
    x, y = jnp.ones((4, 3)), jnp.zeros((4, 2))

    @jax.jit
    def step(state: Any) -> tuple[Any, jax.Array]:
        def loss_fn(p: Any) -> jax.Array:
            return ((state.apply_fn({"params": p}, x) - y) ** 2).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss

    losses = []
    for _ in range(30):
        state, loss = step(state)
        losses.append(float(loss))
    assert losses[-1] < losses[0]


# --------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("packed", [False, True], ids=["per-leaf", "packed"])
@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_round_trip_continues_bit_identically(
    name: str, packed: bool, tmp_path: Any
) -> None:
    ocp = pytest.importorskip("orbax.checkpoint")
    tx = _make(name, norm_coefficient=0.01, pack_leaves_below=100 if packed else 0)
    update = jax.jit(tx.update)

    def steps(params: Any, state: Any, start: int, stop: int) -> tuple[Any, Any]:
        for i in range(start, stop):
            updates, state = update(_grads(params, i), state, params)
            params = optax.apply_updates(params, updates)
        return params, state

    uninterrupted = steps(PARAMS, tx.init(PARAMS), 0, 6)

    params, state = steps(PARAMS, tx.init(PARAMS), 0, 3)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "step3", {"params": params, "opt_state": state})
    checkpointer.wait_until_finished()
    del params, state
    target = jax.eval_shape(lambda: {"params": PARAMS, "opt_state": tx.init(PARAMS)})
    restored = checkpointer.restore(tmp_path / "step3", target)
    assert type(restored["opt_state"]) is type(uninterrupted[1])
    resumed = steps(restored["params"], restored["opt_state"], 3, 6)
    chex.assert_trees_all_equal(resumed, uninterrupted)
