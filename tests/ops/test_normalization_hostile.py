"""Hostile models against the elementwise, shape and loss ops (issue 20, items 2, 3, 6 and 7).

Each test is one finding of the audit of f9a32ac and fails there: a tiny model
that asked numpy for 16-32 GiB while tracing (item 2), a wide node that ended in
``std::bad_alloc`` and an abort (item 3), a result onnxruntime refuses or computes
otherwise (item 6), an exception outside the promised set (item 7). Expected
values come from onnxruntime or the ONNX spec, never from our own output. The
memory bombs and wide nodes run in a child process under a 4 GiB data limit, so
a regression fails the test instead of taking pytest down.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from tests.support.builders import value_info as _vi  # noqa: E402
from tests.support.op_models import F32  # noqa: E402
from tests.support.op_models import one_node as _one_node  # noqa: E402
from tests.support.op_models import ours as _ours  # noqa: E402
from tests.support.op_models import refused_by_onnxruntime as _refused_by_onnxruntime  # noqa: E402


@pytest.mark.parametrize("fed", [True, False], ids=["fed", "constant"])
@pytest.mark.parametrize(("training", "outputs"), [(1, 1), (0, 3)])
def test_batch_normalization_outputs_must_fit_its_training_mode(
    training: int, outputs: int, fed: bool
) -> None:
    """Opset 14 on: training_mode 1 has 3 outputs, 0 one (onnx's shape inference, which
    onnxruntime runs); on 7e22678 the first was a result, the second an AttributeError."""
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 4, 3)
    inputs = [x, *[np.ones(4, np.float32)] * 4]
    model, feeds = _one_node("BatchNormalization", inputs, {"training_mode": training}, 15, fed)
    for k in range(1, outputs):
        model.graph.node[-1].output.append(f"y{k}")
        model.graph.output.append(_vi(f"y{k}", F32, [4]))
    _refused_by_onnxruntime(model, feeds)
    message = rf"training_mode {training} needs {3 if training else 1} output"
    with pytest.raises(ValueError, match=rf"node 'n' \(ai\.onnx\.BatchNormalization\): {message}"):
        _ours(model, feeds)
