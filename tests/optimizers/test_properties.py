"""Property-based tests (hypothesis) against the float64 oracle.

Random shapes (0-d and empty included), dtypes, attributes over their whole
valid range, T from 0 to 2**31 - 1 and random pytrees (dicts, lists, tuples,
None leaves). Profiles: ``ci`` (fixed, derandomized, run by CI) and ``long``
(``HYPOTHESIS_PROFILE=long``), registered in ``conftest.py``.

Properties checked:
1. every op matches the oracle;
2. every transformation matches the oracle over two updates of a random pytree,
   and keeps the state's structure, shapes and dtypes and the updates' dtypes;
3. the outputs are finite whenever the inputs are and the formula is, evaluated
   in the tensors' own precision with XLA's flush-to-zero arithmetic.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tests.support.optimizers import INT32_MAX, NAMES, OPTIMIZERS, Optimizer

DTYPES = ("float32", "float64")


def _f32(x: float) -> float:
    return float(np.float32(x))


# XLA flushes subnormal numbers to zero (test_extremes.py tests that); the general
# properties keep their inputs 0 or of magnitude >= 1e-6, where no intermediate of
# the formulas becomes subnormal.
def _normal(x: float) -> bool:
    return x == 0.0 or abs(x) >= 1e-6


def _unit() -> st.SearchStrategy[float]:
    """[0, 1] with both ends drawn often."""
    return st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0)).map(_f32).filter(_normal)


def _log_uniform(low: float, high: float) -> st.SearchStrategy[float]:
    return st.floats(np.log10(low), np.log10(high)).map(lambda e: _f32(10.0**e))


def _nonnegative(high: float) -> st.SearchStrategy[float]:
    return st.one_of(st.just(0.0), _log_uniform(1e-6, high))


def attributes(
    name: str, *, epsilon: st.SearchStrategy[float]
) -> st.SearchStrategy[dict[str, Any]]:
    """ONNX attributes over their valid ranges (float32 values, as ONNX stores them)."""
    coefficient = st.one_of(st.just(0.0), st.floats(-1.0, 1.0).map(_f32).filter(_normal))
    if name == "adagrad":
        return st.fixed_dictionaries(
            {"decay_factor": _nonnegative(1e6), "epsilon": epsilon, "norm_coefficient": coefficient}
        )
    if name == "adam":
        return st.fixed_dictionaries(
            {
                "alpha": _unit(),
                "beta": _unit(),
                "epsilon": epsilon,
                "norm_coefficient": coefficient,
                "norm_coefficient_post": coefficient,
            }
        )
    return st.fixed_dictionaries(
        {"alpha": _unit(), "beta": st.floats(0.0, 2.0).map(_f32), "norm_coefficient": coefficient}
    )


def counts() -> st.SearchStrategy[int]:
    return st.one_of(
        st.sampled_from([0, 1, 2, INT32_MAX]), st.integers(0, 20), st.integers(0, INT32_MAX)
    )


def tensor(
    shape: tuple[int, ...], dtype: str, *, nonnegative: bool = False
) -> st.SearchStrategy[np.ndarray]:
    low = 0.0 if nonnegative else -1e3
    elements = st.one_of(st.just(0.0), st.floats(low, 1e3, width=32).filter(_normal))
    return hnp.arrays(dtype, shape, elements=elements)


SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


def _close(
    actual: Any, expected: np.ndarray, scale: np.ndarray, dtype: str, ulps: int = 64
) -> None:
    """Non-finite results match in kind; finite ones are within ``ulps`` of each
    element's own scale in the tensor dtype."""
    eps = float(np.finfo(dtype).eps)
    actual = np.asarray(actual, np.float64)
    assert actual.shape == expected.shape
    assert np.array_equal(np.isnan(actual), np.isnan(expected)), (actual, expected)
    infinite = np.isinf(expected)
    assert np.array_equal(actual[infinite], expected[infinite]), (actual, expected)
    finite = np.isfinite(expected)
    assert np.all(np.isfinite(actual[finite])), (actual, expected)
    error = np.abs(actual[finite] - expected[finite])
    bound = ulps * eps * (np.abs(expected[finite]) + scale[finite]) + np.finfo(dtype).tiny
    assert np.all(error <= bound), (actual, expected, error.max())


def _scales(
    optimizer: Optimizer, inputs: list[np.ndarray], outputs: tuple[np.ndarray, ...]
) -> list[np.ndarray]:
    """Each output element's scale: its inputs' and its change's magnitudes."""
    x, g, *state = (np.abs(np.asarray(a, np.float64)) for a in inputs)
    step = np.abs(outputs[0] - np.asarray(inputs[0], np.float64))
    g_scale = g + x  # |G_regularized| <= |G| + |X| for |norm_coefficient| <= 1
    scales = [x + step]
    for s, new in zip(state, outputs[1:], strict=True):
        scales.append(s + np.abs(new) + g_scale * (1 + g_scale))
    return scales


# ------------------------------------------------------------------ property 1


@st.composite
def op_problems(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(st.sampled_from(NAMES))
    optimizer = OPTIMIZERS[name]
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.integers(1, 3))
    shapes = [draw(SHAPES) for _ in range(n)]
    return {
        "name": name,
        "dtype": dtype,
        "attributes": draw(attributes(name, epsilon=_log_uniform(1e-8, 1e6))),
        "T": draw(counts()),
        "R": _f32(draw(st.floats(0.0, 10.0).filter(_normal))),
        "xs": [draw(tensor(s, dtype)) for s in shapes],
        "gs": [draw(tensor(s, dtype)) for s in shapes],
        "states": [
            [draw(tensor(s, dtype, nonnegative=k == "h")) for s in shapes]
            for k in optimizer.state_names
        ],
    }


# Found by CI: with alpha = 1 and T > 2048, 1 - alpha**T must be +0.0 (the step is
# -inf, as the formula reads), not the -0.0 of -expm1(0).
_ALPHA_ONE = {
    "name": "adam",
    "dtype": "float32",
    "attributes": {
        "alpha": 1.0,
        "beta": 0.0,
        "epsilon": 1.0,
        "norm_coefficient": 0.0,
        "norm_coefficient_post": 0.0,
    },
    "T": 2049,
    "R": 1.0,
    "xs": [np.zeros((), np.float32)],
    "gs": [np.zeros((), np.float32)],
    "states": [[np.ones((), np.float32)], [np.zeros((), np.float32)]],
}


@given(op_problems())
@example(problem=_ALPHA_ONE)
def test_op_matches_oracle(problem: dict[str, Any]) -> None:
    optimizer = OPTIMIZERS[problem["name"]]
    dtype = problem["dtype"]
    n = len(problem["xs"])
    with jax.enable_x64(dtype == "float64"):
        R = np.asarray(problem["R"], dtype)
        outputs = optimizer.op(
            R,
            problem["T"],
            *problem["xs"],
            *problem["gs"],
            *(t for s in problem["states"] for t in s),
            **problem["attributes"],
        )
    assert all(np.asarray(o).dtype == np.dtype(dtype) for o in outputs)
    for i in range(n):
        inputs = [problem["xs"][i], problem["gs"][i], *(s[i] for s in problem["states"])]
        with np.errstate(all="ignore"):
            expected = optimizer.oracle(float(R), problem["T"], *inputs, **problem["attributes"])
        ours = [outputs[k * n + i] for k in range(len(expected))]
        for out, exp, scale in zip(
            ours, expected, _scales(optimizer, inputs, expected), strict=True
        ):
            _close(out, exp, scale, dtype)


# ------------------------------------------------------------------ property 2


def pytrees(leaf: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Nested dicts, lists and tuples of arrays, with None leaves (empty subtrees)."""
    keys = st.text("abcdefgh", min_size=1, max_size=3)
    return st.recursive(
        st.one_of(leaf, st.none()),
        lambda children: st.one_of(
            st.dictionaries(keys, children, min_size=1, max_size=3),
            st.lists(children, min_size=1, max_size=3),
            st.lists(children, min_size=1, max_size=3).map(tuple),
        ),
        max_leaves=6,
    )


@st.composite
def transform_problems(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(st.sampled_from(NAMES))
    dtype = draw(st.sampled_from(DTYPES))
    params = draw(pytrees(SHAPES.flatmap(lambda s: tensor(s, dtype))))
    leaves = jax.tree.leaves(params)
    return {
        "name": name,
        "dtype": dtype,
        "attributes": draw(attributes(name, epsilon=_log_uniform(1e-8, 1e6))),
        "initial_count": draw(counts()),
        "R": _f32(draw(st.floats(0.0, 10.0).filter(_normal))),
        "params": params,
        "grads": [[draw(tensor(np.shape(p), dtype)) for p in leaves] for _ in range(2)],
        "pack": draw(st.sampled_from([0, 10])),
    }


@given(transform_problems())
def test_transform_matches_oracle_and_keeps_its_structure(problem: dict[str, Any]) -> None:
    optimizer = OPTIMIZERS[problem["name"]]
    dtype = problem["dtype"]
    attributes = problem["attributes"]
    with jax.enable_x64(dtype == "float64"):
        params = jax.tree.map(jnp.asarray, problem["params"])
        treedef = jax.tree.structure(params)
        tx = optimizer.transform(
            problem["R"],
            attributes,
            initial_count=problem["initial_count"],
            pack_leaves_below=problem["pack"],
        )
        state = tx.init(params)
        state_def = jax.tree.structure(state)
        state_dtypes = [leaf.dtype for leaf in jax.tree.leaves(state)]
        update = jax.jit(tx.update)
        for grads in problem["grads"]:
            grads_tree = jax.tree.unflatten(treedef, [jnp.asarray(g) for g in grads])
            updates, state = update(grads_tree, state, params)
            assert jax.tree.structure(updates) == treedef
            assert [u.dtype for u in jax.tree.leaves(updates)] == [
                g.dtype for g in jax.tree.leaves(grads_tree)
            ]
            assert jax.tree.structure(state) == state_def
            assert [leaf.dtype for leaf in jax.tree.leaves(state)] == state_dtypes
            params = optax.apply_updates(params, updates)
    expected_count = min(problem["initial_count"] + 2, INT32_MAX)
    assert int(state.count) == expected_count

    # The oracle, leaf by leaf, over the same two updates.
    xs = [np.asarray(p, np.float64) for p in jax.tree.leaves(problem["params"])]
    states = [[np.zeros_like(x) for x in xs] for _ in optimizer.state_names]
    for k, grads in enumerate(problem["grads"]):
        T = min(problem["initial_count"] + k, INT32_MAX)
        for i, g in enumerate(grads):
            inputs = [xs[i], g, *(s[i] for s in states)]
            with np.errstate(all="ignore"):
                out = optimizer.oracle(
                    np.float64(np.asarray(problem["R"], dtype)), T, *inputs, **attributes
                )
            xs[i] = out[0]
            for j, s in enumerate(states):
                s[i] = out[1 + j]
    # Two steps compound the roundings of one: compare each leaf normwise.
    initial = [np.abs(np.asarray(p, np.float64)) for p in jax.tree.leaves(problem["params"])]
    for ours, exp, x0 in zip(jax.tree.leaves(params), xs, initial, strict=True):
        scale = np.full(exp.shape, np.max(np.abs(np.nan_to_num(exp - x0)), initial=0.0)) + x0
        _close(ours, exp, scale, dtype, ulps=256)


# ------------------------------------------------------------------ property 3


@st.composite
def extreme_problems(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(st.sampled_from(NAMES))
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=5))
    magnitude = (
        st.sampled_from([0.0, 1e-30, 1e-8, 1.0, 1e8, 1e30])
        if dtype == "float64"
        else st.sampled_from([0.0, 1e-30, 1e-8, 1.0, 1e8, 1e19])
    )
    signs = st.sampled_from([-1.0, 1.0])

    def values(nonnegative: bool = False) -> np.ndarray:
        flat = [
            draw(magnitude) * (1.0 if nonnegative else draw(signs))
            for _ in range(int(np.prod(shape)))
        ]
        return np.asarray(flat, dtype).reshape(shape)

    return {
        "name": name,
        "dtype": dtype,
        "attributes": draw(
            attributes(name, epsilon=st.one_of(st.just(0.0), _log_uniform(1e-30, 1e30)))
        ),
        "T": draw(counts()),
        "R": _f32(draw(st.sampled_from([0.0, 1e-8, 1e-3, 1.0, 1e3]))),
        "inputs": [values(), values()]
        + [values(nonnegative=k == "h") for k in OPTIMIZERS[name].state_names],
    }


@given(extreme_problems())
def test_finite_whenever_inputs_and_formula_are(problem: dict[str, Any]) -> None:
    optimizer = OPTIMIZERS[problem["name"]]
    dtype = problem["dtype"]
    with np.errstate(all="ignore"):
        expected = optimizer.oracle(
            problem["R"],
            problem["T"],
            *problem["inputs"],
            **problem["attributes"],
            dtype=np.dtype(dtype).type,
            flush_subnormals=True,
        )
    with jax.enable_x64(dtype == "float64"):
        outputs = optimizer.op(
            np.asarray(problem["R"], dtype),
            problem["T"],
            *problem["inputs"],
            **problem["attributes"],
        )
    for ours, exp in zip(outputs, expected, strict=True):
        finite = np.isfinite(exp)
        # Where the formula is finite in the tensors' precision, so are we.
        assert np.all(np.isfinite(np.asarray(ours))[finite]), (np.asarray(ours), exp)
