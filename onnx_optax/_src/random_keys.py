"""The random key a training step hands to its random ops (training-mode Dropout).

A :class:`training.Session` made with ``seed=`` sets :func:`step_key` around
each step it traces: ``fold_in(key(seed), T)``, T the step's count. An op draws
with :func:`node_key`, ``fold_in(step key, crc32(node name))``, so a mask is a
pure function of (seed, T, node), the node known by its description and first
output name (unique in a graph): the same in an uninterrupted run and in one
saved and resumed at T, the same in the forward pass and in each Gradient that
runs the node again, and different for two nodes of one step.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import zlib
from collections.abc import Iterator
from typing import Any

import jax


@dataclasses.dataclass(frozen=True)
class StepKey:
    """The key of one step (None: the session has no seed), and who set it, for messages."""

    key: Any
    owner: str


_STEP_KEY: contextvars.ContextVar[StepKey | None] = contextvars.ContextVar(
    "onnx_optax_step_key", default=None
)


@contextlib.contextmanager
def step_key(key: Any, owner: str) -> Iterator[None]:
    """Random ops traced inside draw from ``key`` (None: they are refused, naming ``owner``)."""
    token = _STEP_KEY.set(StepKey(key, owner))
    try:
        yield
    finally:
        _STEP_KEY.reset(token)


def current() -> StepKey | None:
    """The step key set by :func:`step_key`; None outside any (a graph run on its own)."""
    return _STEP_KEY.get()


def node_key(key: Any, node: str) -> Any:
    """``fold_in(key, crc32(node))``: a key of its own for the node the text ``node`` names."""
    return jax.random.fold_in(key, zlib.crc32(node.encode()) & 0x7FFFFFFF)
