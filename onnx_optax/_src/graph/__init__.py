"""The graph core: load (one checked way in) -> passes -> lowering -> run.

- :mod:`.load`: every model a user hands over comes through ``load_model``, checked;
- :mod:`.passes`: pruning and ordering (:mod:`.passes.prune`), then the passes, each a
  small model-agnostic rewrite (constants, gradient fusion, batched products, one-hot
  products, weight transposes);
- :mod:`.steps`: lowering, each node as the op registry's function (Gradient by
  ``jax.vjp``), with :mod:`.replay` and :mod:`.remat` (checkpointed segments);
- :mod:`.interpreter`: :class:`GraphFunction`, the graph as one function of its inputs
  and initializers, which runs the passes and lowers;
- :mod:`.run`, :mod:`.feeds`, :mod:`.jit`, :mod:`.packing`: feeds checked, placement on
  a device, one compilation per signature, many small values as a few buffers;
- :mod:`.function`: the pure-function seam, ``apply(params, inputs)`` and ``params``.
"""

from onnx_optax._src.graph.errors import node_errors, unsupported_error
from onnx_optax._src.graph.feeds import as_array, refuse_undefined_types, to_jax
from onnx_optax._src.graph.function import graph_function
from onnx_optax._src.graph.interpreter import GraphFunction
from onnx_optax._src.graph.jit import flattened, jit_graph, paused_gc
from onnx_optax._src.graph.passes import PASS_NAMES
from onnx_optax._src.graph.support import GRADIENT, latest_opset, node_graph, supported_ops

__all__ = [
    "GRADIENT",
    "PASS_NAMES",
    "GraphFunction",
    "as_array",
    "flattened",
    "graph_function",
    "jit_graph",
    "latest_opset",
    "node_errors",
    "node_graph",
    "paused_gc",
    "refuse_undefined_types",
    "supported_ops",
    "to_jax",
    "unsupported_error",
]
