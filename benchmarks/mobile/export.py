"""Exports the mobile networks of ``benchmarks/mobile_nets.py`` from PyTorch model code.

MobileNetV2 (inverted residuals, depthwise 3x3, ReLU6) and a MobileNetV3-Small-style
network (squeeze-and-excitation gates, HardSwish, HardSigmoid) are written here from
their papers' block tables, with random weights, in eval mode (the exporter folds each
BatchNormalization into its Conv), and exported by torch's TorchScript exporter with a
dynamic batch axis. The float initializers' data is then dropped (each keeps its name,
type and shape): the committed files are the graphs as the exporter wrote them, and
``mobile_nets.py`` fills in seeded random weights when it loads them.

Needs torch (not a dependency of onnx_optax); run from the repository root::

    python -m venv /tmp/torch-venv && /tmp/torch-venv/bin/pip install torch onnx
    /tmp/torch-venv/bin/python benchmarks/mobile/export.py
"""

from __future__ import annotations

import os

import onnx
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
KEEP_ELEMENTS = 16  # float initializers of at most this many elements keep their data


def _conv(cin: int, cout: int, k: int, stride: int, groups: int, act: type[nn.Module] | None):
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers = [] if expand == 1 else [_conv(cin, hidden, 1, 1, 1, nn.ReLU6)]
        layers += [
            _conv(hidden, hidden, 3, stride, hidden, nn.ReLU6),
            _conv(hidden, cout, 1, 1, 1, None),
        ]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.residual else y


# MobileNetV2's table (Sandler et al. 2018): expansion t, channels c, repeats n, stride s
V2_TABLE = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]


def _width(c: float) -> int:
    return max(8, int(c + 4) // 8 * 8)


class MobileNetV2(nn.Module):
    def __init__(self, width: float = 1.0, classes: int = 1000) -> None:
        super().__init__()
        cin = _width(32 * width)
        layers: list[nn.Module] = [_conv(3, cin, 3, 2, 1, nn.ReLU6)]
        for t, c, n, s in V2_TABLE:
            cout = _width(c * width)
            for i in range(n):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        last = max(1280, _width(1280 * width))
        layers.append(_conv(cin, last, 1, 1, 1, nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(last, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x).mean((2, 3))
        return self.classifier(x)


class SqueezeExcite(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        squeezed = _width(c / 4)
        self.reduce = nn.Conv2d(c, squeezed, 1)
        self.expand = nn.Conv2d(squeezed, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        s = self.expand(torch.relu(self.reduce(s)))
        return x * nn.functional.hardsigmoid(s)


class V3Block(nn.Module):
    def __init__(self, cin: int, k: int, hidden: int, cout: int, se: bool, act, stride: int):
        super().__init__()
        layers: list[nn.Module] = []
        if hidden != cin:
            layers.append(_conv(cin, hidden, 1, 1, 1, act))
        layers.append(_conv(hidden, hidden, k, stride, hidden, act))
        if se:
            layers.append(SqueezeExcite(hidden))
        layers.append(_conv(hidden, cout, 1, 1, 1, None))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.residual else y


# MobileNetV3-Small's table (Howard et al. 2019): kernel, expansion size, out, SE, NL, stride
V3_SMALL = [
    (3, 16, 16, True, "RE", 2),
    (3, 72, 24, False, "RE", 2),
    (3, 88, 24, False, "RE", 1),
    (5, 96, 40, True, "HS", 2),
    (5, 240, 40, True, "HS", 1),
    (5, 240, 40, True, "HS", 1),
    (5, 120, 48, True, "HS", 1),
    (5, 144, 48, True, "HS", 1),
    (5, 288, 96, True, "HS", 2),
    (5, 576, 96, True, "HS", 1),
    (5, 576, 96, True, "HS", 1),
]


class MobileNetV3Small(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv(3, 16, 3, 2, 1, nn.Hardswish)]
        cin = 16
        for k, hidden, cout, se, nl, s in V3_SMALL:
            act = nn.ReLU if nl == "RE" else nn.Hardswish
            layers.append(V3Block(cin, k, hidden, cout, se, act, s))
            cin = cout
        layers.append(_conv(cin, 576, 1, 1, 1, nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


def _skeleton(path: str) -> None:
    """Drops the data of the float initializers of more than KEEP_ELEMENTS elements."""
    model = onnx.load(path)
    for tensor in model.graph.initializer:
        size = 1
        for d in tensor.dims:
            size *= d
        if tensor.data_type == onnx.TensorProto.FLOAT and size > KEEP_ELEMENTS:
            tensor.ClearField("raw_data")
            tensor.ClearField("float_data")
    onnx.save(model, path)


def export(name: str, model: nn.Module, size: int) -> None:
    torch.manual_seed(0)
    model.eval()
    path = os.path.join(HERE, f"{name}.skeleton.onnx")
    torch.onnx.export(
        model,
        (torch.randn(1, 3, size, size),),
        path,
        input_names=["image"],
        output_names=["logits"],
        dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    _skeleton(path)
    print(path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    export("mobilenet_v2_1.0_224", MobileNetV2(1.0), 224)
    export("mobilenet_v2_0.5_128", MobileNetV2(0.5), 128)
    export("mobilenet_v3_small_224", MobileNetV3Small(), 224)
