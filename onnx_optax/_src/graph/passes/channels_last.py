"""Channels-last regions: the convolutions of a network, and the ops between them, run
on values held (N, D1, ..., C), with no transpose around each conv.

An exporter writes a CNN channels-first (N, C, H, W). XLA:CPU's fast convolutions and
products read channels innermost, so each conv lowered alone transposes its input in
and its output back: on MobileNetV2 most of the forward. This pass keeps such values
channels-last from one conv to the next. A Conv it lowers (see
:func:`~onnx_optax._src.ops.nhwc_convolution.lowers_channels_last`) stores its output as a
:class:`~onnx_optax._src.graph.packing.ChannelsLast` value; the ops after it that run
the same on channels-last values (elementwise ops and activations, BatchNormalization,
global pools, Concat, a residual Add, a squeeze-and-excitation gate's Mul) read it as
it lies and store theirs so too; any other op reads the value as it stands for (one
transpose, where the region ends, which XLA shares between its readers). A Transpose
from channels-last to channels-first (tf2onnx's, before every Conv) starts a region
without moving anything.

A MaxPool holds its output channels-last as a running maximum over its windows' slices
(``pools.max_pool_channels_last``); AveragePool reads its input channels-first. Computed
channels-last by a ``reduce_window`` over (N, H, W, C), light_vgg19's logits came out NaN
in 2 runs of 8, XLA:CPU reading garbage, with a barrier before the pool and with
YNNPACK's reduce fusions off alike; channels-first, never in 32.

The decision is taken per value while the graph is traced, from the values' kinds and
shapes: nothing is guessed from declared shapes, and a graph with no conv is untouched.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src.graph.packing import ChannelsLast, materialize
from onnx_optax._src.graph.passes.base import Pass, PassGraph
from onnx_optax._src.graph.steps import Env, StandardStep
from onnx_optax._src.ops import domain_of, is_static
from onnx_optax._src.ops.nhwc_convolution import convolve_channels_last, lowers_channels_last
from onnx_optax._src.ops.pools import max_pool_channels_last
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import is_sequence_or_optional

# Ops computing each element from the elements at the same place of their inputs (by
# numpy broadcasting) and their attributes alone: the same on channels-last values.
# Those of several inputs from the opset where they broadcast numpy's way.
UNARY = frozenset(
    [
        "Abs",
        "Cast",
        "Ceil",
        "Celu",
        "Clip",
        "Cos",
        "Elu",
        "Erf",
        "Exp",
        "Floor",
        "Gelu",
        "HardSigmoid",
        "HardSwish",
        "Identity",
        "IsInf",
        "IsNaN",
        "LeakyRelu",
        "Log",
        "Mish",
        "Neg",
        "Not",
        "Reciprocal",
        "Relu",
        "Round",
        "Selu",
        "Shrink",
        "Sigmoid",
        "Sign",
        "Sin",
        "Softplus",
        "Softsign",
        "Sqrt",
        "Tanh",
        "ThresholdedRelu",
    ]
)
BROADCASTING = {
    **dict.fromkeys(
        [
            "Add",
            "Sub",
            "Mul",
            "Div",
            "Pow",
            "PRelu",
            "Equal",
            "Greater",
            "Less",
            "And",
            "Or",
            "Xor",
        ],
        7,
    ),
    **dict.fromkeys(["Max", "Min", "Sum", "Mean"], 8),
    **dict.fromkeys(["GreaterOrEqual", "LessOrEqual", "Mod", "Where"], 9),
}


def _held(value: Any) -> bool:
    """Whether a value is held channels-last, its channels one axis."""
    return isinstance(value, ChannelsLast) and value.channels == 1


def channels_last_array(value: Any, rank: int) -> Any:
    """A channels-first value of at most ``rank`` axes, which broadcasts against a value
    (N, C, ...) of that rank, as it broadcasts against that value held channels-last:
    ranked up with leading 1s, its axis 1 moved last (host values stay on the host)."""
    if _held(value):
        return value.array
    if np.ndim(value) == 0:
        return value
    shape = (1,) * (rank - np.ndim(value)) + tuple(np.shape(value))
    order = (0, *range(2, rank), 1)
    if is_static(value):
        return np.transpose(np.reshape(value, shape), order)
    return jnp.transpose(jnp.reshape(value, shape), order)


class ChannelsLastStep(StandardStep):
    """A node the pass may run channels-last: where an input is held so (and the rest
    fit), it runs on the channels-last values and stores its outputs so; else as the
    op's own step. ``compute`` computes the outputs from the channels-last inputs (and
    may check the node); ``own_compute`` False: the op itself does (an elementwise op)."""

    own_compute = False
    folds_as_op = True

    def compute(self, node: Node, args: list[Any]) -> Any:
        raise NotImplementedError

    def _run(self, env: Env) -> None:
        args = self._channels_last_args([env[n] if n else None for n in self.inputs])
        if args is None:
            super()._run(env)
            return
        compute: Callable[[list[Any]], Any] | None = None
        if self.own_compute:
            compute = functools.partial(self.compute, self.info)
        for name, value in zip(self.outputs, self._results(env, args, compute), strict=False):
            if name:
                env[name] = value if value is None or is_static(value) else ChannelsLast(value)

    def _channels_last_args(self, values: list[Any]) -> list[Any] | None:
        """The inputs as channels-last arrays, if one is held so and every other is an
        array of at most its rank; else None."""
        rank = next((v.array.ndim for v in values if _held(v)), None)
        if rank is None:
            return None
        args = []
        for value in values:
            value = value if value is None or _held(value) else materialize(value)
            if value is not None and (is_sequence_or_optional(value) or np.ndim(value) > rank):
                return None
            args.append(None if value is None else channels_last_array(value, rank))
        return args


def _as_channels_first(array: Any) -> jax.ShapeDtypeStruct:
    """The shape and dtype of the value a channels-last array stands for."""
    n, *spatial, c = array.shape
    return jax.ShapeDtypeStruct((n, c, *spatial), array.dtype)


def _checked(node: Node, op: Any, args: list[Any]) -> None:
    """The op's own checks (traced abstractly), on the channels-first shapes of its
    inputs held channels-last (those of the first's rank; channel vectors as they are)."""
    rank = np.ndim(args[0])
    given = [_as_channels_first(a) if np.ndim(a) == rank else a for a in args]
    jax.eval_shape(lambda *xs: op.fn(node, *xs), *given)


# A conv of X channels-first with fewer channels is computed channels-first, its output
# then moved channels-last: a network's first conv, on an image of 3 channels, took 0.77
# ms channels-last against 0.39 channels-first (light_shufflenet's [1, 3, 224, 224] by
# [24, 3, 3, 3], stride 2: each tap's slice is 3 values a position); XLA's own conv
# channels-last 2.7 ms. Left channels-first, MobileNetV2's first depthwise conv (the
# largest) ran channels-first too, its step at batch 8 1.2-1.4x the time.
FEW_CHANNELS = 16


class ConvStep(ChannelsLastStep):
    """A Conv with a channels-last lowering (``lowers_channels_last``): its output is
    held channels-last (a channels-first X is transposed once, by XLA, fused with what
    computes it), but a depthwise conv continues a region and starts none, and a conv
    of fewer than FEW_CHANNELS channels is computed channels-first.

    In ShuffleNet each depthwise conv sits between grouped 1x1 convs, which stay
    channels-first (``lowers_channels_last``): started there, a region was two
    transposes around each depthwise conv (light_shufflenet 1.9x the time)."""

    def _channels_last_args(self, values: list[Any]) -> list[Any] | None:
        if len(values) < 2 or values[0] is None or values[1] is None:
            return None
        x, w, *rest = (v if _held(v) else materialize(v) for v in values)
        if not _held(x) and (is_static(x) or np.ndim(x) < 3):
            return None
        shape = x.shape if _held(x) else np.shape(x)
        dtype = x.array.dtype if _held(x) else x.dtype
        group = int(self.info.get("group", 1))
        if _held(w) or not lowers_channels_last(jax.ShapeDtypeStruct(shape, dtype), w, group):
            return None
        if not _held(x) and group > 1:
            return None  # a depthwise conv starts no region
        self.channels_first = not _held(x) and shape[1] < FEW_CHANNELS
        if self.channels_first:
            return [x, w, *rest]
        return [x.array if _held(x) else jnp.moveaxis(x, 1, -1), w, *rest]

    own_compute = True
    channels_first = False  # this trace's: X of few channels, channels-first

    def compute(self, node: Node, args: list[Any]) -> Any:
        if self.channels_first:  # the op's own lowering, its output moved
            return jnp.moveaxis(self.op.fn(node, *args), 1, -1)
        return convolve_channels_last(node, *args)


class PerChannelStep(ChannelsLastStep):
    """An op of X (N, C, ...) held channels-last and of channel vectors (C,):
    BatchNormalization (inference: one output), the global pools."""

    def _channels_last_args(self, values: list[Any]) -> list[Any] | None:
        if not values or not _held(values[0]) or len(self.outputs) != 1:
            return None
        rest = [None if v is None else materialize(v) for v in values[1:]]
        if any(v is not None and (_held(v) or np.ndim(v) != 1) for v in rest):
            return None
        return [values[0].array, *rest]

    own_compute = True

    def compute(self, node: Node, args: list[Any]) -> Any:
        _checked(node, self.op, args)
        x, *rest = args
        if self.node.op_type.startswith("Global"):
            return global_pool(x, self.node.op_type == "GlobalMaxPool")
        return batch_norm_channels_last(node, x, *rest)


def global_pool(x: Any, maximum: bool) -> Any:
    """The mean (or max) of X (N, ..., C) over its positions, (N, 1, ..., 1, C).

    The mean as a product by 1/positions: XLA:CPU fused a sum with the product and
    activation computing X into one YNNPACK kernel that reduced over the positions 30x
    slower than the product (light_squeezenet's last 1x1 conv, ReLU and mean: 3.9 of its
    12 ms; a barrier before the sum did not stop it)."""
    rows = x.reshape((x.shape[0], -1, x.shape[-1]))
    if maximum:
        pooled = jnp.max(rows, axis=1)
    else:
        weights = np.full((rows.shape[1],), 1 / rows.shape[1], x.dtype)
        pooled = jax.lax.dot_general(rows, weights, (((1,), (0,)), ((), ())))
    return pooled.reshape((x.shape[0], *(1,) * (x.ndim - 2), x.shape[-1]))


def batch_norm_channels_last(node: Node, x: Any, scale: Any, bias: Any, mean: Any, var: Any) -> Any:
    """BatchNormalization in inference (its registry formula, channels on the last axis)."""
    inv = jax.lax.rsqrt(var + np.asarray(node["epsilon"], var.dtype))
    return (x - mean.astype(x.dtype)) * (inv * scale).astype(x.dtype) + bias.astype(x.dtype)


class MaxPoolStep(ChannelsLastStep):
    """MaxPool of one output on float X held channels-last (``max_pool_channels_last``;
    where it has more to do, the op on X channels-first, its output moved back)."""

    own_compute = True

    def _channels_last_args(self, values: list[Any]) -> list[Any] | None:
        if len(values) != 1 or not _held(values[0]) or len(self.outputs) != 1:
            return None
        if not jnp.issubdtype(values[0].array.dtype, jnp.floating):
            return None
        return [values[0].array]

    def compute(self, node: Node, args: list[Any]) -> Any:
        y = max_pool_channels_last(node, args[0])
        if y is None:
            y = jnp.moveaxis(self.op.fn(node, jnp.moveaxis(args[0], -1, 1)), 1, -1)
        return y


class ConcatStep(ChannelsLastStep):
    """Concat of values of one rank, one of them held channels-last: the others
    transposed, the axis moved with the channels."""

    def _channels_last_args(self, values: list[Any]) -> list[Any] | None:
        args = super()._channels_last_args(values)
        if args is None or any(a is None or np.ndim(a) != np.ndim(args[0]) for a in args):
            return None
        return args

    own_compute = True

    def compute(self, node: Node, args: list[Any]) -> Any:
        _checked(node, self.op, args)
        rank = args[0].ndim
        axis = int(node["axis"]) % rank
        return jnp.concatenate(args, axis=0 if axis == 0 else rank - 1 if axis == 1 else axis - 1)


class TransposeStep(StandardStep):
    """A Transpose that moves channels alone: from (N, ..., C) to (N, C, ...) it stores
    its input held channels-last (nothing moves); from a value held so back, that
    value's array; one permuting a held value's channel axes alone (a channel
    shuffle's), the value held with its channels permuted."""

    folds_as_op = True

    def _run(self, env: Env) -> None:
        value = env[self.inputs[0]] if self.inputs else None
        array = value.array if isinstance(value, ChannelsLast) else materialize(value)
        rank = np.ndim(array)
        perm = tuple(self.info.get("perm") or ())
        if rank >= 3 and not is_static(array) and not is_sequence_or_optional(array):
            found = None
            if isinstance(value, ChannelsLast):
                found = _transposed(value, perm)
            elif perm == (0, rank - 1, *range(1, rank - 1)):
                found = ChannelsLast(array)
            if found is not None:
                env[self.outputs[0]] = found
                return
        super()._run(env)


def _transposed(value: ChannelsLast, perm: tuple[int, ...]) -> Any:
    """A held value transposed by ``perm`` where that moves only its channels, else None."""
    rank, k = value.array.ndim, value.channels
    if sorted(perm) != list(range(rank)):
        return None  # the op refuses it
    if k == 1 and perm == (0, *range(2, rank), 1):
        return value.array
    if perm[0] != 0 or perm[k + 1 :] != tuple(range(k + 1, rank)):
        return None
    moved = (0, *range(1, rank - k), *(rank - k - 1 + c for c in perm[1 : k + 1]))
    return ChannelsLast(value.array.transpose(moved), k)


class ReshapeStep(StandardStep):
    """A Reshape of a held value that splits or merges its channels alone (its batch and
    spatial axes kept, as a channel shuffle's): the value held so, its channel axes
    reshaped. Anything else as the op's own step."""

    folds_as_op = True

    def _run(self, env: Env) -> None:
        value = env[self.inputs[0]] if self.inputs else None
        shape = materialize(env[self.inputs[1]]) if len(self.inputs) > 1 else None
        if isinstance(value, ChannelsLast) and shape is not None and is_static(shape):
            rank, k = value.array.ndim, value.channels
            spatial = tuple(value.array.shape[1 : rank - k])
            struct = jax.ShapeDtypeStruct(value.shape, value.array.dtype)
            out = jax.eval_shape(lambda x: self.op.fn(self.info, x, shape), struct).shape
            split = len(out) - len(spatial)
            if split >= 2 and out[0] == value.shape[0] and tuple(out[split:]) == spatial:
                channels = tuple(out[1:split])
                reshaped = value.array.reshape((out[0], *spatial, *channels))
                env[self.outputs[0]] = ChannelsLast(reshaped, len(channels))
                return
        super()._run(env)


# Whether a graph has a depthwise conv, by its Dependencies (computed once a graph).
_DEPTHWISE: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def has_depthwise_conv(graph: PassGraph) -> bool:
    """Whether a Conv of the graph has one input channel a group and more than one group,
    its weight an initializer or a Constant (a depthwise conv: MobileNets, ShuffleNets,
    PaddleOCR's).

    The pass holds values channels-last in such graphs alone. There the depthwise sums
    read rows of C and the regions pay (PaddleOCR's classifier at batch 8: 0.76x the
    time, its training step 0.60x; MobileNetV2 0.85-0.90x); in a network of k x k convs
    alone the transposes where regions begin and the weights moved for the stacked
    products cost more than they saved (light_resnet50: 1.39x the time: a [1, 64, 56,
    56] X transposed in 5.4 ms, a [512, 512, 3, 3] weight in 6.2 ms)."""
    found = _DEPTHWISE.get(graph.edges)
    if found is None:
        found = False
        for node in graph.edges.nodes:
            if node.op_type != "Conv" or len(node.input) < 2:
                continue
            shape = _declared_shape(graph, node.input[1])
            group = next((a.i for a in node.attribute if a.name == "group"), 1)
            if shape is not None and len(shape) >= 3 and shape[1] == 1 and group > 1:
                found = True
                break
        _DEPTHWISE[graph.edges] = found
    return found


def _declared_shape(graph: PassGraph, name: str) -> tuple[int, ...] | None:
    """An initializer's shape, a graph input's as declared (a Session's trained weights)
    or a Constant node's (PaddlePaddle writes its weights so)."""
    if name in graph.initializer_shapes:
        return graph.initializer_shapes[name]
    if name in graph.input_types:
        dims = graph.input_types[name].shape.dim
        return tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims)
    constant = graph.edges.made_by(name, "Constant")
    value = (
        None
        if constant is None
        else next((a.t for a in constant.attribute if a.name == "value"), None)
    )
    return None if value is None else tuple(value.dims)


def _step(graph: PassGraph, node: Any) -> StandardStep | None:
    """The pass's step for a node of ai.onnx it may run channels-last, else None."""
    if domain_of(node) != "" or not has_depthwise_conv(graph):
        return None
    kind = node.op_type
    if kind == "Conv":
        return ConvStep(graph, node)
    if kind in ("BatchNormalization", "GlobalAveragePool", "GlobalMaxPool"):
        return PerChannelStep(graph, node)
    if kind == "Concat":
        return ConcatStep(graph, node)
    if kind == "MaxPool":
        return MaxPoolStep(graph, node)
    if kind == "Reshape":
        return ReshapeStep(graph, node)
    if kind == "Transpose":
        return TransposeStep(graph, node)
    if kind in UNARY or kind in BROADCASTING:
        step = ChannelsLastStep(graph, node)
        return step if step.info.opset >= BROADCASTING.get(kind, 1) else None
    return None


CHANNELS_LAST = Pass("channels_last", lower=_step)
