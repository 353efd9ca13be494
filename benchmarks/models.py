"""Real exported models on CPU: onnx_optax's forward (and training step) against onnxruntime.

The models are the real exports the tests pin (``tests/support/real_models.py``: magika,
PaddleOCR's text-direction classifier, MTCNN's onet and rnet, captcha-whisperer's
CRNN) and, with ``--zoo``, light zoo models shipped inside the onnx wheel
(``onnx/backend/test/data/light``: ShuffleNet and ResNet-50; their weights are
generated, their shapes and ops the zoo's; their batch is fixed at 1), and with
``--mobile`` the mobile networks PyTorch exported (``benchmarks/mobile``:
MobileNetV2 1.0 at 224 px and 0.5 at 128 px, a MobileNetV3-Small-style network;
seeded random weights). Each real
model is fed the tests' deterministic batch, its batch axis resized to ``--batch``.

Forward: ``onnx_optax.backend.prepare(model).run`` (``ours``) and an onnxruntime
``InferenceSession`` with ``intra_op_num_threads=2`` (``ort``) on the same
inputs; ``ours, channels-first`` is onnx_optax without its channels-last pass
(``channels_first``: each conv lowered alone, the lowering before issue 35). Times
are medians over rounds after a warm-up, the implementations in blocks of 5 calls in
a freshly shuffled order each round, each block after a pause (onnxruntime's threads
stop spinning) and 0.1 s of untimed calls (see ``_medians``); ``x ort`` is a time
over onnxruntime's (below 1: faster than onnxruntime). ``first`` is
prepare (session creation) plus the first run: for onnx_optax, the compile.

Training (``--train``): ``training.attach`` with the tests' loss and Adam, then
``Session.step`` on the batch and random targets, blocked on; the first step
(its compile) apart.

onnxruntime-training (``--ort-training PYTHON``: the Python of the separate
environment benchmarks/README.md describes; not a dependency): the same step
against ``benchmarks/ort_training_step.py`` (``Module`` + AdamW ``Optimizer``),
kept running in a subprocess on the same model, batch, trained tensors and loss
(our attached model's graph, lifted constants as initializers; the logits of a
final Softmax with cross-entropy, as attach reads them), blocks of steps
interleaved A B A B in a shuffled order, medians over every step. Its models:
an MLP 784-1024-1024-10 (Gemm, Relu; batch 256) built here, and the real
models. A model onnxruntime-training cannot build artifacts for or step
(no gradient for PRelu, HardSigmoid, GlobalMaxPool) gets its error in the table.
::

    PYTHONPATH=. .venv/bin/python benchmarks/models.py                 # ~3 minutes on 2 cores
    PYTHONPATH=. .venv/bin/python benchmarks/models.py --zoo --train --batch 4
    PYTHONPATH=. .venv/bin/python benchmarks/models.py --ort-training /tmp/ortt-venv/bin/python
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import re
import statistics
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import onnx_optax
from benchmarks.mobile import nets as mobile
from onnx_optax import backend, training
from onnx_optax._src.graph import passes
from onnx_optax._src.write import write_file
from onnx_optax.training._losses import softmax_logits
from tests.support.real_models import MODELS, RealModel, attach_for_fine_tune, load

ZOO = ("light_shufflenet", "light_resnet50", "light_squeezenet")
ORT_TRAINING_STEP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ort_training_step.py")


@contextlib.contextmanager
def channels_first() -> Iterator[None]:
    """Every graph prepared meanwhile runs without the channels-last pass (each conv
    lowered alone, channels-first around it: the lowering before issue 35)."""
    saved = passes.PASSES
    passes.PASSES = tuple(p for p in saved if p.name != "channels_last")
    try:
        yield
    finally:
        passes.PASSES = saved


def _resized(feeds: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
    """The feeds with their batch axis ``batch`` long (rows repeated, or cut)."""
    out = {}
    for name, value in feeds.items():
        rows = np.resize(np.arange(value.shape[0]), batch)
        out[name] = np.ascontiguousarray(value[rows])
    return out


def _zoo(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    folder = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    model = onnx.load(os.path.join(folder, f"{name}.onnx"))
    initializers = {i.name for i in model.graph.initializer}
    (feed,) = [i for i in model.graph.input if i.name not in initializers]
    shape = [d.dim_value for d in feed.type.tensor_type.shape.dim]
    rng = np.random.default_rng(0)
    return model, {feed.name: rng.standard_normal(shape).astype(np.float32)}


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = jax.block_until_ready(fn())
    return result, time.perf_counter() - start


# Before each timed block: a pause (s), then untimed calls for WARM seconds (onnxruntime-
# training's steps, run in its own process: WARM_STEPS of them). See _medians.
PAUSE, WARM, WARM_STEPS = 0.25, 0.1, 3


def _settled(fn: Callable[[], Any], pause: float = PAUSE, warm: float = WARM) -> None:
    """A pause of ``pause`` seconds, then untimed calls of ``fn`` for ``warm`` seconds (at
    least one): what comes before each timed block (see _medians)."""
    time.sleep(pause)
    until = time.perf_counter() + warm
    _timed(fn)
    while time.perf_counter() < until:
        _timed(fn)


def _medians(
    fns: dict[str, Callable[[], Any]],
    rounds: int,
    block: int = 5,
    pause: float = PAUSE,
    warm: float = WARM,
) -> dict[str, float]:
    """Medians of ``rounds`` timed calls of each, in blocks of ``block`` calls, the blocks
    in a freshly shuffled order each time; before each block a ``pause`` of that many
    seconds, then untimed calls for ``warm`` seconds (at least one).

    Each runtime is thus timed in its steady state, alone on the cores. onnxruntime's
    intra-op threads keep spinning for a while after a run returns (its
    ``allow_spinning`` default): an onnx_optax call timed after onnxruntime's shared
    the cores with them (magika at batch 1: 4.0 against 2.2 ms, light_squeezenet 5.1
    against 3.6 ms; an untimed call first was not enough). The pause lets them stop; a
    pause alone left XLA's threads asleep and its first calls after it slow (magika 4.2
    ms), so calls follow it until ``warm`` has passed. onnxruntime's own times are as
    they were (within 2%).
    """
    for fn in fns.values():
        _timed(fn)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(-(-rounds // block)):
        for name in random.sample(list(fns), len(fns)):
            _settled(fns[name], pause, warm)
            times[name] += [_timed(fns[name])[1] for _ in range(block)]
    return {name: statistics.median(t) for name, t in times.items()}


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def forward(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rounds: int) -> dict[str, float]:
    """Medians of the forward (seconds), and the first calls'."""
    reps: dict[str, Any] = {}
    first: dict[str, float] = {}
    start = time.perf_counter()
    session = _session(model)
    want = session.run(None, feeds)
    first["ort"] = time.perf_counter() - start
    for name, context in (("ours", contextlib.nullcontext), ("channels-first", channels_first)):
        with context():
            start = time.perf_counter()
            reps[name] = backend.prepare(model)
            outs = jax.block_until_ready(reps[name].run(feeds))
            first[name] = time.perf_counter() - start
        for ours, theirs in zip(outs, want, strict=True):
            np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-3, atol=1e-4)
    medians = _medians(
        {
            "ort": lambda: session.run(None, feeds),
            "ours": lambda: reps["ours"].run(feeds),
            "channels-first": lambda: reps["channels-first"].run(feeds),
        },
        rounds,
    )
    return {**medians, **{f"first {k}": v for k, v in first.items()}}


def train(real: RealModel, feeds: dict[str, np.ndarray], rounds: int) -> dict[str, float]:
    """Medians of one Adam step (seconds), with and without the channels-last pass."""
    tune = real.fine_tune
    attached = attach_for_fine_tune(real)
    target = attached.training_info[0].algorithm.input[0].name
    # the targets' shape for the tests' batch, its batch axis resized (CRNN's is time-major)
    batch, test_batch = next(iter(feeds.values())).shape[0], real.feeds[0].shape[0]
    shape = tuple(batch if d == test_batch else d for d in tune.target_shape)
    feeds = {**feeds, target: np.random.default_rng(1).integers(0, tune.classes, shape)}
    sessions: dict[str, Any] = {}
    first: dict[str, float] = {}
    for name, context in (("ours", contextlib.nullcontext), ("channels-first", channels_first)):
        with context():
            sessions[name] = training.Session(attached)
            _, first[name] = _timed(lambda name=name: sessions[name].step(feeds))
    medians = _medians({k: lambda k=k: sessions[k].step(feeds) for k in sessions}, rounds)
    return {**medians, **{f"first {k}": v for k, v in first.items()}}


def mlp(batch: int = 256) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """An MLP 784-1024-1024-10 (Gemm, Relu; He-initialized) and a batch of ``batch`` rows."""
    rng = np.random.default_rng(0)
    sizes = [784, 1024, 1024, 10]
    nodes, inits, x = [], [], "x"
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        w = rng.standard_normal((fan_in, fan_out)) * np.sqrt(2 / fan_in)
        inits += [
            numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
            numpy_helper.from_array(np.zeros(fan_out, np.float32), f"b{i}"),
        ]
        y = "logits" if i == len(sizes) - 2 else f"h{i}"
        nodes.append(
            helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [y if y == "logits" else f"z{i}"])
        )
        if y != "logits":
            nodes.append(helper.make_node("Relu", [f"z{i}"], [y]))
        x = y
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 784])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((batch, 784)).astype(np.float32)}


def _for_ort_training(
    attached: onnx.ModelProto, output: str, loss: str, class_axis: int | None
) -> tuple[onnx.ModelProto, list[str], str, str]:
    """The model, trained tensors, output and loss that ort_training_step.py gets.

    The attached model's graph (its lifted constants are initializers), without
    training_info and the optimizer's state; its one output the scores the loss
    reads, with the classes on axis 1: the logits of a final Softmax with
    cross-entropy, as ``attach`` reads them; a Transpose if the class axis is
    another (the labels are then our targets as they are).
    """
    model = onnx.ModelProto()
    model.CopyFrom(attached)
    model.ir_version = min(model.ir_version, 9)  # onnx 1.17, which onnxruntime-training needs
    del model.training_info[:]
    graph = model.graph
    read = {name for node in graph.node for name in node.input}
    bound = {b.key for b in attached.training_info[0].update_binding}
    trained = [i.name for i in graph.initializer if i.name in bound and i.name in read]
    kept = [i for i in graph.initializer if i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    (info,) = [o for o in graph.output if o.name == output]
    dims = list(info.type.tensor_type.shape.dim)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    logits = softmax_logits(graph, output, len(dims), class_axis, opset)
    scores, ort_loss = (logits, "cross_entropy") if logits else (output, loss)
    if ort_loss == "softmax_cross_entropy":
        ort_loss = "cross_entropy"
    axis = 1 if class_axis is None else class_axis % len(dims)
    if axis != 1:
        perm = [0, axis, *(i for i in range(1, len(dims)) if i != axis)]
        graph.node.append(helper.make_node("Transpose", [scores], ["ort.scores"], perm=perm))
        scores, dims = "ort.scores", [dims[i] for i in perm]
    shape = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims]
    del graph.output[:]
    graph.output.append(
        helper.make_tensor_value_info(scores, info.type.tensor_type.elem_type, shape)
    )
    return model, trained, scores, ort_loss


def _npz(arrays: dict[str, np.ndarray]) -> Callable[[Any], None]:
    """Writes ``arrays`` as an .npz (a zip of .npy members) into the file it is given."""

    def write(file: Any) -> None:
        with zipfile.ZipFile(file, mode="w") as archive:
            for name, value in arrays.items():
                with archive.open(name + ".npy", mode="w") as member:
                    np.lib.format.write_array(member, np.asarray(value))

    return write


class OrtTraining:
    """ort_training_step.py running in ``python`` (--serve): ``steps(n)`` times n steps."""

    def __init__(
        self,
        python: str,
        folder: str,
        model: onnx.ModelProto,
        trained: list[str],
        feeds: dict[str, np.ndarray],
        output: str,
        loss: str,
        learning_rate: float,
    ) -> None:
        # Through the package's one writer, as every file the project writes.
        write_file(os.path.join(folder, "model.onnx"), model.SerializeToString())
        write_file(os.path.join(folder, "trainable.txt"), "\n".join(trained).encode())
        write_file(os.path.join(folder, "feeds.npz"), _npz(feeds))
        command = [python, ORT_TRAINING_STEP, "--serve", "--output", output, "--loss", loss]
        command += ["--lr", str(learning_rate), "--model", os.path.join(folder, "model.onnx")]
        command += ["--trainable", os.path.join(folder, "trainable.txt")]
        command += ["--feeds", os.path.join(folder, "feeds.npz")]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self._log = tempfile.TemporaryFile("w+")  # noqa: SIM115  (its stderr, for errors)
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
        )
        self.head: dict[str, Any] = json.loads(self._read())

    def _read(self) -> str:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            return json.dumps({"error": f"exited with status {self._process.wait()}"})
        return line

    def steps(self, n: int) -> list[float]:
        assert self._process.stdin is not None
        self._process.stdin.write(f"{n}\n")
        self._process.stdin.flush()
        answer = json.loads(self._read())
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return list(answer["step_s"])

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait()
        self._log.close()


def versus_ort_training(
    python: str,
    attached: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    targets: np.ndarray,
    output: str,
    loss: str,
    class_axis: int | None,
    learning_rate: float,
    rounds: int,
    block: int = 5,
) -> dict[str, Any]:
    """Our ``Session.step`` against onnxruntime-training's, blocks of ``block`` steps
    interleaved in a shuffled order, ``rounds`` steps each: medians (s), or its error."""
    model, trained, scores, ort_loss = _for_ort_training(attached, output, loss, class_axis)
    target = attached.training_info[0].algorithm.input[0].name
    ours_feeds = {**feeds, target: targets}
    session = training.Session(attached)
    _, first = _timed(lambda: session.step(ours_feeds))
    result: dict[str, Any] = {"first ours": first, "trained": len(trained)}
    with tempfile.TemporaryDirectory(prefix="models_ort_training_") as folder:
        ort_feeds = {**feeds, "target": targets.astype(np.int64)}
        theirs = OrtTraining(
            python, folder, model, trained, ort_feeds, scores, ort_loss, learning_rate
        )
        try:
            if "error" in theirs.head:
                return {**result, "error": theirs.head["error"]}
            result["first ort"] = theirs.head["setup_s"] + theirs.head["first_step_s"]

            # Each block after a pause and untimed steps, as in _medians: the other
            # runtime's threads may still spin.
            def ours() -> list[float]:
                _settled(lambda: session.step(ours_feeds))
                return [_timed(lambda: session.step(ours_feeds))[1] for _ in range(block)]

            def ort() -> list[float]:
                time.sleep(PAUSE)
                return theirs.steps(block + WARM_STEPS)[WARM_STEPS:]

            steps: dict[str, Callable[[], list[float]]] = {"ours": ours, "ort": ort}
            times: dict[str, list[float]] = {"ours": [], "ort": []}
            for fn in steps.values():  # warm-up
                fn()
            for _ in range(max(1, rounds // block)):
                for name in random.sample(list(steps), 2):
                    times[name] += steps[name]()
        except RuntimeError as error:
            return {**result, "error": f"step: {error}"}
        finally:
            theirs.close()
    return {**result, **{k: statistics.median(v) for k, v in times.items()}}


def _reason(error: str) -> str:
    """onnxruntime-training's error, short: the op it has no gradient for, else its end."""
    found = re.search(r"has not been registered: (\S+) for node", error)
    return f"no gradient for {found.group(1)}" if found else error[-160:]


def ort_training_rows(python: str, names: list[str], batch: int, rounds: int) -> None:
    """The table of ``Session.step`` against onnxruntime-training's step."""
    print(
        f"\nTraining step (Adam; onnxruntime-training: AdamW, weight decay 0), ms (median of "
        f"{max(1, rounds // 5) * 5} steps, blocks of 5 after a pause and untimed steps, "
        "interleaved), "
        "first step in s\n"
    )
    print(
        "| model | batch | trained | ort-training | ours | x ort-training "
        "| first: ort-training | ours |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    cases = ["mlp", *names]
    for name in cases:
        if name == "mlp":
            model, feeds = mlp()
            attached = training.attach(
                model,
                loss="softmax_cross_entropy",
                output="logits",
                optimizer=onnx_optax.adam(1e-3),
            )
            n = next(iter(feeds.values())).shape[0]
            targets = np.random.default_rng(1).integers(0, 10, (n,))
            spec = ("logits", "softmax_cross_entropy", None, 1e-3)
            label = "MLP 784-1024-1024-10"
        else:
            real = next(m for m in MODELS if m.name == name)
            tune = real.fine_tune
            attached = attach_for_fine_tune(real)
            feeds = _resized(real.make_feeds(), batch)
            n, test_batch = next(iter(feeds.values())).shape[0], real.feeds[0].shape[0]
            shape = tuple(n if d == test_batch else d for d in tune.target_shape)
            targets = np.random.default_rng(1).integers(0, tune.classes, shape)
            spec = (tune.output, tune.loss, tune.class_axis, tune.learning_rate)
            label = name
        t = versus_ort_training(python, attached, feeds, targets, *spec, rounds)
        row = [label, str(n), str(t["trained"])]
        if "error" in t:
            row += [
                f"cannot train it ({_reason(t['error'])})",
                "",
                "",
                "",
                f"{t['first ours']:.2f}",
            ]
        else:
            row += [
                f"{t['ort'] * 1e3:.2f}",
                f"{t['ours'] * 1e3:.2f}",
                f"{t['ours'] / t['ort']:.2f}",
            ]
            row += [f"{t['first ort']:.2f}", f"{t['first ours']:.2f}"]
        print("| " + " | ".join(row) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--zoo", action="store_true", help="the light zoo models too")
    parser.add_argument("--train", action="store_true", help="time a training step too")
    parser.add_argument(
        "--mobile", action="store_true", help="the mobile networks of benchmarks/mobile too"
    )
    parser.add_argument("--only", help="comma-separated model names")
    parser.add_argument(
        "--ort-training",
        metavar="PYTHON",
        help="a Python with onnxruntime-training: time Session.step against its step only",
    )
    args = parser.parse_args()
    names = [m.name for m in MODELS] + (list(ZOO) if args.zoo else [])
    names += list(mobile.NETS) if args.mobile else []
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    if args.ort_training:
        reals = [n for n in names if any(m.name == n for m in MODELS)]
        return ort_training_rows(args.ort_training, reals, args.batch, args.rounds)
    print(
        f"onnx_optax on jax {jax.__version__} ({jax.devices()[0].device_kind}) against "
        f"onnxruntime {ort.__version__} (2 threads), ms (median of "
        f"{args.rounds}), first call in s\n"
    )
    columns = ["model", "batch", "ort", "ours", "x ort", "ours, channels-first", "x ort"]
    print("| " + " | ".join([*columns, "first: ort", "ours", "channels-first"]) + " |")
    print("|---|" + "--:|" * (len(columns) + 2))
    steps = []
    for name in names:
        real = next((m for m in MODELS if m.name == name), None)
        if real is not None:
            model, feeds = load(real), _resized(real.make_feeds(), args.batch)
        elif name in mobile.NETS:
            model = mobile.load(name)
            feeds = mobile.image(model, args.batch)
        else:
            model, feeds = _zoo(name)
        t = forward(model, feeds, args.rounds)
        row = [name, str(next(iter(feeds.values())).shape[0])]
        row += [f"{t[k] * 1e3:.2f}" for k in ("ort", "ours")] + [f"{t['ours'] / t['ort']:.2f}"]
        row += [f"{t['channels-first'] * 1e3:.2f}", f"{t['channels-first'] / t['ort']:.2f}"]
        row += [f"{t[f'first {k}']:.2f}" for k in ("ort", "ours", "channels-first")]
        print("| " + " | ".join(row) + " |", flush=True)
        if args.train and real is not None:
            steps.append((name, train(real, feeds, args.rounds)))
    if steps:
        print("\nTraining step (Adam), ms (median), first step in s\n")
        print(
            "| model | ours | ours, channels-first | channels-first / ours | first step "
            "| channels-first |"
        )
        print("|---|--:|--:|--:|--:|--:|")
        for name, t in steps:
            print(
                f"| {name} | {t['ours'] * 1e3:.2f} | {t['channels-first'] * 1e3:.2f} | "
                f"{t['channels-first'] / t['ours']:.2f} | {t['first ours']:.2f} | "
                f"{t['first channels-first']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    onnx_optax.reuse_host_memory()  # as the onnx-optax command does (docs/performance.md)
    main()
