"""Every notebook in notebooks/ runs end to end and draws its plots."""

from __future__ import annotations

import gc
import pathlib
import warnings

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_there() -> None:
    assert [p.name for p in NOTEBOOKS] == [
        "01_quickstart.ipynb",
        "02_flax_training.ipynb",
        "03_onnx_vs_optax_and_pytorch.ipynb",
        "04_onnx_training_models.ipynb",
        "05_train_an_onnx_model.ipynb",
    ]


# The kernel's client objects (jupyter_client, traitlets) can raise while being
# finalized; that happens here, at the end of this test, and does not count.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: pathlib.Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(path, as_version=4)
    with warnings.catch_warnings():
        # jupyter_client and friends warn about their own deprecations.
        warnings.simplefilter("ignore", DeprecationWarning)
        nbclient.NotebookClient(
            notebook,
            timeout=300,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, "every notebook draws at least one plot"
    gc.collect()
