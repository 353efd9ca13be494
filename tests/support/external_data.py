"""Helpers shared by the tests split out of tests/test_hostile.py (issue 34)."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import pytest

import onnx_optax

onnx = pytest.importorskip("onnx")
from onnx_optax import interop  # noqa: E402

CANARY = b"CANARY-secret-bytes"


def make_external(tensor: onnx.TensorProto, location: str) -> None:
    """Points ``tensor`` at an external file, as a hostile model would."""
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location


@pytest.fixture
def canary_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "canary.bin").write_bytes(CANARY)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def trained_model() -> onnx.ModelProto:
    """An Adagrad training model of a 3-element weight, from ``interop.to_model``."""
    tx = onnx_optax.adagrad(0.1)
    params = {"w": jnp.ones(3)}
    return interop.to_model(tx, params, tx.init(params))
