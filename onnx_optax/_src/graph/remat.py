"""Rematerialization: the nodes a Gradient differentiates, run in checkpointed segments.

A Gradient's backward pass reads what its forward pass kept (the residuals of
every node between xs and y). With :func:`rematerialized` on, the nodes run in
about sqrt(n) segments of about sqrt(n) nodes, each checkpointed (as
``jax.checkpoint`` does, see :func:`_checkpointed` for why not with it):
the forward pass keeps only the values that cross a segment's boundary, and the
backward pass recomputes one segment's residuals at a time. The computation is
the same (the same ops on the same values); memory falls from n nodes'
residuals to about 2 sqrt(n) of them, for about one more forward pass.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from onnx_optax._src.graph.packing import materialize
from onnx_optax._src.ops import collect_run_checks, is_static, record_run_checks

_REMAT: contextvars.ContextVar[bool] = contextvars.ContextVar("onnx_optax_remat", default=False)


@contextlib.contextmanager
def rematerialized(on: bool = True) -> Iterator[None]:
    """Gradients traced inside run their nodes in checkpointed segments (see the module)."""
    token = _REMAT.set(on)
    try:
        yield
    finally:
        _REMAT.reset(token)


def is_rematerializing() -> bool:
    """Whether Gradients traced now run their nodes in checkpointed segments."""
    return _REMAT.get()


def _reads(steps: Sequence[Any]) -> set[str]:
    """The names the steps read, those of the nodes a nested Gradient runs included."""
    names: set[str] = set()
    for step in steps:
        names.update(n for n in step.inputs if n)
        names.update(_reads(getattr(step, "order", [])))
    return names


# The most nodes one chain of a differentiated function runs between two optimization
# barriers (see run_bounded).
BARRIER_DEPTH = 16
# While a Gradient's function is traced: the nodes on the chain behind each traced value
# since its last barrier, by the value's id. Kept by value, not by name, so a chain
# continues through subgraph calls (an unrolled Loop's iterations, an If's branch).
_DEPTHS: contextvars.ContextVar[dict[int, int] | None] = contextvars.ContextVar(
    "onnx_optax_chain_depths", default=None
)


@contextlib.contextmanager
def chain_depths() -> Iterator[None]:
    """The chains of values traced inside are counted together (see run_bounded)."""
    token = _DEPTHS.set({})
    try:
        yield
    finally:
        _DEPTHS.reset(token)


def run_bounded(steps: Sequence[Any], env: dict[str, Any]) -> None:
    """Runs ``steps`` on ``env``, an optimization barrier on each traced value that ends
    BARRIER_DEPTH nodes of a chain since the last barrier on it.

    XLA:CPU fused the backward pass of a long elementwise chain whole: the gradient
    through 1,250 Sin nodes failed to compile ("Unknown MLIR failure") and one through
    20,000 ended the process. The barriers (their cotangents barred alike) cut such a
    chain into fusions of a bounded depth; the values are the same. Within
    :func:`chain_depths` (a Gradient's function) chains are followed through subgraph
    calls; elsewhere (a forward that nothing differentiates: a subgraph's body outside
    any Gradient) the steps run as they are, fused as XLA chooses.
    """
    depths = _DEPTHS.get()
    if depths is None:
        for step in steps:
            step.run(env)
        return
    for step in steps:
        step.run(env)
        reached = 1 + max(
            (depths.get(id(env.get(name)), 0) for name in step.inputs if name), default=0
        )
        for name in step.outputs:
            value = env.get(name) if name else None
            if not isinstance(value, jax.Array):
                continue
            if reached >= BARRIER_DEPTH:
                value = env[name] = jax.lax.optimization_barrier(value)
                depths[id(value)] = 0
            else:
                depths[id(value)] = reached


def run_steps(steps: Sequence[Any], env: dict[str, Any], keep: Sequence[str]) -> None:
    """Runs ``steps`` on ``env``; checkpointed segments when :func:`rematerialized` is on.

    ``keep``: the names the caller reads afterwards (a Gradient's y).
    """
    if not _REMAT.get() or len(steps) < 4:
        run_bounded(steps, env)
        return
    size = math.isqrt(len(steps) - 1) + 1
    segments = [steps[i : i + size] for i in range(0, len(steps), size)]
    later = [set(keep)]  # later[j]: what is read after segment len(segments) - 1 - j
    for segment in reversed(segments[1:]):
        later.append(later[-1] | _reads(segment))
    for segment, wanted in zip(segments, reversed(later), strict=True):
        _run_segment(segment, env, wanted)


def _run_segment(segment: Sequence[Any], env: dict[str, Any], wanted: set[str]) -> None:
    """One segment under :func:`_checkpointed`: traced values in and out, host values
    (shapes, computed while tracing) kept beside it."""
    names = [
        n
        for n in sorted(_reads(segment))
        if n in env and env[n] is not None and not is_static(env[n])
    ]
    produced = [n for step in segment for n in step.outputs if n and n in wanted]
    host: dict[str, Any] = {}
    traced_names: list[str] = []

    def run(*values: Any) -> tuple[list[Any], Any]:
        local = dict(env)
        local.update(zip(names, values, strict=True))
        # A Gradient inside runs as it is: the segment's own backward differentiates it.
        with rematerialized(False), collect_run_checks() as checks:  # returned: no leaks
            run_bounded(segment, local)
        host.clear()
        traced_names.clear()
        outputs = []
        for name in produced:
            value = local.get(name)
            if value is None or is_static(value):
                host[name] = value
            else:
                traced_names.append(name)
                outputs.append(materialize(value))
        return outputs, checks

    outputs, checks = _checkpointed(run)(*[materialize(env[n]) for n in names])
    record_run_checks(checks)
    env.update(host)
    env.update(zip(traced_names, outputs, strict=True))


def _checkpointed(fn: Any) -> Any:
    """``fn`` whose backward pass recomputes it from its inputs, keeping nothing else.

    ``jax.checkpoint`` guards the recomputation with an optimization barrier,
    which XLA:CPU removes before common-subexpression elimination: the
    recomputation then merges with the forward pass, which keeps every
    residual again (measured: more memory than without it). Here the
    recomputation reads its inputs plus zero times one element of the
    incoming cotangent, a dependency no pass removes (0 * x is not folded for
    floats), so it can only run when the backward pass reaches it. The value
    is the same unless that element is infinite or NaN, when the gradient is
    not finite anyway.
    """

    @jax.custom_vjp
    def checkpointed(*args: Any) -> Any:
        return fn(*args)

    def forward(*args: Any) -> tuple[Any, tuple[Any, ...]]:
        return fn(*args), args

    def backward(args: tuple[Any, ...], cotangent: Any) -> Any:
        floats = [
            c for c in jax.tree.leaves(cotangent) if jnp.issubdtype(c.dtype, jnp.inexact) and c.size
        ]
        if floats:
            tie = jnp.zeros((), floats[0].dtype) * floats[0].reshape(-1)[0]
            args = tuple(
                a + tie.astype(a.dtype) if jnp.issubdtype(a.dtype, jnp.inexact) else a for a in args
            )
        return jax.vjp(fn, *args)[1](cotangent)

    checkpointed.defvjp(forward, backward)
    return checkpointed
