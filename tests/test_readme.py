"""Every ```python block in README.md is a complete program that runs as written."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).parent.parent / "README.md"


def python_blocks() -> list[tuple[int, str]]:
    """(line number, source) of each ```python block, in order."""
    text = README.read_text()
    return [
        (text.count("\n", 0, match.start()) + 1, match.group(1))
        for match in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    ]


BLOCKS = python_blocks()


def test_the_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize(("line", "source"), BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_readme_block_runs(line: int, source: str, tmp_path: pathlib.Path) -> None:
    """Each block runs alone, in a fresh interpreter and an empty folder, as a reader would."""
    for module in ("onnx", "flax"):
        if re.search(rf"^\s*(import|from) {module}\b", source, flags=re.M):
            pytest.importorskip(module)
    result = subprocess.run(
        [sys.executable, "-c", source],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        # This checkout's package first (an installed onnx_optax may be another copy).
        env={
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(README.parent), os.environ.get("PYTHONPATH")) if p
            ),
        },
        check=False,
    )
    assert result.returncode == 0, f"README.md line {line}:\n{result.stderr}"
