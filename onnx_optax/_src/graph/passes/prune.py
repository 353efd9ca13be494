"""Pruning and ordering: the nodes the requested outputs need (a Gradient's y
included), and an order that runs them, each walk with its own stack.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from typing import Any

from onnx_optax._src.graph.errors import too_much_work
from onnx_optax._src.graph.nodes import free_names, gradient_names
from onnx_optax._src.graph.steps import Step
from onnx_optax._src.graph.support import GRADIENT, GRADIENT_WORK
from onnx_optax._src.onnx_nodes import (
    DOMAIN,
    describe,
)
from onnx_optax._src.ops import (
    domain_of,
)


def postorder(
    roots: Iterable[Any],
    visit: Callable[[Any, Any], Any],
    children: Callable[[Any], Iterable[Any]],
    cycle: Callable[[Any], Exception],
) -> list[Any]:
    """Nodes in depth-first postorder, walked with its own stack: a chain of many nodes
    needs no Python recursion.

    ``visit(item, parent)`` is the node an item leads to, or None where the walk stops
    there (``parent``: the node whose item it is, None for a root); ``children(node)``
    the items a node leads on to. Each node comes once, after every node its items lead
    to; ``cycle(node)`` is raised when the walk meets a node on its current path.
    """
    order: list[Any] = []
    path: set[Any] = set()
    done: set[Any] = set()

    def enter(item: Any, parent: Any) -> Any:
        node = visit(item, parent)
        if node is None or node in done:
            return None
        if node in path:
            raise cycle(node)
        path.add(node)
        return node

    for root in roots:
        first = enter(root, None)
        stack = [] if first is None else [(first, iter(children(first)))]
        while stack:
            node, todo = stack[-1]
            for item in todo:
                child = enter(item, node)
                if child is not None:
                    stack.append((child, iter(children(child))))
                    break
            else:
                stack.pop()
                path.discard(node)
                done.add(node)
                order.append(node)
    return order


def sorted_steps(steps: list[Step], reads: Mapping[int, Sequence[str]]) -> list[Step] | None:
    """``steps`` in an order that runs (each after the producers of what it reads, by
    ``id(step)`` in ``reads``), else in their given order; None if they form a cycle."""
    producer = {name: step for step in steps for name in step.outputs if name}

    def producers(step: Step) -> Iterator[Step]:
        return (producer[name] for name in reads[id(step)] if name in producer)

    try:
        return postorder(steps, lambda step, _: step, producers, lambda _: LookupError())
    except LookupError:
        return None


class Dependencies:
    """A graph's nodes and the names between them: which node computes each name, what
    each reads (a Gradient: also what computing its y reads), the nodes some names need
    and an order that runs them.

    ``available``: the graph's inputs, initializers and outer values; ``scope``: the
    enclosing graphs' names (looked up there, never copied); ``depth``: how many graphs
    enclose this one; ``max_traced_nodes``: the node runs a trace may make.
    """

    def __init__(
        self,
        nodes: Sequence[Any],
        available: set[str],
        scope: Container[str],
        depth: int,
        max_traced_nodes: int,
    ) -> None:
        self.nodes = list(nodes)
        self.available = available
        self.scope = scope
        self.depth = depth
        self.max_traced_nodes = max_traced_nodes
        self.nesting = 0  # Gradients whose reach is being found, one inside the other
        self.producer: dict[str, int] = {}
        for index, node in enumerate(self.nodes):
            for name in node.output:
                if not name:
                    continue
                if name in self.producer or name in available or name in scope:
                    raise ValueError(f"{describe(node)}: output '{name}' is already defined")
                self.producer[name] = index
        self._memo: dict[int, tuple[str, ...]] = {}

    def defines(self, name: str) -> bool:
        """Whether ``name`` is a value here: an input, initializer, output or outer name."""
        return name in self.available or name in self.producer or name in self.scope

    def made_by(self, name: str, op_type: str) -> Any:
        """The ai.onnx node of ``op_type`` of this graph that computes ``name``, else None."""
        index = self.producer.get(name) if name else None
        node = None if index is None else self.nodes[index]
        if node is None or node.op_type != op_type or domain_of(node) != "":
            return None
        return node

    def transposes_of(self, names: Sequence[str]) -> tuple[tuple[int, ...] | None, ...]:
        """Per name, the perm of the ai.onnx Transpose node of this graph computing it (()
        for the default perm), else None (see ``Node.input_perms``)."""
        perms: list[tuple[int, ...] | None] = []
        for name in names:
            node = self.made_by(name, "Transpose")
            if node is None:
                perms.append(None)
                continue
            perm = next((a for a in node.attribute if a.name == "perm"), None)
            perms.append(() if perm is None else tuple(int(i) for i in perm.ints))
        return tuple(perms)

    @functools.cached_property
    def differentiated(self) -> frozenset[str]:
        """The names a Gradient node of this graph differentiates with respect to (its
        nodes do not change: read once)."""
        names: set[str] = set()
        for node in self.nodes:
            if node.op_type == GRADIENT:
                try:
                    names |= gradient_names(node)[1]
                except ValueError:  # its own step says what is wrong
                    continue
        return frozenset(names)

    @contextlib.contextmanager
    def gradient(self, node: Any) -> Iterator[None]:
        """One more Gradient nested in the one being read; refused past the work limit.

        A Gradient whose y needs another Gradient traces that one GRADIENT_WORK times,
        so k nested Gradients run at least GRADIENT_WORK**k nodes: refused before the
        walk goes deeper (which would also exhaust Python's recursion).
        """
        self.nesting += 1
        try:
            if GRADIENT_WORK**self.nesting > self.max_traced_nodes:
                raise too_much_work(
                    f"{describe(node)}: with {self.nesting} Gradients nested in its y, its trace",
                    GRADIENT_WORK**self.nesting,
                    self.max_traced_nodes,
                    at_least=True,
                )
            yield
        finally:
            self.nesting -= 1

    def deps(self, index: int) -> tuple[str, ...]:
        """The names a node reads: its inputs, and for Gradient what computing y reads."""
        if index in self._memo:
            return self._memo[index]
        node = self.nodes[index]
        deps = [name for name in node.input if name]
        deps += free_names(node, self.depth)
        if domain_of(node) == DOMAIN and node.op_type == GRADIENT:
            self._memo[index] = tuple(deps)  # guards against y depending on itself
            y, stop = gradient_names(node)
            with self.gradient(node):
                reached = self.reach([y] if y else [], stop, index)
            produced = {n for i in reached for n in self.nodes[i].output}
            for i in reached:
                deps += [n for n in self.deps(i) if n not in produced and n not in stop]
        self._memo[index] = tuple(dict.fromkeys(deps))
        return self._memo[index]

    def reach(self, names: Sequence[str], stop: set[str], owner: int | None = None) -> set[int]:
        """Indices of the nodes that ``names`` depend on, not looking past ``stop``."""
        reached: set[int] = set()
        todo = [n for n in names if n not in stop]
        while todo:
            name = todo.pop()
            index = self.producer.get(name)
            if index is None or index in reached:
                continue
            if index == owner:
                raise ValueError(f"{describe(self.nodes[index])}: y depends on the node itself")
            reached.add(index)
            todo += [n for n in self.deps(index) if n not in stop]
        return reached

    def needed(self, outputs: Sequence[str]) -> set[int]:
        """Every node the outputs need, including those computing each Gradient's y."""
        for name in outputs:
            if not self.defines(name):
                raise ValueError(f"graph output '{name}' is produced by no node")
        needed = self.reach(outputs, set())
        todo = list(needed)
        while todo:
            index = todo.pop()
            node = self.nodes[index]
            if domain_of(node) == DOMAIN and node.op_type == GRADIENT:
                y, stop = gradient_names(node)
                for found in self.reach([y] if y else [], stop, index) - needed:
                    needed.add(found)
                    todo.append(found)
        return needed

    def topological(
        self, names: Sequence[str], stop: set[str], owner: int | None = None
    ) -> list[int]:
        """The nodes computing ``names`` (not past ``stop``) in an order that runs."""

        def producer(name: str, reader: int | None) -> int | None:
            """The node computing ``name``, None past the graph's edge; checks the edge."""
            if name in stop or name in self.available or name in self.scope:
                return None
            index = self.producer.get(name)
            if index is None:
                where = (
                    describe(self.nodes[reader])
                    if reader is not None
                    else "graph output"
                    if owner is None
                    else describe(self.nodes[owner])
                )
                raise ValueError(
                    f"{where}: input '{name}' is not a graph input, an initializer or the output "
                    "of a node"
                )
            if index == owner:
                raise cycle(index)
            return index

        def cycle(index: int) -> ValueError:
            return ValueError(f"{describe(self.nodes[index])}: the graph has a cycle through it")

        order: list[int] = postorder(names, producer, self.deps, cycle)
        return order
