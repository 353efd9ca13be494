"""An ONNX backend (``onnx.backend.base`` convention) for the training operators.

It runs ``ai.onnx.preview.training`` Adagrad, Adam and Momentum nodes, and
models made of them and of the plain ops a training step needs around them
(Identity, Constant, Add, Sub, Mul, Div, Neg, Cast), with XLA on whatever device
JAX sees. Attributes come from the node, defaults from the ONNX schema; any
other op is refused with an ``UnsupportedOperatorError`` naming it and its
domain. A model is compiled once per input signature.

Example:
  >>> import numpy as np
  >>> from onnx import helper
  >>> from onnx_optax import backend
  >>> node = helper.make_node("Momentum", ["R", "T", "X", "G", "V"], ["X_new", "V_new"],
  ...                         domain="ai.onnx.preview.training", alpha=0.9, beta=1.0,
  ...                         mode="standard", norm_coefficient=0.0)
  >>> x_new, v_new = backend.run_node(
  ...     node, [np.float32(0.5), np.int64(0), np.ones(2, np.float32),
  ...            np.full(2, 2.0, np.float32), np.zeros(2, np.float32)])
  >>> print(x_new, v_new)
  [0. 0.] [2. 2.]

Needs the ``onnx`` extra (``pip install "onnx-optax[onnx]"``, from a clone
``pip install ".[onnx]"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from onnx_optax._src.extras import missing_extra

try:
    import onnx
    from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict
except ImportError as _error:
    raise missing_extra("onnx_optax.backend", "onnx", _error) from _error

from onnx_optax._src.onnx_graph import CompiledNode, GraphFunction, check_feed
from onnx_optax._src.onnx_nodes import UnsupportedOperatorError

__all__ = [
    "OnnxOptaxBackend",
    "OnnxOptaxRep",
    "UnsupportedOperatorError",
    "prepare",
    "run_model",
    "run_node",
    "supports_device",
]


def _jax_device(device: str) -> jax.Device:
    try:
        parsed = Device(device)
    except (AttributeError, ValueError, TypeError):
        raise ValueError(
            f"unknown device {device!r}; ONNX backends name 'CPU' or 'CUDA', optionally ':id'"
        ) from None
    platform = "gpu" if parsed.type == DeviceType.CUDA else "cpu"
    try:
        devices = jax.devices(platform)
    except RuntimeError:
        devices = []
    if not devices:
        raise ValueError(f"device {device!r}: JAX sees no {platform} device")
    if parsed.device_id >= len(devices):
        raise ValueError(f"device {device!r}: JAX sees {len(devices)} {platform} device(s)")
    return devices[parsed.device_id]


class OnnxOptaxRep(BackendRep):
    """A prepared model: ``run(inputs)`` with a list in graph-input order or a dict."""

    def __init__(self, model: Any, device: str) -> None:
        self.model = model
        self.device = _jax_device(device)
        self.graph = GraphFunction(model.graph)

    @property
    def input_names(self) -> tuple[str, ...]:
        """The graph inputs to feed (initializers excluded), in order."""
        return self.graph.input_names

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        del kwargs
        outputs = self.graph(inputs, self.device)
        result: tuple[Any, ...] = namedtupledict("Outputs", list(self.graph.output_names))(*outputs)
        return result


class OnnxOptaxBackend(Backend):
    """onnx_optax as an ONNX backend: ``prepare``, ``run_node``, ``supports_device``."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Whether JAX sees a device of this ONNX kind ("CPU" or "CUDA", with ":id").

        Example:
          >>> from onnx_optax import backend
          >>> backend.supports_device("CPU")
          True
        """
        try:
            _jax_device(device)
        except ValueError:
            return False
        return True

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> OnnxOptaxRep:
        """Checks ``model`` and compiles its graph into one jitted function.

        Every node is checked first (supported op, valid optimizer node, inputs
        defined); the returned rep's ``run(inputs)`` takes the graph inputs that
        are not initializers, as a list in order or a dict, and returns the
        outputs by name and position. See :func:`onnx_optax.interop.step_model`
        for an example.
        """
        del kwargs
        if not isinstance(model, onnx.ModelProto):
            raise TypeError(f"prepare needs an onnx.ModelProto, got {type(model).__name__}")
        onnx.checker.check_model(model)
        return OnnxOptaxRep(model, device)

    @classmethod
    def run_node(
        cls,
        node: Any,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Runs one node on ``inputs`` (a list in the node's input order, or a dict).

        The optimizer ops are jitted, so repeated calls with the same signature
        reuse one compilation. See the module docstring for an example.
        """
        del outputs_info, kwargs
        if not isinstance(node, onnx.NodeProto):
            raise TypeError(f"run_node needs an onnx.NodeProto, got {type(node).__name__}")
        compiled = CompiledNode(node)
        names = list(node.input)
        if isinstance(inputs, dict):
            inputs = [inputs[name] for name in names]
        if len(inputs) != len(names):
            raise ValueError(f"node has {len(names)} inputs, got {len(inputs)} values")
        arrays = jax.device_put(
            [check_feed(n, v) for n, v in zip(names, inputs, strict=True)], _jax_device(device)
        )
        return tuple(np.asarray(out) for out in compiled(*arrays))


prepare = OnnxOptaxBackend.prepare
run_model = OnnxOptaxBackend.run_model
run_node = OnnxOptaxBackend.run_node
supports_device = OnnxOptaxBackend.supports_device
