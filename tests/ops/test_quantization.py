"""The quantization ops against onnxruntime, where ONNX's node cases (one small input each) stop.

Per tensor, per axis and blocked scales, ties at .5 (rounded half to even), saturation
of every integer type and of float8, the integer kernels with per-row, per-column and
per-channel zero points and scales; refusals naming the node; the straight-through
derivative of QuantizeLinear against its definition written by hand. Few models, many
nodes each: every one is a compile.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import onnx_optax  # noqa: E402
from onnx_optax import backend, training  # noqa: E402
from onnx_optax._src.ops import OPS, Node  # noqa: E402

F32 = TensorProto.FLOAT


def _model(
    nodes: list[Any],
    feeds: dict[str, np.ndarray],
    consts: dict[str, np.ndarray],
    outputs: list[str],
    opset: int = 21,
    out_type: int = TensorProto.UINT8,
) -> Any:
    def info(name: str, value: np.ndarray) -> Any:
        return helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)
        )

    graph = helper.make_graph(
        nodes,
        "g",
        [info(n, v) for n, v in feeds.items()],
        [],
        initializer=[numpy_helper.from_array(v, n) for n, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(model)  # the outputs' types
    found = {v.name: v for v in inferred.graph.value_info}
    del model.graph.output[:]
    model.graph.output.extend(
        found[n] if n in found else helper.make_tensor_value_info(n, out_type, [2, 4])
        for n in outputs  # a model that fails shape inference: the refusals'
    )
    return model


def _agree(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs and onnx_optax's, equal to the bit (dtype included)."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    got = backend.prepare(model).run(feeds)
    for name, g, e in zip([o.name for o in model.graph.output], got, expected, strict=True):
        g = np.asarray(g)
        assert g.dtype == e.dtype and g.shape == e.shape, name
        np.testing.assert_array_equal(g, e, err_msg=name)
    return expected


def test_quantize_dequantize_match_onnxruntime() -> None:
    rng = np.random.default_rng(1)  # each test its own: xdist orders them freely
    # ties at .5 of the scale (half to even), values far past every range (saturation)
    ties = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 1e9, -1e9, 0.0, 126.5, -127.5])
    x = np.concatenate([ties, TRAPS, rng.normal(scale=60, size=24)]).astype(np.float32)
    x = x.reshape(4, 12)
    consts = {
        "one": np.array(1.0, np.float32),
        "z_u8": np.array(3, np.uint8),
        "s_axis": rng.uniform(0.2, 2, size=12).astype(np.float32),
        "z_axis": rng.integers(-20, 20, size=12).astype(np.int8),
        "s_block": rng.uniform(0.2, 2, size=(4, 3)).astype(np.float32),
        "z_block": rng.integers(-5, 5, size=(4, 3)).astype(np.int8),
        "s_rows": rng.uniform(0.01, 0.1, size=4).astype(np.float32),
        "z_i16": rng.integers(-900, 900, size=4).astype(np.int16),
        "z_u16": np.array(30000, np.uint16),
        "z_i4": np.array([1, -2, 0, 7, -8, 3, 2, 1, 0, -1, 4, 5], dtype=np.int8),
        "s_f8": np.array(0.01, np.float32),
    }
    consts["z_i4"] = consts["z_i4"].astype(onnx.helper.tensor_dtype_to_np_dtype(TensorProto.INT4))
    q = lambda name, ins, **kw: helper.make_node("QuantizeLinear", ins, [name], **kw)  # noqa: E731
    dq = lambda name, ins, **kw: helper.make_node("DequantizeLinear", ins, [name], **kw)  # noqa: E731
    nodes = [
        q("q_u8", ["x", "one", "z_u8"]),
        q("q_i8_axis", ["x", "s_axis", "z_axis"], axis=1),
        dq("d_i8_axis", ["q_i8_axis", "s_axis", "z_axis"], axis=1),
        q("q_block", ["x", "s_block", "z_block"], axis=1, block_size=4),
        dq("d_block", ["q_block", "s_block", "z_block"], axis=1, block_size=4),
        q("q_i16", ["x", "s_rows", "z_i16"], axis=0),
        dq("d_i16", ["q_i16", "s_rows", "z_i16"], axis=0),
        q("q_u16", ["x", "s_f8", "z_u16"]),
        q("q_i4", ["x", "s_axis", "z_i4"], axis=-1),
        dq("d_i4", ["q_i4", "s_axis", "z_i4"], axis=-1),
        q("q_default", ["x", "s_f8"]),  # no zero point: uint8
        q("q_f8", ["x", "s_f8"], output_dtype=TensorProto.FLOAT8E4M3FN),
        dq("d_f8", ["q_f8", "s_f8"]),
        q("q_f8_nosat", ["x", "s_f8"], output_dtype=TensorProto.FLOAT8E5M2, saturate=0),
        dq("d_f8_nosat", ["q_f8_nosat", "s_f8"]),
    ]
    outputs = [n.output[0] for n in nodes if n.output[0] not in ("q_i4", "q_f8", "q_f8_nosat")]
    expected = _agree(_model(nodes, {"x": x}, consts, outputs), {"x": x})
    first = expected[0][0]  # q_u8 of the ties: half to even, plus 3, saturated
    np.testing.assert_array_equal(first, [3, 5, 5, 3, 1, 1, 7, 255, 0, 3, 129, 0])


@pytest.mark.parametrize("opset", [10, 13, 19, 23])
def test_older_and_newer_opsets_match_onnxruntime(opset: int) -> None:
    """Opset 10's scalar scale, 13's axis, 19's float8 without saturation, 23's output_dtype."""
    rng = np.random.default_rng(2)  # each test its own: xdist orders them freely
    x = np.concatenate([[0.5, 2.5, -3.5, 1e6], rng.normal(scale=40, size=8)]).astype(np.float32)
    x = x.reshape(3, 4)
    consts = {"s": np.array(0.5, np.float32), "z": np.array(-3, np.int8)}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
    ]
    outputs = ["q", "d"]
    if opset >= 13:
        consts["s4"] = rng.uniform(0.1, 1, size=4).astype(np.float32)
        nodes.append(helper.make_node("QuantizeLinear", ["x", "s4"], ["q4"], axis=-1))
        outputs.append("q4")
    if opset >= 19:
        nodes.append(helper.make_node("QuantizeLinear", ["x", "s", "z8"], ["q8"], saturate=0))
        nodes.append(helper.make_node("DequantizeLinear", ["q8", "s"], ["d8"]))
        consts["z8"] = np.zeros((), helper.tensor_dtype_to_np_dtype(TensorProto.FLOAT8E4M3FNUZ))
        outputs.append("d8")
    if opset >= 23:
        nodes.append(
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d16"], output_dtype=10)
        )
        outputs.append("d16")
    feeds = {"x": x}
    _agree(_model(nodes, feeds, consts, outputs, opset=opset), feeds)


# Near ties of x / 0.01 where x * (1 / 0.01), XLA's rewrite of a division by a broadcast
# scale, rounds the other way (found with numpy: rint(x / s) != rint(x * (1 / s))).
TRAPS = [-54.91499710083008, -299.3949890136719, 299.5050048828125, -142.05499267578125]
TRAPS += [284.5149841308594, 206.5349884033203, 275.4549865722656, -299.2850036621094]
TRAPS += [-277.2850036621094, -158.6949920654297, -264.17498779296875, -212.39498901367188]


def test_quantize_divides_exactly() -> None:
    x = np.array(TRAPS, np.float32).reshape(3, 4)
    consts = {"s": np.array(0.01, np.float32), "z": np.array(30000, np.uint16)}
    consts["s_axis"] = np.full(4, 0.01, np.float32)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["per_tensor"]),
        helper.make_node("QuantizeLinear", ["x", "s_axis"], ["per_axis"], axis=1),
    ]
    feeds = {"x": x}
    _agree(_model(nodes, feeds, consts, ["per_tensor", "per_axis"]), feeds)


def test_integer_kernels_match_onnxruntime() -> None:
    rng = np.random.default_rng(3)  # each test its own: xdist orders them freely
    a = rng.integers(0, 256, size=(2, 3, 5)).astype(np.uint8)
    a8 = rng.integers(-128, 128, size=(2, 3, 5)).astype(np.int8)  # onnxruntime: QLinearMatMul
    xi = rng.integers(-128, 128, size=(2, 4, 6, 6)).astype(np.int8)
    xf = (rng.normal(size=(3, 7)) * 4).astype(np.float32)
    consts = {
        "b": rng.integers(-128, 128, size=(5, 4)).astype(np.int8),
        "a_zp": np.array(120, np.uint8),
        "b_zp": rng.integers(-3, 3, size=4).astype(np.int8),
        "a8_zp": np.array(-20, np.int8),
        "a_scale": np.array(0.02, np.float32),
        "b_scale": rng.uniform(0.01, 0.03, size=4).astype(np.float32),
        "y_scale": np.array(0.05, np.float32),
        "y_zp": np.array(-4, np.int8),
        "w": rng.integers(-128, 128, size=(6, 2, 3, 3)).astype(np.int8),
        "x_zp": np.array(-7, np.int8),
        "w_zp": np.array(2, np.int8),
        "x_scale": np.array(0.03, np.float32),
        "w_scale": rng.uniform(0.001, 0.004, size=6).astype(np.float32),
        "c_scale": np.array(0.4, np.float32),
        "c_zp": np.array(10, np.int8),
        "bias": rng.integers(-5000, 5000, size=6).astype(np.int32),
    }
    conv = {"pads": [1, 0, 1, 2], "strides": [1, 2], "group": 2}
    nodes = [
        helper.make_node("MatMulInteger", ["a", "b", "a_zp", "b_zp"], ["mmi"]),
        helper.make_node(
            "QLinearMatMul",
            ["a8", "a_scale", "a8_zp", "b", "b_scale", "b_zp", "y_scale", "y_zp"],
            ["qmm"],
        ),
        helper.make_node("ConvInteger", ["xi", "w", "x_zp", "w_zp"], ["ci"], **conv),
        helper.make_node(
            "QLinearConv",
            ["xi", "x_scale", "x_zp", "w", "w_scale", "w_zp", "c_scale", "c_zp", "bias"],
            ["qc"],
            **conv,
        ),
        helper.make_node("DynamicQuantizeLinear", ["xf"], ["dq_y", "dq_s", "dq_z"]),
    ]
    feeds = {"a": a, "a8": a8, "xi": xi, "xf": xf}
    outputs = ["mmi", "qmm", "ci", "qc", "dq_y", "dq_s", "dq_z"]
    # opset 20: onnxruntime has no QLinearMatMul of opset 21 (its float8 form)
    expected = _agree(_model(nodes, feeds, consts, outputs, opset=20), feeds)
    assert (
        expected[0].dtype == np.int32 and np.abs(expected[0]).max() > 2**14
    )  # sums past int8 x int8
    assert 0 < np.isin(expected[1], [-128, 127]).sum() < expected[1].size  # some saturate


@pytest.mark.parametrize(
    ("node", "consts", "message"),
    [
        (
            helper.make_node("QuantizeLinear", ["x", "s"], ["y"], name="n", axis=1),
            {"s": np.ones(3, np.float32)},
            "y_scale of shape [3] is neither a scalar nor 1-D of the 4 entries",
        ),
        (
            helper.make_node("DequantizeLinear", ["xq", "s"], ["y"], name="n", block_size=3),
            {"s": np.ones((2, 1), np.float32)},
            "does not fit X of shape [2, 4] in blocks of 3 along axis 1 (expected [2, 2])",
        ),
        (
            helper.make_node(
                "QuantizeLinear", ["x", "s", "z"], ["y"], name="n", output_dtype=TensorProto.INT8
            ),
            {"s": np.array(1, np.float32), "z": np.array(0, np.uint8)},
            "output_dtype int8 differs from the zero point's type uint8",
        ),
        (
            helper.make_node(
                "QLinearMatMul", ["x", "s", "f8", "f8w", "s", "f8", "s", "f8"], ["y"], name="n"
            ),
            {
                "s": np.array(1, np.float32),
                "f8": np.zeros((), helper.tensor_dtype_to_np_dtype(TensorProto.FLOAT8E4M3FN)),
                "f8w": np.zeros((4, 2), helper.tensor_dtype_to_np_dtype(TensorProto.FLOAT8E4M3FN)),
            },
            "QLinearMatMul of float8 tensors is not supported",
        ),
    ],
)
def test_refusals_name_the_node(node: Any, consts: dict[str, np.ndarray], message: str) -> None:
    x = np.zeros((2, 4), np.float32)
    feeds = {"xq": x.astype(np.uint8)} if node.op_type == "DequantizeLinear" else {"x": x}
    if node.op_type == "QLinearMatMul":
        feeds = {"x": x.astype(helper.tensor_dtype_to_np_dtype(TensorProto.FLOAT8E4M3FN))}
    with pytest.raises((ValueError, TypeError), match=r"\bn\b") as info:
        out_type = F32 if node.op_type == "DequantizeLinear" else TensorProto.INT8
        backend.prepare(_model([node], feeds, consts, ["y"], out_type=out_type)).run(feeds)
    assert message in str(info.value)


def test_straight_through_derivative_matches_its_definition() -> None:
    """d/dw sum(c * DQ(Q(w))) = c where round(w / s) + z lies in [-128, 127], else 0."""
    rng = np.random.default_rng(4)  # each test its own: xdist orders them freely
    w = jnp.asarray(
        np.concatenate([rng.normal(scale=3, size=20), [2.5, -2.5, 40, -40]]).astype(np.float32)
    )
    s, z = np.array(0.1, np.float32), np.array(-3, np.int8)
    c = jnp.asarray(rng.normal(size=w.shape).astype(np.float32))
    quantize = Node({"axis": 1, "saturate": 1}, 21, "node 'q'", 1)
    dequantize = Node({"axis": 1}, 21, "node 'd'", 1)

    def loss(w: jax.Array) -> tuple[jax.Array, jax.Array]:
        q = OPS["QuantizeLinear"].fn(quantize, w, s, z)
        y = OPS["DequantizeLinear"].fn(dequantize, q, s, z)
        return jnp.sum(c * y), y

    grad, y = jax.jit(jax.grad(loss, has_aux=True))(w)  # one compile
    pre = np.round(np.asarray(w) / np.float32(0.1)) - 3  # by hand: numpy, half to even
    inside = (pre >= -128) & (pre <= 127)
    assert 0 < inside.sum() < inside.size
    # (c / s) * s: one rounding from c within range; exactly 0 where clipped
    np.testing.assert_allclose(np.asarray(grad), np.where(inside, np.asarray(c), 0), rtol=3e-7)
    assert (np.asarray(grad)[~inside] == 0).all()
    # and the forward values are the integers' (read from the shadow, which holds them)
    np.testing.assert_array_equal(
        np.asarray(y),
        (np.clip(pre, -128, 127) + 3).astype(np.float32) * np.float32(0.1),
    )


@pytest.mark.parametrize("kind", ["int8", "float8"])
def test_qdq_weight_trains_through_attach(kind: str) -> None:
    """Quantize -> Dequantize around a MatMul weight: the weight trains, the loss falls."""
    rng = np.random.default_rng(5)  # each test its own: xdist orders them freely
    w = (rng.normal(size=(4, 3)) / 2).astype(np.float32)
    if kind == "int8":
        zero = np.array([0, 3, -2], np.int8)
    else:  # float8 is a float tensor: the derivative needs no shadow
        zero = np.zeros(3, helper.tensor_dtype_to_np_dtype(TensorProto.FLOAT8E4M3FN))
    nodes = [
        helper.make_node("QuantizeLinear", ["W", "s", "z"], ["Wq"], axis=1),
        helper.make_node("DequantizeLinear", ["Wq", "s", "z"], ["Wd"], axis=1),
        helper.make_node("MatMul", ["x", "Wd"], ["out"]),
    ]
    consts = {"W": w, "s": np.array([0.02, 0.03, 0.05], np.float32), "z": zero}
    graph = helper.make_graph(
        nodes,
        "net",
        [helper.make_tensor_value_info("x", F32, ["N", 4])],
        [helper.make_tensor_value_info("out", F32, ["N", 3])],
        initializer=[numpy_helper.from_array(v, n) for n, v in consts.items()],
    )
    base = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model = training.attach(
        base, loss="mse", target="t", optimizer=onnx_optax.adam(0.05), trainable=["W"]
    )
    session = training.Session(model)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    t = x @ rng.normal(size=(4, 3)).astype(np.float32)
    losses = [float(session.step({"x": x, "t": t})["loss"]) for _ in range(10)]
    assert losses[-1] < 0.7 * losses[0]
    assert not np.array_equal(session.initializers["W"], w)


def test_a_float64_initializer_is_checked_as_stored_without_64_bit_jax() -> None:
    """32-bit JAX holds a float64 initializer as float32 while tracing; the schema's type
    check reads the dtype it is stored in, so a float64 scale DequantizeLinear does not
    allow is refused, as onnxruntime refuses it (found by the differential fuzzer)."""
    import onnxruntime as ort

    q = numpy_helper.from_array(np.array([1, -2, 3, 7], np.int8), "q")
    scale = numpy_helper.from_array(np.array(0.5, np.float64), "scale")
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["q", "scale"], ["y"], name="dq")],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [q, scale],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(Exception, match="tensor\\(double\\)"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert not jax.config.read("jax_enable_x64")
    with pytest.raises(TypeError, match=r"node 'dq' .*input 'scale' has dtype float64"):
        backend.prepare(model).run({})
