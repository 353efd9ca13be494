"""ONNX ``ai.onnx.preview.training`` Adagrad, Adam and Momentum on JAX/XLA.

Each operator comes as an optax ``GradientTransformation`` (:func:`adagrad`,
:func:`adam`, :func:`momentum`, :func:`nesterov`) and as a jitted op with the
exact ONNX signature (:mod:`onnx_optax.ops`), both computed by one formula.
"""

from importlib import metadata as _metadata

from onnx_optax import ops
from onnx_optax._src.adagrad import AdagradState, adagrad
from onnx_optax._src.adam import AdamState, adam
from onnx_optax._src.host_memory import reuse_host_memory
from onnx_optax._src.momentum import MomentumState, momentum, nesterov
from onnx_optax._src.packed import PackedTree

try:
    __version__ = _metadata.version("onnx-optax")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = [
    "AdagradState",
    "AdamState",
    "MomentumState",
    "PackedTree",
    "__version__",
    "adagrad",
    "adam",
    "momentum",
    "nesterov",
    "ops",
    "reuse_host_memory",
]
