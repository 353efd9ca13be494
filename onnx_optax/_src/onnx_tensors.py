"""Values from a stranger's model on their way into JAX (``read_tensor`` needs ``onnx``).

Every tensor a graph carries (initializers, Constant ``value``, ConstantOfShape
``value``, any other tensor attribute) is read by :func:`read_tensor`, the one
place that turns a ``TensorProto`` into an array. It refuses external data (not
loaded here), checks the byte count of ``raw_data`` against ``dims`` and the
data type before converting, or else the field of the type (``int32_data`` for
the small and packed types): exactly the entries the dims need, none in another
field, and no float type's entry beyond its bits, as onnxruntime requires. It
refuses types XLA does not run.

Host values stay numpy while a graph is traced (shape arithmetic in int64 is
exact); :func:`refuse_narrowing` is the one check made where such a value
becomes a JAX array, so an int64 beyond int32 is refused alike whether it came
from an initializer, a Constant, a tensor attribute or a feed.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from onnx_optax._src.checks import refuse_truncation

# Element types whose values a JAX array cannot hold.
_REFUSED = {
    "STRING": "string tensors",
    "UNDEFINED": "an undefined element type",
}
# What to do about a string tensor (a class label, a category), which XLA cannot hold.
STRINGS_ADVICE = (
    "XLA computes numbers only, so onnx_optax runs no string tensor; keep the labels numeric "
    "(for a scikit-learn classifier: fit it on integer class labels, e.g. "
    "LabelEncoder().fit_transform(y), and map the predicted integers back to names on the host)"
)
# Types packed below one byte per element in raw_data: bits per element.
_PACKED_BITS = {"UINT4": 4, "INT4": 4, "FLOAT4E2M1": 4, "UINT2": 2, "INT2": 2}
# The fields a TensorProto may keep its values in, besides raw_data.
_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")
# Float types kept in int32_data as their bits: how many bits an entry may hold (a packed
# FLOAT4E2M1 entry is a byte of two). onnxruntime refuses more ("data overflow").
_FLOAT_BITS = {"FLOAT16": 16, "BFLOAT16": 16, "FLOAT4E2M1": 8}


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


def refuse_narrowing(what: str, array: np.ndarray) -> None:
    """Refuses a host value that JAX cannot hold, or that 32-bit JAX would silently narrow.

    Strings and objects are no tensors XLA computes. Without ``jax_enable_x64``
    JAX holds int64 as int32, uint64 as uint32, float64 as float32 and
    complex128 as complex64: values beyond the narrow type, and 64-bit float
    tensors, are refused with the hint to enable 64-bit JAX.
    """
    dtype = np.dtype(array.dtype)
    if dtype.kind in "OSUMm" or dtype.fields is not None:  # bfloat16 & co. are kind "V"
        raise TypeError(
            f"{what} has dtype {dtype}, which is not a numeric tensor; onnx_optax computes "
            "numeric and boolean tensors only"
        )
    if jax.config.read("jax_enable_x64"):
        return
    refuse_truncation(what, array)  # float64 tensors, int64 beyond int32
    hint = "enable 64-bit JAX (jax.config.update('jax_enable_x64', True))"
    if dtype == np.uint64 and array.size and np.max(array) > np.iinfo(np.uint32).max:
        raise ValueError(f"{what} holds uint64 values beyond uint32; {hint}")
    if dtype == np.complex128 and np.ndim(array):
        raise TypeError(f"{what} is complex128, which 32-bit JAX computes as complex64; {hint}")


def utf8(value: bytes, what: str) -> str:
    """A string attribute's bytes as text; a clear error naming ``what`` if they are not UTF-8."""
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise ValueError(
            f"{what} {value[:60]!r} is not valid UTF-8; ONNX names and strings are UTF-8 text"
        ) from None


def raw_byte_count(data_type: int, count: int, dtype: np.dtype) -> int:
    """Bytes that ``count`` elements of ONNX type ``data_type`` take as raw (or external) data.

    Types below a byte per element (INT4, UINT4, FLOAT4E2M1, INT2, UINT2) are
    packed, the last byte padded.
    """
    import onnx

    bits = _PACKED_BITS.get(onnx.TensorProto.DataType.Name(data_type), 8 * dtype.itemsize)
    return (count * bits + 7) // 8


def _check_field(tensor: Any, label: str, dims: tuple[int, ...], dtype: np.dtype) -> None:
    """The values kept outside raw_data: in the field of the tensor's type, exactly as many
    entries as the dims need (packed types: a byte an entry), each within the type's bits.

    onnxruntime refuses the same ("data field count does not match", "data overflow").
    """
    import onnx
    from onnx import helper

    name = onnx.TensorProto.DataType.Name(tensor.data_type)
    field = helper.tensor_dtype_to_field(tensor.data_type)
    stray = next((f for f in _FIELDS if f != field and len(getattr(tensor, f))), None)
    if stray is not None:
        raise ValueError(
            f"{label}: holds its values in {stray}; a {name} tensor keeps them in {field} "
            "(or raw_data)"
        )
    count = math.prod(dims)
    if name in _PACKED_BITS:
        expected = raw_byte_count(tensor.data_type, count, dtype)
        how = f" ({8 // _PACKED_BITS[name]} values to an entry)"
    else:
        expected, how = count * (2 if name.startswith("COMPLEX") else 1), ""
    entries = getattr(tensor, field)
    if len(entries) != expected:
        raise ValueError(
            f"{label}: {field} holds {len(entries)} entries, but dims {list(dims)} of {name} "
            f"need {expected}{how}"
        )
    bits = _FLOAT_BITS.get(name, 8 if name.startswith("FLOAT8") else 0)
    if bits and expected:
        values = np.asarray(entries, np.int64)
        outside = values[(values < 0) | (values >= 2**bits)]
        if outside.size:
            raise ValueError(
                f"{label}: int32_data holds {int(outside[0])}, beyond the {bits} bits of "
                f"{'a byte of ' if name in _PACKED_BITS else 'a '}{name}"
            )


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
        expected = raw_byte_count(tensor.data_type, count, dtype)
        if len(tensor.raw_data) != expected:
            raise ValueError(
                f"{label}: raw_data holds {len(tensor.raw_data)} bytes, but dims {list(dims)} of "
                f"{dtype} need {expected}"
            )
    else:
        _check_field(tensor, label, dims, dtype)
    try:
        array = np.asarray(numpy_helper.to_array(tensor))
    except (ValueError, TypeError) as error:
        raise ValueError(f"{label} cannot be read: {error}") from None
    if array.shape != dims:
        raise ValueError(f"{label} holds {array.size} values for dims {list(dims)}")
    return array
