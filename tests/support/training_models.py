"""Models and batches shared by the training tests.

The 4-8-3 MLP of test_training (``mlp``, ``data``, and the same network by hand), the
16-32-3 MLP of test_session (``session_mlp``, ``trainable``, ``trained``), the float16
MLP of test_master_weights (``half_mlp``), the deep network of test_memory_levers
(``deep``), and the helpers of the tests split out of tests/test_hostile_training.py.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import onnx_optax

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import interop, training  # noqa: E402

F32 = TensorProto.FLOAT
ELEM = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE}


# ----------------------------------------------------------------------------- test_training's MLP


def mlp_params() -> dict[str, np.ndarray]:
    """The weights of ``mlp``: W1[4, 8], b1, W2[8, 3], b2, drawn with seed 0."""
    rng = np.random.default_rng(0)
    return {
        "W1": (rng.normal(size=(4, 8)) / 2).astype(np.float32),
        "b1": np.zeros(8, np.float32),
        "W2": (rng.normal(size=(8, 3)) / 3).astype(np.float32),
        "b2": np.zeros(3, np.float32),
    }


def two_layer_mlp(
    values: dict[str, np.ndarray], name: str = "mlp", softmax: bool = False
) -> onnx.ModelProto:
    """x (N, W1's rows) -> Gemm W1, b1 -> Relu -> Gemm W2, b2 -> logits (N, W2's columns),
    or their softmax ``probs``, at opset 18, the ``values`` its initializers."""
    nodes = [
        helper.make_node("Gemm", ["x", "W1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("Gemm", ["a", "W2", "b2"], ["logits"]),
    ]
    out = "logits"
    if softmax:
        nodes.append(helper.make_node("Softmax", ["logits"], ["probs"], axis=1))
        out = "probs"
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", F32, ["N", values["W1"].shape[0]])],
        [helper.make_tensor_value_info(out, F32, ["N", values["W2"].shape[1]])],
        initializer=[numpy_helper.from_array(v, n) for n, v in values.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def mlp(softmax: bool = False) -> onnx.ModelProto:
    """A 4-8-3 MLP: logits (or probabilities) of x."""
    return two_layer_mlp(mlp_params(), softmax=softmax)


def data(n: int = 16, seed: int = 1) -> dict[str, np.ndarray]:
    """A batch for ``mlp``: x[n, 4] and int64 class labels in [0, 3)."""
    rng = np.random.default_rng(seed)
    return {
        "x": rng.normal(size=(n, 4)).astype(np.float32),
        "target": rng.integers(0, 3, size=n).astype(np.int64),
    }


def mlp_forward(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """``mlp``'s logits written in JAX."""
    h = jax.nn.relu(x @ p["W1"] + p["b1"][None, :])
    return h @ p["W2"] + p["b2"][None, :]


# ----------------------------------------------------------------------------- test_session's MLP


def session_mlp() -> onnx.ModelProto:
    """A 16-32-3 MLP; W1 (2 KiB) and its optimizer state are large enough for external data."""
    rng = np.random.default_rng(0)
    values = {
        "W1": (rng.normal(size=(16, 32)) / 4).astype(np.float32),
        "b1": np.zeros(32, np.float32),
        "W2": (rng.normal(size=(32, 3)) / 6).astype(np.float32),
        "b2": np.zeros(3, np.float32),
    }
    return two_layer_mlp(values)


def trainable() -> onnx.ModelProto:
    """``session_mlp`` attached with the default loss and Adam(0.01)."""
    return training.attach(session_mlp(), optimizer=onnx_optax.adam(0.01))


def session_data(seed: int, n: int = 16) -> dict[str, np.ndarray]:
    """A batch for ``session_mlp``: x[n, 16] and int64 class labels in [0, 3)."""
    rng = np.random.default_rng(seed)
    return {
        "x": rng.normal(size=(n, 16)).astype(np.float32),
        "target": rng.integers(0, 3, size=n).astype(np.int64),
    }


def trained(steps: int) -> training.Session:
    """A Session of ``trainable()`` after ``steps`` steps on ``session_data(0..steps-1)``."""
    session = training.Session(trainable())
    for i in range(steps):
        session.step(session_data(i))
    return session


# ----------------------------------------------------------------------------- other networks


def half_mlp(seed: int = 0, dtype: type = np.float16) -> onnx.ModelProto:
    """x[N, 8] -> MatMul W1[8, 16] + b1 -> Tanh -> MatMul W2[16, 3], all float16 (``dtype``)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    rng = np.random.default_rng(seed)
    weights = {
        "W1": rng.normal(size=(8, 16)) / 3,
        "b1": rng.normal(size=16) / 10,
        "W2": rng.normal(size=(16, 3)) / 4,
    }
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W1"], ["h"]),
            helper.make_node("Add", ["h", "b1"], ["z"]),
            helper.make_node("Tanh", ["z"], ["a"]),
            helper.make_node("MatMul", ["a", "W2"], ["y"]),
        ],
        "half_mlp",
        [helper.make_tensor_value_info("x", elem, ["N", 8])],
        [helper.make_tensor_value_info("y", elem, ["N", 3])],
        initializer=[numpy_helper.from_array(v.astype(dtype), n) for n, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def deep(
    dtype: str = "float32", width: int = 32, depth: int = 3, inputs: int = 16
) -> onnx.ModelProto:
    """x[N, inputs] -> depth x (Gemm, Tanh) -> Gemm to 3 logits."""
    rng = np.random.default_rng(0)
    nodes, values, last, size = [], {}, "x", inputs
    for i in range(depth):
        values[f"W{i}"] = (rng.normal(size=(size, width)) / size**0.5).astype(dtype)
        values[f"b{i}"] = (rng.normal(size=width) / 10).astype(dtype)
        nodes += [
            helper.make_node("Gemm", [last, f"W{i}", f"b{i}"], [f"h{i}"]),
            helper.make_node("Tanh", [f"h{i}"], [f"a{i}"]),
        ]
        last, size = f"a{i}", width
    values["Wout"] = (rng.normal(size=(size, 3)) / size**0.5).astype(dtype)
    nodes.append(helper.make_node("MatMul", [last, "Wout"], ["logits"]))
    graph = helper.make_graph(
        nodes,
        "deep",
        [helper.make_tensor_value_info("x", ELEM[dtype], ["N", inputs])],
        [helper.make_tensor_value_info("logits", ELEM[dtype], ["N", 3])],
        initializer=[numpy_helper.from_array(v, n) for n, v in values.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def deep_batch(
    seed: int, n: int, dtype: str = "float32", inputs: int = 16
) -> dict[str, np.ndarray]:
    """A batch for ``deep``: x[n, inputs] of ``dtype`` and int64 class labels in [0, 3)."""
    rng = np.random.default_rng(seed)
    return {
        "x": rng.normal(size=(n, inputs)).astype(dtype),
        "target": rng.integers(0, 3, size=n).astype(np.int64),
    }


# ----------------------------------------------------------------------------- split from test_hostile_training


def attached_mse() -> onnx.ModelProto:
    """``mlp`` attached with the mse loss on target ``t`` and Adam(0.1)."""
    return training.attach(mlp(), loss="mse", target="t", optimizer=onnx_optax.adam(0.1))


def gradient_node(model: onnx.ModelProto) -> onnx.NodeProto:
    """The one Gradient node of ``model``'s training algorithm."""
    (node,) = [n for n in model.training_info[0].algorithm.node if n.op_type == "Gradient"]
    return node


def set_attribute(node: onnx.NodeProto, attribute: onnx.AttributeProto) -> None:
    """Replaces (or adds) ``attribute`` on ``node``."""
    kept = [a for a in node.attribute if a.name != attribute.name]
    del node.attribute[:]
    node.attribute.extend([*kept, attribute])


def adagrad_model() -> onnx.ModelProto:
    """An Adagrad training model of a 3-element weight, from ``interop.to_model``."""
    tx = onnx_optax.adagrad(0.1)
    params = {"w": np.ones(3, np.float32)}
    return interop.to_model(tx, params, tx.init(params))


def set_initializer(model: onnx.ModelProto, tensor: onnx.TensorProto) -> None:
    """Replaces the initializer of ``tensor``'s name with ``tensor``."""
    (found,) = [i for i in model.graph.initializer if i.name == tensor.name]
    found.CopyFrom(tensor)
