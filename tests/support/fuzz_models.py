"""Mutated ONNX models for ``tests/test_fuzz.py``: seeds, mutations, entry points, a driver.

Each example takes a small valid model (:func:`seeds`: an MLP, the MLP made
trainable by ``training.attach``, an optimizer model from ``interop.to_model``,
a CNN, shape arithmetic, indexing ops, a classifier trained with a softmax
cross-entropy), mutates its fields (:data:`MUTATIONS`: the model's fields, or
what its ops read) and then its bytes, and hands the result to every entry
point that reads a model. Each call must end in a result or in one of :data:`DOCUMENTED`; the
driver runs the examples in this process with a time limit per example and a
memory limit, so that ``test_fuzz.py`` can run it as a child process and see a
crash or a hang as a failure instead of losing pytest. By hand::

    python -m tests.support.fuzz_models --examples 2000            # derandomized, as in CI
    python -m tests.support.fuzz_models --examples 2000 --seed 7   # another stream of examples
    python -m tests.support.fuzz_models --mutations op --seeds cnn,indexing --examples 500 --seed 3
    python -m tests.support.fuzz_models --examples 3000 --seed 5 --findings f.txt  # log each, go on
    python -m tests.support.fuzz_models --differential --examples 2000 --seed 3  # against onnxruntime
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import faulthandler
import functools
import io
import math
import os
import signal
import sys
import tempfile
import traceback
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
from tests.support import fuzz_mutations as mutations

# What the docs promise for bad input (docs/operators.md "Bad input", docs/security.md): a TypeError
# or ValueError naming the problem (TrainingModelError is a ValueError), and
# UnsupportedOperatorError, a NotImplementedError, for ops the backend lacks.
DOCUMENTED = (TypeError, ValueError, NotImplementedError)
CANARY = b"CANARY-a-file-outside-the-model-folder"
CLI_EXIT = (0, 1, 2)  # success, a check failed or the model cannot train, a usage error
RECORD: list[Path] = []  # where the driver writes the running example, read after a crash
NOTES: list[str] = []  # the running example's steps


def _note(text: str) -> None:
    """Notes a step of the example for hypothesis's report and for the record file."""
    if currently_in_test_context():
        note(text)
    NOTES.append(text)
    for path in RECORD:
        with path.open("a") as file:
            file.write(text + "\n")


def _model(
    name: str,
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, list[Any]]],
    outputs: list[tuple[str, int, list[Any]]],
    initializers: dict[str, np.ndarray],
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(*value) for value in inputs],
        [helper.make_tensor_value_info(*value) for value in outputs],
        initializer=[numpy_helper.from_array(v, k) for k, v in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _cnn() -> onnx.ModelProto:
    """Conv, BatchNormalization, Relu, MaxPool, AveragePool, Flatten, Gemm on [N, 1, 4, 4]."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "k", "kb"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("AveragePool", ["m"], ["a"], kernel_shape=[2, 2]),
        helper.make_node("Flatten", ["a"], ["f"]),
        helper.make_node("Gemm", ["f", "g", "gb"], ["y"], transB=1),
    ]
    weights = {
        "k": rng.normal(size=(2, 1, 3, 3)).astype(np.float32),
        "kb": np.array([0.1, -0.1], np.float32),
        "scale": np.ones(2, np.float32),
        "bias": np.zeros(2, np.float32),
        "mean": np.full(2, 0.1, np.float32),
        "var": np.full(2, 0.9, np.float32),
        "g": rng.normal(size=(3, 2)).astype(np.float32),
        "gb": np.zeros(3, np.float32),
    }
    x, y = ("x", TensorProto.FLOAT, ["N", 1, 4, 4]), ("y", TensorProto.FLOAT, ["N", 3])
    return _model("cnn", nodes, [x], [y], weights)


def _shapes() -> onnx.ModelProto:
    """Shape arithmetic: Shape -> Gather -> Concat -> Reshape, then MatMul."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Concat", ["n", "minus1"], ["to"], axis=0),
        helper.make_node("Reshape", ["x", "to"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["y"]),
    ]
    constants = {
        "zero": np.array([0], np.int64),
        "minus1": np.array([-1], np.int64),
        "w": np.full((6, 2), 0.5, np.float32),
    }
    x, y = ("x", TensorProto.FLOAT, ["N", 2, 3]), ("y", TensorProto.FLOAT, ["N", 2])
    return _model("shapes", nodes, [x], [y], constants)


def _indexing() -> onnx.ModelProto:
    """Gather, GatherElements, Slice, Pad and Split on a [2, 4] input."""
    nodes = [
        helper.make_node("Gather", ["x", "columns"], ["g"], axis=1),
        helper.make_node("GatherElements", ["g", "picks"], ["e"], axis=1),
        helper.make_node("Slice", ["e", "starts", "ends", "axes"], ["s"]),
        helper.make_node("Pad", ["s", "pads", "fill"], ["p"]),
        helper.make_node("Split", ["p", "split"], ["a", "b"], axis=1),
    ]
    constants = {
        "columns": np.array([3, 0, 1, 2], np.int64),
        "picks": np.array([[0, 1, 1, 3], [2, 2, 0, 1]], np.int64),
        "starts": np.array([1], np.int64),
        "ends": np.array([4], np.int64),
        "axes": np.array([1], np.int64),
        "pads": np.array([0, 1, 0, 1], np.int64),
        "fill": np.array(0.5, np.float32),
        "split": np.array([2, 3], np.int64),
    }
    x = ("x", TensorProto.FLOAT, [2, 4])
    outputs = [("a", TensorProto.FLOAT, [2, 2]), ("b", TensorProto.FLOAT, [2, 3])]
    return _model("indexing", nodes, [x], outputs, constants)


@functools.cache
def seeds() -> dict[str, bytes]:
    """The valid models every example starts from, serialized.

    An MLP, the MLP made trainable by ``attach`` (mean squared error, Adam), an
    Adagrad model from ``interop.to_model``, and models that reach more ops: a
    small CNN, a shape-arithmetic chain, an indexing chain, and a classifier made
    trainable with a SoftmaxCrossEntropyLoss (Momentum).
    """
    weights = {
        "w1": np.full((3, 4), 0.1, np.float32),
        "b1": np.zeros(4, np.float32),
        "w2": np.full((4, 2), -0.2, np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    x, y = ("x", TensorProto.FLOAT, ["N", 3]), ("y", TensorProto.FLOAT, ["N", 2])
    mlp = _model("mlp", nodes, [x], [y], weights)
    trainable = training.attach(mlp, loss="mse", target="t", optimizer=onnx_optax.adam(0.1))
    classifier = training.attach(
        mlp,
        loss="softmax_cross_entropy",
        target="t",
        optimizer=onnx_optax.momentum(0.1, alpha=0.9, beta=1.0, norm_coefficient=0.0),
    )
    tx = onnx_optax.adagrad(0.1)
    params = {"w": jnp.ones(3, jnp.float32)}
    optimizer = interop.to_model(tx, params, tx.init(params))
    models = {
        "mlp": mlp,
        "trainable": trainable,
        "optimizer": optimizer,
        "cnn": _cnn(),
        "shapes": _shapes(),
        "indexing": _indexing(),
        "classifier": classifier,
    }
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
    # main turns an exception no check foresaw into exit 2 too: still a failure here.
    unforeseen = f"onnx-optax {argv[0]}: unexpected "
    assert unforeseen not in err.getvalue(), err.getvalue()
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


MUTATIONS = {
    "all": [*mutations.FIELD, *mutations.OP],
    "field": mutations.FIELD,  # the model's fields: tensors, names, opsets, bindings
    "op": mutations.OP,  # what the ops read: attributes, widths, subgraphs, constants, dtypes
}


def fuzz_case(
    folder: Folder, data: st.DataObject, *, kind: str = "all", names: tuple[str, ...] = ()
) -> dict[str, str]:
    """One example: a seed, mutated fields, mutated bytes, and every entry point on it.

    ``kind`` picks the mutations (a key of :data:`MUTATIONS`; "op" examples mutate
    bytes rarely, so that most reach the ops), ``names`` the seeds (default: all).
    """
    name = data.draw(st.sampled_from(sorted(names or seeds())), label="seed")
    model = onnx.ModelProto.FromString(seeds()[name])
    _note(f"seed: {name}")
    count = data.draw(st.integers(1 if kind == "op" else 0, 3), label="field mutations")
    for _ in range(count):
        mutate = data.draw(st.sampled_from(MUTATIONS[kind]), label="mutation")
        _note(f"{mutate.__name__}: {mutate(model, data, folder.locations())}")
    blob = model.SerializeToString()
    least, most = (0, 1) if kind == "op" else (0 if count else 1, 2)
    for _ in range(data.draw(st.integers(least, most), label="byte mutations")):
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
    return exercise(source, folder, base_dir=base_dir, node=node, run_cli=run_cli)


def main(argv: list[str] | None = None) -> int:
    """Runs the fuzzer; exit status 0 when every example ended as documented."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=250)
    parser.add_argument("--seed", type=int, help="a random stream (default: derandomized)")
    parser.add_argument("--example-seconds", type=float, default=60.0)
    parser.add_argument("--memory-gib", type=float, default=4.0)
    parser.add_argument("--last", help="file that holds the running example's mutations")
    parser.add_argument(
        "--mutations", choices=sorted(MUTATIONS), default="all", help="which mutations to draw"
    )
    parser.add_argument("--seeds", default="", help="comma-separated seed models (default: all)")
    parser.add_argument(
        "--findings",
        help="for long runs: append each failing example (its steps and traceback) to this file "
        "and go on, instead of stopping at the first and shrinking it; exit 1 if any failed",
    )
    parser.add_argument(
        "--differential",
        action="store_true",
        help="inference models against onnxruntime (tests/support/fuzz_onnxruntime.py): onnxruntime "
        "refuses, so must we",
    )
    parser.add_argument(
        "--compare", action="store_true", help="with --differential: outputs must match too"
    )
    parser.add_argument(
        "--no-odd-feeds",
        action="store_true",
        help="with --differential: feeds always of the declared shape and type",
    )
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
    names = tuple(filter(None, args.seeds.split(",")))
    unknown = sorted(set(names) - set(seeds()))
    if unknown:
        parser.error(f"unknown seed(s) {', '.join(unknown)}; the seeds are {', '.join(seeds())}")
    timed_out: list[float] = []
    calls: list[int] = []
    failed: list[str] = []
    tally: collections.Counter[tuple[str, str]] = collections.Counter()

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
            NOTES.clear()
            if RECORD:
                RECORD[0].write_text("")
            signal.setitimer(signal.ITIMER_REAL, args.example_seconds)
            # A hang inside C (protobuf, onnx, XLA) never returns to the alarm's handler:
            # print every thread's stack and exit instead.
            faulthandler.dump_traceback_later(args.example_seconds + 10, exit=True)
            try:
                try:
                    if args.differential:
                        from tests.support import fuzz_onnxruntime

                        outcome = fuzz_onnxruntime.differential_case(
                            data,
                            _note,
                            compare_outputs=args.compare,
                            odd_feeds=not args.no_odd_feeds,
                        )
                        outcomes = {"differential": outcome}
                    else:
                        outcomes = fuzz_case(folder, data, kind=args.mutations, names=names)
                    tally.update((outcomes or {}).items())
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    faulthandler.cancel_dump_traceback_later()
                if timed_out:
                    timed_out.clear()
                    raise Hang(f"an example ran longer than {args.example_seconds} s")
            except Exception as error:
                timed_out.clear()
                if not args.findings:
                    raise
                failed.append(f"{type(error).__name__}: {str(error)[:200]}")
                trace = "".join(traceback.format_exception(error)[-12:])
                with open(args.findings, "a") as file:
                    file.write(f"--- example {len(calls)}\n" + "\n".join(NOTES) + "\n" + trace)

        if args.seed is not None:
            run = seed(args.seed)(run)
        run()
    # How far the examples got: each entry point's outcomes (ok, an exception's name, an exit code)
    entries = sorted({entry for entry, _ in tally})
    for entry in entries:
        counts = sorted(((n, o) for (e, o), n in tally.items() if e == entry), reverse=True)
        print(f"  {entry}: " + ", ".join(f"{outcome} {n}" for n, outcome in counts))
    if failed:
        print(f"fuzz: {len(failed)} of {len(calls)} examples failed (in {args.findings}):")
        print("\n".join(sorted(set(failed))))
        return 1
    print(
        f"fuzz: {len(calls)} examples ({args.mutations} mutations, seed {args.seed}) ended in "
        "a result or a documented exception"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
