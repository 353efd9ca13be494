"""How a TensorProto's storage is read: the entries of each field against its dims.

A tensor keeps its values in ``raw_data`` or in the field of its type
(``int32_data`` for the small and packed types, two int4 values to an entry);
either must hold exactly what the dims need, and a float type kept in
``int32_data`` no more bits than it has. onnxruntime refuses the same tensors
("data field count (3) does not match expected count", "data overflow");
what it reads by wrapping (an int8 of 300) is read alike.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax._src.onnx_tensors import read_tensor  # noqa: E402
from tests.support.builders import onnxruntime_outputs as onnxruntime_run  # noqa: E402

PACKED = ["INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2"]
IN_ORT = {"INT4", "UINT4", "FLOAT4E2M1"}  # the packed types onnxruntime's Cast reads


def tensor(data_type: int, dims: list[int], **fields: list[int] | bytes) -> TensorProto:
    t = TensorProto(name="w", data_type=data_type, dims=dims)
    for name, values in fields.items():
        if name == "raw_data":
            t.raw_data = values
        else:
            getattr(t, name).extend(values)
    return t


def cast_model(t: TensorProto) -> onnx.ModelProto:
    """Cast(w) to float, w an initializer of one axis."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["w"], ["y"], to=TensorProto.FLOAT, name="c")],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(t.dims))],
        initializer=[t],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def packed(name: str, values: int) -> TensorProto:
    """A packed tensor of ``values`` elements, as onnx.helper stores it (int32_data)."""
    vals = [0.5] * values if name.startswith("FLOAT") else [1] * values
    return helper.make_tensor("w", getattr(TensorProto, name), [values], vals)


@pytest.mark.parametrize("name", PACKED)
def test_packed_int32_data_of_more_entries_than_the_dims_need_is_refused(name: str) -> None:
    t = packed(name, 3)
    t.int32_data.append(7)  # one entry more than [3] needs
    if name in IN_ORT:
        with pytest.raises(Exception, match=r"does not match"):  # onnxruntime's own types
            onnxruntime_run(cast_model(t))
    pattern = rf"tensor 'w': int32_data holds {len(t.int32_data)} entries, but dims \[3\] of"
    with pytest.raises(ValueError, match=pattern):
        read_tensor(t, "here")
    if name in IN_ORT:
        with pytest.raises(ValueError, match=pattern):
            backend.prepare(cast_model(t))


@pytest.mark.parametrize("name", PACKED)
def test_packed_int32_data_of_fewer_entries_than_the_dims_need_is_refused(name: str) -> None:
    t = packed(name, 5)
    del t.int32_data[-1]
    with pytest.raises(
        ValueError, match=r"tensor 'w': int32_data holds \d entries, but dims \[5\]"
    ):
        read_tensor(t, "here")


@pytest.mark.parametrize("name", PACKED)
def test_packed_values_in_another_field_are_refused(name: str) -> None:
    t = tensor(getattr(TensorProto, name), [2], int64_data=[1])
    if name in IN_ORT:
        with pytest.raises(Exception):  # noqa: B017 - onnxruntime's own types
            onnxruntime_run(cast_model(t))
    with pytest.raises(ValueError, match=r"tensor 'w': holds its values in int64_data"):
        read_tensor(t, "here")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("FLOAT16", 70000),
        ("FLOAT16", -1),
        ("BFLOAT16", 70000),
        ("FLOAT8E4M3FN", 300),
        ("FLOAT8E5M2", -1),
        ("FLOAT4E2M1", 300),
    ],
)
def test_float_bits_beyond_their_type_in_int32_data_are_refused(name: str, value: int) -> None:
    t = helper.make_tensor("w", getattr(TensorProto, name), [3], [0.5, 1.0, 1.5])
    t.int32_data[-1] = value
    with pytest.raises(Exception, match=r"data overflow"):  # onnxruntime's own types
        onnxruntime_run(cast_model(t))
    pattern = rf"tensor 'w': int32_data holds {value}, beyond the \d+ bits of"
    with pytest.raises(ValueError, match=pattern):
        backend.prepare(cast_model(t))


@pytest.mark.parametrize(
    ("name", "entries"),
    [("INT4", [33, 300]), ("INT4", [33, -1]), ("UINT4", [33, 255]), ("INT8", [1, 300, 200])],
)
def test_integers_onnxruntime_wraps_are_read_as_it_reads_them(
    name: str, entries: list[int]
) -> None:
    count = 3 if name.endswith("4") else len(entries)
    model = cast_model(tensor(getattr(TensorProto, name), [count], int32_data=entries))
    (want,) = onnxruntime_run(model)
    (got,) = backend.prepare(model).run({})
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", PACKED)
def test_packed_raw_data_of_another_length_is_still_refused(name: str) -> None:
    t = tensor(getattr(TensorProto, name), [3], raw_data=b"\x11\x01\x00")
    with pytest.raises(ValueError, match=r"tensor 'w': raw_data holds 3 bytes"):
        read_tensor(t, "here")
