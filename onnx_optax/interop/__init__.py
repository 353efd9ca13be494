"""Import and export between ONNX optimizer nodes/models and optax transformations.

* :func:`from_node`: an Adagrad/Adam/Momentum ``NodeProto`` as the matching
  transformation (its float32 attribute values kept exactly).
* :func:`from_model`: a ``ModelProto`` whose ``training_info`` algorithm holds one
  optimizer node: the transformation, the parameters and optimizer state stored
  in its initializers, T and R, and the checked ``update_binding``.
* :func:`to_node`, :func:`step_model`, :func:`to_model`: the other way round,
  from a transformation built by onnx_optax.

Tensor names: a parameter pytree of (nested) dicts is named by its keys joined
with ``/``; each X then has inputs ``<name>.grad`` and ``<name>.v``/``<name>.h``
and outputs ``<name>.new``, ``<name>.v.new``, ``<name>.h.new``.

Example:
  >>> import jax.numpy as jnp, onnx_optax
  >>> from onnx_optax import interop
  >>> tx = onnx_optax.adam(0.01, beta=0.99)
  >>> params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
  >>> model = interop.to_model(tx, params, tx.init(params))
  >>> imported = interop.from_model(model)
  >>> imported.node.attributes["beta"] == float(jnp.float32(0.99)), int(imported.T)
  (True, 1)
  >>> sorted(imported.update_binding)
  ['T', 'b', 'b.h', 'b.v', 'w', 'w.h', 'w.v']

Needs the ``onnx`` extra (``pip install "onnx-optax[onnx]"``, from a clone
``pip install ".[onnx]"``).
"""

from __future__ import annotations

from onnx_optax._src.extras import missing_extra

try:
    import onnx  # noqa: F401
except ImportError as _error:
    raise missing_extra("onnx_optax.interop", "onnx", _error) from _error

from onnx_optax._src.graph.load import Limits
from onnx_optax._src.onnx_nodes import DOMAIN, UnsupportedOperatorError
from onnx_optax.interop._from_onnx import ImportedModel, from_model, from_node
from onnx_optax.interop._to_onnx import step_model, to_model, to_node

__all__ = [
    "DOMAIN",
    "ImportedModel",
    "Limits",
    "UnsupportedOperatorError",
    "from_model",
    "from_node",
    "step_model",
    "to_model",
    "to_node",
]
