"""Helpers shared by the tests split out of tests/test_hostile_audit3.py (issue 34)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def seeded_floats(*shape: int) -> np.ndarray:
    """float32 standard normals of ``shape``, drawn with seed 0 on every call."""
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)
