"""LinearAttention, CausalConvWithState (opset 27) and ai.onnx.preview's FlexAttention against
onnx.reference on random inputs beyond ONNX's node cases (every update rule with grouped heads,
per-key decay and a carried state; an input shorter than the kernel after a state; 16-bit
inputs; score and probability modifiers together, float64 softmax), their gradients against
float64 central differences (a recurrence and a convolution written by hand here in float64,
as the first two ops take no double), and refusals naming the node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax._src.graph import GraphFunction  # noqa: E402

PREVIEW = "ai.onnx.preview"
OPSETS = {"": 27, PREVIEW: 1}
RNG = np.random.default_rng(0)


def normal(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def op_model(
    op: str,
    feeds: dict[str, np.ndarray],
    n_outputs: int,
    *,
    node_inputs: list[str] | None = None,
    **attrs: Any,
) -> Any:
    """One node named 'n' reading ``feeds`` (graph inputs; '' skips an optional input), or
    the ``node_inputs`` among them (the others read by its subgraphs)."""
    domain = PREVIEW if op == "FlexAttention" else ""
    names = [f"y{i}" for i in range(n_outputs)]
    read = list(feeds) if node_inputs is None else node_inputs
    node = helper.make_node(op, read, names, name="n", domain=domain, **attrs)
    inputs = [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)
        )
        for name, value in feeds.items()
        if name
    ]
    first = next(iter(feeds.values()))
    state = feeds.get("past", np.zeros((0,) * (4 if op == "LinearAttention" else 3), first.dtype))
    outputs = [  # Y as the first input, then a state as past_state
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(like.dtype), [None] * like.ndim
        )
        for name, like in zip(names, [first, state], strict=False)
    ]
    graph = helper.make_graph([node], "g", inputs, outputs)
    imports = [helper.make_opsetid(d, v) for d, v in OPSETS.items()]
    return helper.make_model(graph, opset_imports=imports)


def check_against_reference(
    op: str, feeds: dict[str, np.ndarray], n_outputs: int, tol: float, **attrs: Any
) -> list[np.ndarray]:
    """onnx_optax's outputs equal onnx.reference's (dtype, shape, values); the latter returned."""
    model = op_model(op, feeds, n_outputs, **attrs)
    given = {name: value for name, value in feeds.items() if name}
    expected = ReferenceEvaluator(model).run(None, given)
    got = backend.prepare(model).run(given)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        g = np.asarray(g)
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=tol, atol=tol)
    return expected


# ----------------------------------------------------------------------------- CausalConvWithState


@pytest.mark.parametrize("activation", ["none", "silu"])
def test_causal_conv_with_bias_and_state_matches_the_reference(activation: str) -> None:
    feeds = {"x": normal(2, 5, 7), "w": normal(5, 1, 4), "b": normal(5), "past": normal(2, 5, 3)}
    expected = check_against_reference("CausalConvWithState", feeds, 2, 1e-5, activation=activation)
    # the state carries the last k - 1 inputs
    np.testing.assert_array_equal(expected[1], feeds["x"][:, :, -3:])


def test_causal_conv_input_shorter_than_the_state_keeps_part_of_the_state() -> None:
    """Two steps after a state of five: the new state is three old values and the two new."""
    feeds = {"x": normal(1, 3, 2), "w": normal(3, 1, 6), "": np.zeros(0), "past": normal(1, 3, 5)}
    expected = check_against_reference("CausalConvWithState", feeds, 2, 1e-5, activation="swish")
    want = np.concatenate([feeds["past"][:, :, 2:], feeds["x"]], axis=2)
    np.testing.assert_array_equal(expected[1], want)


def test_causal_conv_in_float16_matches_the_reference() -> None:
    feeds = {"x": normal(2, 4, 9, dtype=np.float16), "w": normal(4, 1, 3, dtype=np.float16)}
    check_against_reference("CausalConvWithState", feeds, 2, 2e-3, activation="silu")


def test_causal_conv_decoding_step_by_step_equals_the_whole_sequence() -> None:
    """4 positions, then 2 with the state carried, give the reference's run over all 6."""
    x, w = normal(2, 3, 6), normal(3, 1, 3)
    whole = ReferenceEvaluator(op_model("CausalConvWithState", {"x": x, "w": w}, 2)).run(
        None, {"x": x, "w": w}
    )
    first = backend.prepare(op_model("CausalConvWithState", {"x": x[..., :4], "w": w}, 2))
    y1, state = first.run({"x": x[..., :4], "w": w})
    feeds = {"x": x[..., 4:], "w": w, "": np.zeros(0), "past": np.asarray(state)}
    second = backend.prepare(op_model("CausalConvWithState", feeds, 2))
    y2, state2 = second.run({"x": x[..., 4:], "w": w, "past": np.asarray(state)})
    np.testing.assert_allclose(np.concatenate([y1, y2], axis=2), whole[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(state2, whole[1])


# ----------------------------------------------------------------------------- LinearAttention


def linear_feeds(
    rule: str, *, b: int = 2, t: int = 5, hq: int = 4, hkv: int = 2, dk: int = 3, dv: int = 2,
    per_key: bool = True, beta_heads: int = 2, dtype: Any = np.float32,
) -> dict[str, np.ndarray]:  # fmt: skip
    """Random LinearAttention inputs for ``rule`` (keys L2-normalized, gates in range)."""
    k = normal(b, t, hkv, dk, dtype=np.float64)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    feeds = {
        "q": normal(b, t, hq * dk),
        "k": k.reshape(b, t, hkv * dk),
        "v": normal(b, t, hkv * dv),
        "past": normal(b, hkv, dk, dv) * 0.5,
    }
    feeds = {name: value.astype(dtype) for name, value in feeds.items()}
    if rule in ("gated", "gated_delta"):
        feeds["decay"] = -RNG.uniform(0.05, 1.0, (b, t, hkv * dk if per_key else hkv)).astype(dtype)
    if rule in ("delta", "gated_delta"):
        if "decay" not in feeds:
            feeds[""] = np.zeros(0, dtype)  # decay omitted
        feeds["beta"] = RNG.uniform(0.1, 0.9, (b, t, beta_heads)).astype(dtype)
    return feeds


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention_grouped_with_state_matches_the_reference(rule: str) -> None:
    feeds = linear_feeds(rule)
    kw = {"q_num_heads": 4, "kv_num_heads": 2, "update_rule": rule}
    check_against_reference("LinearAttention", feeds, 2, 1e-5, **kw)


def test_linear_attention_per_head_decay_shared_beta_and_scale_matches_the_reference() -> None:
    """Multi-query (one K/V head), decay per head, one beta for all heads, an explicit scale."""
    feeds = linear_feeds("gated_delta", hq=3, hkv=1, dk=4, dv=5, per_key=False, beta_heads=1)
    kw = {"q_num_heads": 3, "kv_num_heads": 1, "scale": 0.3, "chunk_size": 2}
    check_against_reference("LinearAttention", feeds, 2, 1e-5, **kw)


def test_linear_attention_in_float16_with_a_float32_state_matches_the_reference() -> None:
    """16-bit activations, the state in float32 (type S): outputs float16, the state float32."""
    feeds = linear_feeds("gated", dtype=np.float16)
    feeds["past"] = feeds["past"].astype(np.float32)
    kw = {"q_num_heads": 4, "kv_num_heads": 2, "update_rule": "gated"}
    expected = check_against_reference("LinearAttention", feeds, 2, 3e-3, **kw)
    assert expected[0].dtype == np.float16 and expected[1].dtype == np.float32


def test_linear_attention_without_state_then_decoding_equals_one_prefill() -> None:
    """3 steps from zeros (no past_state), then 2 with the state carried, give the
    reference's run over all 5."""
    feeds = linear_feeds("gated", t=5)
    kw = {"q_num_heads": 4, "kv_num_heads": 2, "update_rule": "gated"}

    def named(part: slice, past: np.ndarray | None) -> dict[str, np.ndarray]:
        given = {n: feeds[n][:, part] for n in ("q", "k", "v")}
        named = {**given, "": np.zeros(0)} if past is None else {**given, "past": past}
        return {**named, "decay": feeds["decay"][:, part]}

    def run(part: slice, past: np.ndarray | None) -> list[Any]:
        inputs = named(part, past)
        model = op_model("LinearAttention", inputs, 2, **kw)
        return list(backend.prepare(model).run({n: x for n, x in inputs.items() if n}))

    inputs = named(slice(0, 5), None)
    model = op_model("LinearAttention", inputs, 2, **kw)
    whole = ReferenceEvaluator(model).run(None, {n: x for n, x in inputs.items() if n})
    y1, state = run(slice(0, 3), None)
    y2, state2 = run(slice(3, 5), np.asarray(state))
    np.testing.assert_allclose(np.concatenate([y1, y2], axis=1), whole[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state2, whole[1], rtol=1e-5, atol=1e-6)


def test_empty_sequences_match_the_reference() -> None:
    """No positions: outputs of length 0, the state carried through (all of it)."""
    feeds = {"x": normal(2, 3, 0), "w": normal(3, 1, 3), "": np.zeros(0), "past": normal(2, 3, 2)}
    check_against_reference("CausalConvWithState", feeds, 2, 0)
    kw = {"q_num_heads": 4, "kv_num_heads": 2}
    check_against_reference("LinearAttention", linear_feeds("gated_delta", t=0), 2, 0, **kw)


# ----------------------------------------------------------------------------- FlexAttention


def modifier(name: str, nodes: list[Any], dtype: int) -> Any:
    """A one-input, one-output subgraph 'x' -> 'out' of ``nodes``."""
    return helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", dtype, None)],
        [helper.make_tensor_value_info("out", dtype, None)],
    )


def score_and_prob_mods(dtype: Any, q_len: int, kv_len: int) -> dict[str, Any]:
    """score_mod: a softcap of 4, a relative-position bias, causal (bottom right) mask;
    prob_mod: each key's probability weighted (a fixed keep mask over 0.8)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    rows, cols = np.arange(q_len)[:, None], np.arange(kv_len)[None, :]
    bias = (-0.1 * np.abs(rows + kv_len - q_len - cols)).astype(dtype)
    keep = cols <= rows + kv_len - q_len
    weights = ((RNG.random((q_len, kv_len)) > 0.3) / 0.8).astype(dtype)

    def const(name: str, value: np.ndarray) -> Any:
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(
            name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape, value.ravel()))  # fmt: skip

    score = modifier("score", [
        const("cap", np.asarray(4, dtype)), const("bias", bias), const("keep", keep),
        const("ninf", np.asarray(-np.inf, dtype)),
        helper.make_node("Div", ["x", "cap"], ["t0"]),
        helper.make_node("Tanh", ["t0"], ["t1"]),
        helper.make_node("Mul", ["t1", "cap"], ["t2"]),
        helper.make_node("Add", ["t2", "bias"], ["t3"]),
        helper.make_node("Where", ["keep", "t3", "ninf"], ["out"]),
    ], elem)  # fmt: skip
    prob = modifier("prob", [
        const("w", weights), helper.make_node("Mul", ["x", "w"], ["out"]),
    ], elem)  # fmt: skip
    return {"score_mod": score, "prob_mod": prob}


def test_flex_attention_grouped_with_both_modifiers_matches_the_reference() -> None:
    feeds = {"q": normal(2, 4, 3, 5), "k": normal(2, 2, 6, 5), "v": normal(2, 2, 6, 7)}
    mods = score_and_prob_mods(np.float32, 3, 6)
    check_against_reference("FlexAttention", feeds, 1, 1e-5, scale=0.2, **mods)


def test_flex_attention_float16_softmax_in_float32_matches_the_reference() -> None:
    feeds = {n: normal(1, 2, 4, 8, dtype=np.float16) for n in ("q", "k", "v")}
    mods = score_and_prob_mods(np.float32, 4, 4)
    check_against_reference("FlexAttention", feeds, 1, 2e-3, **mods)


def test_flex_attention_float32_with_a_float64_softmax_matches_the_reference() -> None:
    with jax.enable_x64(True):
        feeds = {"q": normal(1, 3, 2, 4), "k": normal(1, 1, 5, 4), "v": normal(1, 1, 5, 3)}
        mods = score_and_prob_mods(np.float64, 2, 5)
        kw = {"softmax_precision": TensorProto.DOUBLE, **mods}
        check_against_reference("FlexAttention", feeds, 1, 1e-6, **kw)


# ----------------------------------------------------------------------------- gradients


def test_flex_attention_score_mod_reading_an_outer_bias_is_differentiable_in_it() -> None:
    """score_mod adds a graph input of the enclosing graph: values against numpy written
    here (Q and K each scaled by sqrt(1 / sqrt(4)) taken in float32, as the function body of
    the spec does), the gradient of that bias against central differences (float64)."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(9)
        feeds = {n: rng.standard_normal(s) for n, s in
                 (("q", (1, 2, 3, 4)), ("k", (1, 2, 5, 4)), ("v", (1, 2, 5, 2)),
                  ("bias", (3, 5)))}  # fmt: skip
        add = helper.make_node("Add", ["x", "bias"], ["out"])
        mod = modifier("add_bias", [add], TensorProto.DOUBLE)
        weights = rng.standard_normal((1, 2, 3, 2))

        def by_hand(x: dict[str, np.ndarray]) -> np.ndarray:
            root = np.float64(np.sqrt(np.float32(0.5)))  # in float32, as the spec's body
            scores = (x["q"] * root) @ np.swapaxes(x["k"] * root, -1, -2) + x["bias"]
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            return (probs / probs.sum(-1, keepdims=True)) @ x["v"]

        read = ["q", "k", "v"]
        model = op_model("FlexAttention", feeds, 1, node_inputs=read, score_mod=mod)
        got = backend.prepare(model).run(feeds)[0]
        np.testing.assert_allclose(got, by_hand(feeds), rtol=1e-12, atol=1e-12)
        grads = graph_gradients(
            "FlexAttention", feeds, ["bias", "q"], weights, node_inputs=read, score_mod=mod
        )
        expected = central_differences(
            lambda x: float((by_hand(x) * weights).sum()), feeds, ["bias", "q"]
        )
        for name in ("bias", "q"):
            assert np.abs(expected[name]).max() > 1e-3
            np.testing.assert_allclose(grads[name], expected[name], rtol=1e-6, atol=1e-8)


def central_differences(f: Callable[[dict[str, np.ndarray]], float], at: dict[str, np.ndarray],
                        names: list[str], step: float = 1e-6) -> dict[str, np.ndarray]:  # fmt: skip
    """d f / d at[name], each element by central differences in float64."""
    grads = {}
    for name in names:
        grad = np.zeros(at[name].shape)
        for index in np.ndindex(*at[name].shape):
            plus, minus = at[name].astype(np.float64), at[name].astype(np.float64)
            plus[index] += step
            minus[index] -= step
            grad[index] = (f({**at, name: plus}) - f({**at, name: minus})) / (2 * step)
        grads[name] = grad
    return grads


def graph_gradients(op: str, feeds: dict[str, np.ndarray], names: list[str], weights: np.ndarray,
                    node_inputs: list[str] | None = None, **attrs: Any,
                    ) -> dict[str, np.ndarray]:  # fmt: skip
    """jax.grad of ``sum(output * weights)`` through the one-node graph, by input name."""
    n_outputs = 1 if op == "FlexAttention" else 2
    model = op_model(op, feeds, n_outputs, node_inputs=node_inputs, **attrs)
    graph = GraphFunction(model.graph, opsets=OPSETS)
    given = {name: value for name, value in feeds.items() if name}

    @jax.jit
    @jax.grad
    def loss(values: dict[str, Any]) -> Any:
        return (graph.apply({**given, **values})[0] * weights).sum()

    grads = loss({name: given[name] for name in names})
    return {name: np.asarray(grads[name], np.float64) for name in names}


def linear_attention_by_hand(x: dict[str, np.ndarray], hq: int, hkv: int) -> np.ndarray:
    """gated_delta in float64: S = e^g S; S += k ⊗ beta (v - S^T k); o = q^T S / sqrt(d_k)."""
    b, t, _ = x["q"].shape
    q = x["q"].reshape(b, t, hq, -1)
    k, v = x["k"].reshape(b, t, hkv, -1), x["v"].reshape(b, t, hkv, -1)
    g = x["decay"].reshape(b, t, hkv, -1)
    state, out = x["past"].astype(np.float64), []
    for i in range(t):
        state = state * np.exp(g[:, i])[..., None]
        wrong = x["beta"][:, i, :, None] * (v[:, i] - np.einsum("bhdm,bhd->bhm", state, k[:, i]))
        state = state + k[:, i, :, :, None] * wrong[:, :, None, :]
        read = np.repeat(state, hq // hkv, axis=1)
        out.append(np.einsum("bhd,bhdm->bhm", q[:, i], read) / np.sqrt(q.shape[-1]))
    return np.stack(out, axis=1).reshape(b, t, -1)


def test_linear_attention_gradients_match_central_differences() -> None:
    feeds = linear_feeds("gated_delta", b=1, t=4, hq=4, hkv=2, dk=3, dv=2)
    names = ["q", "k", "v", "past", "decay", "beta"]
    kw = {"q_num_heads": 4, "kv_num_heads": 2}
    weights = np.random.default_rng(5).standard_normal((1, 4, 8)).astype(np.float32)
    by_hand = linear_attention_by_hand({n: feeds[n].astype(np.float64) for n in names}, 4, 2)
    check_against_reference("LinearAttention", feeds, 2, 1e-5, **kw)
    want = ReferenceEvaluator(op_model("LinearAttention", feeds, 2, **kw)).run(None, feeds)[0]
    np.testing.assert_allclose(by_hand, want, rtol=1e-5, atol=1e-5)  # the hand-written is right
    got = graph_gradients("LinearAttention", feeds, names, weights, **kw)
    expected = central_differences(
        lambda x: float((linear_attention_by_hand(x, 4, 2) * weights).sum()), feeds, names
    )
    for name in names:
        assert np.abs(expected[name]).max() > 1e-3, name
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-4, err_msg=name)


def causal_conv_by_hand(x: dict[str, np.ndarray]) -> np.ndarray:
    """silu(sum_j w[c, 0, j] * P[b, c, t + j] + bias[c]), P = concat(past, x), in float64."""
    padded = np.concatenate([x["past"], x["x"]], axis=2)
    taps, length = x["w"].shape[2], x["x"].shape[2]
    y = sum(x["w"][None, :, 0, j, None] * padded[:, :, j : j + length] for j in range(taps))
    y = y + x["b"][None, :, None]
    return y / (1 + np.exp(-y))


def test_causal_conv_gradients_match_central_differences() -> None:
    feeds = {"x": normal(2, 3, 5), "w": normal(3, 1, 3), "b": normal(3), "past": normal(2, 3, 2)}
    names = list(feeds)
    weights = np.random.default_rng(6).standard_normal((2, 3, 5)).astype(np.float32)
    want = check_against_reference("CausalConvWithState", feeds, 2, 1e-5, activation="silu")[0]
    np.testing.assert_allclose(causal_conv_by_hand(feeds), want, rtol=1e-5, atol=1e-5)
    got = graph_gradients("CausalConvWithState", feeds, names, weights, activation="silu")
    expected = central_differences(
        lambda x: float((causal_conv_by_hand(x) * weights).sum()), feeds, names
    )
    for name in names:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-4, err_msg=name)


def test_flex_attention_gradients_through_the_modifiers_match_central_differences() -> None:
    """float64 throughout: gradients of Q, K and V through score_mod, softmax and prob_mod."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(7)
        feeds = {n: rng.standard_normal(s) for n, s in
                 (("q", (1, 2, 3, 4)), ("k", (1, 1, 4, 4)), ("v", (1, 1, 4, 3)))}  # fmt: skip
        mods = score_and_prob_mods(np.float64, 3, 4)
        weights = rng.standard_normal((1, 2, 3, 3))
        got = graph_gradients("FlexAttention", feeds, list(feeds), weights, **mods)
        model = op_model("FlexAttention", feeds, 1, **mods)
        reference = ReferenceEvaluator(model)
        expected = central_differences(
            lambda x: float((reference.run(None, x)[0] * weights).sum()), feeds, list(feeds)
        )
        for name in feeds:
            assert np.abs(expected[name]).max() > 1e-3, name
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-8)


# ----------------------------------------------------------------------------- refusals


def flex_bad_mod() -> Any:
    """A score_mod whose output is a scalar (a sum over every axis)."""
    return modifier("bad", [helper.make_node("ReduceSum", ["x"], ["out"], keepdims=0)],
                    TensorProto.FLOAT)  # fmt: skip


@pytest.mark.parametrize(
    ("op", "feeds", "attrs", "message"),
    [
        ("CausalConvWithState", {"x": normal(1, 2, 4), "w": normal(3, 1, 2)}, {},
         r"weight of shape \[3, 1, 2\] must be \(2, 1, k\)"),
        ("CausalConvWithState", {"x": normal(1, 2, 4), "w": normal(2, 1, 3), "": np.zeros(0),
                                 "p": normal(1, 2, 3)}, {},
         r"past_state of shape \[1, 2, 3\] must be .* \[1, 2, 2\]"),
        ("CausalConvWithState", {"x": normal(1, 2, 4), "w": normal(2, 1, 3)},
         {"activation": "gelu"}, "activation 'gelu' must be"),
        ("LinearAttention", {"q": normal(1, 2, 6), "k": normal(1, 2, 6), "v": normal(1, 2, 6)},
         {"q_num_heads": 3, "kv_num_heads": 2, "update_rule": "linear"},
         "q_num_heads 3 must be a positive multiple of kv_num_heads 2"),
        ("LinearAttention", {"q": normal(1, 2, 6), "k": normal(1, 2, 6), "v": normal(1, 2, 6)},
         {"q_num_heads": 2, "kv_num_heads": 2}, "update_rule 'gated_delta' needs decay"),
        ("LinearAttention", {"q": normal(1, 2, 6), "k": normal(1, 2, 6), "v": normal(1, 2, 6)},
         {"q_num_heads": 2, "kv_num_heads": 2, "update_rule": "rwkv"}, "update_rule 'rwkv'"),
        ("LinearAttention", {"q": normal(1, 2, 6), "k": normal(1, 2, 6), "v": normal(1, 2, 4),
                             "p": normal(1, 2, 3, 3)},
         {"q_num_heads": 2, "kv_num_heads": 2, "update_rule": "linear"},
         r"past_state of shape \[1, 2, 3, 3\] must be .* \[1, 2, 3, 2\]"),
        ("LinearAttention", {"q": normal(1, 2, 6), "k": normal(1, 2, 6), "v": normal(1, 2, 6),
                             "": np.zeros(0), "g": normal(1, 2, 4)},
         {"q_num_heads": 2, "kv_num_heads": 2, "update_rule": "gated"},
         r"decay of shape \[1, 2, 4\]"),
        ("LinearAttention", {"q": normal(1, 2, 6), "k": normal(1, 3, 6), "v": normal(1, 2, 6)},
         {"q_num_heads": 2, "kv_num_heads": 2, "update_rule": "linear"},
         r"key of shape \[1, 3, 6\] must be"),
        ("FlexAttention", {"q": normal(1, 3, 2, 4), "k": normal(1, 2, 2, 4),
                           "v": normal(1, 2, 2, 4)}, {}, "Q's heads a multiple of K's"),
        ("FlexAttention", {"q": normal(2, 4), "k": normal(2, 4), "v": normal(2, 4)}, {},
         "must all be 4-D"),
        ("FlexAttention", {"q": normal(1, 1, 2, 0), "k": normal(1, 1, 3, 0),
                           "v": normal(1, 1, 3, 4)}, {}, "give the scale attribute"),
        ("FlexAttention", {"q": normal(1, 1, 2, 4), "k": normal(1, 1, 3, 4),
                           "v": normal(1, 1, 3, 4)}, {"score_mod": flex_bad_mod()},
         r"score_mod gives float32\[\] where float32\[1, 1, 2, 3\]"),
    ],
)  # fmt: skip
def test_refusals_name_the_node(
    op: str, feeds: dict[str, np.ndarray], attrs: dict[str, Any], message: str
) -> None:
    domain = "ai.onnx.preview" if op == "FlexAttention" else "ai.onnx"
    model = op_model(op, feeds, 1 if op == "FlexAttention" else 2, **attrs)
    given = {name: value for name, value in feeds.items() if name}
    with pytest.raises(ValueError, match=rf"node 'n' \({domain}\.{op}\).*{message}"):
        backend.prepare(model).run(given)
