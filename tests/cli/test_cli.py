"""The ``onnx-optax`` command line, run as a user would (in a subprocess)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

import onnx_optax
from onnx_optax import cli
from onnx_optax.cli import bench
from tests.support.builders import inference_model as _inference_model
from tests.support.builders import write_npz as _npz

OPTIMIZERS = ("adagrad", "adam", "momentum", "nesterov")
REPOSITORY = pathlib.Path(__file__).resolve().parents[2]


def _python(*args: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
        cwd=cwd,
    )


def _run(*args: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    return _python("-m", "onnx_optax", *args, cwd=cwd)


def _blocked(*modules: str) -> str:
    """Python source that makes ``modules`` unimportable, as if their extra were missing."""
    return "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules)


def test_help_lists_the_commands() -> None:
    result = _run("--help")
    assert result.returncode == 0
    for command in ("demo", "conformance", "bench", "attach", "check", "train", "exit status"):
        assert command in result.stdout


def test_version() -> None:
    result = _run("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"onnx-optax {onnx_optax.__version__}"


def test_the_module_and_the_cli_module_both_run() -> None:
    for module in ("onnx_optax", "onnx_optax.cli"):
        result = _python("-m", module, "--help")
        assert result.returncode == 0, result.stderr
        assert "usage: onnx-optax" in result.stdout


def test_no_command_prints_help_and_exits_2() -> None:
    result = _run()
    assert result.returncode == 2
    assert "usage: onnx-optax" in result.stderr
    assert "conformance" in result.stderr


def test_an_unknown_option_is_a_usage_error() -> None:
    result = _run("demo", "--epochs", "x")
    assert result.returncode == 2
    assert "invalid int value" in result.stderr


def test_demo_output_to_a_missing_folder_exits_2_before_training(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "missing" / "curves.png"
    result = _run("demo", "--output", str(target))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    assert "Training" not in result.stdout  # refused before any work


def test_demo_one_epoch_trains_every_optimizer_and_plots(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("flax")
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    target = tmp_path / "curves.png"
    result = _run("demo", "--epochs", "1", "--output", str(target))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split("  ")[0].strip(): line.split() for line in result.stdout.splitlines()}
    for name in ("onnx adagrad", "onnx adam", "onnx momentum", "onnx nesterov"):
        assert name in rows, result.stdout
        accuracy = float(rows[name][2])
        assert 0.5 < accuracy <= 1.0  # one epoch already learns the digits
    assert "optax.sgd nesterov" in rows
    assert target.read_bytes().startswith(b"\x89PNG")


def test_demo_without_the_examples_extra_names_it() -> None:
    code = _blocked("flax") + "from onnx_optax.cli import main\nsys.exit(main(['demo']))\n"
    result = _python("-c", code)
    assert result.returncode == 2
    assert 'pip install "onnx-optax[examples]"' in result.stderr
    assert 'pip install ".[examples]"' in result.stderr
    assert "Traceback" not in result.stderr


def test_conformance_prints_its_table_and_passes() -> None:
    pytest.importorskip("onnx")
    result = _run("conformance")  # 3 rounds: with seed 0, two used to share a label
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "all 31 cases pass"
    rows = [line for line in lines[:-1] if line.endswith((" pass", " FAIL"))]
    assert len(rows) == 7 + 4 * 2 * 3
    assert all(row.endswith(" pass") for row in rows)
    assert any(row.startswith("test_nesterov_momentum ") for row in rows)
    assert any(" float64 " in row for row in rows)
    labels = [" ".join(row[: row.index(" float") + 8].split()) for row in rows]  # case, dtype
    assert len(set(labels)) == len(labels), "every row has its own label"
    # float64 Adam is judged at float32 precision, and the footnote says why.
    adam64 = [row for row in rows if " adam " in row and " float64 " in row]
    assert adam64 and all("16 ulp(float32) [1]" in row for row in adam64)
    assert any(line.startswith("[1] float64 Adam is judged at float32") for line in lines)
    # Progress goes to stderr as the cases run.
    assert "node case 7/7" in result.stderr
    assert "onnx.reference differential: nesterov float64" in result.stderr


def test_conformance_without_the_onnx_extra_exits_2_and_says_how_to_install() -> None:
    code = _blocked("onnx") + "from onnx_optax.cli import main\nsys.exit(main(['conformance']))\n"
    result = _python("-c", code)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "needs the onnx extra" in result.stderr
    assert 'pip install "onnx-optax[onnx]"' in result.stderr
    assert 'pip install ".[onnx]"' in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("module", ["interop", "backend", "training"])
def test_importing_without_the_onnx_extra_names_the_extra(module: str) -> None:
    code = _blocked("onnx") + (
        "try:\n"
        f"    import onnx_optax.{module}\n"
        "except ImportError as error:\n"
        "    print(type(error).__name__, type(error.__cause__).__name__)\n"
        "    print(error)\n"
    )
    result = _python("-c", code)
    assert result.returncode == 0, result.stderr
    kind, message = result.stdout.split("\n", 1)
    assert kind == "MissingExtraError ModuleNotFoundError"  # chained from the original
    assert message.startswith(f"onnx_optax.{module} needs the onnx extra: ")
    assert 'pip install "onnx-optax[onnx]"' in message
    assert 'pip install ".[onnx]"' in message


def test_bench_smoke_prints_every_row_and_its_notes(tmp_path: pathlib.Path) -> None:
    markdown = tmp_path / "bench.md"
    # From the checkout's root, as a user would; found there even if the package is installed.
    result = _run("bench", "--smoke", "--markdown", str(markdown), cwd=REPOSITORY)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "x optax's time" in out
    for optimizer in OPTIMIZERS:
        for implementation in ("optax", "onnx_optax transform", "onnx_optax op"):
            assert f"{optimizer:<9} {implementation} " in out, (optimizer, implementation)
        assert f"{optimizer:<9} onnx_optax transform, packed " in out
    assert "smoke mode:" in out and "mean nothing" in out
    if pathlib.Path("/sys/devices/system/cpu/cpu0/cache").is_dir():  # Linux: cache size known
        assert "1 tensor, 4K *" in out
        assert "starred (*) workloads: the working set" in out
    assert ("skipped torch.optim foreach: torch is not installed" in out) == (
        importlib.util.find_spec("torch") is None
    )
    assert "timing 1 tensor, 4K" in result.stderr  # progress as it goes
    table = markdown.read_text()
    assert table.count("| adam | optax |") == 2


def test_bench_output_to_a_missing_folder_exits_2(tmp_path: pathlib.Path) -> None:
    result = _run("bench", "--smoke", "--no-slow", "--markdown", str(tmp_path / "no" / "x.md"))
    assert result.returncode == 2  # the folder is checked first
    assert "does not exist" in result.stderr


def test_bench_outside_a_checkout_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench, "find_benchmark", lambda: None)
    assert cli.main(["bench", "--quick"]) == 2
    assert "run onnx-optax bench from a clone" in capsys.readouterr().err


def test_bench_finds_the_harness_of_this_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPOSITORY)  # found next to the package source, or else in the cwd
    path = bench.find_benchmark()
    assert path is not None and path.name == "optimizer_step.py"


def test_bench_runs_no_harness_of_a_folder_that_is_not_a_clone(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench executes the harness it finds: in the cwd, only a clone's (its pyproject.toml
    names onnx-optax), never the benchmarks/ of a stranger's folder."""
    harness = tmp_path / "benchmarks" / "optimizer_step.py"
    harness.parent.mkdir()
    harness.write_text("raise SystemExit('a stranger ran')\n")
    monkeypatch.chdir(tmp_path)
    # The package's own source has no harness beside it (an installed wheel).
    monkeypatch.setattr(cli.onnx_optax, "__file__", str(tmp_path / "site" / "onnx_optax" / "x.py"))
    assert bench.find_benchmark() is None
    for text in ("", "[project]\nname = 'other'\n", "[project\n", "\xff"):
        (tmp_path / "pyproject.toml").write_text(text, encoding="latin-1")
        assert bench.find_benchmark() is None, text
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'onnx-optax'\n")
    assert bench.find_benchmark() == harness


# ----------------------------------------------------------------------------- attach, check, train


def test_attach_check_train_and_resume(tmp_path: pathlib.Path) -> None:
    import numpy as np

    pytest.importorskip("onnx")
    _inference_model(tmp_path / "in.onnx")
    result = _run(
        "attach", str(tmp_path / "in.onnx"), "--loss", "softmax_cross_entropy",
        "--optimizer", "adam", "--learning-rate", "1e-2", "-o", str(tmp_path / "t.onnx"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    result = _run("check", str(tmp_path / "t.onnx"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok" in result.stdout
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    _npz(tmp_path / "d.npz", x=x, target=(x[:, 0] > 0).astype(np.int64))
    args = ["--data", str(tmp_path / "d.npz"), "--steps", "20", "--batch-size", "16"]
    result = _run("train", str(tmp_path / "t.onnx"), *args, "-o", str(tmp_path / "1.onnx"))
    assert result.returncode == 0, result.stderr
    assert "step 1/20 loss=" in result.stderr and "step 20/20 loss=" in result.stderr
    out = ["-o", str(tmp_path / "2.onnx"), "--inference", str(tmp_path / "i.onnx")]
    result = _run("train", str(tmp_path / "1.onnx"), *args, *out)
    assert result.returncode == 0, result.stderr
    import onnx

    from onnx_optax import training

    trained = training.Session(training.load(tmp_path / "2.onnx")).initializers
    assert trained["T"] == 41  # resumed: 1 + 20 + 20
    inference = onnx.load(str(tmp_path / "i.onnx"))
    assert not inference.training_info
    assert {i.name for i in inference.graph.initializer} == {"W", "b"}
    np.testing.assert_array_equal(
        onnx.numpy_helper.to_array(inference.graph.initializer[0]), trained["W"]
    )


def test_attach_frozen_and_loss_reach_attach(tmp_path: pathlib.Path) -> None:
    onnx = pytest.importorskip("onnx")
    _inference_model(tmp_path / "in.onnx")
    out = str(tmp_path / "t.onnx")
    result = _run("attach", str(tmp_path / "in.onnx"), "--loss", "l1", "--frozen", "b", "-o", out)
    assert result.returncode == 0, result.stderr
    (gradient,) = [
        n for n in onnx.load(out).training_info[0].algorithm.node if n.op_type == "Gradient"
    ]
    xs = next(a for a in gradient.attribute if a.name == "xs").strings
    assert xs == [b"W"]  # b frozen
    result = _run("attach", str(tmp_path / "in.onnx"), "--loss", "hinge", "-o", out)
    assert result.returncode == 2 and "unknown loss 'hinge'" in result.stderr
    result = _run("attach", str(tmp_path / "in.onnx"), "--frozen", "nope", "-o", out)
    assert result.returncode == 2 and "nope" in result.stderr
    result = _run("attach", str(tmp_path / "in.onnx"), "--clip-global-norm", "0.5", "-o", out)
    assert result.returncode == 0, result.stderr
    ops = [n.op_type for n in onnx.load(out).training_info[0].algorithm.node]
    assert "Sqrt" in ops and "Where" in ops  # the global norm and the clipped gradients
    result = _run("attach", str(tmp_path / "in.onnx"), "--clip-global-norm", "-1", "-o", out)
    assert result.returncode == 2 and "clip_global_norm" in result.stderr


def test_check_reports_problems_with_exit_1(tmp_path: pathlib.Path) -> None:
    onnx = pytest.importorskip("onnx")
    import onnx_optax
    from onnx_optax import training

    _inference_model(tmp_path / "in.onnx")
    model = training.attach(onnx.load(str(tmp_path / "in.onnx")), optimizer=onnx_optax.adam(0.1))
    model.training_info[0].update_binding.add(key="nothing", value="loss")
    onnx.save(model, str(tmp_path / "bad.onnx"))
    result = _run("check", str(tmp_path / "bad.onnx"))
    assert result.returncode == 1
    assert "update_binding['nothing'] = 'loss': 'nothing' is not an initializer" in result.stdout
    result = _run("check", str(tmp_path / "missing.onnx"))
    assert result.returncode == 2 and "no such file" in result.stderr


def test_train_says_which_arrays_do_not_match(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np

    pytest.importorskip("onnx")
    _inference_model(tmp_path / "in.onnx")
    # In process (cli.main), to keep the five cases fast.
    assert cli.main(["attach", str(tmp_path / "in.onnx"), "-o", str(tmp_path / "t.onnx")]) == 0
    x = np.zeros((8, 4), np.float32)
    cases = {
        "missing": ({"x": x}, r"no array for the input(s) ['target']"),
        "rows": ({"x": x, "target": np.zeros(5, np.int64)}, "the same number of rows"),
        "dtype": ({"x": x, "target": np.zeros(8, np.float32)}, "feed 'target' has dtype float32"),
        "shape": (
            {"x": np.zeros((8, 5), np.float32), "target": np.zeros(8, np.int64)},
            "feed 'x' has shape [4, 5]",
        ),
    }
    for name, (arrays, message) in cases.items():
        _npz(tmp_path / f"{name}.npz", **arrays)
        capsys.readouterr()
        status = cli.main([
            "train", str(tmp_path / "t.onnx"), "--data", str(tmp_path / f"{name}.npz"),
            "--steps", "1", "--batch-size", "4", "-o", str(tmp_path / "out.onnx"),
        ])  # fmt: skip
        stderr = capsys.readouterr().err
        assert status == 2, (name, stderr)
        assert message in stderr, (name, stderr)
    assert not (tmp_path / "out.onnx").exists()


def test_training_commands_without_the_onnx_extra_exit_2(tmp_path: pathlib.Path) -> None:
    code = _blocked("onnx") + (
        f"from onnx_optax.cli import main\nsys.exit(main(['check', {str(tmp_path / 'm.onnx')!r}]))\n"
    )
    result = _python("-c", code)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "needs the onnx extra" in result.stderr and "Traceback" not in result.stderr


def test_attach_list_prints_the_plan_and_several_outputs_need_a_name(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np

    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    _inference_model(tmp_path / "in.onnx")
    model = onnx.load(str(tmp_path / "in.onnx"))
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(0.5, np.float32), "half"))
    model.graph.node.append(helper.make_node("Mul", ["logits", "half"], ["scaled"]))
    model.graph.output.append(helper.make_tensor_value_info("scaled", 1, ["N", 3]))
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("", 11))
    onnx.save(model, str(tmp_path / "two.onnx"))
    capsys.readouterr()
    # In process (cli.main): --list alone prints the plan and writes nothing.
    assert cli.main(["attach", str(tmp_path / "two.onnx"), "--list"]) == 2
    assert "pass --output-name to say which one" in capsys.readouterr().err
    assert (
        cli.main(["attach", str(tmp_path / "two.onnx"), "--list", "--output-name", "scaled"]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "loss output: scaled; 2 of 3 tensors train (15 values)"
    rows = {line.split()[1]: line for line in lines[2:]}
    assert rows["W"].startswith("yes") and rows["b"].startswith("yes")
    assert rows["half"].startswith("no") and "exporter constant: one element" in rows["half"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.onnx", "two.onnx"]
    out = str(tmp_path / "t.onnx")
    status = cli.main(["attach", str(tmp_path / "two.onnx"), "--output-name", "logits", "-o", out])
    assert status == 0
    err = capsys.readouterr().err
    assert "note: the model imports ai.onnx opset 11 and the loss needs 12" in err
    assert f"wrote {out} (its step reads the targets from input 'target')" in err
