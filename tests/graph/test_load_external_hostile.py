"""Models from strangers: nothing is read from outside the model, nothing comes back silently."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

from onnx_optax import backend, interop  # noqa: E402
from tests.support.external_data import (  # noqa: E402
    CANARY,
    canary_cwd,  # noqa: F401 (fixtures)
)
from tests.support.external_data import make_external as _external  # noqa: E402
from tests.support.external_data import trained_model as _trained_model  # noqa: E402


@pytest.mark.usefixtures("canary_cwd")
def test_from_model_does_not_read_external_data_from_the_working_directory() -> None:
    model = _trained_model()
    (r,) = [t for t in model.graph.initializer if t.name == "R"]
    _external(r, "canary.bin")
    with pytest.raises(ValueError, match="no folder to read external data from") as info:
        interop.from_model(model)
    assert "CANARY" not in str(info.value)


@pytest.mark.usefixtures("canary_cwd")
def test_prepare_does_not_read_external_data_from_the_working_directory() -> None:
    weight = helper.make_tensor("w", onnx.TensorProto.FLOAT, [4], [0.0] * 4)
    _external(weight, "canary.bin")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "leak",
        [],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])],
        initializer=[weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(ValueError, match="no folder to read external data from") as info:
        backend.prepare(model).run([])
    assert "CANARY" not in str(info.value)


def test_raw_data_longer_than_dims_is_refused() -> None:
    tensor = helper.make_tensor("w", onnx.TensorProto.FLOAT, [2], [1.0, 2.0])
    tensor.raw_data = np.arange(4, dtype=np.float32).tobytes()
    tensor.ClearField("float_data")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "long",
        [],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
        initializer=[tensor],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(ValueError, match="tensor 'w'"):
        backend.prepare(model)


def _saved_with_external_weight(folder: Path, location: str) -> Path:
    weight = helper.make_tensor("w", onnx.TensorProto.FLOAT, [4], [0.0] * 4)
    _external(weight, location)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "external",
        [],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])],
        initializer=[weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_external_data_inside_the_folder_is_read(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    path = _saved_with_external_weight(tmp_path, "w.bin")
    (y,) = backend.prepare(str(path)).run([])
    np.testing.assert_array_equal(y, [0.0, 1.0, 2.0, 3.0])


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("../canary.bin", "leaves the model's folder"),
        ("/etc/hostname", "relative path inside the model's folder"),
        ("link/canary.bin", "leaves the model's folder"),
        ("short.bin", "lie outside the file"),
        ("missing.bin", "no such file"),
    ],
)
def test_external_data_outside_or_broken_is_refused(
    tmp_path: Path, location: str, message: str
) -> None:
    (tmp_path / "canary.bin").write_bytes(CANARY)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "link").symlink_to(tmp_path, target_is_directory=True)
    (folder / "short.bin").write_bytes(b"\0" * 8)
    path = _saved_with_external_weight(folder, location)
    with pytest.raises(ValueError, match=message) as info:
        backend.prepare(str(path))
    assert "CANARY" not in str(info.value)


def test_limits_name_the_limit_and_how_to_raise_it() -> None:
    model = _trained_model()
    with pytest.raises(
        ValueError, match=r"limit of 1; raise it with limits=Limits\(nodes=\.\.\.\)"
    ):
        interop.from_model(model, limits=backend.Limits(nodes=1))
    imported = interop.from_model(model, limits=backend.Limits(nodes=10))
    assert imported.T == 0


def test_declared_output_types_are_not_applied_silently() -> None:
    node = helper.make_node(
        "Adagrad", ["R", "T", "X", "G", "H"], ["X_new", "H_new"], domain="ai.onnx.preview.training"
    )
    f32, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    graph = helper.make_graph(
        [node],
        "int8",
        [helper.make_tensor_value_info("R", f32, []), helper.make_tensor_value_info("T", i64, [])]
        + [helper.make_tensor_value_info(n, f32, [3]) for n in ("X", "G", "H")],
        [
            helper.make_tensor_value_info("X_new", onnx.TensorProto.INT8, [3]),
            helper.make_tensor_value_info("H_new", f32, [3]),
        ],
    )
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 21),
            helper.make_opsetid("ai.onnx.preview.training", 1),
        ],
    )
    x = np.full(3, 2.6, np.float32)
    with pytest.raises(TypeError, match="graph output 'X_new' is declared int8"):
        backend.prepare(model).run([np.float32(0.1), np.int64(0), x, x, x])


@pytest.mark.parametrize("op_type", ["Relu", "Adagrad"])
def test_a_repeated_attribute_is_refused(op_type: str) -> None:
    if op_type == "Relu":
        node = helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.1)
        node.attribute.append(helper.make_attribute("alpha", 0.5))
        inputs = [np.ones(2, np.float32)]
    else:
        node = helper.make_node(
            "Adagrad",
            ["R", "T", "X", "G", "H"],
            ["X2", "H2"],
            domain="ai.onnx.preview.training",
            epsilon=1e-6,
        )
        node.attribute.append(helper.make_attribute("epsilon", 0.5))
        x = np.ones(2, np.float32)
        inputs = [np.float32(0.1), np.int64(0), x, x, x]
    with pytest.raises(ValueError, match="given more than once"):
        backend.run_node(node, inputs)


def test_training_info_external_data_is_read_from_the_model_folder_only(tmp_path: Path) -> None:
    """onnx.load leaves training_info's external data unloaded; the loading layer reads it,
    from inside the folder, for every entry point that takes a path."""
    from onnx_optax import training

    model = _trained_model()
    (constant,) = [n for n in model.training_info[0].algorithm.node if n.op_type == "Constant"]
    one = constant.attribute[0].t
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "canary.bin").write_bytes(np.int64(2**40 + 7).tobytes())
    (folder / "one.bin").write_bytes(np.int64(1).tobytes())
    _external(one, "one.bin")
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    assert interop.from_model(str(path)).T == 0
    assert training.check(str(path)) == []
    one.external_data[0].value = "../canary.bin"
    path.write_bytes(model.SerializeToString())
    for read in (interop.from_model, training.check, training.Session, backend.prepare):
        with pytest.raises(ValueError, match="leaves the model's folder") as info:
            read(str(path))
        assert str(2**40 + 7) not in str(info.value)
