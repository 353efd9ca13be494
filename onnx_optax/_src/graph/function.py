"""The graph as a pure function: ``apply(params, inputs) -> outputs`` and its parameter table.

The seam front ends build on (the ONNX backend's :meth:`OnnxOptaxRep.function`, a JAX
or Flax user's own step): ``apply`` is :meth:`GraphFunction.apply` with the float
initializers as its first argument, pure, jittable and differentiable with respect to
them; ``params`` holds their values in the model, by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp

from onnx_optax._src.graph.interpreter import GraphFunction

Apply = Callable[[Mapping[str, Any], Mapping[str, Any]], tuple[Any, ...]]


def graph_function(graph: GraphFunction) -> tuple[Apply, dict[str, Any]]:
    """``(apply, params)`` of a graph: ``apply(params, inputs)`` its outputs, in order, from
    the graph inputs fed (by name) and the float initializers (by name: those missing
    keep the model's values); ``params`` the model's float initializers.

    Example:
      >>> import jax, numpy as np
      >>> from onnx import TensorProto, helper, numpy_helper
      >>> w = numpy_helper.from_array(np.full((2, 2), 0.5, np.float32), "w")
      >>> node = helper.make_node("MatMul", ["x", "w"], ["y"])
      >>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
      >>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
      >>> g = helper.make_graph([node], "g", [x], [y], initializer=[w])
      >>> apply, params = graph_function(GraphFunction(g))
      >>> jax.jit(apply)(params, {"x": np.ones((1, 2), np.float32)})[0].tolist()
      [[1.0, 1.0]]
    """

    def apply(params: Mapping[str, Any], inputs: Mapping[str, Any]) -> tuple[Any, ...]:
        return graph.apply(inputs, params)

    floats = {
        name: value
        for name, value in graph.params.items()
        if jnp.issubdtype(value.dtype, jnp.inexact)
    }
    return apply, floats
