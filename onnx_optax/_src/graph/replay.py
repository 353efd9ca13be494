"""Repeated ops replayed: an op traced once per signature of its inputs, its jaxpr
bound again for every later node of that signature (see :class:`Replay`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import numpy as np

from onnx_optax._src.graph.jit import inline_jaxpr
from onnx_optax._src.ops.sequence import SEQUENCE_OPS

# Host values (shapes, axes) up to this many elements key an op's trace in a Replay.
REPLAY_HOST_LIMIT = 1024
# Ops whose result may differ between two calls with equal inputs (random ops without a
# seed), and the quantization pair, whose integer tensor carries its straight-through
# derivative beside it (ops.quantization's shadows, which a replayed trace would drop):
# never replayed. Every other op must be a function of its attributes, its inputs' types
# and its host inputs' values while tracing, as the registry's ops are.
UNREPLAYED = frozenset(
    (
        "Dropout",  # draws from the step's key (random_keys), read when it is called
        "RandomNormalLike",
        "RandomUniformLike",
        "Bernoulli",
        "Multinomial",
        "QuantizeLinear",
        "DequantizeLinear",
    )
)


class OpTrace(NamedTuple):
    """An op's jaxpr for one signature of its inputs, and how its outputs come out of it."""

    closed: Any  # the ClosedJaxpr of the op as a function of its traced inputs
    positions: tuple[int, ...]  # the traced inputs' positions among the op's inputs
    outputs: tuple[Any, ...]  # per output: None, ("host", value) or ("traced", index)

    def bind(self, args: Sequence[Any], inline: bool) -> tuple[Any, ...]:
        outs = inline_jaxpr(self.closed, *[args[i] for i in self.positions], calls=inline)
        return tuple(
            None
            if out is None
            else np.array(out[1], copy=True)  # each node its own host value, as the op gave
            if out[0] == "host"
            else outs[out[1]]
            for out in self.outputs
        )


# Sequence ops return no JAX values of their own (a TensorSeq of their inputs' pieces).
NEVER_REPLAYED = UNREPLAYED | SEQUENCE_OPS


# A signature's entry in a Replay: None once seen, its trace once recorded, False for an
# op that checks values at run time (never replayed).
Traced = OpTrace | Literal[False] | None


class Replay:
    """The ops one trace of a graph has seen: a repeated call is traced once, then replayed.

    A node whose op, attributes and inputs' types (host inputs: values) equal
    two earlier nodes' computes the same function of its traced inputs: the
    second such node records the op's jaxpr, and every later one binds that
    jaxpr's equations on the trace instead of calling the op again (jax.numpy's
    dispatch, about 0.1 ms a call, and Relu's custom_jvp, about 0.5 ms, cost far
    more than binding the one equation each emits). ``inline``: nothing
    differentiates this trace (a compiled graph's own function), so calls are
    inlined as they are bound (see :func:`flattened`); inside a Gradient they are
    bound as they are, keeping custom derivative rules (Relu's at 0).
    """

    def __init__(self, inline: bool, traces: dict[Any, Traced] | None = None) -> None:
        self.inline = inline
        self.traces: dict[Any, Traced] = {} if traces is None else traces

    def faithful(self) -> Replay:
        """The same traces, bound without inlining (for a trace that is differentiated)."""
        return self if not self.inline else Replay(False, self.traces)


REPLAY: contextvars.ContextVar[Replay | None] = contextvars.ContextVar(
    "onnx_optax_replay", default=None
)
