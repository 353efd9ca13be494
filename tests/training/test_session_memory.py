"""What a Session holds: its state once, and nothing after it is deleted."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from pathlib import Path

import onnx_optax
from onnx_optax import training
from onnx_optax.training._export import save_model

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import big_model


def attached_file(folder: Path, hidden: int) -> Path:
    path = big_model.write_inference_model(folder, hidden)
    model = training.attach(path, loss="softmax_cross_entropy", optimizer=onnx_optax.adam(1e-3))
    save_model(model, folder / "attached.onnx", True, {})
    return folder / "attached.onnx"


def test_a_deleted_session_is_freed_without_a_garbage_collection(tmp_path: Path) -> None:
    session = training.Session(attached_file(tmp_path, 64))
    session.step(big_model.batch(0))
    session.evaluate(big_model.batch(1))
    ref = weakref.ref(session)
    gc.disable()
    try:
        del session
        assert ref() is None  # no reference cycle keeps it (and its state) alive
    finally:
        gc.enable()


# Measured in a fresh process: in a test worker, what earlier tests left to free or to
# allocate moved the resident size by more than the margin (2.5x the state, once in CI).
MEASURE = """
import gc, sys
import numpy as np
sys.path.insert(0, sys.argv[2])
import big_model
from onnx_optax import training
gc.collect()
before = big_model.current_rss()
session = training.Session(sys.argv[1])
gc.collect()
print(big_model.current_rss() - before)
assert np.isfinite(session.step(big_model.batch(0))["loss"])
"""


def test_a_session_holds_its_state_once_not_the_loaded_model_beside_it(tmp_path: Path) -> None:
    path = attached_file(tmp_path, 8192)  # W, V and H: 3 x 67 MB
    state_bytes = 3 * 4 * (2 * 1024 * 8192 + 1024 * 8)
    benchmarks = str(Path(__file__).parents[2] / "benchmarks")
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path), benchmarks],
        capture_output=True,
        text=True,
        check=True,
    )
    grown = int(done.stdout.split()[-1])
    # The loaded model kept alive beside the state would be 2x the state.
    assert grown < 1.6 * state_bytes, (grown / state_bytes, "times the state")
