"""The ONNX training operators as jitted functional ops with the ONNX signature.

Each op takes ``R, T`` and the variadic tensors in ONNX order and returns the
variadic outputs in ONNX order, computed by the same formula as the matching
optax transformation in :mod:`onnx_optax`.
"""

from onnx_optax._src.adagrad import adagrad_op as adagrad
from onnx_optax._src.adam import adam_op as adam
from onnx_optax._src.momentum import momentum_op as momentum

__all__ = ["adagrad", "adam", "momentum"]
