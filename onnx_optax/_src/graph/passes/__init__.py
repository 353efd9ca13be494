"""The graph passes, in the order the interpreter applies them at each stage.

Each is a small, model-agnostic rewrite (see :class:`Pass`); ``PASSES`` is today's
pipeline and :func:`chosen` picks some of them by name (a test switching one off).
Pruning and ordering (:mod:`.prune`) are not among them: they define what runs.
"""

from __future__ import annotations

from collections.abc import Collection

from onnx_optax._src.graph.passes.base import Pass, PassGraph, RunPlan
from onnx_optax._src.graph.passes.batched_products import BATCHED_PRODUCTS
from onnx_optax._src.graph.passes.channels_last import CHANNELS_LAST
from onnx_optax._src.graph.passes.constants import CONSTANTS
from onnx_optax._src.graph.passes.gradient_fusion import GRADIENT_FUSION
from onnx_optax._src.graph.passes.one_hot import ONE_HOT
from onnx_optax._src.graph.passes.weight_transposes import WEIGHT_TRANSPOSES

PASSES: tuple[Pass, ...] = (
    ONE_HOT,
    CHANNELS_LAST,
    GRADIENT_FUSION,
    BATCHED_PRODUCTS,
    CONSTANTS,
    WEIGHT_TRANSPOSES,
)
PASS_NAMES = frozenset(p.name for p in PASSES)

__all__ = ["PASSES", "PASS_NAMES", "Pass", "PassGraph", "RunPlan", "chosen"]


def chosen(names: Collection[str] | None) -> tuple[Pass, ...]:
    """The passes named (None: all of them), in the pipeline's order; an unknown name is
    refused."""
    if names is None:
        return PASSES
    unknown = sorted(set(names) - PASS_NAMES)
    if unknown:
        raise ValueError(f"unknown graph pass(es) {unknown}; the passes are {sorted(PASS_NAMES)}")
    return tuple(p for p in PASSES if p.name in names)
