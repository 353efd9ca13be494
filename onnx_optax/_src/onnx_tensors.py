"""Reading an ONNX ``TensorProto`` from a stranger's model, safely (needs ``onnx``).

Every tensor a graph carries (initializers, Constant ``value``, ConstantOfShape
``value``, any other tensor attribute) is read by :func:`read_tensor`, the one
place that turns a ``TensorProto`` into an array. It refuses external data (not
loaded here), checks the byte count of ``raw_data`` against ``dims`` and the
data type before converting, and refuses types XLA does not run.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# Element types whose values a JAX array cannot hold.
_REFUSED = {
    "STRING": "string tensors",
    "UNDEFINED": "an undefined element type",
}
# Types packed below one byte per element in raw_data: bits per element.
_PACKED_BITS = {"UINT4": 4, "INT4": 4, "FLOAT4E2M1": 4, "UINT2": 2, "INT2": 2}


# The dtypes of the element types seen so far (a model has thousands of tensors, few types).
_DTYPES: dict[int, np.dtype] = {}


def tensor_dtype(elem_type: int, where: str) -> np.dtype:
    """The numpy dtype of an ONNX element type; a clear error for the types we refuse."""
    if elem_type in _DTYPES:
        return _DTYPES[elem_type]
    import onnx
    from onnx import helper

    try:
        name = onnx.TensorProto.DataType.Name(elem_type)
    except ValueError:
        raise ValueError(f"{where}: unknown ONNX element type {elem_type}") from None
    if name in _REFUSED:
        raise ValueError(f"{where}: element type {name} ({_REFUSED[name]}) is not supported")
    _DTYPES[elem_type] = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    return _DTYPES[elem_type]


def read_tensor(tensor: Any, where: str) -> np.ndarray:
    """A ``TensorProto`` as a numpy array, checked; ``where`` names its owner in errors."""
    import onnx
    from onnx import numpy_helper

    if not isinstance(tensor, onnx.TensorProto):
        raise TypeError(f"{where}: expected an onnx.TensorProto, got {type(tensor).__name__}")
    label = f"{where}: tensor '{tensor.name}'" if tensor.name else f"{where}: tensor"
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        raise ValueError(
            f"{label} keeps its data in an external file, which is not loaded here; load the "
            "model with its external data first (onnx.load(path, load_external_data=True))"
        )
    dtype = tensor_dtype(tensor.data_type, label)
    dims = tuple(tensor.dims)
    if any(d < 0 for d in dims):
        raise ValueError(f"{label} has negative dims {list(dims)}")
    count = math.prod(dims)
    if tensor.HasField("raw_data"):
        name = onnx.TensorProto.DataType.Name(tensor.data_type)
        bits = _PACKED_BITS.get(name, 8 * dtype.itemsize)
        expected = (count * bits + 7) // 8
        if len(tensor.raw_data) != expected:
            raise ValueError(
                f"{label}: raw_data holds {len(tensor.raw_data)} bytes, but dims {list(dims)} of "
                f"{dtype} need {expected}"
            )
    try:
        array = np.asarray(numpy_helper.to_array(tensor))
    except (ValueError, TypeError) as error:
        raise ValueError(f"{label} cannot be read: {error}") from None
    if array.shape != dims:
        raise ValueError(f"{label} holds {array.size} values for dims {list(dims)}")
    return array
