"""An ONNX backend (``onnx.backend.base`` convention) running models on XLA.

It runs ``ai.onnx.preview.training`` Adagrad, Adam, Momentum and Gradient, the
standard ONNX ops and the ``ai.onnx.ml`` ops of scikit-learn exports (inference)
listed in ``docs/onnx-ops.md`` (``supported_ops()``), with XLA on whatever device
JAX sees. ``prepare`` compiles the nodes the graph's
outputs need into one jitted function (compiled once per input signature);
attributes come from the node, defaults from the ONNX schema of the model's
opset. A needed node of any other op is refused at prepare time with one
``UnsupportedOperatorError`` listing every unsupported op of the model.

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

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from onnx_optax._src.extras import missing_extra

try:
    import onnx
    from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict
except ImportError as _error:
    raise missing_extra("onnx_optax.backend", "onnx", _error) from _error

from onnx_optax._src.graph import (
    GraphFunction,
    graph_function,
    node_graph,
    refuse_undefined_types,
    supported_ops,
)
from onnx_optax._src.graph.load import (
    DEFAULT_LIMITS,
    Limits,
    check_node_text,
    check_node_width,
    load_model,
)
from onnx_optax._src.onnx_nodes import UnsupportedOperatorError, describe, listed

__all__ = [
    "Limits",
    "OnnxOptaxBackend",
    "OnnxOptaxRep",
    "UnsupportedOperatorError",
    "prepare",
    "run_model",
    "run_node",
    "supported_ops",
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


@functools.lru_cache(maxsize=64)
def _node_function(serialized: bytes) -> GraphFunction:
    """One compiled graph per distinct node, so repeated run_node calls reuse it."""
    node = onnx.NodeProto()
    node.ParseFromString(serialized)
    return GraphFunction(node_graph(node))


class OnnxOptaxRep(BackendRep):
    """A prepared model: ``run(inputs)`` with a list in graph-input order or a dict."""

    def __init__(self, model: Any, device: str, limits: Limits = DEFAULT_LIMITS) -> None:
        self.model = model
        if not model.graph.output:  # onnxruntime: "At least one output should be requested"
            raise ValueError(
                f"graph '{model.graph.name}' has no outputs: there is nothing to compute"
            )
        self.device = _jax_device(device)
        opsets = {o.domain: o.version for o in model.opset_import}
        self.graph = GraphFunction(
            model.graph,
            opsets=opsets,
            max_bytes=limits.tensor_bytes,
            max_traced_nodes=limits.traced_nodes,
            max_gradient_depth=limits.gradient_depth,
        )
        refuse_undefined_types(model.graph, self.graph.input_names)
        # one class for every run (making a namedtuple class took a tenth of a small run)
        self._outputs = namedtupledict("Outputs", list(self.graph.output_names))

    @property
    def input_names(self) -> tuple[str, ...]:
        """The graph inputs to feed (initializers excluded), in order."""
        return self.graph.input_names

    def function(self) -> tuple[Any, dict[str, Any]]:
        """The graph as a pure function: ``(apply, params)``, ``apply(params, inputs)`` its
        outputs in order from the inputs fed by name and the float initializers by name
        (jit it, differentiate it with respect to them); ``params`` the model's values."""
        return graph_function(self.graph)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        del kwargs
        outputs = self.graph(inputs, self.device)
        result: tuple[Any, ...] = self._outputs(*outputs)
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

        ``model`` is a ``ModelProto``, its bytes or a path; it is read through
        the one loading layer (external data only from inside the model's folder,
        or ``base_dir=`` for bytes and protos; ``limits=Limits(...)`` to raise
        the size limits). Every node is checked first (supported op, valid
        optimizer node, inputs defined); the returned rep's ``run(inputs)``
        takes the graph inputs that are not initializers, as a list in order or
        a dict, and returns the outputs by name and position. See
        :func:`onnx_optax.interop.step_model` for an example.
        """
        base_dir, limits = kwargs.pop("base_dir", None), kwargs.pop("limits", DEFAULT_LIMITS)
        if not isinstance(model, onnx.ModelProto | bytes | str | os.PathLike):
            raise TypeError(
                f"prepare needs an onnx.ModelProto, got {type(model).__name__} (the model's "
                "bytes or its path work too)"
            )
        model = load_model(model, base_dir=base_dir, limits=limits)
        try:
            onnx.checker.check_model(model)
        except onnx.checker.ValidationError as error:
            raise ValueError(f"the model is not valid ONNX (onnx.checker): {error}") from None
        return OnnxOptaxRep(model, device, limits)

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

        The node runs at the newest opset; a node seen before reuses its compilation. See
        the module docstring for an example.
        """
        del outputs_info, kwargs
        if not isinstance(node, onnx.NodeProto):
            raise TypeError(f"run_node needs an onnx.NodeProto, got {type(node).__name__}")
        check_node_text(node, "run_node: the node")
        check_node_width(node, "run_node: the node")
        names = [name for name in dict.fromkeys(node.input) if name]
        if isinstance(inputs, Mapping):
            missing = [name for name in names if name not in inputs]
            if missing:
                raise ValueError(
                    f"run_node: {describe(node)}: no value given for its input(s) "
                    f"{listed(missing)}; it reads {listed(names)}"
                )
            inputs = [inputs[name] for name in names]
        if len(inputs) != len(names):
            raise ValueError(f"node has {len(names)} inputs, got {len(inputs)} values")
        graph = _node_function(node.SerializeToString(deterministic=True))
        return tuple(graph(list(inputs), _jax_device(device)))


prepare = OnnxOptaxBackend.prepare
run_model = OnnxOptaxBackend.run_model
run_node = OnnxOptaxBackend.run_node
supports_device = OnnxOptaxBackend.supports_device
