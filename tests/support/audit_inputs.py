"""Helpers shared by the tests split out of tests/test_hostile_audit3.py (issue 34)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _x(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)
