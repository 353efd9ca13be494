"""A graph's runs reuse their scratch memory (onnx_optax._src.host_memory).

Counted in page faults, not timed: a jitted function whose scratch holds at least
128 MiB (more than the 64 MiB a thread's own glibc heap can hold) runs twelve times
in a fresh interpreter. Once :func:`onnx_optax.reuse_host_memory` is called, most of its last ten runs (the
median; glibc may place a block elsewhere now and then, more often on a busy
machine) must fault in almost nothing. With the opt-out
(``ONNX_OPTAX_HOST_MEMORY=system``) they fault in their whole scratch, which shows
that the check can fail, and so they do with the malloc half alone
(``JAX_CPU_ENABLE_ASYNC_DISPATCH=1``: the runs' own thread allocates). The
interpreter runs without transparent huge pages (which would fault 2 MiB at a time)
and without the caller's malloc tunables.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from onnx_optax._src import host_memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# Two 128 MiB intermediates that XLA cannot fuse away (each kept by a barrier), a scalar out.
_RUNS = """
import ctypes, resource
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: 4 KiB pages, as counted
import jax, jax.numpy as jnp
import onnx_optax
onnx_optax.reuse_host_memory()

@jax.jit
def scratch(x):
    y = jax.lax.optimization_barrier(jnp.tanh(x))
    z = jax.lax.optimization_barrier(y * 2.0)
    return jnp.sum(z) + jnp.sum(y)

x = jnp.ones((1 << 25,), jnp.float32)
faults = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    scratch(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sorted(faults[2:])[5])
"""


def _median_faults(**env: str) -> int:
    dropped = ("JAX_CPU_ENABLE_ASYNC_DISPATCH", "GLIBC_TUNABLES", host_memory.OPT_OUT)
    environment = {
        k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("MALLOC_")
    }
    result = subprocess.run(
        [sys.executable, "-c", _RUNS],
        env={**environment, "JAX_PLATFORMS": "cpu", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return int(result.stdout.split()[-1])


@pytest.mark.skipif(not GLIBC, reason="tunes glibc's malloc: Linux with glibc only")
def test_a_run_reuses_the_scratch_of_the_last() -> None:
    pages = (4 << 25) // 4096  # one 128 MiB intermediate, in 4 KiB pages
    assert _median_faults() < pages // 20
    assert _median_faults(JAX_CPU_ENABLE_ASYNC_DISPATCH="1") > pages // 2
    assert _median_faults(**{host_memory.OPT_OUT: "system"}) > pages // 2


def test_opting_out_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(host_memory.OPT_OUT, "system")
    assert host_memory.reuse_host_memory() is False


_IMPORTS = """
import ctypes, json
calls = []
real = ctypes.CDLL
class Spy:
    def __init__(self, *args, **kwargs):
        self._lib = real(*args, **kwargs)
    def __getattr__(self, name):
        calls.append(name)
        return getattr(self._lib, name)
ctypes.CDLL = Spy
import jax
def flags():
    return {k: jax.config.values[k] for k in sorted(jax.config.values)}
before = flags()
import onnx_optax, onnx_optax.backend, onnx_optax.training, onnx_optax.interop, onnx_optax.cli
after = flags()
changed = sorted(k for k in after if before.get(k) != after[k])
print(json.dumps({"changed": changed, "libc": calls}))
"""


def test_importing_the_package_changes_nothing_in_the_process() -> None:
    """No jax.config flag flips and glibc's malloc is not called (mallopt) on import."""
    environment = {k: v for k, v in os.environ.items() if k != host_memory.OPT_OUT}
    result = subprocess.run(
        [sys.executable, "-c", _IMPORTS],
        env={**environment, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen == {"changed": [], "libc": []}
