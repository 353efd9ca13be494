"""benchmarks/big_model.py's stages (attach, check, Session, save, resume) and its fixes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from benchmarks.big_model import run
from onnx_optax.training._model import copy_model


def _check(figures: dict[str, object]) -> None:
    equal = figures["state_equal"]
    assert isinstance(equal, dict) and equal and all(equal.values()), equal
    assert {"W1", "W1.v", "W1.h", "T"} <= set(equal)
    first, resumed = figures["next_losses"]  # type: ignore[misc]
    assert first == resumed and np.isfinite(first)


def test_a_model_with_external_weights_trains_saves_and_resumes(tmp_path: Path) -> None:
    figures = run(tmp_path, hidden=2048, steps=2, say=lambda _: None)
    _check(figures)
    assert (tmp_path / "trained.onnx.data").stat().st_size == 3 * figures["weight_bytes"]  # type: ignore[operator]


@pytest.mark.slow
def test_a_model_above_2_gib_trains_saves_and_resumes(tmp_path: Path) -> None:
    # About 20 GiB of memory and 5 minutes on 2 cores: `pytest -m slow` (see the benchmark).
    figures = run(tmp_path, hidden=270336, steps=2, say=print)
    assert figures["weight_bytes"] > 2**31  # type: ignore[operator]
    _check(figures)


def test_copy_model_copies_a_tensor_at_a_time_and_hollows_the_named() -> None:
    from tests.support.training_models import half_mlp as mlp

    model = mlp()
    model.metadata_props.add(key="k", value="v")
    copied = copy_model(model)
    assert copied.SerializeToString() == model.SerializeToString()
    hollow = copy_model(model, {"W1"})
    w1 = next(i for i in hollow.graph.initializer if i.name == "W1")
    assert not w1.HasField("raw_data") and list(w1.dims) == [8, 16]
    assert w1.data_type == onnx.TensorProto.FLOAT16
    assert [i.name for i in hollow.graph.initializer] == ["W1", "b1", "W2"]
