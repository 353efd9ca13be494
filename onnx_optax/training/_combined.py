"""A training model's graphs as functions of the bound initializers, for jit.

:class:`Entry`: one ``training_info`` entry on the inference graph;
:class:`Inference`: the inference graph alone, for some of its outputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import jax
import numpy as np
import onnx
from onnx import helper

from onnx_optax._src.graph import GraphFunction, to_jax
from onnx_optax._src.onnx_nodes import describe
from onnx_optax._src.onnx_tensors import tensor_dtype
from onnx_optax._src.ops import STANDARD_DOMAINS, RunChecks
from onnx_optax.training._feeds import from_python, is_python
from onnx_optax.training._micro import Micro
from onnx_optax.training._model import View, declared, opsets, reads, value_info

# Losses whose input 1 holds class indices into axis 1 of input 0.
CLASS_LOSSES = ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss")


class Target(NamedTuple):
    """The class labels of a loss node, read from a feed of the step."""

    feed: str  # the feed the labels come from
    casts: tuple[np.dtype, ...]  # the integer Casts between the feed and the node, in order
    scores: str  # the node's input 0: its axis 1 counts the classes
    ignore_index: int | None  # the node's attribute, a label that is not a class
    where: str  # the node, for messages


class MainGraph:
    """A training model's inference graph, indexed once for all its entries.

    Each entry runs the main-graph nodes its algorithm reaches, and only those:
    an entry's graph is built from this index in time proportional to what it
    reads, not to the main graph (2,000 entries of a large model each copied
    and indexed the whole graph).
    """

    def __init__(self, model: onnx.ModelProto) -> None:
        main = model.graph
        self.name = main.name
        self.position: dict[str, int] = {}  # tensor name -> index of the node computing it
        self.nodes = list(main.node)
        self.initializers = {i.name: i for i in main.initializer}
        self.inputs = {i.name: i for i in main.input if i.name not in self.initializers}
        self.problem: str | None = None  # a name defined twice, refused by every entry
        for index, node in enumerate(self.nodes):
            for name in node.output:
                if not name:
                    continue
                if name in self.position or name in self.initializers or name in self.inputs:
                    self.problem = self.problem or (
                        f"{describe(node)}: output '{name}' is already defined"
                    )
                self.position.setdefault(name, index)
        self.value_info = {v.name: v for v in (*main.value_info, *main.output)}
        # Where each graph input and initializer stands, to keep an entry's in that order.
        self.order = {name: k for k, name in enumerate([*self.inputs, *self.initializers])}

    def in_order(self, names: Iterable[str]) -> list[str]:
        """Those of ``names`` that are graph inputs or initializers, in the graph's order."""
        return sorted((n for n in names if n in self.order), key=self.order.__getitem__)

    def reached(self, names: Iterable[str]) -> list[int]:
        """The nodes computing ``names``, through node inputs and Gradient ys, in graph order."""
        found: set[int] = set()
        todo = [n for n in names if n]
        while todo:
            index = self.position.get(todo.pop())
            if index is None or index in found:
                continue
            found.add(index)
            todo += reads(self.nodes[index])
        return sorted(found)


M = TypeVar("M", onnx.NodeProto, onnx.ValueInfoProto, onnx.TensorProto)


def _detached(messages: Iterable[M]) -> list[M]:
    """A copy of each message, referring into nothing else."""
    copies = []
    for message in messages:
        copy = type(message)()
        copy.CopyFrom(message)
        copies.append(copy)
    return copies


class Entry:
    """One training_info entry as one function of (state, feeds, constants), for jit.

    Its graph holds the algorithm's nodes and the main-graph nodes they reach; its
    inputs are the feeds and the bound initializers it reads (:attr:`reads`).
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        index: int,
        state: Mapping[str, np.ndarray],
        initializers: Mapping[str, np.ndarray],
        main: MainGraph | None = None,
    ) -> None:
        del initializers  # the main graph's, by name in main
        main = MainGraph(model) if main is None else main
        if main.problem is not None:
            raise ValueError(main.problem)
        info = model.training_info[index]
        algorithm = info.algorithm
        self.where = f"training_info[{index}]"
        self.binding = {e.key: e.value for e in info.update_binding}
        # Names the algorithm defines must not be the main graph's: refused by the node,
        # as the combined graph would.
        own = {*(i.name for i in algorithm.input), *(i.name for i in algorithm.initializer)}
        for node in algorithm.node:
            for name in node.output:
                if name in main.position or name in main.initializers or name in main.inputs:
                    raise ValueError(f"{describe(node)}: output '{name}' is already defined")
        for name in own:
            if name in main.position:
                clash = main.nodes[main.position[name]]
                raise ValueError(f"{describe(clash)}: output '{name}' is already defined")
        wanted = [name for node in algorithm.node for name in reads(node)]
        wanted += [o.name for o in algorithm.output]
        nodes = [main.nodes[i] for i in main.reached(wanted)]
        read = {*wanted, *(name for node in nodes for name in reads(node))}
        read -= own
        outer = main.in_order(read)
        read_state = [n for n in outer if n in state]
        inputs = [main.inputs[n] for n in outer if n in main.inputs]
        inputs += [
            value_info(
                n, int(helper.np_dtype_to_tensor_dtype(state[n].dtype)), list(state[n].shape)
            )
            for n in read_state
        ]
        inputs += list(algorithm.input)
        constants = [
            main.initializers[n] for n in outer if n in main.initializers and n not in state
        ]
        produced = {name for node in (*nodes, *algorithm.node) for name in node.output}
        # Copies: a message read out of the model keeps the whole model alive (protobuf's
        # upb frees a model's memory at once, when nothing refers into it), and with it every
        # bound initializer's data, which the session holds again as its state.
        graph = View(
            f"{main.name}+{algorithm.name}",
            _detached([*nodes, *algorithm.node]),
            _detached(inputs),
            _detached(algorithm.output),
            _detached([*constants, *algorithm.initializer]),
            _detached(main.value_info[n] for n in read | produced if n in main.value_info),
        )
        self.function = GraphFunction(graph, opsets=opsets(model), check_shapes=False)
        if self.function.static_inputs:
            raise ValueError(
                f"{self.where}: inputs {list(self.function.static_inputs)} are read as shapes; "
                "a training step cannot take them as data"
            )
        used = _used(self.function.order) | set(self.function.output_names)
        self.feeds = [i for i in graph.input if i.name not in state and i.name in used]
        # The bound initializers the step reads, in the graph's order.
        self.reads = [n for n in read_state if n in used]
        self.outputs = [o.name for o in info.algorithm.output]
        bound = set(self.binding.values())
        self.reported = [n for n in self.outputs if n not in bound]
        self.constants = {
            n: to_jax(f"initializer '{n}'", v) for n, v in self.function.params.items()
        }
        self.targets = _targets(graph, _nodes(self.function.order), {v.name for v in self.feeds})
        # For the targets' scores (built on the first check): the graph without its
        # initializers, whose values the function already holds.
        self._graph = (
            helper.make_graph(list(graph.node), graph.name, list(graph.input), [])
            if self.targets
            else None
        )
        self._opsets = opsets(model)
        self._scores: GraphFunction | None = None
        self._view = graph
        self._micro: Micro | None = None  # built on the first step over micro-batches

    def step(
        self,
        state: Mapping[str, jax.Array],
        feeds: Mapping[str, jax.Array],
        constants: Mapping[str, Any],
    ) -> tuple[dict[str, jax.Array], dict[str, jax.Array], RunChecks]:
        """The unbound outputs, the new value of each bound initializer and the run-time
        checks (traced, for jit; :func:`raise_failed` raises the first that failed).

        ``state`` holds at least :attr:`reads`. Nothing differentiates a step, so
        the trace drops custom derivative rules (``differentiable=False``).
        """
        inputs = {**feeds, **{n: state[n] for n in self.reads}}
        outputs, checks = self.function.apply_checked(inputs, dict(constants), differentiable=False)
        values = dict(zip(self.outputs, outputs, strict=True))
        updates = {key: values[name] for key, name in self.binding.items()}
        return {n: values[n] for n in self.reported}, updates, checks

    def micro_step(
        self,
        state: Mapping[str, jax.Array],
        feeds: Mapping[str, jax.Array],
        constants: Mapping[str, Any],
        micro_batches: int,
    ) -> tuple[dict[str, jax.Array], dict[str, jax.Array], RunChecks]:
        """:meth:`step` with the gradients averaged over ``micro_batches`` parts of the batch.

        Each feed of rank 1 or more is cut along axis 0 into ``micro_batches``
        parts (part j holds rows j, j + k, j + 2k, ..., so that each part keeps
        a batch split over devices split the same way); a ``lax.scan`` runs the
        forward pass and every Gradient on one part at a time and sums; the
        optimizer then runs once on the means. The reported outputs that do not
        depend on a gradient (the loss) are the means over the parts too.
        """
        if self._micro is None:
            self._micro = Micro(self._view, self._opsets, self.binding, self.reported, self.where)
        state = {n: state[n] for n in self.reads}
        values, checks = self._micro(feeds, state, dict(constants), micro_batches)
        updates = {key: values[name] for key, name in self.binding.items()}
        return {n: values[n] for n in self.reported}, updates, checks

    def check_feeds(self, inputs: Mapping[str, Any], dims: dict[str, Any]) -> dict[str, Any]:
        """The feeds of a step, checked (see :func:`check_feeds`), as JAX arrays."""
        feeds = check_feeds(self.where, "the step", self.feeds, inputs, dims)
        return {name: to_jax(f"feed '{name}'", array) for name, array in feeds.items()}

    def classes(self, state: Mapping[str, Any], feeds: Mapping[str, Any]) -> dict[str, int]:
        """How many classes each target's scores have for this signature (traced, not run)."""
        if self._graph is None:
            return {}
        if self._scores is None:
            self._scores = GraphFunction(
                self._graph,
                outer_values={**self.function.static, **self.function.params},
                outputs=list(dict.fromkeys(t.scores for t in self.targets)),
                opsets=self._opsets,
                check_shapes=False,  # traced just below, on the feeds' shapes
            )
        scores = self._scores
        shapes = jax.eval_shape(lambda inputs: scores.apply(inputs), {**feeds, **state})
        return {
            name: spec.shape[1]
            for name, spec in zip(scores.output_names, shapes, strict=True)
            if len(spec.shape) >= 2
        }

    def check_targets(self, inputs: Mapping[str, Any], classes: Mapping[str, int]) -> None:
        """Refuses a class label outside [0, C) that is not the loss node's ``ignore_index``.

        XLA would clip such a label to a valid class and train on it silently.
        ``inputs`` are the feeds as given, already checked by :meth:`check_feeds`.
        """
        for target in self.targets:
            count = classes.get(target.scores)
            if count is None:  # the loss node itself refuses scores of rank < 2
                continue
            for labels in _host(inputs[target.feed]):
                for dtype in target.casts:
                    labels = labels.astype(dtype) if labels.dtype.kind in "iu" else labels
                if labels.dtype.kind not in "iu":
                    continue
                bad = (labels < 0) | (labels >= count)
                if target.ignore_index is not None:
                    bad &= labels != target.ignore_index
                if bad.any():
                    ignored = (
                        ""
                        if target.ignore_index is None
                        else f", and is not its ignore_index {target.ignore_index}"
                    )
                    raise ValueError(
                        f"{self.where}: feed '{target.feed}' holds the label "
                        f"{labels[bad].flat[0]}, outside [0, {count}): the scores "
                        f"'{target.scores}' of {target.where} have {count} classes (axis 1)"
                        f"{ignored}; nothing was run"
                    )


class Inference:
    """The inference graph's ``outputs`` as one function of its feeds and the bound initializers.

    The bound initializers (``bound``: name to stored dtype) are inputs of the
    function, not constants, so a step that changes them needs no new
    compilation; the other initializers are constants (those in ``replaced``
    with its value). Only the feeds and
    bound initializers the outputs need are inputs.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        bound: Mapping[str, np.dtype],
        outputs: Sequence[str],
        replaced: Mapping[str, onnx.TensorProto] | None = None,
    ) -> None:
        main = model.graph
        initializers = {i.name for i in main.initializer}
        feeds = [i for i in main.input if i.name not in initializers]
        state = [
            value_info(n, int(helper.np_dtype_to_tensor_dtype(dtype)), None)
            for n, dtype in bound.items()
        ]
        replaced = replaced or {}  # initializers inference reads otherwise (Dropout's switch)
        constants = [replaced.get(i.name, i) for i in main.initializer if i.name not in bound]

        def function(inputs: list[onnx.ValueInfoProto]) -> GraphFunction:
            graph = helper.make_graph(
                list(main.node), main.name, inputs, list(main.output), initializer=constants
            )
            return GraphFunction(graph, outputs=outputs, opsets=opsets(model))

        self.function = function(feeds + state)
        used = _used(self.function.order) | set(self.function.output_names)
        if not used.issuperset(self.function.input_names):  # the optimizer state, at least
            feeds = [i for i in feeds if i.name in used]
            state = [i for i in state if i.name in used]
            self.function = function(feeds + state)
        self.feeds = feeds
        self.state = [i.name for i in state]


def check_feeds(
    where: str,
    taker: str,
    values: Sequence[onnx.ValueInfoProto],
    inputs: Mapping[str, Any],
    dims: dict[str, Any],
) -> dict[str, Any]:
    """The feeds ``values`` declares, checked: names, dtypes, declared shapes.

    ``dims`` binds the symbolic dimensions across calls; ``where`` and
    ``taker`` (what takes the feeds) are for the messages. The arrays are
    returned as given (a JAX array) or as numpy arrays.
    """
    feeds = {}
    for value in values:
        name = value.name
        if name not in inputs:
            raise ValueError(
                f"{where}: missing feed '{name}'; {taker} takes {[v.name for v in values]}"
            )
        array = inputs[name]
        elem, shape = declared(value)
        want = tensor_dtype(elem, f"input '{name}'") if elem else None
        if is_python(array):  # numbers and lists, converted to the declared dtype if lossless
            array = from_python(where, name, array, want)
        array = array if isinstance(array, jax.Array) else np.asarray(array)
        if want is not None and np.dtype(array.dtype) not in (
            want,
            jax.dtypes.canonicalize_dtype(want),
        ):
            raise TypeError(
                f"{where}: feed '{name}' has dtype {array.dtype}; the graph declares {want}"
            )
        if shape is not None:
            ok = len(shape) == array.ndim
            for d, n in zip(shape, array.shape, strict=False):
                if isinstance(d, int):
                    ok = ok and d == n
                elif d is not None:
                    ok = ok and dims.setdefault(d, n) == n
            if not ok:
                raise ValueError(
                    f"{where}: feed '{name}' has shape {list(array.shape)}; the graph "
                    f"declares {shape}" + (f" with {dims}" if dims else "")
                )
        feeds[name] = array
    return feeds


def _host(array: Any) -> list[np.ndarray]:
    """A feed's values on this host: the rows of this process for a multi-host array."""
    if isinstance(array, jax.Array) and not array.is_fully_addressable:
        return [np.asarray(shard.data) for shard in array.addressable_shards]
    return [np.asarray(array)]


def _nodes(steps: Sequence[Any]) -> list[onnx.NodeProto]:
    """The nodes the steps run, those a Gradient runs to compute its y included."""
    found: dict[int, onnx.NodeProto] = {}
    todo = list(steps)
    while todo:
        step = todo.pop()
        found.setdefault(id(step.node), step.node)
        todo += getattr(step, "order", [])
    return list(found.values())


def _targets(graph: View, nodes: Sequence[onnx.NodeProto], feeds: set[str]) -> list[Target]:
    """The class losses among ``nodes`` whose labels are a feed, through Identity and Cast."""
    producer = {name: node for node in graph.node for name in node.output if name}
    targets = []
    for node in nodes:
        if node.domain not in STANDARD_DOMAINS or node.op_type not in CLASS_LOSSES:
            continue
        if len(node.input) < 2 or not node.input[0]:
            continue
        name = node.input[1]
        casts: list[np.dtype] = []
        while name in producer and producer[name].domain in STANDARD_DOMAINS:
            source = producer[name]
            if source.op_type == "Cast":
                to = {a.name: helper.get_attribute_value(a) for a in source.attribute}.get("to", 0)
                try:
                    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(int(to)))
                except (KeyError, TypeError, ValueError):
                    break
                if dtype.kind not in "iu":
                    break
                casts.insert(0, dtype)
            elif source.op_type != "Identity":
                break
            name = source.input[0] if source.input else ""
        if name not in feeds:
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        ignore = attributes.get("ignore_index")
        targets.append(
            Target(
                name,
                tuple(casts),
                node.input[0],
                None if ignore is None else int(ignore),
                describe(node),
            )
        )
    return targets


def _used(steps: Sequence[Any]) -> set[str]:
    names: set[str] = set()
    for step in steps:
        names.update(step.inputs)
        names.update(_used(getattr(step, "order", [])))
    return names
