"""``onnx-optax attach``'s options, and a running Session's learning rate.

The CLI runs in process (``cli.main``): its models are compared with the ones
the Python API makes from the same arguments, its steps with the ONNX formulas
written by hand in numpy. The learning rate changed on a running Session is
compared with a second session attached at that rate from the same state.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import numpy as np
import optax
import pytest

import onnx_optax
from onnx_optax import cli, ops
from onnx_optax.cli import attach as attach_command

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import interop, training  # noqa: E402
from onnx_optax.training import _metrics, schedules  # noqa: E402
from tests.support.builders import compilations as _compilations  # noqa: E402

F32 = TensorProto.FLOAT
# tf2onnx's names: long, with slashes and colons.
PREFIX = "StatefulPartitionedCall/sequential_1"
K1, B1 = f"{PREFIX}/dense_1/MatMul/ReadVariableOp:0", f"{PREFIX}/dense_1/BiasAdd/ReadVariableOp:0"
K2, B2 = f"{PREFIX}/dense_2/MatMul/ReadVariableOp:0", f"{PREFIX}/dense_2/BiasAdd/ReadVariableOp:0"
HALF = f"{PREFIX}/scale/half:0"


def _mlp() -> onnx.ModelProto:
    """x[N, 4] -> dense 5 -> relu -> dense 3 = logits, and logits * 0.5 = scaled: two outputs."""
    rng = np.random.default_rng(0)
    inits = {
        K1: rng.normal(size=(4, 5)).astype(np.float32),
        B1: np.zeros(5, np.float32),
        K2: rng.normal(size=(5, 3)).astype(np.float32),
        B2: np.zeros(3, np.float32),
        HALF: np.asarray(0.5, np.float32),
    }
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", K1], ["h0"]),
            helper.make_node("Add", ["h0", B1], ["h1"]),
            helper.make_node("Relu", ["h1"], ["h"]),
            helper.make_node("MatMul", ["h", K2], ["l0"]),
            helper.make_node("Add", ["l0", B2], ["logits"]),
            helper.make_node("Mul", ["logits", HALF], ["scaled"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", F32, ["N", 4])],
        [
            helper.make_tensor_value_info("logits", F32, ["N", 3]),
            helper.make_tensor_value_info("scaled", F32, ["N", 3]),
        ],
        initializer=[numpy_helper.from_array(v, n) for n, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _linear() -> onnx.ModelProto:
    """y = x @ w, x[N, 3], w[3, 2]: one output, for steps written by hand."""
    w = np.random.default_rng(1).normal(size=(3, 2)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("x", F32, ["N", 3])],
        [helper.make_tensor_value_info("y", F32, ["N", 2])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _batch(seed: int, n: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.normal(size=(n, 3)).astype(np.float32),
        "t": rng.normal(size=(n, 2)).astype(np.float32),
    }


def _attach_cli(
    tmp_path: pathlib.Path, model: onnx.ModelProto, *options: str, name: str = "t.onnx"
) -> onnx.ModelProto:
    """``onnx-optax attach`` on ``model``; the model it wrote."""
    source = tmp_path / "in.onnx"
    onnx.save(model, str(source))
    out = tmp_path / name
    assert cli.main(["attach", str(source), *options, "-o", str(out)]) == 0
    return onnx.load(str(out))


def _refused(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], *options: str
) -> list[str]:
    """``onnx-optax attach`` on the MLP exits 2; its stderr's lines (nothing written)."""
    source = tmp_path / "in.onnx"
    onnx.save(_mlp(), str(source))
    capsys.readouterr()
    status = cli.main(["attach", str(source), *options, "-o", str(tmp_path / "no.onnx")])
    lines = capsys.readouterr().err.splitlines()
    assert status == 2, lines
    assert not (tmp_path / "no.onnx").exists()
    return lines


def _node(model: onnx.ModelProto, op_type: str) -> onnx.NodeProto:
    (node,) = [n for n in model.training_info[0].algorithm.node if n.op_type == op_type]
    return node


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


# ----------------------------------------------------------------------------- what trains


def test_several_outputs_need_output_name_said_in_one_line(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for options in ([], ["--list"]):
        assert _refused(tmp_path, capsys, *options) == [
            "onnx-optax attach: the model has 2 outputs ('logits' float32[N, 3], 'scaled' "
            "float32[N, 3]); pass --output-name to say which one the loss reads"
        ]
    (line,) = _refused(tmp_path, capsys, "--output-name", "nope")
    assert "output 'nope' is not a graph output; the outputs are 'logits'" in line


def test_trainable_and_frozen_take_repeatable_glob_patterns(tmp_path: pathlib.Path) -> None:
    def trained(*options: str) -> list[str]:
        model = _attach_cli(tmp_path, _mlp(), "--output-name", "scaled", *options)
        return [x.decode() for x in _attributes(_node(model, "Gradient"))["xs"]]

    assert trained() == [K1, B1, K2, B2]  # the plan's weights; HALF is an exporter constant
    assert trained("--trainable", "*/dense_2/*") == [K2, B2]
    assert trained("--trainable", "*dense_1/MatMul*", "--trainable", "*dense_2/Bias*") == [K1, B2]
    # Overlapping patterns: each tensor once, trained in the graph's order.
    assert trained("--trainable", "*MatMul*", "--trainable", f"{PREFIX}/dense_?/*") == [
        K1,
        B1,
        K2,
        B2,
    ]
    assert trained("--frozen", "*BiasAdd*") == [K1, K2]
    assert trained("--frozen", "*dense_1/*", "--frozen", B2) == [K2]
    # An exact name still names a constant (check then warns that it trains).
    model = _attach_cli(tmp_path, _mlp(), "--output-name", "scaled", "--trainable", HALF)
    assert [x.decode() for x in _attributes(_node(model, "Gradient"))["xs"]] == [HALF]
    assert [p.blocking for p in training.check(model)] == [False]


def test_a_pattern_matching_nothing_is_a_usage_error_naming_it(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--output-name", "scaled"]
    (line,) = _refused(
        tmp_path, capsys, *base, "--trainable", "*dense_1/*", "--trainable", "*conv*"
    )
    assert line == (
        "onnx-optax attach: --trainable '*conv*' matches no tensor of the model (see --list "
        "for them)"
    )
    (line,) = _refused(tmp_path, capsys, *base, "--frozen", "nothing/*")
    assert "--frozen 'nothing/*' matches no tensor of the model" in line
    (line,) = _refused(tmp_path, capsys, *base, "--frozen", "dense_1")
    assert "--frozen 'dense_1' names no tensor of the model" in line
    # A glob reaching only a constant does not train it: that takes its exact name.
    (line,) = _refused(tmp_path, capsys, *base, "--trainable", "*/half*")
    assert f"--trainable '*/half*' matches no weight, only '{HALF}' (exporter constant)" in line
    (line,) = _refused(tmp_path, capsys, *base, "--trainable", "*", "--frozen", "*")
    assert "give --trainable (exactly these) or --frozen" in line


def test_list_shows_the_plan_of_the_patterns(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    onnx.save(_mlp(), str(tmp_path / "in.onnx"))
    capsys.readouterr()
    args = ["attach", str(tmp_path / "in.onnx"), "--list", "--output-name", "logits"]
    assert cli.main([*args, "--frozen", "*dense_1*"]) == 0
    rows = {line.split()[1]: line.split()[0] for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows == {K1: "no", B1: "no", K2: "yes", B2: "yes", HALF: "no"}


# ----------------------------------------------------------------------------- schedules


LR = ["--learning-rate", "0.2"]
SCHEDULES = [
    ("constant(0.05)", [], schedules.constant_schedule(0.05), optax.constant_schedule(0.05)),
    (
        "linear(init_value=0.1, end_value=0.01, transition_steps=3, transition_begin=1)",
        [],
        schedules.linear_schedule(0.1, 0.01, 3, 1),
        optax.linear_schedule(0.1, 0.01, 3, 1),
    ),
    (
        "exponential_decay(0.1, 2, 0.5, staircase=True, end_value=0.03)",
        [],
        schedules.exponential_decay(0.1, 2, 0.5, staircase=True, end_value=0.03),
        optax.exponential_decay(0.1, 2, 0.5, staircase=True, end_value=0.03),
    ),
    (
        "cosine_decay(decay_steps=4, alpha=0.1)",  # init_value from --learning-rate
        LR,
        schedules.cosine_decay_schedule(0.2, 4, alpha=0.1),
        optax.cosine_decay_schedule(0.2, 4, alpha=0.1),
    ),
    (
        "warmup_cosine_decay(warmup_steps=2, decay_steps=5e0, end_value=0.001)",  # 5e0 steps
        LR,  # peak_value; init_value 0
        schedules.warmup_cosine_decay_schedule(0.0, 0.2, 2, 5, end_value=0.001),
        optax.warmup_cosine_decay_schedule(0.0, 0.2, 2, 5, end_value=0.001),
    ),
]


@pytest.mark.standard_promotion  # optax's schedules
@pytest.mark.parametrize(
    ("spec", "options", "ours", "reference"), SCHEDULES, ids=[s[0].split("(")[0] for s in SCHEDULES]
)
def test_schedule_gives_the_python_apis_model_and_optaxs_R(
    tmp_path: pathlib.Path, spec: str, options: list[str], ours: Any, reference: Any
) -> None:
    model = _attach_cli(
        tmp_path, _linear(), "--loss", "mse", "--target", "t", "--schedule", spec, *options
    )
    python = training.attach(_linear(), loss="mse", target="t", optimizer=onnx_optax.adam(ours))
    assert model.SerializeToString() == python.SerializeToString()
    session = training.Session(model)
    for step in range(6):  # T from 1 (Adam's first count) to 6
        T = int(session.initializers["T"])
        # optax's value to float32 rounding (docs/training.md's claim for the schedules).
        assert session.learning_rate == pytest.approx(float(reference(T)), rel=1e-6), (step, T)
        session.step(_batch(step))


def test_schedule_spec_errors_are_usage_errors(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--output-name", "logits", "--schedule"]
    cases = {
        "cosine": "unknown schedule 'cosine'; the schedules: constant, linear, "
        "exponential_decay, cosine_decay, warmup_cosine_decay",
        "cosine_decay": "missing decay_steps; it takes cosine_decay(init_value=LR, decay_steps, "
        "alpha=0.0, exponent=1.0) with LR from --learning-rate",
        "linear(1, 0, steps)": "'steps' is not a number, True, False or None",
        "linear(1, 0, 3, foo=2)": "got an unexpected keyword argument 'foo'",
        "__import__('os').system('true')": "--schedule takes NAME or NAME(ARGUMENT=VALUE, ...)",
        "linear(*[1, 0, 3])": "--schedule takes NAME or NAME(ARGUMENT=VALUE, ...)",
        "constant(value='0.1')": "\"'0.1'\" is not a number",
        "linear(1, 0, 2.5)": "transition_steps must be an integer",
        "cosine_decay(decay_steps=0)": "decay_steps must be in [1, ",
        "linear(1, 0, {[1]})": "'{[1]}' is not a number",
        "linear(1, 0, 2**10)": "'2 ** 10' is not a number",
        "linear(1,": "--schedule takes NAME or NAME(ARGUMENT=VALUE, ...)",
        "constant(0.1)\x00": "--schedule takes NAME or NAME(ARGUMENT=VALUE, ...)",
        "constant(1e999)": "value must be finite, got inf",
    }
    for spec, message in cases.items():
        (line,) = _refused(tmp_path, capsys, *base, spec)
        assert message in line, (spec, line)
    (line,) = _refused(tmp_path, capsys, *base, "constant(0.1)", "--learning-rate", "0.2")
    assert "gives value and --learning-rate gives it too; give one" in line


# ----------------------------------------------------------------------------- hyperparameters


def test_each_optimizers_options_reach_its_node(tmp_path: pathlib.Path) -> None:
    cases = {
        "adagrad": (
            ["--decay-factor", "0.1", "--epsilon", "1e-5", "--norm-coefficient", "0.01"],
            {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.01},
        ),
        "adam": (
            [
                *("--alpha", "0.8", "--beta", "0.99", "--epsilon", "1e-7"),
                *("--norm-coefficient", "0.01", "--norm-coefficient-post", "0.02"),
            ],
            {
                "alpha": 0.8,
                "beta": 0.99,
                "epsilon": 1e-7,
                "norm_coefficient": 0.01,
                "norm_coefficient_post": 0.02,
            },
        ),
        "momentum": (
            ["--alpha", "0.5", "--beta", "0.7", "--norm-coefficient", "0.01"],
            {"alpha": 0.5, "beta": 0.7, "norm_coefficient": 0.01, "mode": b"standard"},
        ),
        "nesterov": ([], {"alpha": 0.9, "beta": 1.0, "norm_coefficient": 0.0, "mode": b"nesterov"}),
    }
    for optimizer, (options, expected) in cases.items():
        model = _attach_cli(
            tmp_path, _linear(), "--loss", "mse", "--optimizer", optimizer, *options
        )
        node = _node(model, optimizer.capitalize() if optimizer != "nesterov" else "Momentum")
        found = _attributes(node)
        assert set(found) == set(expected), optimizer
        for name, value in expected.items():
            want = value if isinstance(value, bytes) else pytest.approx(value, rel=1e-7)
            assert found[name] == want, (optimizer, name)


def test_the_cli_defaults_are_the_factories() -> None:
    import inspect

    for optimizer in ("adagrad", "adam"):
        parameters = inspect.signature(getattr(onnx_optax, optimizer)).parameters
        for name, value in attach_command.HYPERPARAMETERS[optimizer].items():
            assert parameters[name].default == value, (optimizer, name)


def test_inapplicable_options_are_refused_naming_them(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--output-name", "logits", "--optimizer"]
    (line,) = _refused(tmp_path, capsys, *base, "momentum", "--epsilon", "1e-8")
    assert line == (
        "onnx-optax attach: --epsilon does not apply to momentum (its options: --alpha, --beta, "
        "--norm-coefficient)"
    )
    (line,) = _refused(tmp_path, capsys, *base, "adagrad", "--alpha", "0.5", "--beta", "0.5")
    assert "--alpha, --beta do not apply to adagrad (its options: --decay-factor, --epsilon" in line
    (line,) = _refused(tmp_path, capsys, *base, "adam", "--decay-factor", "0.1")
    assert "--decay-factor does not apply to adam" in line
    (line,) = _refused(tmp_path, capsys, *base, "nesterov", "--weight-decay", "0.01")
    assert "--weight-decay does not apply to nesterov" in line
    assert "its coupled L2 decay (torch.optim's weight_decay) is --norm-coefficient" in line
    (line,) = _refused(tmp_path, capsys, *base, "adagrad", "--norm-coefficient-post", "0.1")
    assert "--norm-coefficient-post does not apply to adagrad" in line
    both = ["--weight-decay", "0.01", "--norm-coefficient-post", "0.1"]
    (line,) = _refused(tmp_path, capsys, *base, "adam", *both)
    assert "give it or --norm-coefficient-post, not both" in line
    (line,) = _refused(tmp_path, capsys, *base, "adam", "--beta", "1.5")
    assert "beta" in line  # the factory's own check, as a usage error


def test_weight_decay_is_the_readmes_adamw_mapping_and_a_step_by_hand(
    tmp_path: pathlib.Path,
) -> None:
    lr, wd = 0.1, 0.05
    options = ["--loss", "mse", "--target", "t", "--learning-rate", str(lr)]
    model = _attach_cli(tmp_path, _linear(), *options, "--weight-decay", str(wd))
    python = training.attach(
        _linear(),
        loss="mse",
        target="t",
        optimizer=onnx_optax.adam(lr, norm_coefficient_post=lr * wd),
    )
    assert model.SerializeToString() == python.SerializeToString()
    c = _attributes(_node(model, "Adam"))["norm_coefficient_post"]
    assert c == np.float32(lr * wd)  # an ONNX float attribute

    # One ONNX Adam step (the operator's formulas) in float64 numpy, from the stored state.
    session = training.Session(model)
    w = session.initializers["w"].astype(np.float64)
    v, h = (session.initializers[n].astype(np.float64) for n in ("w.v", "w.h"))
    T = int(session.initializers["T"])
    batch = _batch(0)
    x, t = batch["x"].astype(np.float64), batch["t"].astype(np.float64)
    g = 2.0 * x.T @ (x @ w - t) / t.size  # mean squared error's gradient
    alpha, beta, epsilon = 0.9, 0.999, 1e-6
    v = alpha * v + (1 - alpha) * g
    h = beta * h + (1 - beta) * g * g
    r = np.float32(lr) * np.sqrt(1 - beta**T) / (1 - alpha**T)
    expected = (1 - np.float64(c)) * (w - r * v / (np.sqrt(h) + epsilon))
    session.step(batch)
    np.testing.assert_allclose(session.initializers["w"], expected, rtol=1e-5, atol=1e-7)
    # PyTorch's AdamW, X - lr*wd*X - lr*step, differs by the factor (1 - lr*wd) on the step.
    step = r * v / (np.sqrt(h) + epsilon)
    adamw = w - c * w - step
    np.testing.assert_allclose(expected - adamw, c * step, rtol=1e-9, atol=1e-15)


def test_weight_decay_with_a_schedule_reads_its_peak_and_says_so(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = "warmup_cosine_decay(peak_value=0.01, warmup_steps=10, decay_steps=100)"
    model = _attach_cli(
        tmp_path, _linear(), "--loss", "mse", "--schedule", spec, "--weight-decay", "0.1"
    )
    assert _attributes(_node(model, "Adam"))["norm_coefficient_post"] == np.float32(0.001)
    assert "the schedule's peak_value as the learning rate" in capsys.readouterr().err


def test_help_shows_every_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # no line breaks inside "--learning-rate" or "1e-06"
    with pytest.raises(SystemExit) as stopped:
        cli.main(["attach", "--help"])
    assert stopped.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for shown in (
        "--learning-rate LR R (default: 0.001)",
        "--optimizer {adagrad,adam,momentum,nesterov} the ONNX optimizer node (default: adam)",
        "(default: softmax_cross_entropy)",
        "the momentum's decay (default: 0.9)",
        "the gradient's factor (default: adam 0.999; momentum, nesterov 1)",
        "added to the square root of H (default: 1e-06)",
        "R / (1 + T * decay_factor) (default: 0)",
        "Adagrad and SGD) (default: 0)",
        "X becomes (1 - c) X after the step (default: 0)",
        "the decay stays constant (default: 0)",
        "--clip C, --clip-global-norm C clip the gradients to global norm C, as "
        "optax.clip_by_global_norm (default: none)",
        "(default: none, R is --learning-rate)",
        "(default: 1; 2 or -1",
    ):
        assert shown in text, shown


def test_clip_is_clip_global_norm(tmp_path: pathlib.Path) -> None:
    short = _attach_cli(tmp_path, _linear(), "--loss", "mse", "--clip", "0.5")
    long = _attach_cli(tmp_path, _linear(), "--loss", "mse", "--clip-global-norm", "0.5")
    python = training.attach(
        _linear(), loss="mse", optimizer=onnx_optax.adam(1e-3), clip_global_norm=0.5
    )
    assert short.SerializeToString() == long.SerializeToString() == python.SerializeToString()


# ----------------------------------------------------------------------------- learning rate


def _state_into(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """``model`` with the stored initializers of ``values`` (parameters, V, H, T) replaced."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    for init in result.graph.initializer:
        if init.name in values and init.name != "R.scale":
            init.CopyFrom(numpy_helper.from_array(values[init.name], init.name))
    return result


RATES = {
    "constant": (onnx_optax.adam(0.02), onnx_optax.adam(0.01)),
    "schedule": (
        onnx_optax.adam(schedules.warmup_cosine_decay_schedule(0.0, 0.04, 3, 12, 0.004)),
        onnx_optax.adam(schedules.warmup_cosine_decay_schedule(0.0, 0.02, 3, 12, 0.002)),
    ),
    "momentum": (
        onnx_optax.momentum(0.02, alpha=0.9, beta=1.0, norm_coefficient=0.0),
        onnx_optax.momentum(0.01, alpha=0.9, beta=1.0, norm_coefficient=0.0),
    ),
}


@pytest.mark.parametrize("kind", list(RATES))
def test_halving_the_rate_equals_a_model_attached_at_half_from_the_same_state(
    tmp_path: pathlib.Path, kind: str
) -> None:
    full, half = RATES[kind]
    session = training.Session(training.attach(_linear(), loss="mse", target="t", optimizer=full))
    assert session.learning_rate_scale == 1.0
    for step in range(3):
        session.step(_batch(step))
    before = session.learning_rate
    assert before is not None
    # The same parameters, V, H and T in a model attached at half the rate.
    halved = _state_into(
        training.attach(_linear(), loss="mse", target="t", optimizer=half), session.initializers
    )
    other = training.Session(halved)
    if kind == "schedule":
        session.learning_rate_scale = 0.5
    else:
        session.set_learning_rate(before / 2)
    assert session.learning_rate_scale == 0.5
    assert session.learning_rate == other.learning_rate == pytest.approx(before / 2)
    for step in range(3, 7):
        np.testing.assert_array_equal(
            session.step(_batch(step))["loss"], other.step(_batch(step))["loss"]
        )
        assert session.learning_rate == other.learning_rate
    for name, value in other.initializers.items():
        if name != "R.scale":
            np.testing.assert_array_equal(session.initializers[name], value, err_msg=name)

    # save, then resume: the scale is kept, and the steps go on bit-identically.
    session.save(tmp_path / "saved.onnx")
    resumed = training.Session(tmp_path / "saved.onnx")
    assert resumed.learning_rate_scale == 0.5
    assert resumed.learning_rate == session.learning_rate
    assert training.check(training.load(tmp_path / "saved.onnx")) == []
    for step in range(7, 9):
        session.step(_batch(step))
        resumed.step(_batch(step))
    for name, value in session.initializers.items():
        np.testing.assert_array_equal(resumed.initializers[name], value, err_msg=name)


def test_a_step_after_set_learning_rate_is_the_adam_op_by_hand_at_that_rate() -> None:
    session = training.Session(
        training.attach(_linear(), loss="mse", target="t", optimizer=onnx_optax.adam(0.05))
    )
    session.step(_batch(0))
    session.set_learning_rate(0.003)
    assert session.learning_rate == 0.003
    assert np.float32(0.05) * np.float32(session.learning_rate_scale) == np.float32(0.003)
    before = session.initializers
    x, t = _batch(1)["x"], _batch(1)["t"]
    g = (2.0 * x.T @ (x @ before["w"] - t) / t.size).astype(np.float32)
    T = np.int64(before["T"])
    expected = ops.adam(
        np.float32(0.003), T, before["w"], g, before["w.v"], before["w.h"], epsilon=1e-6
    )
    session.step(_batch(1))
    np.testing.assert_allclose(session.initializers["w"], expected[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(session.initializers["w.v"], expected[1], rtol=1e-5, atol=1e-9)


def test_changing_the_rate_does_not_compile_the_step_again() -> None:
    session = training.Session(
        training.attach(
            _linear(),
            loss="mse",
            target="t",
            optimizer=onnx_optax.adam(schedules.cosine_decay_schedule(0.1, 100)),
        )
    )
    session.step(_batch(0))
    session.set_learning_rate(0.05)  # compiles R's own small graph, once
    with _compilations() as compiled:
        for step, scale in enumerate((0.25, 2.0, 0.0, 1.0)):
            session.learning_rate_scale = scale
            session.step(_batch(step))
            session.set_learning_rate(0.01 * (step + 1))
            assert session.learning_rate == pytest.approx(0.01 * (step + 1))
            session.step(_batch(step))
    assert compiled == []
    with _compilations() as compiled:  # the listener hears compilations: a new batch size
        session.step(_batch(0, n=5))
    assert compiled


def test_the_scale_reaches_to_model_from_model_and_trains_log(tmp_path: pathlib.Path) -> None:
    session = training.Session(
        training.attach(_linear(), loss="mse", target="t", optimizer=onnx_optax.adam(0.02))
    )
    session.learning_rate_scale = 0.25
    model = session.to_model()
    assert interop.from_model(model).R == pytest.approx(0.005)
    rate, why = _metrics.learning_rate(model)  # what `onnx-optax train` logs
    assert rate is not None, why
    assert rate.rate(rate.stored) == 0.005
    scale = next(i for i in model.graph.initializer if i.name == "R.scale")
    assert numpy_helper.to_array(scale) == np.float32(0.25)
    inference = session.to_inference_model()
    assert {i.name for i in inference.graph.initializer} == {"w"}


def test_bad_rates_are_refused() -> None:
    session = training.Session(
        training.attach(
            _linear(),
            loss="mse",
            target="t",
            optimizer=onnx_optax.adam(schedules.warmup_cosine_decay_schedule(0.0, 0.1, 5, 20)),
        )
    )
    with pytest.raises(ValueError, match=r"the scale must be >= 0, got -1.0"):
        session.learning_rate_scale = -1.0
    with pytest.raises(ValueError, match="must be finite, got nan"):
        session.learning_rate_scale = float("nan")
    with pytest.raises(ValueError, match="must be finite, got inf"):
        session.set_learning_rate(float("inf"))
    with pytest.raises(ValueError, match=r"the learning rate must be >= 0, got -0.1"):
        session.set_learning_rate(-0.1)
    session.initialize()
    assert session.initializers["T"] == 1  # Adam counts from 1: the warmup's 0.02
    session.set_learning_rate(0.01)
    assert session.learning_rate == 0.01
    assert session.learning_rate_scale == pytest.approx(0.5, rel=1e-6)


def test_a_warmup_at_zero_cannot_be_scaled_to_a_rate() -> None:
    tx = onnx_optax.momentum(
        schedules.linear_schedule(0.0, 0.1, 10), alpha=0.9, beta=1.0, norm_coefficient=0.0
    )
    session = training.Session(training.attach(_linear(), loss="mse", target="t", optimizer=tx))
    assert session.learning_rate == 0.0  # Momentum counts from T = 0
    with pytest.raises(
        ValueError, match=r"R before the scale is 0.0 at T = 0 .*learning_rate_scale"
    ):
        session.set_learning_rate(0.01)


def test_a_model_without_a_scale_trains_and_says_the_rate_cannot_change() -> None:
    # A model as attach wrote it before the scale: R read by the optimizer node directly.
    model = training.attach(_linear(), loss="mse", target="t", optimizer=onnx_optax.adam(0.02))
    algorithm = model.training_info[0].algorithm
    (mul,) = [n for n in algorithm.node if n.op_type == "Mul" and "R.scale" in n.input]
    _node(model, "Adam").input[0] = mul.input[0]
    algorithm.node.remove(mul)
    (scale,) = [i for i in model.graph.initializer if i.name == "R.scale"]
    model.graph.initializer.remove(scale)
    assert training.check(model) == []
    session = training.Session(model)
    session.step(_batch(0))
    assert session.learning_rate == 0.02
    assert session.learning_rate_scale is None
    message = r"the model stores no learning-rate scale: R \('R.unscaled'\) of its optimizer node"
    with pytest.raises(ValueError, match=rf"Session.learning_rate_scale: {message}"):
        session.learning_rate_scale = 0.5
    with pytest.raises(ValueError, match=rf"Session.set_learning_rate: {message}"):
        session.set_learning_rate(0.01)
    # interop.to_model's models, too.
    tx = onnx_optax.adagrad(0.1)
    params = {"w": jax.numpy.ones(3)}
    other = training.Session(interop.to_model(tx, params, tx.init(params)))
    assert other.learning_rate == 0.1 and other.learning_rate_scale is None


def test_a_scale_read_by_anything_else_is_not_a_scale() -> None:
    model = training.attach(_linear(), loss="mse", target="t", optimizer=onnx_optax.adam(0.02))
    model.graph.node.append(helper.make_node("Mul", ["y", "R.scale"], ["y2"]))
    model.graph.output.append(helper.make_tensor_value_info("y2", F32, ["N", 2]))
    session = training.Session(model)
    assert session.learning_rate_scale is None  # changing it would change y2 too
    assert session.learning_rate == 0.02


# ----------------------------------------------------------------------------- types


def test_the_training_api_is_typed_and_says_so() -> None:
    """Every public function and method of onnx_optax.training annotates each parameter and
    its return; py.typed (which the wheel ships: hatch takes the package folder whole) is there."""
    import inspect

    missing = []
    for name in training.__all__:
        value = getattr(training, name)
        members = [value]
        if inspect.isclass(value):
            members = [
                m
                for n, m in vars(value).items()
                if (not n.startswith("_") or n == "__init__") and callable(m)
            ]
            members += [p.fget for p in vars(value).values() if isinstance(p, property) and p.fget]
        if inspect.ismodule(value):
            members = [
                getattr(value, n) for n in value.__all__ if inspect.isfunction(getattr(value, n))
            ]
        for member in members:
            if not inspect.isfunction(member):
                continue
            signature = inspect.signature(member)
            untyped = [
                p.name
                for p in signature.parameters.values()
                if p.name not in ("self", "cls") and p.annotation is p.empty
            ]
            if untyped or signature.return_annotation is signature.empty:
                missing.append(f"{name}.{member.__name__}: {untyped or 'return'}")
    assert missing == []
    assert (pathlib.Path(onnx_optax.__file__).parent / "py.typed").is_file()


# ----------------------------------------------------------------------------- dropout, precision


def _dropping(dtype: int = F32) -> onnx.ModelProto:
    """y = Dropout(x @ w, ratio 0.5): inference as exported, dropping once attached so."""
    w = np.random.default_rng(2).normal(size=(3, 2)).astype(helper.tensor_dtype_to_np_dtype(dtype))
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Dropout", ["h", "ratio"], ["y"]),
        ],
        "dropping",
        [helper.make_tensor_value_info("x", dtype, ["N", 3])],
        [helper.make_tensor_value_info("y", dtype, ["N", 2])],
        initializer=[
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.asarray(0.5, np.float32), "ratio"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize(
    ("dtype", "options", "kwargs"),
    [
        (F32, ["--dropout"], {"dropout": True}),
        (F32, ["--compute-dtype", "bfloat16"], {"compute_dtype": "bfloat16"}),
        (TensorProto.FLOAT16, ["--master-dtype", "float32"], {"master_dtype": "float32"}),
        (
            TensorProto.FLOAT16,
            ["--loss-scale", "1024", "--loss-scale-period", "10"],
            {"loss_scale": 1024.0, "loss_scale_period": 10},
        ),
    ],
)
def test_dropout_and_precision_options_are_the_python_apis(
    tmp_path: pathlib.Path, dtype: int, options: list[str], kwargs: dict[str, Any]
) -> None:
    ours = _attach_cli(tmp_path, _dropping(dtype), "--loss", "mse", *options)
    python = training.attach(
        _dropping(dtype), loss="mse", optimizer=onnx_optax.adam(1e-3), **kwargs
    )
    assert ours.SerializeToString() == python.SerializeToString()


def test_train_seeds_dropouts_masks_with_its_seed(tmp_path: pathlib.Path) -> None:
    """Two runs with one --seed write the same weights; another seed draws other masks."""
    _attach_cli(tmp_path, _dropping(), "--loss", "mse", "--dropout", name="d.onnx")
    rng = np.random.default_rng(3)
    x, t = rng.normal(size=(16, 3)).astype(np.float32), rng.normal(size=(16, 2))
    np.savez(tmp_path / "d.npz", x=x, target=t.astype(np.float32))
    found = {}
    for run, seed in (("a", "0"), ("b", "0"), ("c", "1")):
        out = tmp_path / f"{run}.onnx"
        argv = ["train", str(tmp_path / "d.onnx"), "--data", str(tmp_path / "d.npz")]
        options = ["--steps", "3", "--batch-size", "8", "--seed", seed, "--quiet"]
        assert cli.main([*argv, *options, "-o", str(out)]) == 0
        found[run] = training.Session(out).initializers["w"]
    np.testing.assert_array_equal(found["a"], found["b"])
    assert not np.array_equal(found["a"], found["c"])


def test_a_rate_read_from_a_t_no_binding_writes_is_a_function_of_t() -> None:
    # R = T + 0.1 from a T that is an initializer no update_binding writes (counts=False):
    # T stays the function's argument (it used to be read as a constant too, so the
    # learning-rate graph took no input at all).
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "W"], ["Y"])],
        "m",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3])],
        [
            numpy_helper.from_array(np.ones(3, np.float32), "W"),
            numpy_helper.from_array(np.array(5, np.int64), "T"),
            numpy_helper.from_array(np.array(0.1, np.float32), "base"),
        ],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(interop.DOMAIN, 1)],
    )
    info = model.training_info.add()
    info.algorithm.CopyFrom(
        helper.make_graph(
            [
                helper.make_node("Cast", ["T"], ["Tf"], to=TensorProto.FLOAT),
                helper.make_node("Add", ["Tf", "base"], ["R"]),
                helper.make_node(
                    "Adagrad", ["R", "T", "W", "G", "H"], ["W2", "H2"], domain=interop.DOMAIN
                ),
            ],
            "algorithm",
            [],
            [],
        )
    )
    binding = info.update_binding.add()
    binding.key, binding.value = "W", "W2"
    rate, why = _metrics.learning_rate(model)
    assert rate is not None, why
    assert (rate.stored, rate.counts) == (5, False)
    assert rate.rate(5) == pytest.approx(5.1)
    assert rate.rate(7) == pytest.approx(7.1)
