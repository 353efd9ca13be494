"""Every path through one operator's kernel gives the same bits.

The "Exactness" section of docs/reliability.md says that the transformation's new state is
the op's ``V_new``/``H_new`` bit for bit, that ``optax.apply_updates`` gives
the op's ``X_new`` bit for bit (but for Adam's post decay), and that a result
does not depend on whether it was computed eagerly or under ``jit``. This is
the differential test of those claims: the eager op is compared, bit for bit,
with

* the op inside ``jax.jit`` with R and T traced (the attributes, ONNX
  constants, are then constants of the compiled function);
* each member of ``jax.jit(jax.vmap(op))`` with R and T unbatched;
* the transformation's state (eager, jitted, with the packed layout, and inside
  a jitted training step), and its update applied to X (in a jit of its own,
  and in the training step).

For T in {0, 1, 5}, float32 and float64, Momentum, Nesterov, Adagrad and Adam,
random shapes, and values chosen so that terms cancel: V_new = alpha V +
beta G_r near zero, Nesterov's G_r + alpha V_new near zero, X - step near zero.
Cancellation magnifies a last-bit difference in a product into many ulp of the
result, so a kernel that fuses a multiply-add into an FMA on one path and not
on another fails here. Two of our paths are compared with each other, so the
comparison itself is the test; ``test_oracle.py`` checks the values.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import onnx_optax
from tests.support.optimizers import NAMES, OPTIMIZERS, Optimizer, f32, keyed_rng

COUNTS = (0, 1, 5)
SHAPES = [(), (1,), (5,), (3, 4), (2, 3, 5), (33,), (8, 17), (300,)]


def _attributes(name: str, dtype: str, rng: np.random.Generator) -> dict[str, Any]:
    """Random attributes with regularization; in float32, ones that invite XLA to simplify.

    One set per dtype keeps the file fast (each set compiles every path). The
    float32 set has Momentum's alpha = 1, which XLA drops from ``alpha * V``
    when alpha is a compile-time constant, and Adagrad without decay or
    regularization and with epsilon = 0, where XLA turns the division by
    sqrt(H_new) into a multiplication by its reciprocal square root. Adam's
    float64 set has no post decay, so that ``apply_updates`` must give X_new
    exactly, and its float32 set a post decay.
    Adam's beta is one whose ``log1p(beta - 1)`` XLA rounds differently at run
    time than when it folds a constant (with libm's log1p, as numpy's): a path
    that folds the bias factor and one that computes it at run time disagree.
    """
    attributes = OPTIMIZERS[name].draw_attributes(rng)
    attributes["norm_coefficient"] = f32(rng.uniform(0.01, 0.1))
    edge = dtype == "float32"
    if name == "adam":
        candidates = rng.uniform(0.5, 0.99, 64).astype(np.float32).astype(dtype)
        at_run_time = np.asarray(jax.jit(lambda b: jnp.log1p(b - 1))(candidates))
        differs = candidates[at_run_time != np.log1p(candidates - 1)]
        attributes["beta"] = float((differs if differs.size else candidates)[0])
        attributes["norm_coefficient_post"] = f32(rng.uniform(0.01, 0.1)) if edge else 0.0
    elif name == "adagrad" and edge:
        attributes.update(decay_factor=0.0, epsilon=0.0, norm_coefficient=0.0)
    elif name in ("momentum", "nesterov") and edge:
        attributes.update(alpha=1.0, beta=f32(rng.uniform(0.1, 0.9)))
    return attributes


def _cancelling(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Factors 1 + d with |d| from one ulp to 2**20 ulp: near-complete cancellation."""
    eps = float(np.finfo(dtype).eps)
    return 1.0 + eps * 2.0 ** rng.uniform(0, 20, shape) * rng.choice([-1.0, 1.0], shape)


def _tensors(
    name: str,
    attributes: dict[str, Any],
    R: float,
    T: int,
    shapes: list[tuple[int, ...]],
    dtype: str,
    rng: np.random.Generator,
) -> list[list[np.ndarray]]:
    """Per tensor, [X, G, *state]: a third of the elements random, the rest cancelling."""
    tensors = []
    for shape in shapes:
        x, g = rng.standard_normal(shape), rng.standard_normal(shape)
        pick = rng.integers(0, 3, shape)  # 0: random, 1 and 2: two kinds of cancellation
        nc = attributes["norm_coefficient"]
        g_r = nc * x + g
        if name in ("momentum", "nesterov"):
            alpha, b = attributes["alpha"], attributes["beta"] if T > 0 else 1.0
            v = rng.standard_normal(shape)
            if alpha:
                # pick 1: V_new = alpha V + b G_r ~ 0; pick 2: G_r + alpha V_new ~ 0.
                v_new = np.where(pick == 1, 0.0, -g_r / alpha)
                v = np.where(pick == 0, v, (v_new - b * g_r) / alpha)
            state = [v * _cancelling(rng, shape, dtype)]
        elif name == "adam":
            alpha, beta, epsilon = (attributes[k] for k in ("alpha", "beta", "epsilon"))
            v = rng.standard_normal(shape)
            if alpha:  # pick 1: V_new = alpha V + (1 - alpha) G_r ~ 0
                v = np.where(pick == 1, -(1 - alpha) * g_r / alpha, v)
            h = np.abs(rng.standard_normal(shape))
            v_new = alpha * v + (1 - alpha) * g_r
            h_new = beta * h + (1 - beta) * g_r**2
            r = R * np.sqrt(1 - beta**T) / (1 - alpha**T) if T > 0 else R
            # pick 2: X - step ~ 0 (g_r used X before; the step moves little with it)
            x = np.where(pick == 2, r * v_new / (np.sqrt(h_new) + epsilon), x)
            state = [v * _cancelling(rng, shape, dtype), h]
        else:
            h = np.abs(rng.standard_normal(shape))
            r = R / (1 + T * attributes["decay_factor"])
            step = r * g_r / (np.sqrt(h + g_r**2) + attributes["epsilon"])
            x = np.where(pick == 2, step, x)  # X - step ~ 0
            state = [h]
        tensors.append([a.astype(dtype) for a in (x * _cancelling(rng, shape, dtype), g, *state)])
    return tensors


def _bits(array: Any) -> np.ndarray:
    array = np.asarray(array)
    return array.view(np.dtype(f"u{array.dtype.itemsize}"))


def _ulps(a: np.ndarray, b: np.ndarray) -> int:
    """Largest distance in units in the last place (signed zeros one apart)."""
    sign = 1 << (8 * a.itemsize - 1)

    def ordered(x: np.ndarray) -> list[int]:
        return [int(u) if u < sign else sign - 1 - int(u) for u in _bits(x).ravel()]

    return max((abs(p - q) for p, q in zip(ordered(a), ordered(b), strict=True)), default=0)


def _compare(failures: list[str], actual: Any, expected: Any, what: str) -> None:
    """Adds to ``failures`` unless ``actual`` has exactly the bits of ``expected``."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    differ = _bits(actual) != _bits(expected)
    if differ.any():
        failures.append(
            f"{what}: {int(differ.sum())} of {differ.size} elements differ, "
            f"by up to {_ulps(actual, expected)} ulp"
        )


def _fill_state(template: Any, leaves: list[np.ndarray]) -> Any:
    """``leaves`` in the layout of ``template`` (a list, or a PackedTree's shape from init)."""
    if not isinstance(template, onnx_optax.PackedTree):
        return [jnp.asarray(leaf) for leaf in leaves]
    layout = template.layout
    buffers = [np.zeros(b.shape, b.dtype) for b in template.buffers]
    own = []
    for leaf, slot in zip(leaves, layout.slots, strict=True):
        if slot is None:
            own.append(jnp.asarray(leaf))
        else:
            buffers[slot[0]][slot[1] : slot[1] + leaf.size] = leaf.ravel()
    return onnx_optax.PackedTree(layout, [jnp.asarray(b) for b in buffers], own)


def _state_leaves(tree: Any) -> list[np.ndarray]:
    """Each parameter's state as a numpy array (unpacked on the host: no compilation)."""
    if not isinstance(tree, onnx_optax.PackedTree):
        return [np.asarray(leaf) for leaf in tree]
    layout, own = tree.layout, iter(tree.own)
    leaves = []
    for shape, slot in zip(layout.shapes, layout.slots, strict=True):
        if slot is None:
            leaves.append(np.asarray(next(own)))
        else:
            flat = np.asarray(tree.buffers[slot[0]])[slot[1] : slot[1] + int(np.prod(shape))]
            leaves.append(flat.reshape(shape))
    return leaves


_apply_updates = jax.jit(optax.apply_updates)


def _check_paths(
    failures: list[str], optimizer: Optimizer, attributes: dict[str, Any], dtype: str, seed: Any
) -> None:
    n_state = len(optimizer.state_names)

    def run_op(R: Any, T: Any, *flat: Any) -> Any:
        return optimizer.op(R, T, *flat, **attributes)

    jitted_op = jax.jit(run_op)
    vmapped_op = jax.jit(jax.vmap(run_op, in_axes=(None, None, *[0] * 3 * (2 + n_state))))

    def flatten(tensors: list[list[np.ndarray]]) -> list[np.ndarray]:
        return [t[k] for k in range(2 + n_state) for t in tensors]  # ONNX order

    rng = keyed_rng(seed)
    R = np.asarray(rng.uniform(0.01, 0.5), dtype)
    shapes = [SHAPES[i] for i in rng.integers(0, len(SHAPES), size=3)]

    def draw(T: int, *key: Any) -> list[list[np.ndarray]]:
        rng = keyed_rng(seed, T, *key)
        return _tensors(optimizer.name, attributes, float(R), T, shapes, dtype, rng)

    # One transformation per layout; every T reuses its compiled update.
    txs = {
        pack: optimizer.transform(jnp.asarray(R), attributes, pack_leaves_below=pack)
        for pack in (0, 10_000)
    }
    params = [jax.ShapeDtypeStruct(s, dtype) for s in shapes]
    templates = {pack: jax.eval_shape(tx.init, params) for pack, tx in txs.items()}
    # Eager and jitted, and packed (eagerly: the packed buffer is what differs).
    updates = {(0, False): txs[0].update, (0, True): jax.jit(txs[0].update)}
    updates[10_000, False] = txs[10_000].update

    @jax.jit
    def training_step(xs: Any, gs: Any, state: Any) -> Any:
        new_updates, state = txs[0].update(gs, state, xs)
        return optax.apply_updates(xs, new_updates), state

    # The update is exactly -step, X_new = X - step, unless a post decay makes
    # it X_final - X.
    post = bool(attributes.get("norm_coefficient_post", 0.0))
    for T in COUNTS:
        tensors = draw(T)
        flat = flatten(tensors)
        expected = [np.asarray(o) for o in run_op(R, T, *flat)]
        where = f"{optimizer.name} {dtype} T={T} {attributes}"
        for k, out in enumerate(jitted_op(R, np.asarray(T), *flat)):
            _compare(failures, out, expected[k], f"jitted op, output {k}, {where}")

        other = flatten(draw(T, "other"))
        other_expected = run_op(R, T, *other)
        batched = vmapped_op(
            R, np.asarray(T), *(np.stack(p) for p in zip(flat, other, strict=True))
        )
        for k, out in enumerate(batched):
            _compare(failures, out[0], expected[k], f"jit(vmap) member 0, output {k}, {where}")
            _compare(
                failures, out[1], other_expected[k], f"jit(vmap) member 1, output {k}, {where}"
            )

        xs = [jnp.asarray(t[0]) for t in tensors]
        gs = [jnp.asarray(t[1]) for t in tensors]
        op_x, op_state = expected[:3], expected[3:]
        for (pack, jit), update in updates.items():
            fields = {
                field: _fill_state(getattr(templates[pack], field), [t[2 + k] for t in tensors])
                for k, field in enumerate(optimizer.state_names)
            }
            state = templates[pack]._replace(count=jnp.asarray(np.int32(T)), **fields)
            new_updates, new_state = update(gs, state, xs)
            path = f"transformation (pack_leaves_below={pack}, jit={jit})"
            for k, field in enumerate(optimizer.state_names):
                for i, leaf in enumerate(_state_leaves(getattr(new_state, field))):
                    _compare(failures, leaf, op_state[3 * k + i], f"{path} {field}[{i}], {where}")
            if not post:  # applied in a jitted function of its own
                for i, x_new in enumerate(_apply_updates(xs, new_updates)):
                    _compare(failures, x_new, op_x[i], f"{path} X + update [{i}], {where}")

        state = templates[0]._replace(
            count=jnp.asarray(np.int32(T)),
            **{
                f: [jnp.asarray(t[2 + k]) for t in tensors]
                for k, f in enumerate(optimizer.state_names)
            },
        )
        x_new, new_state = training_step(xs, gs, state)
        for k, field in enumerate(optimizer.state_names):
            for i, leaf in enumerate(getattr(new_state, field)):
                _compare(
                    failures, leaf, op_state[3 * k + i], f"training step {field}[{i}], {where}"
                )
        if not post:
            for i, leaf in enumerate(x_new):
                _compare(failures, leaf, op_x[i], f"training step X[{i}], {where}")


@pytest.mark.parametrize("name", NAMES)
def test_every_path_gives_the_op_bits(name: str, dtype: str) -> None:
    failures: list[str] = []
    attributes = _attributes(name, dtype, keyed_rng("attributes", name, dtype))
    _check_paths(failures, OPTIMIZERS[name], attributes, dtype, ("paths", name, dtype))
    assert not failures, f"{len(failures)} comparisons differ:\n" + "\n".join(failures)
