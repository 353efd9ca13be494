"""Hostile model files, fuzzed: mutated models end in a result or a documented exception.

The fuzzer (``tests/support/fuzz_models.py``, mutations in ``tests/support/fuzz_mutations.py``)
runs in a child process: a crash (a signal, say a segfault in protobuf, onnx's
checker or XLA) or a hang would otherwise take pytest down with it or never
end. The child gives each example a time limit (an alarm) and itself a memory
limit; this test gives the child a time limit and reports the running example
of a child that crashed or hung. The examples are derandomized, so CI sees the
same ones every run: 175 of mutated fields and bytes, 75 of mutations the ops
read (attribute values, wide nodes, subgraphs, nested Gradients, huge folded
constants, swapped ops, retyped operands), about 20 s on 2 cores together;
``FUZZ_EXAMPLES=2000`` and ``FUZZ_OP_EXAMPLES=2000`` run more (``FUZZ_SEED=7``
another stream), and ``python -m tests.support.fuzz_models --help`` runs it by hand
(``--findings`` for long runs that log each failing example and go on).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto

from onnx_optax import backend, training
from tests.support import fuzz_models, fuzz_mutations

REPOSITORY = Path(__file__).resolve().parent.parent
# Examples of each kind of mutation (fuzz_models.MUTATIONS): the model's fields and bytes,
# and what the ops read. Together about the CPU time 250 field examples took before the op
# mutations came (7 s); FUZZ_EXAMPLES and FUZZ_OP_EXAMPLES run more.
EXAMPLES = {
    "field": int(os.environ.get("FUZZ_EXAMPLES", "175")),
    "op": int(os.environ.get("FUZZ_OP_EXAMPLES", "75")),
}


def run_child(command: list[str], record: Path, timeout: float) -> str | None:
    """Runs ``command``; None if it exited 0, else what went wrong and the running example."""
    paths = [str(REPOSITORY), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    record.write_text("")
    try:
        done = subprocess.run(
            command, cwd=REPOSITORY, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or b"") + (expired.stderr or b"")
        tail = (output.decode() if isinstance(output, bytes) else output)[-4000:]
        return f"ran past {timeout} s (a hang); the running example:\n{record.read_text()}{tail}"
    if done.returncode == 0:
        return None
    tail = (done.stdout + done.stderr)[-12000:]
    if done.returncode < 0:
        what = f"crashed ({signal.Signals(-done.returncode).name})"
    else:
        what = f"exited {done.returncode}"
    return f"{what}; the running example:\n{record.read_text()}\n{tail}"


# Known findings on b49dea6, each to be fixed in the library, not accepted here: this test fails
# until they are. prepare lets onnx.checker.ValidationError through (the first CI example: a
# flipped ir_version byte); a node of domain "ai.onnx" raises onnx.defs.SchemaError; check()
# raises AttributeError for Gradient xs given as ints, IndexError for T bound to a non-output,
# an opaque TypeError for a non-scalar stored T (a traceback from the CLI); ConstantOfShape
# without `value` raises IndexError; Range raises OverflowError (inf) or MemoryError (1e12);
# Expand to [2**62] behind a graph input with a symbolic dim aborts the process in XLA (SIGABRT),
# and Expand to [2**20, 2**20] summed makes prepare run for hours.
# Known findings of the op mutations on c038037 (issue 20, item 11; seeds 1-4, about 8,000
# examples): an axis of a scalar raises IndexError (Concat, Split, Gather, GatherElements,
# Squeeze, ArgMax, the reductions); an ignore_index beyond int32 raises OverflowError in both
# loss ops; constants folded by numpy raise RuntimeWarning (a Div by zero, a ReduceMean of
# nothing) where warnings are errors; fixed in onnx_optax/_src/ops with tests in
# tests/ops/test_*_hostile.py. Open (graph.py): run_node of a node with more
# outputs than its op computes (MatMul with 2) raises KeyError naming the extra output.
@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_mutated_models_end_in_a_result_or_a_documented_exception(
    tmp_path: Path, kind: str
) -> None:
    record = tmp_path / "running-example.txt"
    examples = ["--examples", str(EXAMPLES[kind]), "--mutations", kind]
    command = [sys.executable, "-m", "tests.support.fuzz_models", *examples]
    if "FUZZ_SEED" in os.environ:
        command += ["--seed", os.environ["FUZZ_SEED"]]
    timeout = 300 + 2 * EXAMPLES[kind]  # 250 examples take about 20 s on 2 cores
    failure = run_child([*command, "--last", str(record)], record, timeout)
    assert failure is None, failure


# Inference models against onnxruntime (tests/support/fuzz_onnxruntime.py, issue 33): where onnxruntime
# refuses a model or its feeds (not for want of a kernel), we refuse too. Derandomized, 150
# examples in about 25 s; FUZZ_DIFFERENTIAL_EXAMPLES runs more, FUZZ_SEED another stream, and
# FUZZ_COMPARE=1 also asks for the same outputs where both give a result, FUZZ_ODD_FEEDS=0
# leaves out feeds of another shape, rank or element type than declared.
# test_findings_of_the_differential_fuzzer_are_refused below holds what it found.
DIFFERENTIAL = int(os.environ.get("FUZZ_DIFFERENTIAL_EXAMPLES", "150"))


def test_where_onnxruntime_refuses_a_model_or_its_feeds_we_refuse(tmp_path: Path) -> None:
    record = tmp_path / "running-example.txt"
    command = [sys.executable, "-m", "tests.support.fuzz_models", "--differential"]
    command += ["--examples", str(DIFFERENTIAL), "--last", str(record)]
    if "FUZZ_SEED" in os.environ:
        command += ["--seed", os.environ["FUZZ_SEED"]]
    if os.environ.get("FUZZ_COMPARE"):
        command.append("--compare")
    if os.environ.get("FUZZ_ODD_FEEDS") == "0":
        command.append("--no-odd-feeds")
    failure = run_child(command, record, timeout=300 + 2 * DIFFERENTIAL)
    assert failure is None, failure


def _declared_input(
    model: onnx.ModelProto, elem: int, dims: list[int], index: int = 0
) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    kind = copy.graph.input[index].type.tensor_type
    kind.elem_type = elem
    del kind.shape.dim[:]
    for size in dims:
        kind.shape.dim.add().dim_value = size
    return copy


def _findings() -> dict[str, tuple[bytes, dict[str, np.ndarray]]]:
    """Cases the differential fuzzer found where onnxruntime refuses and we gave a result.

    Not here, as they are choices written in docs/security.md: an LRN of even size (the
    ONNX specification defines it, onnxruntime's kernel does not: "size_ % 2 == 1"), and
    a node no output reads, of a type onnxruntime refuses (it type-checks and runs every
    node; a node that no output reads is not traced here).
    """
    from tests.support import fuzz_onnxruntime

    seeds = fuzz_onnxruntime.seeds()
    x, i = np.ones((5, 3), np.float32), np.zeros(2, np.int64)
    gather = onnx.ModelProto.FromString(seeds["gather"])
    resize = onnx.ModelProto.FromString(seeds["resize"])
    scales = np.ones(4, np.float32)
    compress = onnx.ModelProto.FromString(seeds["compress"])
    parts = [f"part{k}" for k in range(17)]
    compress.graph.node.append(onnx.helper.make_node("Split", ["y"], parts, axis=0, num_outputs=17))
    compress.graph.output.extend(
        onnx.helper.make_tensor_value_info(p, TensorProto.FLOAT, ["n", 2]) for p in parts[-1:]
    )
    int4 = onnx.ModelProto.FromString(seeds["int4"])
    int4.graph.node[0].attribute.append(onnx.helper.make_attribute("block_size", -1))
    cnn = onnx.ModelProto.FromString(seeds["cnn"])
    cnn.graph.output[0].type.CopyFrom(
        onnx.helper.make_sequence_type_proto(
            onnx.helper.make_tensor_type_proto(TensorProto.FLOAT, None)
        )
    )
    compress_feeds = {"x": np.ones((4, 2), np.float32), "c": np.array([1, 0, 1], np.bool_)}
    topk_split = onnx.ModelProto.FromString(seeds["topk_split"])
    del topk_split.graph.node[1].input[1:]  # Split(x) -> p, q: no split, no num_outputs
    topk_feeds = {"x": np.ones(4, np.float32), "k": np.array([2]), "sp": np.array([2, 2])}
    einsum = onnx.ModelProto.FromString(seeds["gather"])
    einsum.graph.node[0].CopyFrom(onnx.helper.make_node("Einsum", ["x"], ["y"], equation="...i->i"))
    einsum.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 3
    del einsum.graph.output[0].type.tensor_type.shape.dim[1]
    empty = onnx.ModelProto.FromString(fuzz_models.seeds()["cnn"])
    empty.graph.node[0].attribute.append(
        onnx.helper.make_attribute("dilations", [], attr_type=onnx.AttributeProto.INTS)
    )
    return {
        # "Node () Op (Conv) [ShapeInferenceError] Attribute dilations has incorrect size"
        "Conv dilations = []": (
            empty.SerializeToString(),
            {"x": np.ones((2, 1, 4, 4), np.float32)},
        ),
        # "Inputs have ellipses in them but the provided output subscript does not contain..."
        "Einsum ...i->i": (einsum.SerializeToString(), {"x": x, "i": i}),
        # "Neither 'split' input nor 'num_outputs' attribute has been given"
        "Split without split or num_outputs": (topk_split.SerializeToString(), topk_feeds),
        # "Invalid num_outputs value of 17. Split sizes would produce a negative final split."
        "Split num_outputs past the axis": (compress.SerializeToString(), compress_feeds),
        # "'block_size' must be non-negative."
        "DequantizeLinear block_size < 0": (int4.SerializeToString(), {}),
        # "Type (seq(tensor(float))) of output arg (y) of node () does not match expected type"
        "an output declared a sequence": (
            cnn.SerializeToString(),
            {"x": np.ones((2, 1, 4, 4), np.float32)},
        ),
        # "Got invalid dimensions for input: x ... Got: 6 Expected: 5"
        "a feed of other dims": (seeds["gather"], {"x": np.ones((6, 4), np.float32), "i": i}),
        # "Unexpected input data type. Actual: (tensor(int32)) , expected: (tensor(int64))"
        "a feed of another type": (seeds["gather"], {"x": x, "i": i.astype(np.int32)}),
        # "Invalid tensor data type 0." (at load)
        "an input of elem_type 0": (
            _declared_input(gather, 0, [5, 3]).SerializeToString(),
            {"x": x, "i": i},
        ),
        # "Type 'tensor(float4e2m1)' of input parameter (x) of operator (Resize) ... is invalid"
        "an input declared float4e2m1": (
            _declared_input(resize, TensorProto.FLOAT4E2M1, []).SerializeToString(),
            {"x": np.ones((1, 1, 2, 2), np.float32), "scales": scales},
        ),
    }


@pytest.mark.parametrize("case", sorted(_findings()))
def test_findings_of_the_differential_fuzzer_are_refused(case: str) -> None:
    from tests.support import fuzz_onnxruntime

    blob, feeds = _findings()[case]
    _, refusal = fuzz_onnxruntime.ort_run(blob, feeds)
    assert refusal is not None and not fuzz_onnxruntime._lacks(refusal, None), refusal
    with pytest.raises(fuzz_onnxruntime.DOCUMENTED):
        backend.prepare(blob).run(feeds)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import os; os.kill(os.getpid(), 9)", "crashed (SIGKILL)"),  # as a segfault, no core
        ("import time; time.sleep(60)", "ran past 1 s (a hang)"),
        ("raise SystemExit(1)", "exited 1"),
    ],
)
def test_the_runner_reports_a_crash_a_hang_and_a_failure(
    tmp_path: Path, source: str, expected: str
) -> None:
    record = tmp_path / "running-example.txt"
    code = f"open({str(record)!r}, 'w').write('seed: mlp\\n'); {source}"
    failure = run_child([sys.executable, "-c", code], record, timeout=1 if "sleep" in code else 60)
    assert failure is not None
    assert failure.startswith(expected), failure
    assert "the running example:\nseed: mlp" in failure


def test_an_example_past_its_time_limit_fails_the_run(tmp_path: Path) -> None:
    record = tmp_path / "running-example.txt"
    code = (
        "import sys, time, tests.support.fuzz_models as fuzz\n"
        "def hang(folder, data, **options):\n"
        "    fuzz._note('seed: mlp')\n"
        "    time.sleep(60)\n"
        "fuzz.fuzz_case = hang\n"
        "sys.exit(fuzz.main(sys.argv[1:]))\n"
    )
    limits = ["--examples", "1", "--example-seconds", "1", "--memory-gib", "0"]
    command = [sys.executable, "-c", code, *limits, "--last", str(record)]
    failure = run_child(command, record, timeout=120)
    assert failure is not None
    assert failure.startswith("exited 1; the running example:\nseed: mlp"), failure
    assert "Hang: an example ran longer than 1.0 s" in failure


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> fuzz_models.Folder:
    folder = fuzz_models.Folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    return folder


# What each entry point does with each unmutated seed: the fuzzer starts from models that
# reach the end of every entry point it means to test, not from models refused at once.
SEED_OUTCOMES = {
    "mlp": {
        "backend.prepare": "ok",
        "rep.run": "ok",
        "interop.from_model": "ValueError",  # no training_info
        "training.check": "ok",  # returns the problem
        "training.Session": "TrainingModelError",
        "backend.run_node": "ok",
        "interop.from_node": "UnsupportedOperatorError",  # MatMul is no optimizer
        "cli check": "1",
        "cli train": "1",
    },
    "trainable": {
        "backend.prepare": "ok",
        "rep.run": "ok",
        "interop.from_model": "ok",
        "training.check": "ok",
        "training.Session": "ok",
        "Session.step": "ok",
        "backend.run_node": "ok",
        "interop.from_node": "UnsupportedOperatorError",
        "cli check": "0",
        "cli train": "0",
    },
    "optimizer": {
        "backend.prepare": "ok",
        "rep.run": "ok",
        "interop.from_model": "ok",
        "training.check": "ok",
        "training.Session": "ok",
        "Session.step": "ok",
        "backend.run_node": "ok",
        "interop.from_node": "ok",
        "cli check": "0",
        "cli train": "2",  # a step feeds the gradient 'w.grad', not rows of data
    },
    **{
        name: {
            "backend.prepare": "ok",
            "rep.run": "ok",
            "interop.from_model": "ValueError",  # no training_info
            "training.check": "ok",
            "training.Session": "TrainingModelError",
            "backend.run_node": "ok",
            "interop.from_node": "UnsupportedOperatorError",
            "cli check": "1",
            "cli train": "1",
        }
        for name in ("cnn", "shapes", "indexing")
    },
    "classifier": {
        "backend.prepare": "ok",
        "rep.run": "ok",
        "interop.from_model": "ok",
        "training.check": "ok",
        "training.Session": "ok",
        "Session.step": "ok",
        "backend.run_node": "ok",
        "interop.from_node": "UnsupportedOperatorError",
        "cli check": "0",
        "cli train": "2",  # the data's t holds floats, not class labels
    },
}


@pytest.mark.parametrize("name", sorted(SEED_OUTCOMES))
def test_the_seeds_reach_every_entry_point(folder: fuzz_models.Folder, name: str) -> None:
    blob = fuzz_models.seeds()[name]
    folder.path.write_bytes(blob)
    node = 1 if name == "optimizer" else 0  # the Adagrad node of the optimizer model
    outcomes = fuzz_models.exercise(onnx.ModelProto.FromString(blob), folder, node=node)
    assert outcomes == SEED_OUTCOMES[name]


def test_an_undocumented_exception_propagates(
    folder: fuzz_models.Folder, monkeypatch: pytest.MonkeyPatch
) -> None:
    def check(model: object) -> list[str]:
        raise KeyError("a bug")

    monkeypatch.setattr(training, "check", check)
    folder.path.write_bytes(fuzz_models.seeds()["mlp"])
    with pytest.raises(KeyError, match="a bug"):
        fuzz_models.exercise(str(folder.path), folder, run_cli=False)


def test_a_leaked_canary_is_a_failure(
    folder: fuzz_models.Folder, monkeypatch: pytest.MonkeyPatch
) -> None:
    def check(model: object) -> list[str]:
        raise ValueError((folder.root / "secret.bin").read_bytes().decode())

    monkeypatch.setattr(training, "check", check)
    folder.path.write_bytes(fuzz_models.seeds()["mlp"])
    with pytest.raises(AssertionError, match="leaked the canary"):
        fuzz_models.exercise(str(folder.path), folder, run_cli=False)


def test_the_folder_holds_links_out_of_it(folder: fuzz_models.Folder) -> None:
    secret = (folder.root / "secret.bin").read_bytes()
    assert (folder.model / "wlink.bin").read_bytes() == secret
    assert (folder.model / "link" / "secret.bin").read_bytes() == secret
    assert np.array_equal(np.load(folder.data)["t"], np.ones((4, 2), np.float32))


@pytest.mark.parametrize("mutate", fuzz_mutations.OP, ids=lambda mutate: mutate.__name__)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_each_op_mutation_changes_every_seed_into_a_model_protobuf_writes(
    mutate: Any, data: st.DataObject
) -> None:
    name = data.draw(st.sampled_from(sorted(fuzz_models.seeds())), label="seed")
    seed_bytes = fuzz_models.seeds()[name]
    model = onnx.ModelProto.FromString(seed_bytes)
    text = mutate(model, data, [])
    assert isinstance(text, str) and text
    if (mutate, name) == (fuzz_mutations.int_attribute, "mlp"):  # MatMul, Add, Relu have none
        assert text == "no node with an int attribute"
        return
    assert not text.startswith("no "), text  # every seed has what each mutation changes
    assert model.SerializeToString() != seed_bytes, text
