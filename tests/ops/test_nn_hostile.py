"""Hostile shapes and attributes against the nn and reduction ops (issue 20, items 2, 6 and 7).

Each test is a finding of the audit, and fails on f9a32ac:

- memory bombs (2): outputs computed by numpy from trace-time constants, and host
  arrays the size of a declared input, before any size check (MatMul, the
  reductions of an empty constant, AveragePool's Python loop over output
  positions, MaxPool's index constant, Dropout's mask), and a ConvTranspose
  stride that overflowed XLA's shapes (an abort);
- silent wrong results (6): shapes and attributes onnxruntime refuses that we
  computed (negative pads, a ConvTranspose output beyond its natural size or an
  output_padding not below the stride, BatchNormalization on a rank-1 X, statistics,
  biases and scales of the wrong shape, a Conv window larger than its padded input,
  ...), and windows onnxruntime computes that we got wrong (a pool window past the
  padded input, dilated taps that miss X, ConvTranspose's output_shape);
- exceptions outside the promised set (7): a table of attribute values 0, negative
  and huge, each ending in onnxruntime's result or a ValueError/TypeError naming
  the node (ZeroDivisionError and lax's own errors before).

Expected values are onnxruntime's, running the same model (the ONNX reference
evaluator where onnxruntime departs from the spec, said at each such test), never
our own output.
"""

from __future__ import annotations

import pytest

onnx = pytest.importorskip("onnx")
from tests.support.builders import run_capped as _outcome  # noqa: E402
from tests.support.node_models import FOLDED as _FOLDED  # noqa: E402


def test_matmul_of_constant_vectors_is_not_computed_on_the_host() -> None:
    # [65536, 1] x [1, 65536] of ConstantOfShape fills: a 16 GiB product (the limit, so
    # allowed) that numpy computed while tracing (MemoryError from a 300-byte file). It is
    # computed on the device now, whose memory (4 GiB here) refuses it with a ValueError.
    found = _outcome(_FOLDED.format(args='"MatMul", [[65536, 1], [1, 65536]]', limit=2**34))
    assert "RESULT prepared" in found, found
    assert "RESULT ValueError the graph of outputs ['y'] does not fit in the device's" in found


def test_matmul_of_constants_beyond_the_limit_is_refused_before_multiplying() -> None:
    # The same under a 1 GiB tensor limit: refused before numpy multiplied (MemoryError).
    found = _outcome(_FOLDED.format(args='"MatMul", [[65536, 1], [1, 65536]]', limit=2**30))
    assert "RESULT ValueError node 'n' (ai.onnx.MatMul)" in found, found
    assert "[65536, 65536]" in found and "tensor_bytes" in found, found
