"""onnx_optax.training.schedules and attach(clip_global_norm=): equal to optax, in JAX and ONNX."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import onnx_optax

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from onnx_optax._src.graph import GraphFunction  # noqa: E402
from onnx_optax.training import _clipping, schedules  # noqa: E402

COUNTS = np.arange(10_000, dtype=np.int64)

# (optax's function name, its arguments): built both by optax and by schedules.
CASES = [
    ("constant_schedule", {"value": 0.25}),
    (
        "linear_schedule",
        {"init_value": 1e-3, "end_value": 1e-5, "transition_steps": 3000, "transition_begin": 500},
    ),
    ("linear_schedule", {"init_value": 0.0, "end_value": 1.0, "transition_steps": 9999}),
    ("exponential_decay", {"init_value": 1e-2, "transition_steps": 700, "decay_rate": 0.5}),
    (
        "exponential_decay",
        {
            "init_value": 1e-2,
            "transition_steps": 700,
            "decay_rate": 0.5,
            "transition_begin": 100,
            "staircase": True,
            "end_value": 1e-4,
        },
    ),
    (
        "exponential_decay",
        {"init_value": 1e-2, "transition_steps": 700, "decay_rate": 1.5, "end_value": 0.05},
    ),
    ("cosine_decay_schedule", {"init_value": 1e-3, "decay_steps": 1000}),
    (
        "cosine_decay_schedule",
        {"init_value": 1e-3, "decay_steps": 7000, "alpha": 0.1, "exponent": 2.0},
    ),
    (
        "warmup_cosine_decay_schedule",
        {
            "init_value": 0.0,
            "peak_value": 1e-3,
            "warmup_steps": 500,
            "decay_steps": 8000,
            "end_value": 1e-5,
        },
    ),
    (
        "warmup_cosine_decay_schedule",
        {
            "init_value": 1e-4,
            "peak_value": 1e-3,
            "warmup_steps": 0,
            "decay_steps": 8000,
            "exponent": 0.5,
        },
    ),
    (
        "warmup_cosine_decay_schedule",
        {"init_value": 0.1, "peak_value": 0.0, "warmup_steps": 10, "decay_steps": 100},
    ),
]
IDS = [f"{name}-{i}" for i, (name, _) in enumerate(CASES)]


def _optax_values(name: str, kwargs: dict[str, Any], counts: np.ndarray) -> np.ndarray:
    """optax's schedule at ``counts`` (int32, as optax's counters are), as float32."""
    with jax.numpy_dtype_promotion("standard"):  # optax is not clean under strict promotion
        values = getattr(optax, name)(**kwargs)(jnp.asarray(counts, jnp.int32))
    return np.broadcast_to(np.asarray(values, np.float32), counts.shape)


def _assert_float32_close(ours: Any, expected: np.ndarray, exponent: float = 1.0) -> None:
    """Equal to float32 rounding: a few ulps of the values and of the schedule's scale.

    An exponent below 1 magnifies the rounding of the cosine term near its end
    (``c ** 0.5`` has slope ``0.5 / sqrt(c)``), so it gets ten times the margin.
    """
    scale = float(np.max(np.abs(expected))) or 1.0
    atol = (1e-5 if exponent < 1 else 1e-6) * scale
    np.testing.assert_allclose(np.asarray(ours), expected, rtol=1e-6, atol=atol)


def _fresh(taken: set[str]) -> Callable[[str], str]:
    def names(base: str) -> str:
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        return name

    return names


def _schedule_model(schedule: schedules.Schedule, dtype: Any = np.float32) -> onnx.ModelProto:
    """A model computing R from a vector of counts T with the schedule's nodes."""
    nodes = schedule.onnx_nodes("T", "R", _fresh({"T", "R"}), dtype)
    shape = [] if isinstance(schedule, type(schedules.constant_schedule(1.0))) else ["N"]
    graph = helper.make_graph(
        nodes,
        "schedule",
        [helper.make_tensor_value_info("T", TensorProto.INT64, ["N"])],
        [
            helper.make_tensor_value_info(
                "R", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape
            )
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model, full_check=True)
    return model


# ----------------------------------------------------------------------------- the schedules


@pytest.mark.parametrize(("name", "kwargs"), CASES, ids=IDS)
def test_schedule_equals_optax_over_10000_counts(name: str, kwargs: dict[str, Any]) -> None:
    schedule = getattr(schedules, name)(**kwargs)
    expected = _optax_values(name, kwargs, COUNTS)
    counts = jnp.asarray(COUNTS, jnp.int32)
    _assert_float32_close(schedule(counts), expected)
    _assert_float32_close(jax.jit(schedule)(counts), expected)
    assert float(schedule(17)) == pytest.approx(float(expected[17]), rel=1e-6)


@pytest.mark.parametrize(("name", "kwargs"), CASES, ids=IDS)
def test_onnx_nodes_equal_optax_over_10000_counts(name: str, kwargs: dict[str, Any]) -> None:
    model = _schedule_model(getattr(schedules, name)(**kwargs))
    expected = _optax_values(name, kwargs, COUNTS)
    exponent = kwargs.get("exponent", 1.0)
    (reference,) = ReferenceEvaluator(model).run(None, {"T": COUNTS})
    assert reference.dtype == np.float32
    _assert_float32_close(np.broadcast_to(reference, COUNTS.shape), expected, exponent)
    (ours,) = GraphFunction(model.graph, opsets={"": 13})([COUNTS])
    _assert_float32_close(np.broadcast_to(ours, COUNTS.shape), expected, exponent)


def test_onnx_nodes_cast_the_value_to_the_parameters_dtype() -> None:
    schedule = schedules.cosine_decay_schedule(0.1, 100)
    (values,) = ReferenceEvaluator(_schedule_model(schedule, np.float64)).run(None, {"T": COUNTS})
    assert values.dtype == np.float64
    expected = _optax_values(
        "cosine_decay_schedule", {"init_value": 0.1, "decay_steps": 100}, COUNTS
    )
    _assert_float32_close(values, expected)


def test_schedules_are_immutable_hashable_and_print_as_their_call() -> None:
    a, b = schedules.linear_schedule(1.0, 0.0, 10), schedules.linear_schedule(1.0, 0.0, 10)
    assert a == b and hash(a) == hash(b) and a != schedules.linear_schedule(1.0, 0.0, 11)
    with pytest.raises(AttributeError):
        a.init_value = 2.0  # type: ignore[misc]
    assert (
        repr(a)
        == "linear_schedule(init_value=1.0, end_value=0.0, transition_steps=10, transition_begin=0)"
    )


@pytest.mark.parametrize(("name", "kwargs"), CASES, ids=IDS)
def test_transformation_with_a_schedule_equals_it_with_optaxs(
    name: str, kwargs: dict[str, Any]
) -> None:
    """adam(schedule) is a working optax transformation: the same steps as with optax's schedule."""
    params = {"w": jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32)}
    grads = {"w": jnp.linspace(0.5, -2.0, 6, dtype=jnp.float32)}
    results = []
    for schedule in (getattr(schedules, name)(**kwargs), getattr(optax, name)(**kwargs)):
        tx = onnx_optax.adam(schedule)
        p, state = params, tx.init(params)
        with jax.numpy_dtype_promotion("standard"):
            for _ in range(5):
                updates, state = tx.update(grads, state, p)
                p = optax.apply_updates(p, updates)
        results.append(p["w"])
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------- in a training model


def _linear_model(opset: int = 13) -> onnx.ModelProto:
    """y = x @ w + b, with two initializers so that the global norm spans tensors."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(3, 2)).astype(np.float32), "w"),
        numpy_helper.from_array(np.zeros(2, np.float32), "b"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
        ],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _batches(steps: int, scale: float = 3.0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [
        {
            "x": rng.normal(size=(8, 3)).astype(np.float32),
            "t": (scale * rng.normal(size=(8, 2))).astype(np.float32),
        }
        for _ in range(steps)
    ]


def _by_hand(
    model: onnx.ModelProto, tx: optax.GradientTransformation, batches: list[dict[str, np.ndarray]]
) -> tuple[dict[str, jax.Array], list[float]]:
    """The model trained with mse in a JAX loop: final params and each step's gradient norm."""
    params = {i.name: jnp.asarray(numpy_helper.to_array(i)) for i in model.graph.initializer}

    def loss(p: dict[str, jax.Array], x: jax.Array, t: jax.Array) -> jax.Array:
        return jnp.mean((x @ p["w"] + p["b"][None, :] - t) ** 2)

    @jax.jit
    def step(p: Any, state: Any, x: jax.Array, t: jax.Array) -> tuple[Any, Any, jax.Array]:
        grads = jax.grad(loss)(p, x, t)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, sum(jnp.sum(g**2) for g in grads.values())

    state = tx.init(params)
    norms = []
    with jax.numpy_dtype_promotion("standard"):
        for batch in batches:
            params, state, square = step(params, state, batch["x"], batch["t"])
            norms.append(math.sqrt(float(square)))
    return params, norms


def _trained(model: onnx.ModelProto, batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    assert onnx_optax.training.check(model) == []
    onnx.checker.check_model(model, full_check=True)
    session = onnx_optax.training.Session(model)
    for batch in batches:
        session.step(batch)
    return session.initializers


OPTIMIZERS = {
    "adam": onnx_optax.adam,
    "adagrad": onnx_optax.adagrad,
    "momentum": lambda lr: onnx_optax.momentum(lr, alpha=0.9, beta=1.0, norm_coefficient=0.0),
}
TRAINING_SCHEDULES = [
    ("constant_schedule", {"value": 0.05}),
    (
        "linear_schedule",
        {"init_value": 0.1, "end_value": 0.01, "transition_steps": 20, "transition_begin": 3},
    ),
    (
        "exponential_decay",
        {"init_value": 0.1, "transition_steps": 4, "decay_rate": 0.7, "staircase": True},
    ),
    ("cosine_decay_schedule", {"init_value": 0.1, "decay_steps": 25, "alpha": 0.05}),
    (
        "warmup_cosine_decay_schedule",
        {"init_value": 0.0, "peak_value": 0.1, "warmup_steps": 5, "decay_steps": 25},
    ),
]


@pytest.mark.parametrize(
    ("optimizer", "name", "kwargs"),
    [("adam", name, kwargs) for name, kwargs in TRAINING_SCHEDULES]
    + [(optimizer, *TRAINING_SCHEDULES[-1]) for optimizer in ("adagrad", "momentum")],
    ids=[f"adam-{name}" for name, _ in TRAINING_SCHEDULES] + ["adagrad", "momentum"],
)
def test_session_with_a_schedule_equals_the_transformation_by_hand(
    optimizer: str, name: str, kwargs: dict[str, Any]
) -> None:
    """R = schedule(T) in the graph, T counting as the transformation's count does."""
    model = _linear_model()
    tx = OPTIMIZERS[optimizer](getattr(schedules, name)(**kwargs))
    batches = _batches(30)
    trained = _trained(
        onnx_optax.training.attach(model, loss="mse", target="t", optimizer=tx), batches
    )
    expected, _ = _by_hand(model, OPTIMIZERS[optimizer](getattr(optax, name)(**kwargs)), batches)
    for n in ("w", "b"):
        np.testing.assert_allclose(trained[n], expected[n], rtol=1e-5, atol=1e-6)


def test_a_saved_model_resumes_its_schedule_where_it_stopped() -> None:
    """T is stored, so R continues from the saved count: 10 + 10 steps equal 20."""
    tx = onnx_optax.adam(schedules.warmup_cosine_decay_schedule(0.0, 0.1, 5, 25))
    model = onnx_optax.training.attach(
        _linear_model(), loss="mse", target="t", optimizer=tx, clip_global_norm=2.0
    )
    batches = _batches(20)
    whole = onnx_optax.training.Session(model)
    first = onnx_optax.training.Session(model)
    for batch in batches:
        whole.step(batch)
    for batch in batches[:10]:
        first.step(batch)
    second = onnx_optax.training.Session(first.to_model())
    for batch in batches[10:]:
        second.step(batch)
    for name, value in whole.initializers.items():
        np.testing.assert_array_equal(second.initializers[name], value)


@pytest.mark.parametrize("max_norm", [2.0, 1e3])
def test_clip_global_norm_equals_optax_chain(max_norm: float) -> None:
    model = _linear_model()
    batches = _batches(30)
    tx = onnx_optax.adam(schedules.cosine_decay_schedule(0.1, 30))
    attached = onnx_optax.training.attach(
        model, loss="mse", target="t", optimizer=tx, clip_global_norm=max_norm
    )
    trained = _trained(attached, batches)
    reference = optax.chain(
        optax.clip_by_global_norm(max_norm), onnx_optax.adam(optax.cosine_decay_schedule(0.1, 30))
    )
    expected, norms = _by_hand(model, reference, batches)
    if max_norm == 2.0:  # the steps clip some gradients and keep others
        assert any(n > max_norm for n in norms) and any(n < max_norm for n in norms), norms
    else:  # never clipped: the same as no clipping
        unclipped, _ = _by_hand(
            model, onnx_optax.adam(optax.cosine_decay_schedule(0.1, 30)), batches
        )
        np.testing.assert_allclose(expected["w"], unclipped["w"], rtol=1e-6)
    for n in ("w", "b"):
        np.testing.assert_allclose(trained[n], expected[n], rtol=1e-5, atol=1e-6)


def test_clip_global_norm_keeps_zero_gradients() -> None:
    model = _linear_model()
    batch = {"x": np.zeros((4, 3), np.float32), "t": np.zeros((4, 2), np.float32)}
    attached = onnx_optax.training.attach(
        model, loss="mse", target="t", optimizer=onnx_optax.adam(0.1), clip_global_norm=1.0
    )
    trained = _trained(attached, [batch, batch])
    for init in model.graph.initializer:
        np.testing.assert_array_equal(trained[init.name], numpy_helper.to_array(init))


@pytest.mark.parametrize("scale", [0.0, 0.1, 10.0])
def test_clipping_nodes_equal_optax_clip_by_global_norm(scale: float) -> None:
    rng = np.random.default_rng(2)
    grads = {"a": (scale * rng.normal(size=(4, 5))).astype(np.float32), "b": np.float32(scale)}
    nodes, clipped = _clipping.clip_by_global_norm_nodes(
        list(grads), 3.0, _fresh(set(grads)), np.float32
    )
    graph = helper.make_graph(
        nodes,
        "clip",
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, list(np.shape(g)))
            for n, g in grads.items()
        ],
        [
            helper.make_tensor_value_info(c, TensorProto.FLOAT, list(np.shape(g)))
            for c, g in zip(clipped, grads.values(), strict=True)
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    with jax.numpy_dtype_promotion("standard"):
        expected, _ = optax.clip_by_global_norm(3.0).update(
            {k: jnp.asarray(v) for k, v in grads.items()}, optax.EmptyState()
        )
    with np.errstate(invalid="ignore"):  # zero gradients: 0 / 0 in the branch Where drops, as optax
        reference = ReferenceEvaluator(model).run(None, grads)
    for out in (reference, GraphFunction(graph, opsets={"": 18})(list(grads.values()))):
        for got, want in zip(out, expected.values(), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)


# ----------------------------------------------------------------------------- mistakes

BAD_ARGUMENTS = [
    (
        "linear_schedule",
        {"init_value": 1.0, "end_value": 0.0, "transition_steps": 0},
        ValueError,
        r"linear_schedule: transition_steps must be in \[1, 2147483647\], got 0; for a value that does not change use constant_schedule",
    ),
    (
        "linear_schedule",
        {"init_value": 1.0, "end_value": 0.0, "transition_steps": 5, "transition_begin": -1},
        ValueError,
        r"transition_begin must be in \[0, 2147483647\], got -1",
    ),
    (
        "linear_schedule",
        {"init_value": float("nan"), "end_value": 0.0, "transition_steps": 5},
        ValueError,
        "init_value must be finite, got nan",
    ),
    (
        "linear_schedule",
        {"init_value": 1.0, "end_value": 0.0, "transition_steps": 10.0},
        TypeError,
        r"transition_steps must be an integer \(a count of steps\)",
    ),
    (
        "linear_schedule",
        {"init_value": 1.0, "end_value": "0", "transition_steps": 10},
        TypeError,
        "end_value must be a real number",
    ),
    (
        "exponential_decay",
        {"init_value": 1.0, "transition_steps": 10, "decay_rate": 0.0},
        ValueError,
        "decay_rate must be a finite number > 0, got 0.0",
    ),
    (
        "exponential_decay",
        {"init_value": 1.0, "transition_steps": 10, "decay_rate": -0.5},
        ValueError,
        "decay_rate must be a finite number > 0",
    ),
    (
        "exponential_decay",
        {"init_value": 1.0, "transition_steps": -3, "decay_rate": 0.5},
        ValueError,
        "transition_steps must be in",
    ),
    (
        "exponential_decay",
        {"init_value": 1.0, "transition_steps": 10, "decay_rate": 0.5, "staircase": 1},
        TypeError,
        "staircase must be True or False",
    ),
    (
        "exponential_decay",
        {"init_value": 1.0, "transition_steps": 10, "decay_rate": 0.5, "end_value": float("inf")},
        ValueError,
        "end_value must be finite",
    ),
    (
        "cosine_decay_schedule",
        {"init_value": 1.0, "decay_steps": 0},
        ValueError,
        r"decay_steps must be in \[1, ",
    ),
    (
        "cosine_decay_schedule",
        {"init_value": 1.0, "decay_steps": 2**31},
        ValueError,
        "decay_steps must be in",
    ),
    (
        "cosine_decay_schedule",
        {"init_value": 1.0, "decay_steps": 10, "exponent": 0.0},
        ValueError,
        "exponent must be a finite number > 0",
    ),
    (
        "cosine_decay_schedule",
        {"init_value": True, "decay_steps": 10},
        TypeError,
        "init_value must be a real number: a boolean",
    ),
    (
        "warmup_cosine_decay_schedule",
        {"init_value": 0.0, "peak_value": 1.0, "warmup_steps": 10, "decay_steps": 10},
        ValueError,
        r"decay_steps must be in \[11, 2147483647\], got 10 \(greater than warmup_steps",
    ),
    (
        "warmup_cosine_decay_schedule",
        {"init_value": 0.0, "peak_value": 1.0, "warmup_steps": -1, "decay_steps": 10},
        ValueError,
        "warmup_steps must be in",
    ),
    (
        "constant_schedule",
        {"value": np.ones(2)},
        TypeError,
        r"value must be a real number: expected a scalar, got an array of shape \(2,\)",
    ),
]


@pytest.mark.parametrize(("name", "kwargs", "error", "message"), BAD_ARGUMENTS)
def test_out_of_range_arguments_are_named(
    name: str, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        getattr(schedules, name)(**kwargs)


def test_a_traced_argument_is_refused() -> None:
    with pytest.raises(TypeError, match="init_value is traced"):
        jax.jit(lambda v: schedules.linear_schedule(v, 0.0, 10)(0))(1.0)


@pytest.mark.parametrize(
    "learning_rate",
    [lambda count: 0.1, optax.cosine_decay_schedule(0.1, 100)],
    ids=["python-function", "optax-schedule"],
)
def test_attach_names_the_schedules_for_a_python_schedule(learning_rate: Any) -> None:
    with pytest.raises(TypeError, match="Python function") as info:
        onnx_optax.training.attach(
            _linear_model(), loss="mse", target="t", optimizer=onnx_optax.adam(learning_rate)
        )
    for name in schedules.SCHEDULES:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (0.0, ValueError, "clip_global_norm must be a finite number > 0"),
        (-1.0, ValueError, "clip_global_norm must be a finite number > 0"),
        (float("inf"), ValueError, "got inf"),
        (float("nan"), ValueError, "got nan"),
        ("1", TypeError, "clip_global_norm must be a real number"),
        (True, TypeError, "clip_global_norm must be a real number"),
    ],
)
def test_attach_refuses_a_bad_clip_global_norm(
    value: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        onnx_optax.training.attach(
            _linear_model(),
            loss="mse",
            target="t",
            optimizer=onnx_optax.adam(0.1),
            clip_global_norm=value,
        )
