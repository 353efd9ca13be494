"""Gradients accumulated over micro-batches: the forward pass in a scan, the rest once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import onnx

from onnx_optax._src.graph import GRADIENT, GraphFunction
from onnx_optax._src.onnx_nodes import DOMAIN, describe
from onnx_optax._src.ops import RunChecks
from onnx_optax.training._model import View, reads


class Micro:
    """An entry's algorithm in two graphs, for gradients accumulated over micro-batches.

    ``forward``: the nodes up to each Gradient's outputs and the reported
    outputs that need no gradient (run once per micro-batch); ``apply``: the
    rest, the Gradient nodes removed and their outputs read as inputs (the
    optimizer, T + 1, run once on the averaged gradients).
    """

    def __init__(
        self,
        graph: View,
        model_opsets: Mapping[str, int],
        binding: Mapping[str, str],
        reported: Sequence[str],
        where: str,
    ) -> None:
        gradients = [n for n in graph.node if n.op_type == GRADIENT and n.domain == DOMAIN]
        if not gradients:
            raise ValueError(f"{where}: micro_batches needs a Gradient node; the entry has none")
        self.gradients = [name for node in gradients for name in node.output if name]
        # What depends on a gradient: to compute once, after the averaging.
        tainted = set(self.gradients)
        removed = {id(node) for node in gradients}
        changed = True
        while changed:
            changed = False
            for node in graph.node:
                if tainted.isdisjoint(reads(node)):
                    continue
                if id(node) in removed:
                    raise ValueError(
                        f"{where}: {describe(node)} differentiates another Gradient's output; "
                        "micro_batches cannot average nested gradients"
                    )
                if not tainted.issuperset(n for n in node.output if n):
                    tainted.update(n for n in node.output if n)
                    changed = True
        self.averaged = [n for n in reported if n not in tainted]
        once = [*dict.fromkeys([*binding.values(), *(n for n in reported if n in tainted)])]
        self.forward = GraphFunction(
            graph,
            outputs=[*self.gradients, *self.averaged],
            opsets=model_opsets,
            check_shapes=False,
        )
        rest = View(
            graph.name,
            [n for n in graph.node if id(n) not in removed],
            [*graph.input, *(onnx.ValueInfoProto(name=n) for n in self.gradients)],
            graph.output,
            graph.initializer,
            graph.value_info,
        )
        self.apply = GraphFunction(rest, outputs=once, opsets=model_opsets, check_shapes=False)

    def __call__(
        self,
        feeds: Mapping[str, Any],
        state: Mapping[str, Any],
        constants: dict[str, Any],
        k: int,
    ) -> tuple[dict[str, jax.Array], RunChecks]:
        """Every output of the entry by name, and the run-time checks of both graphs.

        Each feed of rank 1 or more is cut into ``k`` parts along axis 0.
        """
        split = {
            n: jax.numpy.moveaxis(v.reshape(v.shape[0] // k, k, *v.shape[1:]), 1, 0)
            for n, v in feeds.items()
            if jax.numpy.ndim(v)
        }
        whole = {**{n: v for n, v in feeds.items() if n not in split}, **state}
        inputs = {**feeds, **state}
        forward = self.forward

        def one(part: Mapping[str, Any]) -> tuple[tuple[Any, ...], RunChecks]:
            return forward.apply_checked({**whole, **part}, constants, differentiable=False)

        shapes = jax.eval_shape(one, {n: v[0] for n, v in split.items()})[0]
        for name, spec in zip(forward.output_names, shapes, strict=True):
            if not jax.numpy.issubdtype(spec.dtype, jax.numpy.inexact):
                raise TypeError(
                    f"micro_batches averages output '{name}' over the micro-batches; it has "
                    f"dtype {spec.dtype}, which is not float"
                )
        # Sums kept in float32 at least: 16-bit gradients lose little in the sum.
        sums = [_accumulated(spec.dtype) for spec in shapes]

        def body(
            carry: tuple[jax.Array, ...], part: Mapping[str, Any]
        ) -> tuple[tuple[jax.Array, ...], RunChecks]:
            outputs, checks = one(part)
            return tuple(c + o.astype(c.dtype) for c, o in zip(carry, outputs, strict=True)), checks

        zeros = tuple(
            jax.numpy.zeros(spec.shape, dtype) for spec, dtype in zip(shapes, sums, strict=True)
        )
        totals, checks = jax.lax.scan(body, zeros, split)
        means = [
            (total / np.asarray(k, total.dtype)).astype(spec.dtype)
            for total, spec in zip(totals, shapes, strict=True)
        ]
        values = dict(zip(forward.output_names, means, strict=True))
        applied, applied_checks = self.apply.apply_checked(
            {**inputs, **{n: values[n] for n in self.gradients}}, constants, differentiable=False
        )
        values.update(zip(self.apply.output_names, applied, strict=True))
        return values, _joined(_first_failed(checks), applied_checks)


def _accumulated(dtype: Any) -> Any:
    """The dtype a sum over micro-batches is kept in: float32 for 16-bit floats."""
    return np.dtype(np.float32) if np.dtype(dtype).itemsize < 4 else np.dtype(dtype)


def _first_failed(checks: RunChecks) -> RunChecks:
    """Checks stacked by a scan (one row per micro-batch) as one: failed if any row did."""
    if not len(checks):
        return RunChecks((), np.zeros(0, bool), ())
    failed = jax.numpy.asarray(checks.failed)
    first = jax.numpy.argmax(failed, axis=0)
    values = tuple(value[first[i]] for i, value in enumerate(checks.values))
    return RunChecks(checks.messages, failed.any(axis=0), values)


def _joined(a: RunChecks, b: RunChecks) -> RunChecks:
    if not len(a):
        return b
    if not len(b):
        return a
    failed = jax.numpy.concatenate([jax.numpy.asarray(a.failed), jax.numpy.asarray(b.failed)])
    return RunChecks((*a.messages, *b.messages), failed, (*a.values, *b.values))
