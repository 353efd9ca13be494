"""Writes and reads in a stranger's folder: one writer for every file, and a capped .npz reader.

A downloaded folder may ship symbolic links where the package writes (``m.onnx``,
``m.onnx.data``) or an ``.npz`` holding a zip bomb beside the arrays a step reads.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx_optax import backend, cli, training
from onnx_optax._src import npz, write
from onnx_optax.cli import demo
from onnx_optax.training import _export
from tests.support.builders import assert_same
from tests.support.builders import inference_model as _inference_model
from tests.support.builders import write_npz as _npz
from tests.support.training_models import session_data as data
from tests.support.training_models import trained

ROOT = Path(__file__).resolve().parent.parent
CANARY = b"a file outside the model's folder, which no save may touch\n"


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A file outside the folder ``tmp_path / 'm'`` (created empty), which links point at."""
    (tmp_path / "m").mkdir()
    path = tmp_path / "canary.txt"
    path.write_bytes(CANARY)
    return path


def _assert_untouched(canary: Path) -> None:
    assert canary.read_bytes() == CANARY


def _regular(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


# ----------------------------------------------------------------------------- Session.save


@pytest.mark.parametrize("linked", ["m.onnx", "m.onnx.data"])
def test_a_symbolic_link_in_the_folder_is_replaced_and_its_target_never_written(
    tmp_path: Path, canary: Path, linked: str
) -> None:
    # Item 1: save opened m.onnx.data (and m.onnx) through the link and truncated the canary.
    folder = tmp_path / "m"
    (folder / linked).symlink_to(canary)
    session = trained(2)
    session.save(folder / "m.onnx", external_data=True)
    _assert_untouched(canary)
    assert _regular(folder / "m.onnx") and _regular(folder / "m.onnx.data")
    assert sorted(p.name for p in folder.iterdir()) == ["m.onnx", "m.onnx.data"]
    resumed = training.Session(folder / "m.onnx")
    assert_same(session.initializers, resumed.initializers)
    np.testing.assert_array_equal(session.step(data(7))["loss"], resumed.step(data(7))["loss"])


def test_a_symbolic_link_at_a_model_saved_in_one_file_is_replaced(
    tmp_path: Path, canary: Path
) -> None:
    path = tmp_path / "m" / "m.onnx"
    path.symlink_to(canary)
    session = trained(1)
    session.save(path)
    _assert_untouched(canary)
    assert _regular(path)
    assert_same(session.initializers, training.Session(path).initializers)


@pytest.mark.parametrize("folder_at", ["m.onnx", "m.onnx.data"])
def test_a_folder_at_the_destination_is_a_value_error_naming_it(
    tmp_path: Path, folder_at: str
) -> None:
    # Item 1: an IsADirectoryError (an OSError from open), after the work.
    (tmp_path / folder_at).mkdir()
    session = trained(1)
    with pytest.raises(ValueError, match=rf"'{tmp_path / folder_at}': it is a folder"):
        session.save(tmp_path / "m.onnx", external_data=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder_at]  # nothing written


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failure_while_writing_leaves_the_previous_files_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: type[BaseException]
) -> None:
    # Item 1: the data file was opened "wb" (truncated) and then written tensor by tensor.
    session = trained(1)
    session.save(tmp_path / "m.onnx", external_data=True)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(before) == ["m.onnx", "m.onnx.data"]
    session.step(data(3))
    calls = []
    fetch = _export._bytes

    def failing(source: object) -> object:
        calls.append(source)
        if len(calls) == 2:  # the second tensor of the data file: the first is written
            raise error("interrupted")
        return fetch(source)  # type: ignore[arg-type]

    monkeypatch.setattr(_export, "_bytes", failing)
    with pytest.raises(error, match="interrupted"):
        session.save(tmp_path / "m.onnx", external_data=True)
    assert len(calls) == 2
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    monkeypatch.undo()
    before_step = training.Session(tmp_path / "m.onnx").initializers
    session.save(tmp_path / "m.onnx", external_data=True)  # and saving works again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    assert_same(session.initializers, training.Session(tmp_path / "m.onnx").initializers)
    assert not np.array_equal(before_step["W1"], session.initializers["W1"])


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE and SIGXFSZ are POSIX")
def test_a_full_disk_while_saving_leaves_the_previous_model(tmp_path: Path) -> None:
    # Item 1: write_bytes truncated m.onnx, then the write failed half way.
    # RLIMIT_FSIZE makes a write past its size fail with EFBIG, as a full disk would.
    script = """
        import resource, signal, sys
        from pathlib import Path
        from tests.support.training_models import session_data as data, trained

        folder = Path(sys.argv[1])
        session = trained(1)
        session.save(folder / "m.onnx")
        (folder / "before.bin").write_bytes((folder / "m.onnx").read_bytes())
        session.step(data(3))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        size = (folder / "m.onnx").stat().st_size
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, resource.RLIM_INFINITY))
        try:
            session.save(folder / "m.onnx")
            print("RESULT saved")
        except OSError as error:
            print("RESULT OSError", error)
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(tmp_path)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "m.onnx").read_bytes() == (tmp_path / "before.bin").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["before.bin", "m.onnx"]
    # The error names the model, not the temporary file the writer wrote.
    assert f"RESULT OSError [Errno 27] File too large: '{tmp_path / 'm.onnx'}'" in done.stdout


# ----------------------------------------------------------------------------- the writer


def test_the_writer_replaces_links_and_writes_nothing_but_the_destination(tmp_path: Path) -> None:
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "created-through-the-link")
    write.write_file(dangling, b"new")
    assert _regular(dangling) and dangling.read_bytes() == b"new"
    assert not (tmp_path / "created-through-the-link").exists()
    (tmp_path / "folder").mkdir()
    to_folder = tmp_path / "to-folder"
    to_folder.symlink_to(tmp_path / "folder")
    write.write_file(to_folder, lambda file: file.write(b"file"))
    assert _regular(to_folder) and list((tmp_path / "folder").iterdir()) == []
    # An ordinary file's permissions (the umask's), not a temporary file's 0o600.
    umask = os.umask(0o022)
    os.umask(umask)
    assert (dangling.stat().st_mode & 0o777) == (0o666 & ~umask)


def test_the_writer_refuses_a_missing_folder_and_a_file_as_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"the folder '.*nowhere' does not exist"):
        write.write_file(tmp_path / "nowhere" / "a.bin", b"")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ValueError, match=r"the folder '.*file' is not a folder"):
        write.write_file(tmp_path / "file" / "a.bin", b"")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_failing_content_leaves_every_destination_and_no_temporary_file(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"old a")
    (tmp_path / "b").write_bytes(b"old b")

    def half(file: object) -> None:
        file.write(b"half")  # type: ignore[attr-defined]
        raise OSError("no space left (as if)")

    with pytest.raises(OSError, match="as if"):
        write.write_files([(tmp_path / "a", b"new a"), (tmp_path / "b", half)])
    assert (tmp_path / "a").read_bytes() == b"old a"  # written, never renamed into place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]
    write.write_files([(tmp_path / "a", b"new a"), (tmp_path / "b", b"new b")])
    assert (tmp_path / "a").read_bytes() + (tmp_path / "b").read_bytes() == b"new anew b"


def _writes(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Calls in ``tree`` that write a file other than through the writer (a heuristic)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
        position = (
            0 if isinstance(function, ast.Attribute) else 1
        )  # path.open(mode), open(path, mode)
        mode = next(iter(node.args[position : position + 1]), None) or next(
            (k.value for k in node.keywords if k.arg == "mode"), None
        )
        writing_mode = (
            isinstance(mode, ast.Constant) and isinstance(mode.value, str) and mode.value != "rb"
        ) and any(c in mode.value for c in "wax+")
        first = node.args[0] if node.args else None
        if (
            name in ("write_bytes", "write_text", "tofile", "savez", "savez_compressed", "dump")
            or (
                name in ("save", "save_model")  # onnx.save, np.save; not Session.save
                and isinstance(getattr(function, "value", None), ast.Name)
                and function.value.id in ("onnx", "np", "numpy", "jnp", "torch")  # type: ignore[attr-defined]
            )
            or (name == "open" and writing_mode)
            or (name == "savefig" and not (isinstance(first, ast.Name) and first.id == "file"))
        ):
            yield node.lineno, ast.unparse(node)[:80]


def test_every_file_the_package_writes_goes_through_the_one_writer() -> None:
    # "One way out": onnx.save, Path.write_bytes, open(.., 'wb') and savefig(path) wrote
    # through links in the package (cli.py, _export.py, demo.py) and the bench harness.
    sources = [*sorted((ROOT / "onnx_optax").rglob("*.py")), *sorted(ROOT.glob("benchmarks/*.py"))]
    found = [
        f"{path.relative_to(ROOT)}:{line}: {call}"
        for path in sources
        if path.name != "write.py"
        for line, call in _writes(ast.parse(path.read_text()))
    ]
    assert found == []


def test_the_demo_plot_goes_through_the_writer(tmp_path: Path, canary: Path) -> None:
    pytest.importorskip("matplotlib")
    results = [demo.Result(name, [1.0, 0.5], 0.9, 1.0) for name in demo.optimizers()]
    path = tmp_path / "m" / "curves.png"
    path.symlink_to(canary)
    demo.plot(results, str(path))
    _assert_untouched(canary)
    assert _regular(path) and path.read_bytes().startswith(b"\x89PNG")


# ----------------------------------------------------------------------------- the CLI's writes


def _error_lines(stderr: str) -> list[str]:
    """stderr without the progress lines of train."""
    assert "Traceback" not in stderr
    return [line for line in stderr.splitlines() if not line.startswith(("step ", "wrote "))]


@pytest.fixture
def attached(tmp_path: Path) -> Path:
    """A training model, its .npz data and an empty folder m/ beside them."""
    _inference_model(tmp_path / "in.onnx")
    assert cli.main(["attach", str(tmp_path / "in.onnx"), "-o", str(tmp_path / "t.onnx")]) == 0
    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    _npz(tmp_path / "d.npz", x=x, target=(x[:, 0] > 0).astype(np.int64))
    (tmp_path / "m").mkdir()
    return tmp_path


def _train(folder: Path, *out: str) -> int:
    args = ["--data", str(folder / "d.npz"), "--steps", "2", "--batch-size", "4"]
    return cli.main(["train", str(folder / "t.onnx"), *args, *out])


def test_cli_outputs_replace_a_symbolic_link_and_never_write_its_target(
    attached: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Item 1: attach -o, train -o and --inference wrote through the links (onnx.save).
    canaries = {}
    for name in ("a.onnx", "t.onnx", "i.onnx"):
        canaries[name] = attached / f"canary-{name}"
        canaries[name].write_bytes(CANARY)
        (attached / "m" / name).symlink_to(canaries[name])
    out = attached / "m"
    assert cli.main(["attach", str(attached / "in.onnx"), "-o", str(out / "a.onnx")]) == 0
    assert _train(attached, "-o", str(out / "t.onnx"), "--inference", str(out / "i.onnx")) == 0
    for name, canary in canaries.items():
        _assert_untouched(canary)
        assert _regular(out / name), name
    assert training.load(out / "a.onnx").training_info
    assert training.Session(out / "t.onnx").initializers["T"] == 3  # 1 + 2 steps
    assert not training.load(out / "i.onnx").training_info
    capsys.readouterr()


def test_cli_output_that_is_a_folder_exits_2_with_one_line(
    attached: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = str(attached / "m")
    capsys.readouterr()
    assert cli.main(["attach", str(attached / "in.onnx"), "-o", folder]) == 2
    assert _error_lines(capsys.readouterr().err) == [
        f"onnx-optax attach: cannot write the model {folder!r}: it is a folder"
    ]
    assert _train(attached, "-o", folder) == 2
    assert _error_lines(capsys.readouterr().err) == [
        f"onnx-optax train: cannot write the model {folder!r}: it is a folder"
    ]
    # Item 1: a folder that appears while the command works (checked before the work
    # only) gave an IsADirectoryError traceback from onnx.save.
    late = attached / "late.onnx"
    step, attach = training.Session.step, training.attach

    def step_then_mkdir(self: training.Session, inputs: dict[str, np.ndarray]) -> object:
        late.mkdir(exist_ok=True)
        return step(self, inputs)

    def attach_then_mkdir(*args: object, **kwargs: object) -> object:
        late.mkdir(exist_ok=True)
        return attach(*args, **kwargs)

    monkeypatch.setattr(training.Session, "step", step_then_mkdir)
    monkeypatch.setattr(training, "attach", attach_then_mkdir)
    for command in (
        lambda: cli.main(["attach", str(attached / "in.onnx"), "-o", str(late)]),
        lambda: _train(attached, "-o", str(late)),
        lambda: _train(attached, "-o", str(attached / "m" / "t.onnx"), "--inference", str(late)),
    ):
        late.rmdir() if late.exists() else None
        assert command() == 2
        (line,) = _error_lines(capsys.readouterr().err)
        assert line.endswith(f"cannot write the model {str(late)!r}: it is a folder"), line


# ----------------------------------------------------------------------------- train --data


def _zeros_member(archive: zipfile.ZipFile, name: str, shape: tuple[int, ...]) -> None:
    """A member ``name`` holding float32 zeros of ``shape``, deflated as it is written."""
    header = {"descr": "<f4", "fortran_order": False, "shape": shape}
    with archive.open(name, "w", force_zip64=True) as member:
        np.lib.format.write_array_header_1_0(member, header)
        left, chunk = 4 * int(np.prod(shape)), bytes(2**20)
        while left > 0:
            left -= member.write(chunk[: min(left, len(chunk))])


def _data(path: Path, **members: tuple[int, ...] | np.ndarray) -> Path:
    """An .npz of arrays (np.savez's members) and float32 zero members of given shapes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, value in members.items():
            if isinstance(value, tuple):
                _zeros_member(archive, f"{name}.npy", value)
            else:
                with archive.open(f"{name}.npy", "w") as member:
                    np.lib.format.write_array(member, value, allow_pickle=True)
    return path


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the zip members opened for reading, in order."""
    names: list[str] = []
    open_member = zipfile.ZipFile.open

    def spy(self: zipfile.ZipFile, name: object, mode: str = "r", **kwargs: object) -> object:
        if mode == "r":
            names.append(name if isinstance(name, str) else name.filename)  # type: ignore[attr-defined]
        return open_member(self, name, mode, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(zipfile.ZipFile, "open", spy)
    return names


def _inputs(rows: int = 8) -> dict[str, np.ndarray]:
    x = np.random.default_rng(0).normal(size=(rows, 4)).astype(np.float32)
    return {"x": x, "target": (x[:, 0] > 0).astype(np.int64)}


def test_train_reads_only_the_arrays_a_step_reads(
    attached: Path, opened: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Item 8: np.load read every member: a 64 KiB member inflating to 64 MiB beside the
    # inputs (a small zip bomb) was inflated although no input uses it.
    path = _data(attached / "bomb.npz", **_inputs(), bomb=(2**24,))
    assert path.stat().st_size < 2**18
    status = cli.main([
        "train", str(attached / "t.onnx"), "--data", str(path), "--steps", "1",
        "--batch-size", "4", "-o", str(attached / "m" / "out.onnx"),
    ])  # fmt: skip
    assert status == 0, capsys.readouterr().err
    assert sorted(opened) == ["target.npy", "x.npy"]


def _refused(folder: Path, path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The one line of a train on ``path`` that exits 2, having written nothing."""
    capsys.readouterr()
    status = cli.main([
        "train", str(folder / "t.onnx"), "--data", str(path), "--steps", "1",
        "--batch-size", "4", "-o", str(folder / "m" / "out.onnx"),
    ])  # fmt: skip
    (line,) = _error_lines(capsys.readouterr().err)
    assert status == 2, line
    assert line.startswith(f"onnx-optax train: cannot read the data {str(path)!r}: "), line
    assert not (folder / "m" / "out.onnx").exists()
    return line


def test_an_input_larger_than_the_limit_is_refused_before_it_is_inflated(
    attached: Path,
    opened: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Item 8: an input array's member is checked before a byte is inflated: the zip's
    # declared size, then the .npy header's shape and dtype, against a limit (lowered here).
    assert npz.MAX_BYTES == backend.Limits().tensor_bytes
    monkeypatch.setattr(npz, "MAX_BYTES", 2**20)
    inputs = _inputs()
    path = _data(attached / "big.npz", x=(2**17, 4), target=inputs["target"])  # 2 MiB
    line = _refused(attached, path, capsys)
    assert line.endswith(
        "member 'x.npy' declares 2097280 bytes, more than the 1048576 bytes left of the "
        "limit of 1048576; it was not read"
    )
    assert opened == []  # refused on the zip's declared size: x.npy was never opened
    # The limit is for the arrays together; the .npy header is read, the data is not.
    path = _data(attached / "both.npz", x=inputs["x"], target=(2**18,))  # 128 + 1 MiB
    line = _refused(attached, path, capsys)
    assert line.endswith(
        "member 'target.npy' declares float32[262144] (1048576 bytes), more than the 1048448 "
        "bytes left of the limit of 1048576; it was not read"
    )
    assert opened == ["x.npy", "target.npy"]
    # A header that declares more than the limit, in a member that holds little.
    path = attached / "header.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", _lying_header((2**40, 4)))
        archive.writestr("target.npy", _npy(inputs["target"]))
    line = _refused(attached, path, capsys)
    assert "member 'x.npy' declares float32[1099511627776, 4] (17592186044416 bytes)" in line
    # Within the limit, but more than the member holds: refused before allocating.
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", _lying_header((2**16, 4)))
        archive.writestr("target.npy", _npy(inputs["target"]))
    line = _refused(attached, path, capsys)
    assert "member 'x.npy' declares float32[65536, 4] (1048576 bytes) but holds 16 bytes" in line


def _npy(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _lying_header(shape: tuple[int, ...]) -> bytes:
    """A float32 .npy header declaring ``shape``, followed by 16 bytes of data."""
    import io

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "<f4", "fortran_order": False, "shape": shape}
    )
    return buffer.getvalue() + bytes(16)


def test_pickled_arrays_and_files_that_are_no_npz_are_refused_naming_why(
    attached: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = _inputs()
    objects = np.array([{"a": 1}] * 8, dtype=object)
    path = _data(attached / "pickle.npz", x=inputs["x"], target=objects)
    line = _refused(attached, path, capsys)
    assert line.endswith("member 'target.npy' holds Python objects (a pickle); refused")
    np.save(attached / "one.npy", inputs["x"])
    line = _refused(attached, attached / "one.npy", capsys)
    assert line.endswith("it is a single array (.npy), not an .npz file of named arrays")
    (attached / "text.npz").write_text("x,target\n")
    line = _refused(attached, attached / "text.npz", capsys)
    assert line.endswith("it is not an .npz file (a zip of .npy arrays)")


def test_a_member_named_twice_and_a_truncated_zip_are_refused(
    attached: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 33: a zip may name x.npy twice; numpy and zipfile would read the last silently.
    inputs = _inputs()
    path = attached / "twice.npz"
    with (
        pytest.warns(UserWarning, match="Duplicate name"),
        zipfile.ZipFile(path, "w") as archive,
    ):
        archive.writestr("x.npy", _npy(inputs["x"]))
        archive.writestr("x.npy", _npy(inputs["x"] + 1))
        archive.writestr("target.npy", _npy(inputs["target"]))
    line = _refused(attached, path, capsys)
    assert line.endswith("member 'x.npy' appears 2 times; it is not clear which array is meant")
    # A zip cut short (its central directory lost): one line, never a traceback.
    good = _data(attached / "good.npz", x=inputs["x"], target=inputs["target"])
    (attached / "cut.npz").write_bytes(good.read_bytes()[:-30])
    line = _refused(attached, attached / "cut.npz", capsys)
    assert "cannot read the data" in line
