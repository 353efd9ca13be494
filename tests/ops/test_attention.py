"""RMSNormalization, Swish, SwiGLU, RotaryEmbedding and Attention against onnxruntime (SwiGLU,
which onnxruntime lacks, against onnx.reference) on random inputs combining what ONNX's node
cases test one at a time: 3-D inputs with grouped heads, a cache and a short boolean mask
together, a float mask with softcap and an explicit scale, partial interleaved rotation read at
position ids; refusals naming the node; gradients of Attention and RMSNormalization against
float64 central differences.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from onnx_optax import backend  # noqa: E402
from tests.support.finite_differences import assert_graph_gradients  # noqa: E402

RNG = np.random.default_rng(0)


def op_model(
    op: str, feeds: dict[str, np.ndarray], n_outputs: int, opset: int, **attrs: Any
) -> Any:
    """One node named 'n' reading ``feeds`` (graph inputs; '' skips an optional input)."""
    names = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op, list(feeds), names, name="n", **attrs)
    inputs = [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)
        )
        for name, value in feeds.items()
        if name
    ]
    first = next(value for value in feeds.values() if value.size)
    outputs = [  # float outputs; the first of the first input's rank, any others 4-D
        helper.make_tensor_value_info(name, TensorProto.FLOAT, [None] * (4 if i else first.ndim))
        for i, name in enumerate(names)
    ]
    graph = helper.make_graph([node], "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run_both(
    op: str, feeds: dict[str, np.ndarray], n_outputs: int = 1, opset: int = 23, **attrs: Any
) -> tuple[list[Any], list[np.ndarray]]:
    """(onnx_optax's outputs, onnxruntime's) of one node."""
    model = op_model(op, feeds, n_outputs, opset, **attrs)
    given = {name: value for name, value in feeds.items() if name}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, given)
    got = backend.prepare(model).run(given)
    return list(got), expected


def assert_close(got: list[Any], expected: list[np.ndarray], tol: float = 2e-6) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert np.asarray(g).dtype == e.dtype and np.shape(g) == e.shape
        np.testing.assert_allclose(np.asarray(g), e, rtol=tol, atol=tol)


def normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# ----------------------------------------------------------------------------- RMSNormalization


def test_rms_normalization_over_two_axes_matches_onnxruntime() -> None:
    feeds = {"x": normal(2, 3, 4, 5) * 3, "scale": normal(4, 5)}
    got, expected = run_both("RMSNormalization", feeds, axis=-2, epsilon=1e-3)
    assert_close(got, expected)
    x = feeds["x"]
    by_hand = x / np.sqrt((x**2).mean(axis=(2, 3), keepdims=True) + 1e-3) * feeds["scale"]
    np.testing.assert_allclose(expected[0], by_hand, rtol=1e-5, atol=1e-5)


def test_swish_matches_onnxruntime_and_swiglu_matches_the_reference() -> None:
    x = normal(3, 4) * 3
    got, expected = run_both("Swish", {"x": x}, opset=24, alpha=0.7)
    assert_close(got, expected)
    feeds = {"a": x, "b": normal(3, 4)}
    model = op_model("SwiGLU", feeds, 1, 28, alpha=1.5)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(want, x / (1 + np.exp(-1.5 * x)) * feeds["b"], rtol=1e-5)
    np.testing.assert_allclose(backend.prepare(model).run(feeds)[0], want, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- RotaryEmbedding


@pytest.mark.parametrize("interleaved", [0, 1])
def test_partial_rotary_embedding_at_positions_matches_onnxruntime(interleaved: int) -> None:
    """3-D X of 2 heads of 8 features, the first 4 rotated, caches read at position ids."""
    angles = RNG.uniform(-3, 3, (7, 2)).astype(np.float32)
    feeds = {
        "x": normal(2, 3, 16),
        "cos": np.cos(angles),
        "sin": np.sin(angles),
        "ids": np.array([[0, 3, 6], [5, 1, 2]], np.int64),
    }
    kw = {"interleaved": interleaved, "num_heads": 2, "rotary_embedding_dim": 4}
    got, expected = run_both("RotaryEmbedding", feeds, **kw)
    assert_close(got, expected)
    assert not np.allclose(expected[0][..., :4], feeds["x"][..., :4])
    np.testing.assert_array_equal(expected[0][..., 4:8], feeds["x"][..., 4:8])  # not rotated


def test_rotary_embedding_of_4d_input_with_batched_caches_matches_onnxruntime() -> None:
    angles = RNG.uniform(-3, 3, (2, 3, 4)).astype(np.float32)
    feeds = {"x": normal(2, 2, 3, 8), "cos": np.cos(angles), "sin": np.sin(angles)}
    got, expected = run_both("RotaryEmbedding", feeds)
    assert_close(got, expected)


# ----------------------------------------------------------------------------- Attention


def test_3d_grouped_attention_with_cache_causal_and_bool_mask_matches_onnxruntime() -> None:
    """4 query heads over 2 key/value heads, a cache of 2, causal and a boolean mask; then
    the mask's last two keys left out (padded as masked: onnx.reference, as onnxruntime
    refuses a mask shorter than the keys)."""
    mask = RNG.random((3, 5)) < 0.7
    mask[:, 0] = True
    mask[:, 3:] = False
    feeds = {
        "q": normal(2, 3, 4 * 4),
        "k": normal(2, 3, 2 * 4),
        "v": normal(2, 3, 2 * 6),
        "mask": mask,
        "past_key": normal(2, 2, 2, 4),
        "past_value": normal(2, 2, 2, 6),
    }
    kw = {"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 1, "qk_matmul_output_mode": 3}
    got, expected = run_both("Attention", feeds, 4, **kw)
    assert_close(got, expected)
    probs = expected[3]
    assert probs.shape == (2, 4, 3, 5)
    assert (probs[..., 3:] == 0).all() and (probs[:, :, 0, 1:] == 0).any()
    short = {**feeds, "mask": mask[:, :3]}
    model = op_model("Attention", short, 4, 23, **kw)
    reference = ReferenceEvaluator(model).run(None, short)
    assert_close(list(backend.prepare(model).run(short)), reference)
    np.testing.assert_allclose(reference[0], expected[0], rtol=1e-5, atol=1e-6)


def test_4d_attention_with_float_mask_softcap_and_scale_matches_onnxruntime() -> None:
    """One node per qk_matmul_output_mode 0 (the raw product), 1 (softcapped), 2 (masked)."""
    given = {"q": normal(1, 2, 3, 4) * 3, "k": normal(1, 2, 5, 4) * 3, "v": normal(1, 2, 5, 3)}
    given["mask"] = normal(2, 3, 5)
    kw = {"scale": 0.4, "softcap": 2.5}
    nodes = [
        helper.make_node("Attention", list(given), [f"y{m}", "", "", f"qk{m}"], **kw,
                         qk_matmul_output_mode=m)
        for m in (0, 1, 2)
    ]  # fmt: skip
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, list(value.shape))
        for name, value in given.items()
    ]
    outputs = [
        helper.make_tensor_value_info(f"{name}{m}", TensorProto.FLOAT, [None] * 4)
        for m in (0, 1, 2)
        for name in ("y", "qk")
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs), opset_imports=[helper.make_opsetid("", 23)]
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, given)
    assert_close(list(backend.prepare(model).run(given)), expected, tol=1e-5)
    raw, capped, masked = expected[1], expected[3], expected[5]
    np.testing.assert_allclose(capped, 2.5 * np.tanh(raw / 2.5), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(masked, capped + given["mask"], rtol=1e-5, atol=1e-6)


def test_attention_with_nonpad_kv_seqlen_matches_onnxruntime() -> None:
    """opset 24's external cache: keys past each batch's length are padding."""
    given = {"q": normal(2, 2, 3, 4), "k": normal(2, 2, 6, 4), "v": normal(2, 2, 6, 4)}
    given["lens"] = np.array([4, 6], np.int64)
    node = helper.make_node("Attention", ["q", "k", "v", "", "", "", "lens"], ["y"], is_causal=1)
    inputs = [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)
        )
        for name, value in given.items()
    ]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)
    model = helper.make_model(
        helper.make_graph([node], "g", inputs, [output]),
        opset_imports=[helper.make_opsetid("", 24)],
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, given)
    assert_close(list(backend.prepare(model).run(given)), expected)


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("op", "feeds", "attrs", "message"),
    [
        ("Attention", {"q": normal(1, 2, 8), "k": normal(1, 2, 8), "v": normal(1, 2, 8)}, {},
         "3-D Q, K and V need positive q_num_heads"),
        ("Attention", {"q": normal(1, 3, 2, 4), "k": normal(1, 2, 2, 4), "v": normal(1, 2, 2, 4)},
         {}, "Q's heads a multiple of K's"),
        ("Attention", {"q": normal(1, 2, 2, 4), "k": normal(1, 2, 2, 4), "v": normal(1, 2, 2, 4),
                       "": np.zeros(0), "pk": normal(1, 2, 1, 4)}, {},
         "past_key and past_value must be given together"),
        ("Attention", {"q": normal(1, 2, 2, 4), "k": normal(1, 2, 2, 4), "v": normal(1, 2, 2, 4),
                       "m": np.ones((2, 3), bool)}, {}, r"attn_mask of shape \[2, 3\] does not"),
        ("Attention", {"q": normal(1, 2, 2, 4), "k": normal(1, 2, 2, 4), "v": normal(1, 2, 2, 4),
                       "m": np.ones((2, 1, 1, 1, 2), bool)}, {}, r"mask of shape \[2, 1, 1, 1, 2\]"),
        ("RMSNormalization", {"x": normal(2, 3), "s": normal(2)}, {}, "does not broadcast"),
        ("SwiGLU", {"a": normal(2, 3), "b": normal(1, 3)}, {}, "must have one shape"),
        ("RotaryEmbedding", {"x": normal(1, 2, 8), "c": normal(4, 2), "s": normal(4, 2),
                             "p": np.array([[0, 4]], np.int64)}, {"num_heads": 2},
         r"position_ids hold 4, outside \[0, 4\)"),
        ("RotaryEmbedding", {"x": normal(1, 2, 8), "c": normal(1, 2, 2), "s": normal(1, 2, 2)},
         {"num_heads": 2, "rotary_embedding_dim": 3}, "must be even"),
    ],
)  # fmt: skip
def test_refusals_name_the_node(
    op: str, feeds: dict[str, np.ndarray], attrs: dict[str, Any], message: str
) -> None:
    opset = 28 if op == "SwiGLU" else 23
    model = op_model(op, feeds, 1, opset, **attrs)
    given = {name: value for name, value in feeds.items() if name}
    with pytest.raises(ValueError, match=rf"node 'n' \(ai\.onnx\.{op}\).*{message}"):
        backend.prepare(model).run(given)


# ----------------------------------------------------------------------------- gradients


def _check_gradient(op: str, feeds: dict[str, np.ndarray], wrts: list[str], **attrs: Any) -> None:
    """Gradients of a weighted sum of the output against float64 central differences."""
    with jax.enable_x64(True):
        model = op_model(op, feeds, 1, 23, **attrs)
    assert_graph_gradients(model, feeds, wrts, 23, points=4, atol=1e-8)


def test_attention_gradients_match_central_differences() -> None:
    """Grouped heads, causal, a boolean mask leaving one query row fully masked (zeros)."""
    rng = np.random.default_rng(7)
    mask = np.ones((3, 4), bool)
    mask[1] = False
    feeds = {
        "q": rng.standard_normal((1, 2, 3, 4)),
        "k": rng.standard_normal((1, 1, 4, 4)),
        "v": rng.standard_normal((1, 1, 4, 3)),
        "mask": mask,
    }
    _check_gradient("Attention", feeds, ["q", "k", "v"], is_causal=1, softcap=3.0)


def test_rms_normalization_gradients_match_central_differences() -> None:
    rng = np.random.default_rng(8)
    feeds = {"x": rng.standard_normal((2, 3, 4)), "scale": rng.standard_normal((3, 4))}
    _check_gradient("RMSNormalization", feeds, ["x", "scale"], axis=1, stash_type=11)
