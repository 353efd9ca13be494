"""Hostile and malformed models against the loading layer, the graph runtime and the backend.

Each test is one finding of the audit of issue 14: what a stranger's model did
to ``backend.prepare``/``run`` and ``backend.run_node``, and the clear refusal
(or the modest run) expected instead.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

from onnx_optax import backend  # noqa: E402
from tests.support import oracle  # noqa: E402
from tests.support.builders import value_info as _vi  # noqa: E402
from tests.support.graph_models import F32  # noqa: E402
from tests.support.graph_models import opset21_model as _graph_model  # noqa: E402
from tests.support.graph_models import run_capped_60s as _outcome  # noqa: E402

# ----------------------------------------------------------------------------- 4. large nodes

N_TENSORS = 5000

ADAM = {"alpha": 0.9, "beta": 0.999, "epsilon": 1e-6, "norm_coefficient": 0.01}


def _adam_inputs(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = [(1 + i % 5,) if i % 3 else (2, 1 + i % 2) for i in range(n)]
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    gs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    vs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    hs = [rng.uniform(0.5, 1.5, s).astype(np.float32) for s in shapes]  # well conditioned
    return [np.float32(0.05), np.int64(3), *xs, *gs, *vs, *hs]


_LARGE_NODE = """
import json, resource, sys
import numpy as np
from onnx import helper
from onnx_optax import backend

resource.setrlimit(resource.RLIMIT_DATA, (4 * 2**30, 4 * 2**30))  # the audit's 4 GB cap
folder, attributes = sys.argv[1], json.loads(sys.argv[2])
with np.load(f"{folder}/inputs.npz") as saved:
    values = [saved[f"arr_{k}"] for k in range(len(saved.files))]
n = (len(values) - 2) // 4
inputs = ["R", "T"] + [f"{g}{i}" for g in "xgvh" for i in range(n)]
outputs = [f"{g}{i}.new" for g in "xvh" for i in range(n)]
node = helper.make_node("Adam", inputs, outputs, domain="ai.onnx.preview.training", **attributes)
np.savez(f"{folder}/outputs.npz", *backend.run_node(node, values))
print(json.dumps({"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def test_an_optimizer_node_with_thousands_of_tensors_runs_in_modest_memory(tmp_path: Path) -> None:
    """5,000 tensors, run in a fresh process under a 4 GB data limit; checked with the oracle."""
    values = _adam_inputs(N_TENSORS)
    np.savez(tmp_path / "inputs.npz", *values)
    root = Path(__file__).parents[2]
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_LARGE_NODE), str(tmp_path), json.dumps(ADAM)],
        cwd=root,
        env={"PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    peak = json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_mib"]
    assert peak < 2048, f"peak RSS {peak:.0f} MiB"
    with np.load(tmp_path / "outputs.npz") as saved:
        results = [saved[f"arr_{k}"] for k in range(len(saved.files))]
    R, T, *tensors = values
    n = N_TENSORS
    assert len(results) == 3 * n
    tolerance = 16 * float(np.finfo(np.float32).eps)  # as tests/support/optimizers.py, one step
    for i in range(n):
        x, g, v, h = tensors[i], tensors[n + i], tensors[2 * n + i], tensors[3 * n + i]
        expected = oracle.adam(float(R), int(T), x, g, v, h, norm_coefficient_post=0.0, **ADAM)
        for k, want in enumerate(expected):
            got = results[k * n + i]
            assert got.shape == x.shape and got.dtype == np.float32
            np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


def test_an_omitted_required_input_is_refused_with_its_position() -> None:
    # F11: MatMul with an empty first input raised AttributeError on None.shape.
    node = helper.make_node("MatMul", ["", "w"], ["y"], name="mm")
    with pytest.raises(
        ValueError, match=r"node 'mm' \(ai\.onnx\.MatMul\).*input 0 is omitted.*optional"
    ):
        backend.run_node(node, [np.ones((2, 2), np.float32)])
    # An optional input may still be left out: Clip without min.
    x = np.array([-2.0, 0.5, 3.0], np.float32)
    clip = helper.make_node("Clip", ["x", "", "high"], ["y"])
    (y,) = backend.run_node(clip, [x, np.array(1.0, np.float32)])
    np.testing.assert_array_equal(y, np.minimum(x, 1.0))


def test_feed_names_that_are_not_str_are_refused() -> None:
    # Mixed bytes and str feed names gave "Comparator raised exception while sorting".
    model = _graph_model(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        [_vi("a", F32, [2]), _vi("b", F32, [2])],
        [_vi("y", F32, [2])],
    )
    feeds = {"a": np.ones(2, np.float32), b"b": np.ones(2, np.float32)}
    with pytest.raises(TypeError, match=r"input names must be str, got \[b'b'\]"):
        backend.prepare(model).run(feeds)


def test_a_graph_the_device_memory_cannot_hold_is_a_value_error() -> None:
    # The fuzzer (4 GiB address space): an 8 GiB ConstantOfShape under the 16 GiB limit
    # ended in jax's RESOURCE_EXHAUSTED JaxRuntimeError.
    script = """
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        import numpy as np
        from onnx import helper
        from onnx_optax import backend

        node = helper.make_node("ConstantOfShape", ["shape"], ["y"])
        try:
            backend.run_node(node, [np.array([2**31], np.int64)])
            print("RESULT ran")
        except ValueError as error:
            print("RESULT ValueError", error)
    """
    found = _outcome(script)
    assert re.search(r"RESULT ValueError .*does not fit in the device's memory", found), found
