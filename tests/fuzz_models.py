"""Mutated ONNX models for ``tests/test_fuzz.py``: seeds, mutations, entry points, a driver.

Each example takes a small valid model (an MLP, the MLP made trainable by
``training.attach``, an optimizer model from ``interop.to_model``), mutates its
fields and then its bytes, and hands the result to every entry point that reads
a model. Each call must end in a result or in one of :data:`DOCUMENTED`; the
driver runs the examples in this process with a time limit per example and a
memory limit, so that ``test_fuzz.py`` can run it as a child process and see a
crash or a hang as a failure instead of losing pytest. By hand::

    python -m tests.fuzz_models --examples 2000            # derandomized, as in CI
    python -m tests.fuzz_models --examples 2000 --seed 7   # another stream of examples
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import functools
import io
import math
import os
import signal
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from hypothesis import HealthCheck, currently_in_test_context, given, note, seed, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import onnx_optax
from onnx_optax import backend, cli, interop, training
from tests import fuzz_mutations as mutations

# What README promises for bad input ("Bad input", "Models from strangers"): a TypeError
# or ValueError naming the problem (TrainingModelError is a ValueError), and
# UnsupportedOperatorError, a NotImplementedError, for ops the backend lacks.
DOCUMENTED = (TypeError, ValueError, NotImplementedError)
CANARY = b"CANARY-a-file-outside-the-model-folder"
CLI_EXIT = (0, 1, 2)  # success, a check failed or the model cannot train, a usage error
RECORD: list[Path] = []  # where the driver writes the running example, read after a crash


def _note(text: str) -> None:
    """Notes a step of the example for hypothesis's report and for the record file."""
    if currently_in_test_context():
        note(text)
    for path in RECORD:
        with path.open("a") as file:
            file.write(text + "\n")


@functools.cache
def seeds() -> dict[str, bytes]:
    """The three valid models every example starts from, serialized."""
    w1 = numpy_helper.from_array(np.full((3, 4), 0.1, np.float32), "w1")
    b1 = numpy_helper.from_array(np.zeros(4, np.float32), "b1")
    w2 = numpy_helper.from_array(np.full((4, 2), -0.2, np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        initializer=[w1, b1, w2],
    )
    mlp = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    trainable = training.attach(mlp, loss="mse", target="t", optimizer=onnx_optax.adam(0.1))
    tx = onnx_optax.adagrad(0.1)
    params = {"w": jnp.ones(3, jnp.float32)}
    optimizer = interop.to_model(tx, params, tx.init(params))
    models = {"mlp": mlp, "trainable": trainable, "optimizer": optimizer}
    return {name: model.SerializeToString() for name, model in models.items()}


class Folder:
    """A model's folder with data files and links out of it, inside a folder with a canary."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.model = root / "model"
        self.model.mkdir()
        (root / "secret.bin").write_bytes(CANARY.ljust(64, b"!"))
        (self.model / "w.bin").write_bytes(np.full(16, 0.5, np.float32).tobytes())
        (self.model / "short.bin").write_bytes(b"\0\0")
        (self.model / "sub").mkdir()
        (self.model / "inside.bin").symlink_to("w.bin")
        (self.model / "wlink.bin").symlink_to(root / "secret.bin")
        (self.model / "link").symlink_to(root, target_is_directory=True)
        self.path = self.model / "model.onnx"
        self.data = root / "data.npz"
        np.savez(self.data, x=np.ones((4, 3), np.float32), t=np.ones((4, 2), np.float32))
        self.output = root / "trained.onnx"

    def locations(self) -> list[str]:
        """External-data locations: inside, missing, leaving, absolute, odd."""
        outside = str(self.root / "secret.bin")
        return ["w.bin", "inside.bin", "short.bin", "missing.bin", "sub", "", ".",
                "../secret.bin", "link/secret.bin", "wlink.bin", "sub/../w.bin",
                "sub/../../secret.bin", "secret.bin", outside, "/etc/hostname",
                "w.bin\x00.txt", "~/secret.bin", "%2e%2e/secret.bin"]  # fmt: skip


def _array(elem: int, dims: list[Any] | None) -> np.ndarray:
    """A small array of a declared element type and shape, for feeding a mutated model."""
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    except (KeyError, ValueError, TypeError):
        dtype = np.dtype(np.float32)
    if dtype.kind not in "biuf":
        dtype = np.dtype(np.float32)
    shape = [
        d if isinstance(d, int) and 0 <= d <= 4 else 2 for d in ([2] if dims is None else dims)
    ]
    return np.ones(shape, dtype)


def _stored(tensor: onnx.TensorProto) -> np.ndarray:
    """A small tensor's stored values (for run_node), else an array of its declared type."""
    dims = list(tensor.dims)
    small = min(dims, default=0) >= 0 and math.prod(dims) <= 64
    if small and tensor.data_location == TensorProto.DEFAULT:
        try:
            return numpy_helper.to_array(tensor)
        except Exception:  # a tensor numpy_helper cannot read; its declared type will do
            pass
    return _array(tensor.data_type, dims)


def _declared(model: onnx.ModelProto | None) -> dict[Any, np.ndarray]:
    """An array for every value a graph of ``model`` declares or stores, by name."""
    if model is None:
        return {}
    arrays: dict[Any, np.ndarray] = {}
    for graph in mutations.graphs(model):
        for tensor in graph.initializer:
            arrays[tensor.name] = _stored(tensor)
        for value in (*graph.input, *graph.value_info):
            kind = value.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in kind.shape.dim]
            arrays[value.name] = _array(kind.elem_type, dims if kind.HasField("shape") else None)
    return arrays


def _parsed(blob: bytes) -> onnx.ModelProto | None:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(blob)
    except Exception:  # protobuf's DecodeError: the entry points must refuse these bytes
        return None
    return model


def _feeds(names: Any, arrays: dict[Any, np.ndarray]) -> dict[Any, np.ndarray]:
    return {name: arrays.get(name, _array(TensorProto.FLOAT, None)) for name in names}


def _attempt(entry: str, call: Callable[[], Any], outcomes: dict[str, str]) -> Any:
    """Runs one entry point; a documented exception is an outcome, any other propagates."""
    _note(f"calling {entry}")
    try:
        result = call()
    except DOCUMENTED as error:
        message = str(error)
        assert CANARY.decode() not in message, f"{entry} leaked the canary: {message}"
        outcomes[entry] = type(error).__name__
        return None
    outcomes[entry] = "ok"
    return result


def _cli(argv: list[str]) -> int:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    assert code in CLI_EXIT, f"onnx-optax {argv[0]} exited {code}: {err.getvalue()}"
    assert CANARY.decode() not in out.getvalue() + err.getvalue()
    return code


def exercise(
    source: Any,
    folder: Folder,
    *,
    base_dir: Path | None = None,
    node: int = 0,
    run_cli: bool = True,
) -> dict[str, str]:
    """Every entry point on ``source`` (a proto, bytes or a path); the outcome of each.

    ``folder.path`` must hold the model's bytes (the CLI reads it there).
    """
    blob = folder.path.read_bytes()
    arrays = _declared(_parsed(blob))
    kwargs: dict[str, Any] = {} if base_dir is None else {"base_dir": base_dir}
    before = source.SerializeToString() if isinstance(source, onnx.ModelProto) else None
    outcomes: dict[str, str] = {}
    rep = _attempt("backend.prepare", lambda: backend.prepare(source, **kwargs), outcomes)
    if rep is not None:
        _attempt("rep.run", lambda: rep.run(_feeds(rep.input_names, arrays)), outcomes)
    _attempt("interop.from_model", lambda: interop.from_model(source, **kwargs), outcomes)
    problems = _attempt("training.check", lambda: training.check(source), outcomes)
    assert problems is None or all(isinstance(p, str) for p in problems), problems
    session = _attempt("training.Session", lambda: training.Session(source), outcomes)
    if session is not None:
        _attempt("Session.step", lambda: session.step(_feeds(session.inputs, arrays)), outcomes)
    nodes = mutations.nodes(_parsed(blob) or onnx.ModelProto())
    if nodes:
        proto = nodes[node % len(nodes)]
        inputs = _feeds(dict.fromkeys(n for n in proto.input if n), arrays)
        _attempt("backend.run_node", lambda: backend.run_node(proto, inputs), outcomes)
        _attempt("interop.from_node", lambda: interop.from_node(proto, 0.1), outcomes)
    if run_cli:
        path = str(folder.path)
        outcomes["cli check"] = str(_cli(["check", path]))
        train = ["train", path, "--data", str(folder.data), "--steps", "1", "--batch-size", "2"]
        outcomes["cli train"] = str(_cli([*train, "-o", str(folder.output)]))
    if before is not None:
        assert source.SerializeToString() == before, "an entry point changed the caller's proto"
    return outcomes


class Hang(Exception):
    """An example ran past its time limit."""


def fuzz_case(folder: Folder, data: st.DataObject) -> None:
    """One example: a seed, mutated fields, mutated bytes, and every entry point on it."""
    name = data.draw(st.sampled_from(sorted(seeds())), label="seed")
    model = onnx.ModelProto.FromString(seeds()[name])
    _note(f"seed: {name}")
    count = data.draw(st.integers(0, 3), label="field mutations")
    for _ in range(count):
        mutate = data.draw(st.sampled_from(mutations.FIELD), label="mutation")
        _note(f"{mutate.__name__}: {mutate(model, data, folder.locations())}")
    blob = model.SerializeToString()
    for _ in range(data.draw(st.integers(0 if count else 1, 2), label="byte mutations")):
        blob, text = mutations.mutate_bytes(blob, model, data)
        _note(text)
    folder.path.write_bytes(blob)
    form = data.draw(st.sampled_from(["bytes", "proto", "path"]), label="form")
    parsed = _parsed(blob)
    proto = blob if parsed is None else parsed  # bytes protobuf refuses stay bytes
    source: Any = {"bytes": blob, "proto": proto, "path": str(folder.path)}[form]
    base_dir = data.draw(st.sampled_from([None, folder.model]), label="base_dir")
    node = data.draw(st.integers(0, 20), label="node for run_node")
    run_cli = data.draw(st.booleans(), label="run the CLI")
    _note(f"as {form}, base_dir={base_dir}, node {node}, cli {run_cli}")
    exercise(source, folder, base_dir=base_dir, node=node, run_cli=run_cli)


def main(argv: list[str] | None = None) -> int:
    """Runs the fuzzer; exit status 0 when every example ended as documented."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=250)
    parser.add_argument("--seed", type=int, help="a random stream (default: derandomized)")
    parser.add_argument("--example-seconds", type=float, default=60.0)
    parser.add_argument("--memory-gib", type=float, default=4.0)
    parser.add_argument("--last", help="file that holds the running example's mutations")
    args = parser.parse_args(argv)
    warnings.simplefilter("error")  # as pytest's filterwarnings = error
    jax.config.update("jax_platforms", "cpu")  # the memory limit below would starve a GPU
    jax.config.update("jax_numpy_dtype_promotion", "strict")  # as tests/conftest.py
    jax.config.update("jax_numpy_rank_promotion", "raise")
    faulthandler.enable()
    if args.memory_gib and sys.platform == "linux":
        import resource

        limit = int(args.memory_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if args.last:
        RECORD.append(Path(args.last))
    seeds()
    timed_out: list[float] = []
    calls: list[int] = []

    def alarm(signum: int, frame: Any) -> None:
        del signum, frame
        timed_out.append(args.example_seconds)
        raise Hang(f"an example ran longer than {args.example_seconds} s")

    signal.signal(signal.SIGALRM, alarm)
    with tempfile.TemporaryDirectory() as temporary:
        folder = Folder(Path(temporary))
        os.chdir(folder.root)  # a location relative to the working directory finds the canary

        @settings(
            max_examples=args.examples,
            derandomize=args.seed is None,
            database=None,
            deadline=None,
            print_blob=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.data())
        def run(data: st.DataObject) -> None:
            calls.append(1)
            if RECORD:
                RECORD[0].write_text("")
            signal.setitimer(signal.ITIMER_REAL, args.example_seconds)
            # A hang inside C (protobuf, onnx, XLA) never returns to the alarm's handler:
            # print every thread's stack and exit instead.
            faulthandler.dump_traceback_later(args.example_seconds + 10, exit=True)
            try:
                fuzz_case(folder, data)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                faulthandler.cancel_dump_traceback_later()
            if timed_out:
                timed_out.clear()
                raise Hang(f"an example ran longer than {args.example_seconds} s")

        if args.seed is not None:
            run = seed(args.seed)(run)
        run()
    print(f"fuzz: {len(calls)} examples ended in a result or a documented exception")
    return 0


if __name__ == "__main__":
    sys.exit(main())
