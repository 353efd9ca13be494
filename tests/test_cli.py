"""The ``onnx-optax`` command line, run as a user would (in a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-m", "onnx_optax.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )


def test_help_lists_the_commands() -> None:
    result = _run("--help")
    assert result.returncode == 0
    for command in ("demo", "conformance"):
        assert command in result.stdout


def test_conformance_prints_its_table_and_passes() -> None:
    pytest.importorskip("onnx")
    result = _run("conformance", "--rounds", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "all 15 cases pass"
    rows = [line for line in lines[:-1] if line.endswith((" pass", " FAIL"))]
    assert len(rows) == 7 + 4 * 2
    assert all(row.endswith(" pass") for row in rows)
    assert any(row.startswith("test_nesterov_momentum ") for row in rows)
    assert any(" float64 " in row for row in rows)
