"""Scale: no temporaries with donated buffers, vmap, and sharding over a device mesh."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.support.optimizers import NAMES, OPTIMIZERS

N = 1 << 18  # 1 MiB a float32 tensor


def _transformation(name: str, **kwargs: Any) -> Any:
    conf = OPTIMIZERS[name].convergent
    return OPTIMIZERS[name].transform(0.01, {**conf["attributes"], **kwargs})


@pytest.mark.parametrize("norm_coefficient", [0.0, 0.01])
@pytest.mark.parametrize("name", NAMES)
def test_donated_step_allocates_no_temporaries(name: str, norm_coefficient: float) -> None:
    tx = _transformation(name, norm_coefficient=norm_coefficient)
    params = {"w": jnp.ones((N,)), "b": jnp.ones((N // 4,))}
    state = tx.init(params)

    def step(params: Any, state: Any, grads: Any) -> Any:
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params).compile()
    memory = compiled.memory_analysis()
    param_bytes = 4 * (N + N // 4)
    state_bytes = param_bytes * len(OPTIMIZERS[name].state_names)
    # The new params and state are written into the donated buffers ...
    assert memory.alias_size_in_bytes >= param_bytes + state_bytes
    # ... and nothing proportional to the parameters is allocated besides.
    assert memory.temp_size_in_bytes < 0.01 * memory.argument_size_in_bytes
    assert memory.output_size_in_bytes - memory.alias_size_in_bytes < 1024


@pytest.mark.parametrize("name", NAMES)
def test_donated_op_allocates_no_temporaries(name: str) -> None:
    optimizer = OPTIMIZERS[name]
    attributes = optimizer.convergent["attributes"]
    k = len(optimizer.state_names)

    def run(x: Any, states: Any, g: Any) -> Any:
        return optimizer.op(jnp.float32(0.1), 3, x, g, *states, **attributes)

    x = jnp.ones((N,))
    states = [jnp.ones((N,))] * k
    memory = jax.jit(run, donate_argnums=(0, 1)).lower(x, states, x).compile().memory_analysis()
    assert memory.alias_size_in_bytes >= 4 * N * (1 + k)
    assert memory.temp_size_in_bytes < 0.01 * memory.argument_size_in_bytes


@pytest.mark.parametrize("name", NAMES)
def test_vmap_ensemble_equals_members(name: str) -> None:
    """Four parameter sets updated under vmap equal four separate runs."""
    tx = _transformation(name, norm_coefficient=0.01)
    rng = np.random.default_rng(1)
    params = {"w": jnp.asarray(rng.standard_normal((4, 3, 2)), jnp.float32), "b": jnp.zeros((4, 2))}

    @jax.jit
    def steps(params: Any) -> Any:
        state = tx.init(params)
        for i in range(3):
            grads = jax.tree.map(lambda p, i=i: jnp.sin(p + i), params)
            updates, state = tx.update(grads, state, params)
            params = optax.apply_updates(params, updates)
        return params, state

    batched = jax.vmap(steps)(params)
    for m in range(4):
        alone = steps(jax.tree.map(lambda a, m=m: a[m], params))
        chex.assert_trees_all_close(
            jax.tree.map(lambda a, m=m: a[m], batched), alone, rtol=1e-6, atol=1e-7
        )


@pytest.mark.standard_promotion
@pytest.mark.parametrize("name", NAMES)
def test_vmap_learning_rate_sweep(name: str) -> None:
    """A sweep over learning rates via inject_hyperparams under vmap."""
    make = OPTIMIZERS[name].make
    attributes = OPTIMIZERS[name].convergent["attributes"]
    rates = jnp.array([0.001, 0.01, 0.1])
    params = jnp.array([1.0, -2.0, 0.5])
    grads = jnp.array([0.3, -0.1, 0.2])

    def run(rate: jax.Array) -> Any:
        tx = optax.inject_hyperparams(make)(learning_rate=rate, **attributes)
        state = tx.init(params)
        p = params
        for _ in range(3):
            updates, state = tx.update(grads, state, p)
            p = optax.apply_updates(p, updates)
        return p

    swept = jax.jit(jax.vmap(run))(rates)
    for k, rate in enumerate([0.001, 0.01, 0.1]):
        tx = make(rate, **attributes)
        state, p = tx.init(params), params
        for _ in range(3):
            updates, state = tx.update(grads, state, p)
            p = optax.apply_updates(p, updates)
        chex.assert_trees_all_close(swept[k], p, rtol=1e-6)


SHARDING_SCRIPT = textwrap.dedent(
    """
    import contextlib, sys
    import jax, jax.numpy as jnp, optax, onnx_optax
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    assert len(jax.devices()) == 8, jax.devices()
    mode = getattr(AxisType, sys.argv[1])
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(mode, mode))
    context = jax.set_mesh(mesh) if mode == AxisType.Explicit else contextlib.nullcontext()
    collectives = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")
    with context:
        shardings = {
            "w": NamedSharding(mesh, P("data", "model")),
            "b": NamedSharding(mesh, P("model")),
            "scale": NamedSharding(mesh, P()),
        }
        params = {"w": jnp.ones((64, 32)), "b": jnp.zeros(32), "scale": jnp.ones(())}
        params = jax.device_put(params, shardings)

        def check(tree, what):
            for key, leaf in tree.items():
                assert leaf.sharding.is_equivalent_to(shardings[key], leaf.ndim), (what, key, leaf.sharding)

        for tx, fields in [
            (onnx_optax.adagrad(0.1, norm_coefficient=0.01), ("h",)),
            (onnx_optax.adam(0.1, norm_coefficient=0.01, norm_coefficient_post=0.001), ("v", "h")),
            (onnx_optax.momentum(0.1, alpha=0.9, beta=1.0, norm_coefficient=0.01), ("v",)),
            (onnx_optax.nesterov(0.1, alpha=0.9, beta=0.5, norm_coefficient=0.0), ("v",)),
        ]:
            # Eagerly, from ShapeDtypeStructs (as optax's init), and under jit
            # with explicit sharding, init follows the parameters' shardings.
            # (Under jit in automatic mode the zeros have no operand to take a
            # sharding from: call init outside jit there.)
            abstract = jax.tree.map(
                lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=p.sharding), params
            )
            inits = [tx.init(params), tx.init(abstract)]
            if mode == AxisType.Explicit:
                inits.append(jax.jit(tx.init)(params))
            for state in inits:
                for field in fields:
                    check(getattr(state, field), field)

            def step(params, state, grads):
                updates, state = tx.update(grads, state, params)
                return optax.apply_updates(params, updates), state

            grads = jax.tree.map(jnp.ones_like, params)
            jitted = jax.jit(step, donate_argnums=(0, 1))
            hlo = jitted.lower(params, state, grads).compile().as_text()
            found = [c for c in collectives if c in hlo]
            assert not found, found
            params, state = jitted(params, state, grads)
            check(params, "params")
            for field in fields:
                check(getattr(state, field), field)
    print("sharding ok")
    """
)


@pytest.mark.parametrize("mode", ["Auto", "Explicit"])
def test_sharded_parameters_keep_their_sharding_without_collectives(mode: str) -> None:
    """Eight host devices: the state follows the parameters' sharding, no collectives."""
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
    }
    result = subprocess.run(
        [sys.executable, "-c", SHARDING_SCRIPT, mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("sharding ok")
