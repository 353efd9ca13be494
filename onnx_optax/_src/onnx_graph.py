"""Running an ONNX graph of optimizer nodes (and the few plain ops around them) with XLA.

A graph is checked once (every node supported, every optimizer node valid) and
turned into one jitted function, compiled once per input signature. Besides
the three training operators it runs the plain ops a training step needs
around them: Identity, Constant, Add (T + 1), Sub, Mul, Div, Neg and Cast.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src.checks import refuse_truncation
from onnx_optax._src.onnx_nodes import (
    DOMAIN,
    OptimizerNode,
    UnsupportedOperatorError,
    describe,
    read_node,
    to_numpy_dtype,
    unsupported,
)

_STANDARD_DOMAINS = ("", "ai.onnx")
_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Add": jnp.add,
    "Sub": jnp.subtract,
    "Mul": jnp.multiply,
    "Div": jnp.divide,
}
PLAIN_OPS = ("Identity", "Constant", "Neg", "Cast", *_BINARY)


def constant_value(node: Any) -> np.ndarray:
    """The value of a Constant node."""
    from onnx import helper, numpy_helper

    if len(node.attribute) != 1:
        raise ValueError(f"{describe(node)}: a Constant has exactly one value attribute")
    attribute = node.attribute[0]
    value = helper.get_attribute_value(attribute)
    if attribute.name == "value":
        return np.asarray(numpy_helper.to_array(value))
    if attribute.name in ("value_float", "value_floats"):
        return np.asarray(value, np.float32)
    if attribute.name in ("value_int", "value_ints"):
        return np.asarray(value, np.int64)
    raise UnsupportedOperatorError(
        f"{describe(node)}: unsupported Constant attribute '{attribute.name}'"
    )


def _binary_operands(node: Any, a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    if a.dtype != b.dtype:
        raise TypeError(
            f"{describe(node)}: inputs have dtypes {a.dtype} and {b.dtype}; ONNX {node.op_type} "
            "takes two tensors of one type"
        )
    return a, b


class CompiledNode:
    """One checked node and how to run it on arrays."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self.inputs = tuple(node.input)
        self.outputs = tuple(node.output)
        self.optimizer: OptimizerNode | None = None
        if node.domain == DOMAIN:
            self.optimizer = read_node(node)
        elif node.domain not in _STANDARD_DOMAINS or node.op_type not in PLAIN_OPS:
            raise unsupported(
                node, f"runs Adagrad, Adam and Momentum of '{DOMAIN}' and {', '.join(PLAIN_OPS)}"
            )
        elif node.op_type == "Constant":
            self.value = constant_value(node)
        elif node.op_type == "Cast":
            from onnx import helper

            self.cast_to = to_numpy_dtype(helper.get_attribute_value(node.attribute[0]))

    def __call__(self, *args: jax.Array) -> tuple[jax.Array, ...]:
        op = self.node.op_type
        if self.optimizer is not None:
            try:
                return self.optimizer.run(*args)
            except (TypeError, ValueError) as error:
                raise type(error)(f"{describe(self.node)}: {error}") from None
        if op == "Constant":
            return (jnp.asarray(self.value),)
        if op == "Identity":
            return (args[0],)
        if op == "Neg":
            return (jnp.negative(args[0]),)
        if op == "Cast":
            return (args[0].astype(self.cast_to),)
        a, b = _binary_operands(self.node, *args)
        return (_BINARY[op](a, b),)


def check_feed(name: str, value: Any) -> jax.Array:
    """An input as a JAX array, refusing what 32-bit JAX would silently truncate."""
    array = value if isinstance(value, jax.Array) else np.asarray(value)
    refuse_truncation(f"input '{name}'", array)
    return jnp.asarray(array)


def cone(graph: Any, outputs: Sequence[str]) -> list[Any]:
    """The nodes of ``graph`` that ``outputs`` depend on, in graph order."""
    needed = set(outputs)
    picked = []
    for node in reversed(graph.node):
        if needed & set(node.output):
            picked.append(node)
            needed.update(name for name in node.input if name)
    return picked[::-1]


class GraphFunction:
    """An ONNX graph as one jitted function of its (non-initializer) inputs."""

    def __init__(
        self,
        graph: Any,
        *,
        outer_values: Mapping[str, np.ndarray] | None = None,
        outputs: Sequence[str] | None = None,
    ) -> None:
        from onnx import numpy_helper

        self.initializers = {
            init.name: np.asarray(numpy_helper.to_array(init)) for init in graph.initializer
        }
        known = {**(outer_values or {}), **self.initializers}
        self.constants = known
        self.input_names = tuple(i.name for i in graph.input if i.name not in known)
        self.output_names = tuple(outputs or (o.name for o in graph.output))
        declared = {
            o.name: to_numpy_dtype(o.type.tensor_type.elem_type)
            for o in graph.output
            if o.type.HasField("tensor_type") and o.type.tensor_type.elem_type
        }
        self.output_dtypes = tuple(declared.get(name) for name in self.output_names)
        self.nodes = [CompiledNode(node) for node in graph.node]
        available = set(self.input_names) | set(known)
        for compiled in self.nodes:
            for name in compiled.inputs:
                if name and name not in available:
                    raise ValueError(
                        f"{describe(compiled.node)}: input '{name}' is not a graph input, an "
                        "initializer or the output of an earlier node"
                    )
            available.update(compiled.outputs)
        for name in self.output_names:
            if name not in available:
                raise ValueError(f"graph output '{name}' is produced by no node")
        self._jitted = jax.jit(self._evaluate)

    def _evaluate(
        self, feeds: tuple[jax.Array, ...], constants: dict[str, jax.Array]
    ) -> tuple[jax.Array, ...]:
        env: dict[str, jax.Array] = dict(constants)
        env.update(zip(self.input_names, feeds, strict=True))
        for compiled in self.nodes:
            results = compiled(*(env[name] for name in compiled.inputs))
            env.update(zip(compiled.outputs, results, strict=True))
        return tuple(env[name] for name in self.output_names)

    def __call__(self, inputs: Any, device: jax.Device | None = None) -> list[np.ndarray]:
        if isinstance(inputs, Mapping):
            missing = [name for name in self.input_names if name not in inputs]
            if missing:
                raise ValueError(f"missing input(s) {missing}; the graph takes {self.input_names}")
            values = [inputs[name] for name in self.input_names]
        else:
            values = list(inputs) if isinstance(inputs, list | tuple) else [inputs]
            if len(values) != len(self.input_names):
                raise ValueError(
                    f"got {len(values)} input(s); the graph takes {len(self.input_names)}: "
                    f"{self.input_names}"
                )
        feeds = tuple(check_feed(n, v) for n, v in zip(self.input_names, values, strict=True))
        constants = {name: check_feed(name, value) for name, value in self.constants.items()}
        if device is not None:
            feeds, constants = jax.device_put((feeds, constants), device)
        outputs = self._jitted(feeds, constants)
        return [
            np.asarray(out) if dtype is None else np.asarray(out).astype(dtype, copy=False)
            for out, dtype in zip(outputs, self.output_dtypes, strict=True)
        ]
