"""Small helpers that several test files used to define word for word.

Each one had the same logic in two or more test modules: a model's outputs as
onnxruntime computes them, a typed graph input or output, a script run in a
capped child interpreter, the XLA compilations of a block, and bit-identical
comparison of named arrays. Where copies differed in a detail (a timeout, a
default), the detail is a parameter here with each caller's old value.

onnx and onnxruntime are imported inside the functions that need them, so that
importing this module never skips a test file that does not use them.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

if TYPE_CHECKING:
    import onnx

# JAX records this event once per XLA compilation (not for a cached executable).
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
FLOAT = 1  # onnx.TensorProto.FLOAT, without importing onnx here


def onnxruntime_outputs(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray] | None = None
) -> list[Any]:
    """All outputs of ``model`` on ``feeds`` (none: ``{}``) from onnxruntime's CPU provider."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, dict(feeds or {})))


def value_info(
    name: str, elem: int = FLOAT, shape: Sequence[int | str] | None = None
) -> onnx.ValueInfoProto:
    """A tensor graph input or output: ``helper.make_tensor_value_info(name, elem, shape)``."""
    from onnx import helper

    return helper.make_tensor_value_info(name, elem, shape)


def capped_child(script: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Runs ``script`` in a fresh interpreter (the repository's root its folder and path,
    JAX on the CPU) under a 4 GiB data limit; its exit is the caller's to judge.

    A hang, an abort or a huge allocation (before the fixes) must not take pytest down.
    """
    root = Path(__file__).parents[2]
    limit = "import resource; resource.setrlimit(resource.RLIMIT_DATA, (4 << 30, 4 << 30))\n"
    return subprocess.run(
        [sys.executable, "-c", limit + textwrap.dedent(script)],
        cwd=root,
        env={"PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_capped(script: str, timeout: float = 120) -> str:
    """``capped_child``'s stdout, its exit 0 asserted."""
    done = capped_child(script, timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@contextlib.contextmanager
def compilations() -> Iterator[list[str]]:
    """The XLA compilations inside the block, as JAX reports them."""
    events: list[str] = []

    def listener(event: str, duration: float, **kwargs: Any) -> None:
        del duration, kwargs
        if event == COMPILE_EVENT:
            events.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    """Bit-identical values and dtypes, name by name."""
    assert list(a) == list(b)
    for name, value in a.items():
        np.testing.assert_array_equal(b[name], value, err_msg=name)
        assert b[name].dtype == value.dtype, name


def inference_model(path: Path) -> None:
    """A 4-3 linear classifier (Gemm, opset 18) saved to ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "b"], ["logits"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
        initializer=[
            numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "W"),
            numpy_helper.from_array(np.zeros(3, np.float32), "b"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))


def write_npz(path: Path, **arrays: object) -> None:
    """``arrays`` saved to ``path`` with ``np.savez``."""
    np.savez(path, **arrays)  # type: ignore[arg-type]
