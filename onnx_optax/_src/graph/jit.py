"""A graph's function jitted: Python's collector paused while tracing, every call
inlined (``flattened``), XLA's options chosen by the largest value the graph computes.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jax_core


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off while a graph is traced or lowered.

    A trace builds hundreds of thousands of long-lived objects (jaxpr equations,
    tracers, MLIR operations); each full collection walks all of them, which
    doubled the trace of a 20,000-node chain. Nested uses do nothing; the
    collector is turned back on only if it was on (another thread may turn it on
    earlier: that costs time, not correctness).
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# Call-like primitives whose body a compiled graph runs inline (see flattened).
_INLINED = {"jit": "jaxpr", "pjit": "jaxpr", "custom_jvp_call": "call_jaxpr"}


def inline_jaxpr(
    closed: Any, *args: Any, calls: bool = True, outputs: Sequence[int] | None = None
) -> list[Any]:
    """Binds a jaxpr's equations on the current trace; ``calls``: their bodies inlined.

    Without ``calls`` it is ``jax.core.eval_jaxpr``: every equation bound as it is.
    ``outputs``: those outputs alone (by position), from the equations they need.
    """

    env: dict[Any, Any] = dict(zip(closed.jaxpr.constvars, closed.consts, strict=True))
    env.update(zip(closed.jaxpr.invars, args, strict=True))
    outvars = closed.jaxpr.outvars
    eqns = closed.jaxpr.eqns
    if outputs is not None:
        outvars = [outvars[i] for i in outputs]
        eqns = _needed(eqns, outvars)

    def read(var: Any) -> Any:
        return var.val if isinstance(var, jax_core.Literal) else env[var]

    for eqn in eqns:
        values = [read(v) for v in eqn.invars]
        body = _INLINED.get(eqn.primitive.name) if calls else None
        if body is not None:
            outs = inline_jaxpr(eqn.params[body], *values)
        else:  # as jax.core.eval_jaxpr binds it (older JAX returns subfuns apart)
            bound = eqn.primitive.get_bind_params(eqn.params)
            subfuns, params = bound if isinstance(bound, tuple) else ((), bound)
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*subfuns, *values, **params)
            if not eqn.primitive.multiple_results:
                outs = [outs]
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in outvars]


def _needed(eqns: Sequence[Any], outvars: Sequence[Any]) -> list[Any]:
    """The equations that compute ``outvars`` (and every one with an effect), in order."""
    needed = {v for v in outvars if not isinstance(v, jax_core.Literal)}
    kept = []
    for eqn in reversed(eqns):
        if eqn.effects or any(v in needed for v in eqn.outvars):
            kept.append(eqn)
            needed.update(v for v in eqn.invars if not isinstance(v, jax_core.Literal))
    return kept[::-1]


def part_of_trace(traced: Any, part: Callable[[Any], Any], **kwargs: Any) -> Any:
    """``part`` of a jitted function's outputs (``part`` picks it from their tree) as a
    jitted function of the same arguments, bound from ``traced`` (that function's
    ``.trace(...)``) with only the equations it needs: the function is not traced
    again (PaddleOCR's classifier's training step: 2.6 s a trace). ``kwargs``: as
    :func:`jit_graph`'s."""
    leaves, tree = jax.tree.flatten(traced.out_info)
    wanted, wanted_tree = jax.tree.flatten(part(jax.tree.unflatten(tree, range(len(leaves)))))

    def fn(*args: Any) -> Any:
        outs = inline_jaxpr(traced.jaxpr, *jax.tree.leaves(args), calls=False, outputs=wanted)
        return jax.tree.unflatten(wanted_tree, outs)

    return jit_graph(fn, flat=False, **kwargs)


def is_default(device: jax.Device) -> bool:
    """Whether a jitted call puts host arrays on ``device`` (no default device is set)."""
    return getattr(jax.config, "jax_default_device", None) is None and device == jax.devices()[0]


# XLA options of the graphs compiled here, on the CPU: LLVM's optimization level 1
# instead of the default. Measured on the real exports (tests/support/real_models.py): the
# first training step's XLA compile took 25% less (PaddleOCR's classifier 12.0 to 9.1 s,
# the CRNN 5.5 to 4.7 s) and the steps and forwards ran as fast (within the noise of
# a few percent); at level 0 the steps ran 2-3x slower. Other JAX code of the process
# keeps its own options.
CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}


def jit_graph(fn: Any, *, flat: bool = True, **kwargs: Any) -> Any:
    """``jax.jit`` of a graph's function (``flattened`` unless ``flat=False``), with
    CPU_COMPILER_OPTIONS where JAX's default backend is the CPU."""
    options = CPU_COMPILER_OPTIONS if jax.default_backend() == "cpu" else None
    return jax.jit(flattened(fn) if flat else fn, compiler_options=options, **kwargs)


# XLA:CPU hands a loop of more than 512 KB read and written to a second thread (its
# "cpu-parallel-task-assigner" pass); in a graph whose values are all small, waking that
# thread costs more than it saves. A graph's run whose largest value (``largest_value``)
# holds at most SMALL_GRAPH_BYTES is therefore compiled without that pass. Measured in
# one process against the pass kept: PaddleOCR's classifier at batch 1 (largest value
# 0.24 MB) took 0.82-0.84x the time, MTCNN onet (0.48 MB) 0.90x, rnet at batch 8 (0.62 MB)
# 0.95x, rnet at batch 1 the same. Larger graphs ran slower without it: magika at batch 1
# (2.5 MB) 1.29x, the CRNN (1.35 MB) 1.05x, the classifier at batch 8 (1.9 MB) 1.05x,
# onet at batch 8 (3.9 MB) 1.12x.
SMALL_GRAPH_BYTES = 1 << 20
SMALL_GRAPH_OPTIONS = {"xla_disable_hlo_passes": "cpu-parallel-task-assigner"}


class SizedJit:
    """A graph's run (``Runner._compiled``'s ``run(buffers, own, p_buffers,
    p_own)``) jitted as ``jit_graph`` does, and on the CPU compiled with
    SMALL_GRAPH_OPTIONS added for each shape of its arguments where none of the values it
    computes exceeds SMALL_GRAPH_BYTES. The choice reads the trace that the compilation
    uses anyway (the two jitted functions share JAX's trace of ``fn``)."""

    def __init__(self, fn: Any) -> None:
        flat = flattened(fn)
        self._default = jit_graph(flat, flat=False)
        self._small = self._default
        if jax.default_backend() == "cpu":
            options = {**CPU_COMPILER_OPTIONS, **SMALL_GRAPH_OPTIONS}
            self._small = jax.jit(flat, compiler_options=options)
        self._chosen: dict[Any, Any] = {}

    def __call__(self, *args: Any) -> Any:
        return self._for(args)(*args)

    def _for(self, args: tuple[Any, ...]) -> Any:
        """The jitted function for these arguments (the packed ones' shapes are fixed: the
        layout that keys this function holds them; the others', ``args[1]``, are not: the
        choice is made once for each of their structures, shapes and dtypes)."""
        if self._small is self._default:
            return self._default
        leaves, tree = jax.tree.flatten(args[1])
        key = (tree, tuple((np.shape(leaf), getattr(leaf, "dtype", None)) for leaf in leaves))
        jitted = self._chosen.get(key)
        if jitted is None:
            jaxpr = self._default.trace(*args).jaxpr
            jitted = self._small if largest_value(jaxpr) <= SMALL_GRAPH_BYTES else self._default
            self._chosen[key] = jitted
        return jitted

    def trace(self, *args: Any) -> Any:
        return self._default.trace(*args)

    def lower(self, *args: Any) -> Any:
        return self._for(args).lower(*args)

    def cache_size(self) -> int:
        """How many compilations its jitted functions hold."""
        jitted = {id(j): j for j in (self._default, self._small)}
        return sum(j._cache_size() for j in jitted.values())


def largest_value(jaxpr: Any) -> int:
    """The bytes of the largest value a (closed) jaxpr computes, its bodies' included (not
    its inputs: a model's weights are read by its products, not by the loops that XLA
    partitions)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)

    def size(var: Any) -> int:
        shape = getattr(var.aval, "shape", None)
        itemsize = getattr(getattr(var.aval, "dtype", None), "itemsize", None)
        return math.prod(shape) * itemsize if shape is not None and itemsize else 0

    largest = 0
    for eqn in jaxpr.eqns:
        largest = max([largest, *map(size, eqn.outvars)])
        for param in eqn.params.values():
            for body in param if isinstance(param, list | tuple) else [param]:
                if hasattr(body, "eqns") or hasattr(getattr(body, "jaxpr", None), "eqns"):
                    largest = max(largest, largest_value(body))
    return largest


def flattened(fn: Any) -> Any:
    """``fn`` traced, then re-emitted with every call inlined, for a compiled graph.

    The op functions call jax.numpy and jax.nn, whose jitted helpers (Relu's
    custom_jvp around a jit, norms, ...) lower to one MLIR function call per
    node; XLA then inlines them one by one, which cost more than the rest of
    its compile for a 20,000-node chain. Nothing differentiates the compiled
    graph itself (Gradient nodes are already transposed inside the trace), so
    the custom derivative rules are not needed there.
    """

    def flat(*args: Any) -> Any:
        with paused_gc():
            closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
            outs = inline_jaxpr(closed, *jax.tree.leaves(args))
        return jax.tree.unflatten(jax.tree.structure(shape), outs)

    return flat


def abstract(value: Any) -> Any:
    """A value's shape and the dtype JAX gives it, as a jitted function's trace sees it."""
    if isinstance(value, jax.ShapeDtypeStruct):
        return value
    return jax.ShapeDtypeStruct(np.shape(value), jax.dtypes.canonicalize_dtype(value.dtype))
