"""onnxruntime-training's training step on one model: ``Module.train_step`` + ``Optimizer.step``.

Run with the Python of a separate environment that has onnxruntime-training
(see benchmarks/README.md, "onnxruntime-training"): this file imports the
standard library and onnxruntime-training (with the onnx and numpy it
depends on) only, never onnx_optax. ``benchmarks/models.py --ort-training
PYTHON`` starts it in a subprocess and interleaves it with ``Session.step``.

It builds the training artifacts of ``--model`` with
``onnxruntime.training.artifacts.generate_artifacts``: ``requires_grad`` the
initializers named in ``--trainable`` (a file, one name a line), every other
initializer frozen, the loss on ``--output`` (classes on axis 1, mean over the
positions): ``cross_entropy``, SoftmaxCrossEntropyLoss on logits (what
onnxruntime-training's ``CrossEntropyLoss`` writes), or ``log_loss``, Clip(p, 1e-7), Log and
NegativeLogLikelihoodLoss on probabilities; and AdamW (weight decay 0, as
Adam) at ``--lr``. A step is ``module(*inputs, target)`` (forward, loss, gradients),
``optimizer.step()`` and ``module.lazy_reset_grad()``; ``--threads`` is the
sessions' ``intra_op_num_threads``. The feeds are an ``.npz`` holding every
graph input by name and ``target`` (int64, the output without its class axis
1), fed as the input ``labels`` that the script declares.

Output: JSON on stdout. Alone, ``{"setup_s", "first_step_s", "step_s": [...]}``
(``--steps`` steps after the first); with ``--serve``, one line
``{"setup_s", "first_step_s"}`` once set up, then for each line ``N`` read
from stdin one line ``{"step_s": [N times]}``, until end of input. A failure
prints ``{"error": "<stage>: <message>"}`` (the stage: ``artifacts``, ``session``
or ``step``) and exits with status 0, so that the caller can say which
models onnxruntime-training cannot train and why.
::

    /tmp/ortt-venv/bin/python benchmarks/ort_training_step.py --model m.onnx \\
        --trainable names.txt --feeds feeds.npz --output logits --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any


def _error(stage: str, error: BaseException) -> None:
    message = " ".join(str(error).split())[-400:] or type(error).__name__
    print(json.dumps({"error": f"{stage}: {message}"}), flush=True)


def _labels(model: Any, output: str) -> None:
    """Declares the int64 input ``labels``: ``output``'s shape without its class axis 1."""
    import onnx

    (info,) = [o for o in model.graph.output if o.name == output]
    dims = list(info.type.tensor_type.shape.dim)
    shape = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims]
    del shape[1]
    model.graph.input.append(
        onnx.helper.make_tensor_value_info("labels", onnx.TensorProto.INT64, shape)
    )


def _loss(kind: str) -> Any:
    """The mean loss over the positions, classes on axis 1, against the input ``labels``:
    ``cross_entropy`` SoftmaxCrossEntropyLoss of logits (as onnxruntime-training's
    CrossEntropyLoss), ``log_loss`` -log(max(p, 1e-7)) of probabilities (onnx_optax's)."""
    import numpy as np
    import onnx
    from onnxruntime.training import onnxblock

    class Loss(onnxblock.Block):  # type: ignore[misc]
        def build(self, scores: str) -> str:
            graph = self.base.graph
            if kind == "cross_entropy":
                outputs = ["loss", "loss.log_prob"]  # its gradient reads the second
                node = onnx.helper.make_node("SoftmaxCrossEntropyLoss", [scores, "labels"], outputs)
                graph.node.append(node)
                return "loss"
            epsilon = np.array(1e-7, np.float32)
            graph.initializer.append(onnx.numpy_helper.from_array(epsilon, "loss.epsilon"))
            graph.node.extend(
                [
                    onnx.helper.make_node("Clip", [scores, "loss.epsilon"], ["loss.clipped"]),
                    onnx.helper.make_node("Log", ["loss.clipped"], ["loss.log"]),
                    onnx.helper.make_node(
                        "NegativeLogLikelihoodLoss", ["loss.log", "labels"], ["loss"]
                    ),
                ]
            )
            return "loss"

    return Loss()


def _artifacts(args: argparse.Namespace, folder: str) -> None:
    import onnx
    from onnxruntime.training import artifacts

    model = onnx.load(args.model)
    _labels(model, args.output)
    with open(args.trainable) as f:
        trainable = [line.strip() for line in f if line.strip()]
    frozen = [i.name for i in model.graph.initializer if i.name not in set(trainable)]
    loss = _loss(args.loss)
    artifacts.generate_artifacts(
        model,
        requires_grad=trainable,
        frozen_params=frozen,
        loss=loss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=folder,
        loss_input_names=[args.output],
    )


def _session(args: argparse.Namespace, folder: str) -> tuple[Any, Any]:
    import onnxruntime as ort
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    state = CheckpointState.load_checkpoint(os.path.join(folder, "checkpoint"))
    module = Module(os.path.join(folder, "training_model.onnx"), state, None, "cpu", options)
    optimizer = Optimizer(os.path.join(folder, "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(args.lr)
    module.train()
    return module, optimizer


def _inputs(args: argparse.Namespace, module: Any) -> list[Any]:
    import numpy as np

    with np.load(args.feeds) as data:
        feeds = {name: data[name] for name in data.files}
    missing = [n for n in module.input_names() if n not in feeds and n != "labels"]
    if missing:
        raise ValueError(f"the feeds lack {missing}")
    return [feeds["target"] if n == "labels" else feeds[n] for n in module.input_names()]


def _step(module: Any, optimizer: Any, inputs: list[Any]) -> float:
    start = time.perf_counter()
    module(*inputs)
    optimizer.step()
    module.lazy_reset_grad()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--trainable", required=True, help="a file: one initializer a line")
    parser.add_argument("--feeds", required=True, help=".npz of the inputs and 'target'")
    parser.add_argument("--output", required=True, help="the graph output the loss reads")
    parser.add_argument("--loss", choices=["cross_entropy", "log_loss"], default="cross_entropy")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--serve", action="store_true", help="answer step counts from stdin")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ort_training_step_") as folder:
        start = time.perf_counter()
        try:
            _artifacts(args, folder)
        except Exception as error:  # onnxruntime-training's refusal is the result
            return _error("artifacts", error)
        try:
            module, optimizer = _session(args, folder)
            inputs = _inputs(args, module)
        except Exception as error:
            return _error("session", error)
        setup = time.perf_counter() - start
        try:
            first = _step(module, optimizer, inputs)
        except Exception as error:
            return _error("step", error)
        head = {"setup_s": setup, "first_step_s": first}
        if not args.serve:
            steps = [_step(module, optimizer, inputs) for _ in range(args.steps)]
            print(json.dumps({**head, "step_s": steps}), flush=True)
            return None
        print(json.dumps(head), flush=True)
        for line in sys.stdin:
            steps = [_step(module, optimizer, inputs) for _ in range(int(line))]
            print(json.dumps({"step_s": steps}), flush=True)
    return None


if __name__ == "__main__":
    main()
