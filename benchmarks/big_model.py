"""A model above protobuf's 2 GiB, end to end: attach, check, train, save, resume.

The inference model: x[N, 1024] -> MatMul W1[1024, H] -> Relu -> MatMul W2[H, 1024] -> MatMul
W3[1024, 8] logits, float32, its weights written as external data (never as one proto:
protobuf cannot serialize 2 GiB). With the default ``--hidden 270336`` the weights take
2.2 GB. Then, each from the files: ``training.attach`` (Adam), ``training.check``, the
attached model written (external data, as ``onnx-optax attach -o`` does), ``Session``,
``--steps`` steps, ``Session.save(..., external_data=True)`` and a new ``Session`` from the
saved file, whose weights, V, H and T must equal the first session's bit for bit, and whose
next step must equal the first session's next step.

Prints the peak resident memory after each stage (``resource.getrusage``: the process's
high-water mark so far) and the time each stage took. Run::

    PYTHONPATH=. .venv/bin/python benchmarks/big_model.py [--hidden 270336] [--folder /tmp/x]

and last the ratio of the peak to the weights' bytes (``--hidden 36864``: 0.3 GB of weights,
for a machine that cannot hold the full size).

``tests/training/test_big_model.py`` runs :func:`run` at a small size (marked ``slow`` to run it at
full size: ``pytest -m slow``).
"""

from __future__ import annotations

import argparse
import hashlib
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from onnx import TensorProto, helper

import onnx_optax
from onnx_optax._src.write import write_file

INPUTS, MIDDLE, CLASSES = 1024, 1024, 8


def peak_rss() -> int:
    """The process's peak resident memory so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss() -> int:
    """The process's resident memory now, in bytes (Linux's /proc/self/statm)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


def weight_shapes(hidden: int) -> dict[str, tuple[int, int]]:
    return {"W1": (INPUTS, hidden), "W2": (hidden, MIDDLE), "W3": (MIDDLE, CLASSES)}


def write_inference_model(folder: Path, hidden: int, seed: int = 0) -> Path:
    """The inference model in ``folder``, its weights in ``weights.bin``, written in chunks.

    No array of more than 64 MiB and no proto holding the weights is made here.
    """
    rng = np.random.default_rng(seed)
    initializers = []
    offset = 0
    tensors: list[tuple[str, tuple[int, int]]] = list(weight_shapes(hidden).items())

    def write_weights(file: BinaryIO) -> None:
        for _, (rows, columns) in tensors:
            scale = np.float32(1 / np.sqrt(rows))
            step = max(1, 2**24 // columns)
            for start in range(0, rows, step):
                chunk = rng.standard_normal((min(step, rows - start), columns), np.float32)
                file.write((chunk * scale).astype("<f4").tobytes())

    for name, (rows, columns) in tensors:
        length = rows * columns * 4
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[rows, columns])
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", "weights.bin"), ("offset", offset), ("length", length)):
            tensor.external_data.add(key=key, value=str(value))
        initializers.append(tensor)
        offset += length
    write_file(folder / "weights.bin", write_weights)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W1"], ["h"]),
            helper.make_node("Relu", ["h"], ["a"]),
            helper.make_node("MatMul", ["a", "W2"], ["m"]),
            helper.make_node("MatMul", ["m", "W3"], ["logits"]),
        ],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", INPUTS])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path = folder / "model.onnx"
    write_file(path, model.SerializeToString())
    return path


def _digest(array: np.ndarray) -> tuple[str, str, tuple[int, ...]]:
    return hashlib.sha256(array.tobytes()).hexdigest(), str(array.dtype), array.shape


def batch(step: int, rows: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1000 + step)
    return {
        "x": rng.standard_normal((rows, INPUTS), np.float32),
        "target": rng.integers(0, CLASSES, rows),
    }


def run(
    folder: Path, hidden: int, steps: int = 2, say: Callable[[str], Any] = print
) -> dict[str, Any]:
    """Every stage on a model of this size in ``folder``; the figures and the final states.

    Returns the peak RSS after each stage (bytes), the sizes of the files, the
    losses, and the two sessions' states after the resumed step, to compare.
    """
    import onnx_optax
    from onnx_optax import training
    from onnx_optax.training._export import save_model

    figures: dict[str, Any] = {"stages": []}

    def stage(name: str, start: float) -> None:
        figures["stages"].append((name, time.perf_counter() - start, peak_rss()))
        took = time.perf_counter() - start
        say(
            f"{name:<26} {took:6.1f} s   peak RSS {peak_rss() / 2**30:6.2f} GiB"
            f"   now {current_rss() / 2**30:6.2f} GiB"
        )

    start = time.perf_counter()
    path = write_inference_model(folder, hidden)
    figures["weight_bytes"] = (folder / "weights.bin").stat().st_size
    stage("write inference model", start)

    start = time.perf_counter()
    attached = training.attach(path, loss="softmax_cross_entropy", optimizer=onnx_optax.adam(1e-4))
    stage("attach (from the path)", start)

    start = time.perf_counter()
    problems = training.check(attached)
    if problems:
        raise AssertionError(f"check found problems: {problems}")
    stage("check", start)

    start = time.perf_counter()
    attached_path = folder / "attached.onnx"
    save_model(attached, attached_path, True, {})  # as `onnx-optax attach -o` does
    del attached
    stage("write attached model", start)

    start = time.perf_counter()
    session = training.Session(attached_path)
    stage("Session (from the path)", start)

    start = time.perf_counter()
    figures["losses"] = [float(session.step(batch(i))["loss"]) for i in range(steps)]
    stage(f"{steps} steps", start)

    start = time.perf_counter()
    saved = folder / "trained.onnx"
    session.save(saved, external_data=True)
    figures["saved_bytes"] = saved.stat().st_size + (folder / "trained.onnx.data").stat().st_size
    stage("Session.save", start)

    # The first session's state and next step, then the session let go: two sessions of
    # this size at once would double the memory. sha256 compares every bit.
    start = time.perf_counter()
    digests = {n: _digest(session._current(n)) for n in session._state}
    next_loss = float(session.step(batch(steps))["loss"])
    del session
    stage("state digests, next step", start)

    start = time.perf_counter()
    resumed = training.Session(saved)
    stage("Session (resumed)", start)

    start = time.perf_counter()
    figures["state_equal"] = {n: _digest(resumed._current(n)) == d for n, d in digests.items()}
    figures["next_losses"] = (next_loss, float(resumed.step(batch(steps))["loss"]))
    stage("compare, next step", start)
    figures["peak_rss"] = peak_rss()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=270336, help="W1's columns, W2's rows")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--folder", help="a folder for the files (default: a new one in /tmp)")
    args = parser.parse_args()
    folder = Path(args.folder or tempfile.mkdtemp(prefix="big_model_"))
    folder.mkdir(exist_ok=True)
    try:
        shapes = weight_shapes(args.hidden)
        total = sum(4 * r * c for r, c in shapes.values())
        print(f"weights: {total:,} bytes ({total / 2**30:.2f} GiB) in {folder}")
        figures = run(folder, args.hidden, args.steps)
        print(f"losses {figures['losses']}, next step {figures['next_losses']}")
        print(f"state bit-identical after resuming: {all(figures['state_equal'].values())}")
        print(f"saved: {figures['saved_bytes']:,} bytes")
        ratio = figures["peak_rss"] / figures["weight_bytes"]
        print(f"peak RSS / weight bytes: {ratio:.1f}")
    finally:
        if not args.folder:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    onnx_optax.reuse_host_memory()  # as the onnx-optax command does (docs/performance.md)
    main()
