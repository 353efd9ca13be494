"""No lost state: interrupted loops resume exactly; mismatched checkpoints fail loudly.

The training loop below is the pattern docs/reliability.md recommends ("No
lost state"): one jitted step with params and state donated, whose results
replace the committed params and state only when the step returns. Bad input
fails while tracing, before anything is donated, so the committed buffers stay
alive.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax
import pytest

from tests.support.optimizers import NAMES, OPTIMIZERS

PARAMS = {"w": jnp.array([[1.0, -2.0], [0.5, 3.0]]), "b": jnp.array([0.1, -0.1])}
STEPS = 8


def _batch(i: int) -> dict[str, jax.Array]:
    return jax.tree.map(lambda p: jnp.sin(p * (i + 1) + i), PARAMS)


def _transformation(name: str) -> Any:
    attributes = {**OPTIMIZERS[name].convergent["attributes"], "norm_coefficient": 0.01}
    return OPTIMIZERS[name].transform(0.05, attributes)


def _step_fn(tx: Any) -> Any:
    def step(params: Any, state: Any, grads: Any) -> Any:
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return jax.jit(step, donate_argnums=(0, 1))


def _fresh(tx: Any) -> dict[str, Any]:
    params = jax.tree.map(jnp.copy, PARAMS)
    return {"params": params, "state": tx.init(params), "steps": 0}


def _alive(tree: Any) -> bool:
    return not any(leaf.is_deleted() for leaf in jax.tree.leaves(tree))


@pytest.mark.parametrize("name", NAMES)
def test_exceptions_and_interrupts_mid_run_lose_nothing(name: str) -> None:
    tx = _transformation(name)
    step = _step_fn(tx)

    uninterrupted = _fresh(tx)
    for i in range(STEPS):
        uninterrupted["params"], uninterrupted["state"] = step(
            uninterrupted["params"], uninterrupted["state"], _batch(i)
        )

    failures = {
        2: lambda: {"w": jnp.ones((3, 2)), "b": jnp.ones(2)},  # malformed: refused while tracing
        4: OSError("the data loader failed"),  # raised between steps
        6: KeyboardInterrupt(),  # Ctrl-C between steps
    }

    def get_batch(i: int) -> Any:
        failure = failures.pop(i, None)
        if isinstance(failure, BaseException):
            raise failure
        return failure() if failure else _batch(i)

    committed = _fresh(tx)
    interruptions = []
    while committed["steps"] < STEPS:
        before = jax.tree.map(jnp.copy, (committed["params"], committed["state"]))
        try:
            batch = get_batch(committed["steps"])
            params, state = step(committed["params"], committed["state"], batch)
        except (ValueError, OSError, KeyboardInterrupt) as error:
            interruptions.append(type(error).__name__)
            # The last committed params and state are alive and unchanged; the
            # loop simply retries the step.
            assert _alive((committed["params"], committed["state"]))
            chex.assert_trees_all_equal((committed["params"], committed["state"]), before)
            continue
        committed.update(params=params, state=state, steps=committed["steps"] + 1)
    assert interruptions == ["ValueError", "OSError", "KeyboardInterrupt"]
    chex.assert_trees_all_equal(
        (committed["params"], committed["state"]),
        (uninterrupted["params"], uninterrupted["state"]),
    )


@pytest.mark.parametrize("name", NAMES)
def test_state_of_another_model_is_refused(name: str) -> None:
    """A state restored for one model never silently updates another."""
    tx = _transformation(name)
    state = tx.init(PARAMS)
    other = {"w": jnp.ones((3, 2)), "b": jnp.ones(2)}
    with pytest.raises(
        ValueError,
        match=r"updates\['w'\] has shape \(3, 2\) but state\.\w+\['w'\] has shape \(2, 2\)",
    ):
        tx.update(other, state, other)
    renamed = {"kernel": PARAMS["w"], "b": PARAMS["b"]}
    with pytest.raises(ValueError, match=r"different tree structures"):
        tx.update(renamed, state, renamed)
    # A raw restore (a dict, not the state type) is refused too.
    raw = dict(zip(state._fields, state, strict=True))
    with pytest.raises(TypeError, match=r"state must be an? \w+State, got dict"):
        tx.update(PARAMS, raw, PARAMS)


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_restored_into_another_model_fails(name: str, tmp_path: Any) -> None:
    ocp = pytest.importorskip("orbax.checkpoint")
    tx = _transformation(name)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "state", tx.init(PARAMS))
    checkpointer.wait_until_finished()
    for other in (
        {"w": PARAMS["w"], "bias": PARAMS["b"]},  # another structure
        {"w": PARAMS["w"]},  # fewer parameters
    ):
        target = jax.eval_shape(lambda other=other: tx.init(other))
        with pytest.raises(ValueError, match=r"(?i)(structure mismatch|do not match)"):
            checkpointer.restore(tmp_path / "state", target)
    restored = checkpointer.restore(tmp_path / "state", jax.eval_shape(lambda: tx.init(PARAMS)))
    chex.assert_trees_all_equal(restored, tx.init(PARAMS))


SHAPE_MISMATCH = textwrap.dedent(
    """
    import sys
    import jax, jax.numpy as jnp, orbax.checkpoint as ocp, onnx_optax
    tx = onnx_optax.adam(0.1)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(sys.argv[1], tx.init({"w": jnp.ones((2, 2))}))
    checkpointer.wait_until_finished()
    try:
        checkpointer.restore(sys.argv[1], jax.eval_shape(lambda: tx.init({"w": jnp.ones((3, 2))})))
    except ValueError as error:
        print("refused:", str(error).splitlines()[0][:80])
    else:
        print("restored a state of shape (2, 2) into (3, 2)")
    """
)


def test_checkpoint_of_other_shapes_is_refused(tmp_path: Any) -> None:
    """Run apart: orbax's other reads fail in the background after the error."""
    pytest.importorskip("orbax.checkpoint")
    result = subprocess.run(
        [sys.executable, "-c", SHAPE_MISMATCH, str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert "refused:" in result.stdout, result.stdout + result.stderr
