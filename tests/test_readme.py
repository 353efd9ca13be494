"""Every ```python block in README.md and docs/*.md is a complete program that runs as written."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def python_blocks(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line number, source) of each ```python block of a Markdown file, in order."""
    text = path.read_text()
    return [
        (text.count("\n", 0, match.start()) + 1, match.group(1))
        for match in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    ]


def unique_blocks() -> list[tuple[str, str]]:
    """(where, source) of each distinct block; a block repeated word for word runs once.

    The README repeats some of the site's examples; ``where`` names every place a block
    appears (``README.md:35,docs/index.md:48``), so a failure points at all of them.
    """
    places: dict[str, list[str]] = {}
    for path in [README, *DOCS]:
        for line, source in python_blocks(path):
            places.setdefault(source, []).append(f"{path.relative_to(ROOT)}:{line}")
    return [(",".join(where), source) for source, where in places.items()]


BLOCKS = unique_blocks()


def test_the_readme_has_python_blocks() -> None:
    assert len(python_blocks(README)) >= 4


# The pages that teach an API show it in code that runs (reference pages need not).
GUIDES = ["index.md", "training.md", "fine-tuning.md", "interop.md", "performance.md"]


@pytest.mark.parametrize("name", GUIDES)
def test_the_guide_has_python_blocks(name: str) -> None:
    assert python_blocks(ROOT / "docs" / name), f"docs/{name} has no ```python block"


@pytest.mark.parametrize(("where", "source"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_markdown_block_runs(where: str, source: str, tmp_path: pathlib.Path) -> None:
    """Each block runs alone, in a fresh interpreter and an empty folder, as a reader would."""
    for module in ("onnx", "flax", "onnxruntime"):
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
                p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
            ),
        },
        check=False,
    )
    assert result.returncode == 0, f"{where}:\n{result.stderr}"
