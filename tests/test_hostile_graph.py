"""Hostile and malformed models against the loading layer, the graph runtime and the backend.

Each test is one finding of the audit of issue 14: what a stranger's model did
to ``backend.prepare``/``run`` and ``backend.run_node``, and the clear refusal
(or the modest run) expected instead.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_optax import backend, training  # noqa: E402
from tests import oracle  # noqa: E402

DOMAIN = "ai.onnx.preview.training"
F32, I64 = TensorProto.FLOAT, TensorProto.INT64
BIG = 2**32 + 7  # an int64 that int32 cannot hold: 32-bit JAX would make it 7
X64_HINT = r"jax\.config\.update\('jax_enable_x64', True\)"


def _model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
    training: Sequence[onnx.TrainingInfoProto] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)],
    )
    model.training_info.extend(training)
    return model


def _vi(name: str, elem: int, shape: list[int] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


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


def test_int64_shape_arithmetic_stays_exact_under_32_bit_jax() -> None:
    """INT64_MAX as Slice's end ("to the end", as exporters write it) is no error."""
    end = helper.make_tensor("end", I64, [1], [2**63 - 1])
    model = _model(
        [
            helper.make_node("Constant", [], ["start"], value_ints=[1]),
            helper.make_node("Slice", ["x", "start", "end"], ["y"]),
        ],
        [_vi("x", F32, [4])],
        [_vi("y", F32, [3])],
        [end],
    )
    (y,) = backend.prepare(model).run([np.arange(4, dtype=np.float32)])
    np.testing.assert_array_equal(y, [1.0, 2.0, 3.0])
    fed = _model(
        [helper.make_node("Slice", ["x", "start", "end"], ["y"])],
        [_vi("x", F32, [4]), _vi("start", I64, [1]), _vi("end", I64, [1])],
        [_vi("y", F32, [3])],
    )
    x, start, end_value = np.arange(4, dtype=np.float32), np.array([1]), np.array([2**63 - 1])
    (y,) = backend.prepare(fed).run([x, start, end_value])  # fed, read as a shape
    np.testing.assert_array_equal(y, [1.0, 2.0, 3.0])
    const = helper.make_tensor("c", I64, [1], [BIG])
    refused = _model([helper.make_node("Constant", [], ["y"], value=const, name="big")], [], [])
    refused.graph.output.append(_vi("y", I64, [1]))
    with pytest.raises(ValueError, match=r"graph output 'y' of node 'big' \(ai.onnx.Constant\)"):
        backend.prepare(refused).run([])


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


# ----------------------------------------------------------------------------- 4. large nodes

N_TENSORS = 5000
ADAM = {"alpha": 0.9, "beta": 0.999, "epsilon": 1e-6, "norm_coefficient": 0.01}


def _adam_inputs(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = [(1 + i % 5,) if i % 3 else (2, 1 + i % 2) for i in range(n)]
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    gs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    vs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    hs = [rng.uniform(0.5, 1.5, s).astype(np.float32) for s in shapes]  # well conditioned
    return [np.float32(0.05), np.int64(3), *xs, *gs, *vs, *hs]


_LARGE_NODE = """
import json, resource, sys
import numpy as np
from onnx import helper
from onnx_optax import backend

resource.setrlimit(resource.RLIMIT_DATA, (4 * 2**30, 4 * 2**30))  # the audit's 4 GB cap
folder, attributes = sys.argv[1], json.loads(sys.argv[2])
with np.load(f"{folder}/inputs.npz") as saved:
    values = [saved[f"arr_{k}"] for k in range(len(saved.files))]
n = (len(values) - 2) // 4
inputs = ["R", "T"] + [f"{g}{i}" for g in "xgvh" for i in range(n)]
outputs = [f"{g}{i}.new" for g in "xvh" for i in range(n)]
node = helper.make_node("Adam", inputs, outputs, domain="ai.onnx.preview.training", **attributes)
np.savez(f"{folder}/outputs.npz", *backend.run_node(node, values))
print(json.dumps({"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def test_an_optimizer_node_with_thousands_of_tensors_runs_in_modest_memory(tmp_path: Path) -> None:
    """5,000 tensors, run in a fresh process under a 4 GB data limit; checked with the oracle."""
    values = _adam_inputs(N_TENSORS)
    np.savez(tmp_path / "inputs.npz", *values)
    root = Path(__file__).parent.parent
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_LARGE_NODE), str(tmp_path), json.dumps(ADAM)],
        cwd=root,
        env={"PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    peak = json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_mib"]
    assert peak < 2048, f"peak RSS {peak:.0f} MiB"
    with np.load(tmp_path / "outputs.npz") as saved:
        results = [saved[f"arr_{k}"] for k in range(len(saved.files))]
    R, T, *tensors = values
    n = N_TENSORS
    assert len(results) == 3 * n
    tolerance = 16 * float(np.finfo(np.float32).eps)  # as tests/optimizers.py, one step
    for i in range(n):
        x, g, v, h = tensors[i], tensors[n + i], tensors[2 * n + i], tensors[3 * n + i]
        expected = oracle.adam(float(R), int(T), x, g, v, h, norm_coefficient_post=0.0, **ADAM)
        for k, want in enumerate(expected):
            got = results[k * n + i]
            assert got.shape == x.shape and got.dtype == np.float32
            np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


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


# ----------------------------------------------------------------------------- 6. fuzzer findings

OPSET21 = [helper.make_opsetid("", 21)]
LIMIT_HINT = r"limits=Limits\(tensor_bytes=\.\.\.\)"


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(value, name))


def _graph_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers)
    return helper.make_model(graph, opset_imports=OPSET21)


def test_the_default_domain_may_be_spelled_ai_onnx() -> None:
    # F2: "ai.onnx" is the default domain's other name; its schema lookup raised SchemaError.
    x = np.array([-1.0, 2.0], np.float32)
    node = helper.make_node("Relu", ["x"], ["y"], domain="ai.onnx")
    (y,) = backend.run_node(node, [x])
    np.testing.assert_array_equal(y, np.maximum(x, 0.0))


def test_constant_of_shape_without_value_fills_float32_zeros() -> None:
    # F4: the default value (a float32 zero) raised IndexError.
    node = helper.make_node("ConstantOfShape", ["shape"], ["y"])
    shape = np.array([2, 3], np.int64)
    (y,) = backend.run_node(node, [shape])
    model = _graph_model([_constant("shape", shape), node], [], [_vi("y", F32, [2, 3])])
    from onnx.reference import ReferenceEvaluator

    (want,) = ReferenceEvaluator(model).run(None, {})
    assert y.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(y, want)
    many = onnx.numpy_helper.from_array(np.ones(2, np.float32), "value")
    wrong = helper.make_node("ConstantOfShape", ["shape"], ["y"], value=many)
    with pytest.raises(ValueError, match=r"ConstantOfShape.*'value' must hold one element, got 2"):
        backend.run_node(wrong, [shape])


def _range_model(limit: float) -> onnx.ModelProto:
    nodes = [
        _constant("start", np.array(0.0, np.float32)),
        _constant("limit", np.array(limit, np.float32)),
        _constant("delta", np.array(1.0, np.float32)),
        helper.make_node("Range", ["start", "limit", "delta"], ["y"], name="r"),
    ]
    return _graph_model(nodes, [], [_vi("y", F32, ["n"])])


@pytest.mark.parametrize("limit", [np.inf, -np.inf, np.nan])
def test_range_with_a_limit_that_is_not_finite_is_refused(limit: float) -> None:
    # F5: an infinite limit raised OverflowError.
    with pytest.raises(
        ValueError, match=r"node 'r' \(ai\.onnx\.Range\).*no finite number of elements"
    ):
        backend.prepare(_range_model(limit)).run([])


def _outcome(script: str) -> str:
    """Runs ``script`` in a fresh interpreter under a 4 GB data limit.

    A hang, an abort or a huge allocation (before the fixes) must not take pytest down.
    """
    root = Path(__file__).parent.parent
    limit = "import resource; resource.setrlimit(resource.RLIMIT_DATA, (4 << 30, 4 << 30))\n"
    done = subprocess.run(
        [sys.executable, "-c", limit + textwrap.dedent(script)],
        cwd=root,
        env={"PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_range_larger_than_the_tensor_limit_is_refused_before_allocating() -> None:
    # F6: limit 3e9 allocated 22 GiB (MemoryError, or the machine swapping).
    script = """
        import numpy as np
        from onnx_optax import backend
        from tests.test_hostile_graph import _range_model

        try:
            backend.prepare(_range_model(3e9)).run([])
            print("RESULT ran")
        except ValueError as error:
            print("RESULT ValueError", error)
    """
    found = _outcome(script)
    assert re.search(rf"RESULT ValueError .*node 'r' \(ai\.onnx\.Range\).*{LIMIT_HINT}", found)
    (y,) = backend.prepare(_range_model(5.0)).run([])
    np.testing.assert_array_equal(y, np.arange(5, dtype=np.float32))


def _expand_sum_script(shape: list[int], symbolic_input: bool, constants: bool) -> str:
    """A script running Expand(ones(1), shape) -> ReduceSum, printing the outcome.

    With ``constants`` x and shape are Constant nodes (host values, folded while tracing).
    """
    return textwrap.dedent(
        f"""
        import numpy as np
        from onnx import TensorProto, helper, numpy_helper
        from onnx_optax import backend

        nodes = [
            helper.make_node("Expand", ["x", "shape"], ["e"], name="grow"),
            helper.make_node("ReduceSum", ["e"], ["s"], keepdims=0),
        ]
        inputs, outputs = [], [helper.make_tensor_value_info("s", TensorProto.FLOAT, [])]
        if {symbolic_input}:
            nodes.append(helper.make_node("Relu", ["n"], ["y"]))
            inputs = [helper.make_tensor_value_info("n", TensorProto.FLOAT, ["N"])]
            outputs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"]))
        inits = [
            numpy_helper.from_array(np.ones(1, np.float32), "x"),
            numpy_helper.from_array(np.array({shape}, np.int64), "shape"),
        ]
        if {constants}:
            nodes[:0] = [helper.make_node("Constant", [], [t.name], value=t) for t in inits]
            inits = []
        graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        try:
            rep = backend.prepare(model)
            rep.run([np.ones(2, np.float32)] if {symbolic_input} else [])
            print("RESULT ran")
        except ValueError as error:
            print("RESULT ValueError", error)
        """
    )


@pytest.mark.parametrize(
    ("shape", "symbolic_input", "constants"),
    [([2**20, 2**20], False, False), ([2**20, 2**20], False, True), ([2**62], True, False)],
    ids=["hang-folding-2**40", "hang-folding-constants", "xla-abort-2**62"],
)
def test_an_expanded_shape_over_the_limit_is_refused_quickly(
    shape: list[int], symbolic_input: bool, constants: bool
) -> None:
    # F9: folding ReduceSum over a broadcast view of 2**40 elements ran for hours;
    # F10: a shape of 2**62 elements reached XLA, which aborted the process.
    found = _outcome(_expand_sum_script(shape, symbolic_input, constants))
    assert re.search(
        rf"RESULT ValueError .*node 'grow' \(ai\.onnx\.Expand\).*over the limit.*{LIMIT_HINT}",
        found,
    )


def test_an_omitted_required_input_is_refused_with_its_position() -> None:
    # F11: MatMul with an empty first input raised AttributeError on None.shape.
    node = helper.make_node("MatMul", ["", "w"], ["y"], name="mm")
    with pytest.raises(
        ValueError, match=r"node 'mm' \(ai\.onnx\.MatMul\).*input 0 is omitted.*optional"
    ):
        backend.run_node(node, [np.ones((2, 2), np.float32)])
    # An optional input may still be left out: Clip without min.
    x = np.array([-2.0, 0.5, 3.0], np.float32)
    clip = helper.make_node("Clip", ["x", "", "high"], ["y"])
    (y,) = backend.run_node(clip, [x, np.array(1.0, np.float32)])
    np.testing.assert_array_equal(y, np.minimum(x, 1.0))


def test_feed_names_that_are_not_str_are_refused() -> None:
    # Mixed bytes and str feed names gave "Comparator raised exception while sorting".
    model = _graph_model(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        [_vi("a", F32, [2]), _vi("b", F32, [2])],
        [_vi("y", F32, [2])],
    )
    feeds = {"a": np.ones(2, np.float32), b"b": np.ones(2, np.float32)}
    with pytest.raises(TypeError, match=r"input names must be str, got \[b'b'\]"):
        backend.prepare(model).run(feeds)


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


def test_a_graph_the_device_memory_cannot_hold_is_a_value_error() -> None:
    # The fuzzer (4 GiB address space): an 8 GiB ConstantOfShape under the 16 GiB limit
    # ended in jax's RESOURCE_EXHAUSTED JaxRuntimeError.
    script = """
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        import numpy as np
        from onnx import helper
        from onnx_optax import backend

        node = helper.make_node("ConstantOfShape", ["shape"], ["y"])
        try:
            backend.run_node(node, [np.array([2**31], np.int64)])
            print("RESULT ran")
        except ValueError as error:
            print("RESULT ValueError", error)
    """
    found = _outcome(script)
    assert re.search(r"RESULT ValueError .*does not fit in the device's memory", found), found


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
