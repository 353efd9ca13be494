"""The packed state layout gives the same numbers as the per-leaf one, bit for bit."""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import onnx_optax
from tests.support.optimizers import NAMES, OPTIMIZERS


def _params(rng: np.random.Generator) -> dict[str, Any]:
    return {
        "dense": {"w": jnp.asarray(rng.standard_normal((16, 8)), jnp.float32)},
        "bias": jnp.asarray(rng.standard_normal(8), jnp.float32),
        "scale": jnp.asarray(rng.standard_normal(()), jnp.float32),
        "big": jnp.asarray(rng.standard_normal((40, 30)), jnp.float32),
        "empty": jnp.zeros((0, 4), jnp.float32),
        "half": jnp.asarray(rng.standard_normal(5), jnp.bfloat16),
        "list": [jnp.asarray(rng.standard_normal(3), jnp.float32) for _ in range(3)],
    }


def _unpacked(tree: Any) -> Any:
    return tree.unpack() if isinstance(tree, onnx_optax.PackedTree) else tree


@pytest.mark.parametrize("accumulator_dtype", [None, jnp.float32])
@pytest.mark.parametrize("regularized", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_packed_equals_per_leaf(name: str, regularized: bool, accumulator_dtype: Any) -> None:
    optimizer = OPTIMIZERS[name]
    rng = np.random.default_rng(7)
    attributes = optimizer.draw_attributes(rng)
    if regularized:
        attributes["norm_coefficient"] = 0.01
        if name == "adam":
            attributes["norm_coefficient_post"] = 0.001
    else:
        attributes["norm_coefficient"] = 0.0
        attributes.pop("norm_coefficient_post", None)
    txs = [
        optimizer.transform(
            0.05, attributes, accumulator_dtype=accumulator_dtype, pack_leaves_below=pack
        )
        for pack in (0, 1000)
    ]
    params = [_params(rng)] * 2
    states = [tx.init(p) for tx, p in zip(txs, params, strict=True)]
    assert isinstance(states[1].count, jax.Array)
    packed_state = getattr(states[1], optimizer.state_names[0])
    assert isinstance(packed_state, onnx_optax.PackedTree)
    # Instead of 9 leaves the packed state passes its buffers (float32 and
    # bfloat16, or one with float32 accumulators), the big leaf and the empty one.
    assert len(jax.tree.leaves(packed_state)) == (3 if accumulator_dtype else 4)
    steps = [jax.jit(tx.update) for tx in txs]
    for i in range(3):
        grads = jax.tree.map(lambda p, i=i: jnp.cos(p * (i + 1)).astype(p.dtype), params[0])
        outs = [step(grads, s, p) for step, s, p in zip(steps, states, params, strict=True)]
        chex.assert_trees_all_equal(outs[0][0], outs[1][0])
        states = [o[1] for o in outs]
        for state_name in optimizer.state_names:
            chex.assert_trees_all_equal(
                getattr(states[0], state_name), _unpacked(getattr(states[1], state_name))
            )
        params = [optax.apply_updates(p, o[0]) for p, o in zip(params, outs, strict=True)]
    assert int(states[1].count) == int(states[0].count)


def test_packed_tree_reads_per_parameter() -> None:
    tx = onnx_optax.adam(0.1, pack_leaves_below=100)
    params = {"w": jnp.ones((2, 3)), "b": jnp.full(3, 2.0), "big": jnp.ones((20, 20))}
    state = tx.init(params)
    _, state = tx.update(jax.tree.map(jnp.ones_like, params), state)
    v = state.v.unpack()
    assert jax.tree.structure(v) == jax.tree.structure(params)
    chex.assert_trees_all_equal_shapes(v, params)
    np.testing.assert_array_equal(state.v["w"], v["w"])
    assert "PackedTree(3 leaves" in repr(state.v)
    # optax's tree utilities find the field, and the keys name what is packed.
    assert optax.tree.get(state, "v") is state.v
    keys = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(state.v)[0]]
    assert keys == ["['packed_0']", "['big']"]


def test_packed_state_under_vmap() -> None:
    """An ensemble of four parameter sets, updated together, equals each alone."""
    tx = onnx_optax.adam(0.1, pack_leaves_below=100)
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.standard_normal((4, 2, 3)), jnp.float32), "b": jnp.zeros((4, 3))}
    grads = jax.tree.map(jnp.sin, params)
    states = jax.vmap(tx.init)(params)
    updates, _ = jax.jit(jax.vmap(tx.update))(grads, states, params)
    for k in range(4):
        member = jax.tree.map(lambda a, k=k: a[k], params)
        alone, _ = tx.update(jax.tree.map(lambda a, k=k: a[k], grads), tx.init(member), member)
        chex.assert_trees_all_equal(jax.tree.map(lambda a, k=k: a[k], updates), alone)


def test_pack_leaves_below_is_checked() -> None:
    with pytest.raises(ValueError, match=r"pack_leaves_below must be >= 0"):
        onnx_optax.adagrad(0.1, pack_leaves_below=-1)
    with pytest.raises(TypeError, match=r"pack_leaves_below must be an integer"):
        onnx_optax.adam(0.1, pack_leaves_below=1.5)


def test_packed_state_exports_to_onnx() -> None:
    pytest.importorskip("onnx")
    from onnx_optax import interop

    tx = onnx_optax.adam(0.1, pack_leaves_below=100)
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    state = tx.init(params)
    _, state = tx.update(jax.tree.map(jnp.ones_like, params), state)
    imported = interop.from_model(interop.to_model(tx, params, state))
    chex.assert_trees_all_equal(imported.state.v, state.v.unpack())
    chex.assert_trees_all_equal(imported.state.h, state.h.unpack())
