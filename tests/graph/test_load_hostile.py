"""Hostile and malformed models against the loading layer, the graph runtime and the backend.

Each test is one finding of the audit of issue 14: what a stranger's model did
to ``backend.prepare``/``run`` and ``backend.run_node``, and the clear refusal
(or the modest run) expected instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import backend, training  # noqa: E402
from tests.support.builders import value_info as _vi  # noqa: E402
from tests.support.graph_models import BIG, DOMAIN, F32, I64  # noqa: E402
from tests.support.graph_models import model_with_training as _model  # noqa: E402

X64_HINT = r"jax\.config\.update\('jax_enable_x64', True\)"


# ----------------------------------------------------------------------------- 1. int64


def _int64_models() -> dict[str, tuple[onnx.ModelProto, list[np.ndarray]]]:
    y1, y2, y0 = [_vi("y", I64, [1])], [_vi("y", I64, [2])], [_vi("y", I64, [])]
    const = helper.make_tensor("c", I64, [1], [BIG])
    shape = helper.make_node("Constant", [], ["s"], value_ints=[2])
    big_shape = helper.make_node("Constant", [], ["s"], value_ints=[70_000])
    fill = helper.make_tensor("v", I64, [1], [BIG])
    x = _vi("x", I64, [1])
    return {
        "Constant value": (
            _model([helper.make_node("Constant", [], ["y"], value=const)], [], y1),
            [],
        ),
        "Constant value_int": (
            _model([helper.make_node("Constant", [], ["y"], value_int=BIG)], [], y0),
            [],
        ),
        "Constant value_ints": (
            _model([helper.make_node("Constant", [], ["y"], value_ints=[BIG])], [], y1),
            [],
        ),
        "small initializer": (
            _model([helper.make_node("Identity", ["c"], ["y"])], [], y1, [const]),
            [],
        ),
        "large initializer": (
            _model(
                [helper.make_node("Identity", ["c"], ["y"])],
                [],
                [_vi("y", I64, [5000])],
                [helper.make_tensor("c", I64, [5000], [BIG] * 5000)],
            ),
            [],
        ),
        "ConstantOfShape value": (
            _model([shape, helper.make_node("ConstantOfShape", ["s"], ["y"], value=fill)], [], y2),
            [],
        ),
        "ConstantOfShape value, large": (
            _model(
                [big_shape, helper.make_node("ConstantOfShape", ["s"], ["y"], value=fill)],
                [],
                [_vi("y", I64, [70_000])],
            ),
            [],
        ),
        "Constant added to a feed": (
            _model(
                [
                    helper.make_node("Constant", [], ["c"], value=const),
                    helper.make_node("Add", ["x", "c"], ["y"]),
                ],
                [x],
                y1,
            ),
            [np.array([1])],
        ),
        "Constant through Abs": (
            _model(
                [
                    helper.make_node("Constant", [], ["c"], value=const),
                    helper.make_node("Abs", ["c"], ["y"]),
                ],
                [],
                y1,
            ),
            [],
        ),
        "feed": (_model([helper.make_node("Identity", ["x"], ["y"])], [x], y1), [np.array([BIG])]),
        "uint64 initializer": (
            _model(
                [helper.make_node("Identity", ["c"], ["y"])],
                [],
                [_vi("y", TensorProto.UINT64, [1])],
                [helper.make_tensor("c", TensorProto.UINT64, [1], [BIG])],
            ),
            [],
        ),
    }


def test_int64_beyond_int32_is_refused_alike_on_every_path() -> None:
    models = _int64_models()
    not_refused = []
    for path, (model, feeds) in models.items():
        try:
            backend.prepare(model).run(feeds)
        except ValueError as error:
            assert re.search(rf"beyond u?int32; enable 64-bit JAX \({X64_HINT}\)", str(error)), (
                f"{path}: {error}"
            )
        else:
            not_refused.append(path)
    assert not not_refused, f"computed in 32 bits, silently: {not_refused}"
    with jax.enable_x64(True):
        for path, (model, feeds) in models.items():
            (y,) = backend.prepare(model).run(feeds)
            expected = BIG + 1 if path == "Constant added to a feed" else BIG
            assert np.all(np.asarray(y) == expected), path


# ----------------------------------------------------------------------------- 2. UTF-8


def _serialized_with(model: onnx.ModelProto, marker: bytes) -> bytes:
    """The model's bytes with ``marker`` made invalid UTF-8 (same length, so lengths hold)."""
    data = model.SerializeToString()
    assert data.count(marker) >= 1
    return data.replace(marker, b"\xff\xfe" + marker[2:])


def _momentum_model(mode: str = "standard", node_name: str = "opt") -> onnx.ModelProto:
    node = helper.make_node(
        "Momentum",
        ["R", "T", "X", "G", "V"],
        ["X_new", "V_new"],
        name=node_name,
        domain=DOMAIN,
        alpha=0.9,
        beta=1.0,
        mode=mode,
        norm_coefficient=0.0,
    )
    inputs = [_vi("R", F32, []), _vi("T", I64, [])] + [_vi(n, F32, [2]) for n in "XGV"]
    return _model([node], inputs, [_vi("X_new", F32, [2]), _vi("V_new", F32, [2])])


@pytest.mark.parametrize(
    ("marker", "model"),
    [
        (b"NODENAME", _momentum_model(node_name="NODENAME")),
        (b"standardMODE", _momentum_model(mode="standardMODE")),
        (
            b"TENSORNAME",
            _model(
                [helper.make_node("Relu", ["TENSORNAME"], ["y"])],
                [_vi("TENSORNAME", F32, [1])],
                [_vi("y", F32, [1])],
            ),
        ),
        (b"GRAPHNAME", _model([], [], [])),
    ],
    ids=["node name", "Momentum mode", "tensor name", "graph name"],
)
def test_names_and_strings_that_are_not_utf8_are_refused(
    marker: bytes, model: onnx.ModelProto
) -> None:
    if marker == b"GRAPHNAME":
        model.graph.name = "GRAPHNAME"
    data = _serialized_with(model, marker)
    with pytest.raises(ValueError, match="is not valid UTF-8") as info:
        backend.prepare(data)
    assert "\\xff\\xfe" in str(info.value)  # the offending bytes are shown


def test_run_node_refuses_a_mode_that_is_not_utf8() -> None:
    node = _momentum_model().graph.node[0]
    node.attribute[2].s = b"stan\xffdard"  # alpha, beta, mode, norm_coefficient
    x = np.ones(2, np.float32)
    with pytest.raises(ValueError, match=r"attribute 'mode' b'stan\\xffdard' is not valid UTF-8"):
        backend.run_node(node, [np.float32(0.1), np.int64(0), x, x, x])


# ----------------------------------------------------------------------------- 3. opaque errors


def _identity_of(tensor: onnx.TensorProto) -> onnx.ModelProto:
    return _model([helper.make_node("Identity", ["w"], ["y"])], [], [_vi("y", F32, [2])], [tensor])


def _spoiled(change: str) -> onnx.TensorProto:
    tensor = helper.make_tensor("w", F32, [2], [1.0, 2.0])
    if change == "data_type":
        tensor.data_type = 999
    elif change == "dims":
        tensor.dims[0] = -2
    else:
        tensor.ClearField("float_data")
        tensor.raw_data = b"\0" * 5
    return tensor


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("data_type", "unknown ONNX element type 999"),
        ("dims", r"negative dims \[-2\]"),
        ("raw_data", r"raw_data size \(5 bytes\)"),
    ],
)
@pytest.mark.parametrize("where", ["initializer", "Constant"])
def test_malformed_tensors_are_refused_with_their_name(
    change: str, message: str, where: str
) -> None:
    tensor = _spoiled(change)
    if where == "initializer":
        model = _identity_of(tensor)
    else:
        model = _model(
            [helper.make_node("Constant", [], ["y"], value=tensor)], [], [_vi("y", F32, [2])]
        )
    with pytest.raises(ValueError, match=message) as info:
        backend.prepare(model).run([])
    assert "'w'" in str(info.value) or "name: w" in str(info.value)


def test_a_declared_element_type_onnx_does_not_know_is_refused() -> None:
    model = _model(
        [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", 999, [2])], [_vi("y", F32, [2])]
    )
    with pytest.raises(
        ValueError, match="graph input 'x' declares an unknown ONNX element type 999"
    ):
        backend.prepare(model)


@pytest.mark.parametrize(
    "value", [np.array(["a", "b"]), "ab", np.array([b"a", b"b"], dtype=object)]
)
def test_a_string_where_a_float_is_needed_is_named(value: object) -> None:
    node = helper.make_node("Adagrad", ["R", "T", "X", "G", "H"], ["X2", "H2"], domain=DOMAIN)
    x = np.ones(2, np.float32)
    with pytest.raises(TypeError, match=r"input 'X' has dtype .*, which is not a numeric tensor"):
        backend.run_node(node, [np.float32(0.1), np.int64(0), value, x, x])
    inputs = [_vi("R", F32, []), _vi("T", I64, [])] + [_vi(n, F32, [2]) for n in "XGH"]
    model = _model([node], inputs, [_vi("X2", F32, [2]), _vi("H2", F32, [2])])
    feeds = {"R": np.float32(0.1), "T": np.int64(0), "X": value, "G": x, "H": x}
    with pytest.raises(TypeError, match=r"input 'X' has dtype .*, which is not a numeric tensor"):
        backend.prepare(model).run(feeds)


# ----------------------------------------------------------------------------- 5. unused data


def _external(tensor: onnx.TensorProto, location: str) -> onnx.TensorProto:
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    return tensor


def _saved(folder: Path, unused_location: str) -> Path:
    """A model reading ``used`` (in used.bin) and carrying ``unused`` it never reads.

    The unused tensor sits in the main graph and in a training algorithm graph.
    """
    used = _external(helper.make_tensor("used", F32, [4], [0.0] * 4), "used.bin")
    unused = _external(helper.make_tensor("unused", F32, [1000], [0.0] * 1000), unused_location)
    spare = _external(helper.make_tensor("spare", F32, [1000], [0.0] * 1000), unused_location)
    algorithm = helper.make_graph(
        [helper.make_node("Identity", ["used"], ["out"])],
        "algorithm",
        [],
        [_vi("out", F32, [4])],
        initializer=[spare],
    )
    info = onnx.TrainingInfoProto(algorithm=algorithm)
    model = _model(
        [helper.make_node("Add", ["x", "used"], ["y"])],
        [_vi("x", F32, [4])],
        [_vi("y", F32, [4])],
        [used, unused],
        training=[info],
    )
    (folder / "used.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("state", ["missing", "truncated"])
def test_unused_external_data_is_never_read(tmp_path: Path, state: str) -> None:
    if state == "truncated":
        (tmp_path / "unused.bin").write_bytes(b"\0" * 8)  # 4,000 bytes declared
    path = _saved(tmp_path, "unused.bin")
    (y,) = backend.prepare(str(path)).run([np.ones(4, np.float32)])
    np.testing.assert_array_equal(y, [1.0, 2.0, 3.0, 4.0])


def test_used_external_data_is_still_read_and_checked(tmp_path: Path) -> None:
    path = _saved(tmp_path, "unused.bin")
    (tmp_path / "used.bin").write_bytes(b"\0" * 8)  # truncated: 16 bytes declared
    with pytest.raises(ValueError, match=r"tensor 'used' .*lie outside the file"):
        backend.prepare(str(path))


@pytest.mark.parametrize("location", ["../outside.bin", "/etc/hostname"])
def test_unused_external_data_outside_the_folder_is_still_refused(
    tmp_path: Path, location: str
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    path = _saved(folder, location)
    with pytest.raises(ValueError, match=r"tensor '(unused|spare)'"):
        backend.prepare(str(path))


# ----------------------------------------------------------------------------- 6. size


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_a_million_nodes_are_refused_and_a_long_chain_under_the_limit_runs() -> None:
    """1M nodes (one node's bytes repeated, merged into the graph) are refused at once.

    A chain of 20,000 nodes, under the limit, is sorted without recursion and runs.
    """
    head = _model([], [_vi("x", F32, [3])], [_vi("x", F32, [3])]).SerializeToString()
    node = helper.make_node("Relu", ["x"], ["y"]).SerializeToString()
    nodes = (b"\x0a" + _varint(len(node)) + node) * 1_000_000  # GraphProto.node = 1
    data = head + b"\x3a" + _varint(len(nodes)) + nodes  # ModelProto.graph = 7
    with pytest.raises(
        ValueError,
        match=r"1000000 nodes, more than the limit of 200000; raise it with "
        r"limits=Limits\(nodes=\.\.\.\)",
    ):
        backend.prepare(data)
    n = 20_000
    chain = [helper.make_node("Identity", [f"t{i}"], [f"t{i + 1}"]) for i in range(n)]
    chain[n // 2] = helper.make_node("Neg", [f"t{n // 2}"], [f"t{n // 2 + 1}"])
    model = _model(chain, [_vi("t0", F32, [3])], [_vi(f"t{n}", F32, [3])])
    (y,) = backend.prepare(model).run([np.array([-1.0, 0.0, 2.5], np.float32)])
    np.testing.assert_array_equal(y, [1.0, -0.0, -2.5])


def test_the_default_domain_may_be_spelled_ai_onnx() -> None:
    # F2: "ai.onnx" is the default domain's other name; its schema lookup raised SchemaError.
    x = np.array([-1.0, 2.0], np.float32)
    node = helper.make_node("Relu", ["x"], ["y"], domain="ai.onnx")
    (y,) = backend.run_node(node, [x])
    np.testing.assert_array_equal(y, np.maximum(x, 0.0))


def test_an_external_location_with_a_nul_character_names_the_tensor(tmp_path: Path) -> None:
    # A location holding "\x00" gave a bare "embedded null byte".
    weight = _external(helper.make_tensor("w", F32, [4], [0.0] * 4), "w\x00.bin")
    model = _model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [_vi("x", F32, [4])],
        [_vi("y", F32, [4])],
        [weight],
    )
    with pytest.raises(ValueError, match=r"tensor 'w' .*NUL character"):
        backend.prepare(model, base_dir=tmp_path)


def test_a_packed_int4_tensor_in_external_data_is_read(tmp_path: Path) -> None:
    """Four INT4 values take two bytes on disk; the size checks count bits, not numpy's int8."""
    values = np.array([1, -2, 3, -4], np.int8)
    packed = bytes([(1 & 0xF) | ((-2 & 0xF) << 4), (3 & 0xF) | ((-4 & 0xF) << 4)])
    (tmp_path / "q.bin").write_bytes(packed)
    tensor = onnx.TensorProto(name="q", data_type=onnx.TensorProto.INT4, dims=[4])
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="q.bin")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["q"], ["y"], to=onnx.TensorProto.FLOAT)],
        "int4",
        [],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])],
        initializer=[tensor],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    (y,) = backend.prepare(str(tmp_path / "m.onnx")).run([])
    np.testing.assert_array_equal(y, values.astype(np.float32))


def test_an_initializer_defined_twice_is_refused_by_name() -> None:
    """Two initializers of one name (onnxruntime warns and keeps the last): refused when
    loaded, on every entry point; Session ended in a KeyError (found by the fuzzer)."""
    w = numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [_vi("x", F32, [2, 2])],
        [_vi("y", F32, [2, 2])],
        [w, w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ValueError, match="graph 'g': the initializer 'w' is defined twice"):
        backend.prepare(model)
    with pytest.raises(ValueError, match="the initializer 'w' is defined twice"):
        training.Session(model)
