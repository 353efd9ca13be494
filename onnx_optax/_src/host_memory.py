"""Host memory that XLA:CPU reuses from one run to the next instead of faulting in afresh.

XLA:CPU gives each run of a compiled graph one scratch block holding all its
intermediates, allocated with ``malloc`` when the run starts and freed when it ends.
glibc serves a block above its mmap threshold (32 MiB at most by default) with a
fresh ``mmap`` and unmaps it on ``free``, so every run touches new pages: the kernel
faults in and zeroes the whole scratch again. magika's training step at batch 64
has a 941 MB scratch: 230,000 page faults and about 0.3 s of kernel time a step,
which took the step from 0.50 to 0.72 s (``benchmarks/models.py``).

:func:`reuse_host_memory` makes such blocks reusable, on Linux with glibc:

- glibc's mmap threshold is raised to ``MMAP_THRESHOLD`` and its trim threshold to
  ``TRIM_THRESHOLD``, so a freed block stays in the heap and the next run's block is
  carved from the same, already mapped, pages (onnxruntime keeps an arena for the
  same reason);
- runs on the CPU execute on the thread that calls them (JAX's
  ``jax_cpu_enable_async_dispatch`` off), because only that main heap can hold a
  block that large: glibc's per-thread heaps are at most 64 MiB, beyond which they
  ``mmap`` whatever the threshold. Our runs block on their results anyway; other
  JAX computations on the CPU then also run inline instead of being queued.

The price, for the whole process: a freed block up to ``MMAP_THRESHOLD`` (a scratch,
a numpy array) stays in the heap for later allocations instead of returning to the
system, and every JAX computation on the CPU returns once its result is ready. That is
why importing onnx_optax changes nothing: :func:`reuse_host_memory` is an explicit call,
``onnx_optax.reuse_host_memory()``, which the ``onnx-optax`` commands that run graphs (each a
process of its own) and the graph benchmarks make first; a program of yours makes it if it
wants the same.
``ONNX_OPTAX_HOST_MEMORY=system`` turns the call into a no-op (the command's opt-out).
Dispatch can only be chosen before JAX starts its backends (any computation,
``jax.devices()``), so it is left as it is after that, or when
``JAX_CPU_ENABLE_ASYNC_DISPATCH`` is set.
"""

from __future__ import annotations

import ctypes
import os
import platform

import jax

__all__ = ["MMAP_THRESHOLD", "OPT_OUT", "TRIM_THRESHOLD", "reuse_host_memory"]

# Blocks up to 1 GiB come from the heap; up to 2 GiB freed at its top stay mapped.
MMAP_THRESHOLD = 1 << 30
TRIM_THRESHOLD = (1 << 31) - 1  # mallopt takes a C int
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
OPT_OUT = "ONNX_OPTAX_HOST_MEMORY"


def reuse_host_memory() -> bool:
    """Lets XLA:CPU reuse a run's scratch memory in the next run: tunes the whole process.

    Raises glibc's mmap threshold to 1 GiB and its trim threshold to 2 GiB, so a freed
    scratch block stays in the heap for the next run instead of being unmapped and faulted
    in afresh (magika's training step at batch 64: 0.72 to 0.50 s), and turns JAX's
    ``jax_cpu_enable_async_dispatch`` off (runs on the calling thread, whose heap can hold
    such a block) unless JAX's backends have started or ``JAX_CPU_ENABLE_ASYNC_DISPATCH``
    is set. The price: freed blocks up to 1 GiB stay in the process, and CPU computations
    return once ready. Importing onnx_optax never does this; the ``onnx-optax`` commands that
    run graphs and the graph benchmarks call it first. Call it before any JAX computation.

    Returns whether malloc was tuned: False off Linux, without glibc, or when
    ``ONNX_OPTAX_HOST_MEMORY=system``. Calling it again changes nothing more.

    Example:
        >>> import onnx_optax
        >>> isinstance(onnx_optax.reuse_host_memory(), bool)
        True
    """
    if os.environ.get(OPT_OUT, "").strip().lower() == "system":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if not (
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    ):
        return False
    if "JAX_CPU_ENABLE_ASYNC_DISPATCH" not in os.environ and not _backends_started():
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    return True


def _backends_started() -> bool:
    """Whether JAX has created its backends (then the CPU client's dispatch is fixed)."""
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - a JAX without the module: assume started
        return True
    started = getattr(xla_bridge, "backends_are_initialized", None)
    return True if started is None else bool(started())
