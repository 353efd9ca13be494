"""Recurrent ops of ai.onnx: RNN, GRU and LSTM, each one ``lax.scan`` per direction.

The three share everything but their cell: the inputs read and checked
(:func:`_inputs`), the activations named by the ``activations`` attribute with
their ``activation_alpha``/``activation_beta`` (:func:`_activations`), the
projection of the whole sequence by ``W`` and the biases (one matmul before the
loop), and the loop itself (:func:`_scan`): forward, reverse or both, with
``sequence_lens`` shorter than the sequence as onnxruntime runs them (the steps
past a sequence's end leave its state alone and output zeros; a reverse
direction starts at the sequence's last valid step). ``layout`` 1 (opset 14)
puts the batch first in X, the states and the outputs. Each cell is the step
of its equations in the ONNX spec, written for one direction on a
``[batch, hidden]`` state; JAX differentiates through the scan, so the weights
train.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src.ops.arrays import check_at_run, check_size
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import canonical, is_static

# name (lowercase, as onnxruntime matches them) -> (fn(x, alpha, beta), alpha, beta): the
# defaults of the ONNX op of that name where there is one; None where the function takes
# no such parameter (it then consumes no value of activation_alpha/activation_beta).
_Fn = Callable[[Any, float, float], Any]
_ACTIVATIONS: dict[str, tuple[_Fn, float | None, float | None]] = {
    "relu": (lambda x, a, b: jnp.maximum(x, 0), None, None),
    "tanh": (lambda x, a, b: jnp.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: jax.nn.sigmoid(x), None, None),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: jnp.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: jnp.where(x > a, x, 0), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * jnp.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: jnp.clip(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: jnp.where(x >= 0, x, a * jnp.expm1(jnp.minimum(x, 0))), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + jnp.abs(x)), None, None),
    "softplus": (lambda x, a, b: jax.nn.softplus(x), None, None),
}
# the names as the spec spells them (onnxruntime's RNN takes these alone)
_SPELT = frozenset(
    {"Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh"}
    | {"HardSigmoid", "Elu", "Softsign", "Softplus"}
)
_DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}

Activation = Callable[[Any], Any]


class _Inputs(NamedTuple):
    """A node's inputs as one direction-major, sequence-first computation sees them."""

    x: Any  # [seq, batch, input]
    w: Any  # [directions, gates * hidden, input]
    r: Any  # [directions, gates * hidden, hidden]
    b: Any  # [directions, 2 * gates * hidden] (zeros when omitted)
    lengths: Any  # [batch] int32, or None: every sequence is seq long
    states: tuple[Any, ...]  # each [directions, batch, hidden] (zeros when omitted)
    hidden: int
    directions: int


def _activations(
    node: Node, defaults: Sequence[str], directions: int, exact: bool = False
) -> list[list[Activation]]:
    """The cell's activations for each direction (``defaults`` for one when the attribute
    is absent), their alphas and betas bound. Names match in any case, as onnxruntime's
    LSTM and GRU match them, or ``exact``ly as spelt in the spec (its RNN: 'Tanh', not
    'tanh')."""
    per_direction = len(defaults)
    names = [str(name) for name in node.get("activations") or defaults]
    if len(names) == per_direction * directions:
        pass
    elif len(names) == per_direction:  # one set given for both directions
        names = names * directions
    elif len(names) > per_direction * directions and node["activations"] == ["Tanh", "Tanh"]:
        names = names[:per_direction]  # RNN's schema default, for a single direction
    else:
        raise ValueError(
            f"{node.where}: {len(names)} activations given; {per_direction} per direction "
            f"({per_direction * directions} in all) are needed"
        )
    alphas = list(node.get("activation_alpha") or [])
    betas = list(node.get("activation_beta") or [])
    bound: list[Activation] = []
    for name in names:  # each takes the next alpha/beta if it uses one, as onnxruntime does
        found = _ACTIVATIONS.get(name.lower())
        if found is None or (exact and name not in _SPELT):
            raise ValueError(
                f"{node.where}: unknown activation '{name}' (one of Relu, Tanh, Sigmoid, Affine, "
                "LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus)"
            )
        fn, alpha, beta = found
        a = 0.0 if alpha is None else float(alphas.pop(0)) if alphas else alpha
        b = 0.0 if beta is None else float(betas.pop(0)) if betas else beta
        bound.append(functools.partial(_bound, fn, a, b))
    return [bound[d * per_direction : (d + 1) * per_direction] for d in range(directions)]


def _bound(fn: _Fn, alpha: float, beta: float, x: Any) -> Any:
    return fn(x, alpha, beta)


def _check_shape(node: Node, name: str, value: Any, shape: Sequence[int]) -> None:
    if tuple(np.shape(value)) != tuple(shape):
        raise ValueError(
            f"{node.where}: {name} has shape {list(np.shape(value))}, {list(shape)} expected"
        )


def _inputs(node: Node, gates: int, n_states: int, given: Sequence[Any]) -> _Inputs:
    """The inputs checked against each other, layout 1 moved to layout 0, omitted ones filled."""
    padded: list[Any] = [*given, *[None] * (5 + n_states - len(given))]
    x, w, r, b, lengths, *states = padded
    direction = node["direction"]
    if direction not in _DIRECTIONS:
        raise ValueError(
            f"{node.where}: direction '{direction}' must be forward, reverse or bidirectional"
        )
    directions = _DIRECTIONS[direction]
    layout = int(node.get("layout", 0))
    if layout not in (0, 1):
        raise ValueError(f"{node.where}: layout {layout} must be 0 or 1")
    if np.ndim(x) != 3:
        raise ValueError(f"{node.where}: X must be 3-D, got shape {list(np.shape(x))}")
    if np.ndim(r) != 3:
        raise ValueError(f"{node.where}: R must be 3-D, got shape {list(np.shape(r))}")
    hidden = int(np.shape(r)[-1])
    if node.get("hidden_size") is not None and int(node["hidden_size"]) != hidden:
        raise ValueError(
            f"{node.where}: hidden_size {node['hidden_size']} but R has shape {list(np.shape(r))}"
        )
    dtype = canonical(x.dtype)
    x = jnp.asarray(x, dtype)
    if layout:
        x = jnp.swapaxes(x, 0, 1)
    seq, batch, size = x.shape
    _check_shape(node, "W", w, (directions, gates * hidden, size))
    _check_shape(node, "R", r, (directions, gates * hidden, hidden))
    if b is None:
        b = jnp.zeros((directions, 2 * gates * hidden), dtype)
    _check_shape(node, "B", b, (directions, 2 * gates * hidden))
    check_size(node, (seq, directions, batch, hidden), dtype, "Y")
    filled = []
    for name, state in zip(("initial_h", "initial_c")[:n_states], states, strict=True):
        if state is None:
            state = jnp.zeros((directions, batch, hidden), dtype)
        elif layout:
            _check_shape(node, name, state, (batch, directions, hidden))
            state = jnp.swapaxes(jnp.asarray(state, dtype), 0, 1)
        _check_shape(node, name, state, (directions, batch, hidden))
        filled.append(jnp.asarray(state, dtype))
    if lengths is not None:
        _check_shape(node, "sequence_lens", lengths, (batch,))
        if is_static(lengths) or not isinstance(lengths, jax.core.Tracer):
            lengths = np.asarray(lengths)
            if np.all(lengths == seq):
                lengths = None  # the whole sequence: the plain loop
        if lengths is not None:
            check_at_run(
                f"{node.where}: sequence_lens holds {{}}, outside [0, {seq}]",
                (lengths < 0) | (lengths > seq),
                lengths,
            )
            lengths = jnp.asarray(lengths, jnp.int32)
    w, r, b = (jnp.asarray(v, dtype) for v in (w, r, b))
    return _Inputs(x, w, r, b, lengths, tuple(filled), hidden, directions)


def _scan(
    cell: Callable[[Any, tuple[Any, ...]], tuple[Any, ...]],
    xw: Any,
    states: tuple[Any, ...],
    lengths: Any,
    reverse: bool,
) -> tuple[Any, tuple[Any, ...]]:
    """One direction: ``cell(xw_t, states) -> states`` (the first is the output) over the
    sequence axis 0 of ``xw``; Y ``[seq, batch, hidden]`` and the final states.

    With ``lengths``, step ``t`` of a sequence shorter than ``t + 1`` keeps its states and
    outputs zeros; in reverse, each sequence is reversed within its own length. A sequence
    of length 0 has zero final states, as onnxruntime gives.
    """
    if lengths is None:

        def plain(carry: tuple[Any, ...], xt: Any) -> tuple[tuple[Any, ...], Any]:
            new = cell(xt, carry)
            return new, new[0]

        final, ys = lax.scan(plain, states, xw, reverse=reverse)
        return ys, final
    steps = jnp.arange(xw.shape[0], dtype=jnp.int32)[:, None]
    valid = steps < lengths[None, :]  # [seq, batch]
    if reverse:  # step t reads element lengths - 1 - t of its sequence
        order = jnp.where(valid, lengths[None, :] - 1 - steps, steps)
        xw = jnp.take_along_axis(xw, order[:, :, None], axis=0)

    def masked(carry: tuple[Any, ...], step: Any) -> tuple[tuple[Any, ...], Any]:
        xt, ok = step
        new = cell(xt, carry)
        kept = tuple(jnp.where(ok[:, None], n, c) for n, c in zip(new, carry, strict=True))
        return kept, jnp.where(ok[:, None], new[0], jnp.zeros_like(new[0]))

    final, ys = lax.scan(masked, states, (xw, valid))
    # A sequence of length 0 ends in zero states, not its initial ones (onnxruntime's choice).
    final = tuple(jnp.where((lengths > 0)[:, None], f, jnp.zeros_like(f)) for f in final)
    if reverse:  # the same permutation puts each output back where its input was
        ys = jnp.take_along_axis(ys, order[:, :, None], axis=0)
    return ys, final


def _run(
    node: Node,
    inputs: _Inputs,
    activations: list[list[Activation]],
    make_cell: Callable[..., Callable[[Any, tuple[Any, ...]], tuple[Any, ...]]],
    gates: int,
    extra: Sequence[Any] = (),
) -> tuple[Any, ...]:
    """Every direction scanned; Y, then the final states, in the node's layout."""
    n = gates * inputs.hidden
    # The input projection of the whole sequence, one matmul per direction before the loop,
    # with the W bias; the R bias goes to the cell (GRU's linear_before_reset needs it there).
    xw = jnp.einsum("sbi,dgi->dsbg", inputs.x, inputs.w) + inputs.b[:, None, None, :n]
    ys, finals = [], []
    for d in range(inputs.directions):
        reverse = node["direction"] == "reverse" or d == 1
        cell = make_cell(
            inputs.r[d], inputs.b[d, n:], activations[d], *(e if e is None else e[d] for e in extra)
        )
        states = tuple(s[d] for s in inputs.states)
        y, final = _scan(cell, xw[d], states, inputs.lengths, reverse)
        ys.append(y)
        finals.append(final)
    y = jnp.stack(ys, axis=1)  # [seq, directions, batch, hidden]
    outs = [jnp.stack([f[k] for f in finals]) for k in range(len(inputs.states))]
    if int(node.get("layout", 0)):
        y = jnp.transpose(y, (2, 0, 1, 3))  # [batch, seq, directions, hidden]
        outs = [jnp.swapaxes(o, 0, 1) for o in outs]  # [batch, directions, hidden]
    return (y, *outs)[: node.n_outputs]


def _clipper(node: Node) -> Callable[[Any], Any]:
    clip = node.get("clip")
    if clip is None:
        return lambda v: v
    if not clip > 0:
        raise ValueError(f"{node.where}: clip {clip} must be positive")
    return lambda v: jnp.clip(v, -clip, clip)


# ----------------------------------------------------------------------------- RNN


@register("RNN")
def _rnn(node: Node, *given: Any) -> Any:
    inputs = _inputs(node, 1, 1, given)
    clip = _clipper(node)

    def make_cell(r: Any, rb: Any, fns: list[Activation]) -> Any:
        (f,) = fns

        def cell(xt: Any, states: tuple[Any, ...]) -> tuple[Any, ...]:
            (h,) = states
            return (f(clip(xt + h @ r.T + rb)),)

        return cell

    activations = _activations(node, ["Tanh"], inputs.directions, exact=True)
    return _run(node, inputs, activations, make_cell, 1)


# ----------------------------------------------------------------------------- GRU


@register("GRU")
def _gru(node: Node, *given: Any) -> Any:
    inputs = _inputs(node, 3, 1, given)
    clip = _clipper(node)
    hidden = inputs.hidden
    before_reset = bool(node.get("linear_before_reset", 0))

    def make_cell(r: Any, rb: Any, fns: list[Activation]) -> Any:
        f, g = fns
        r_zr, r_h = r[: 2 * hidden], r[2 * hidden :]
        rb_zr, rb_h = rb[: 2 * hidden], rb[2 * hidden :]

        def cell(xt: Any, states: tuple[Any, ...]) -> tuple[Any, ...]:
            (h,) = states
            zr = f(clip(xt[:, : 2 * hidden] + h @ r_zr.T + rb_zr))
            z, reset = zr[:, :hidden], zr[:, hidden:]
            if before_reset:  # reset after R's product: ht = g(xWh + r * (h Rh + Rbh) + Wbh)
                candidate = xt[:, 2 * hidden :] + reset * (h @ r_h.T + rb_h)
            else:  # reset before it: ht = g(xWh + (r * h) Rh + Rbh + Wbh)
                candidate = xt[:, 2 * hidden :] + (reset * h) @ r_h.T + rb_h
            return ((1 - z) * g(clip(candidate)) + z * h,)

        return cell

    return _run(
        node, inputs, _activations(node, ["Sigmoid", "Tanh"], inputs.directions), make_cell, 3
    )


# ----------------------------------------------------------------------------- LSTM


@register("LSTM")
def _lstm(node: Node, *given: Any) -> Any:
    inputs = _inputs(node, 4, 2, given[:7])
    clip = _clipper(node)
    hidden = inputs.hidden
    coupled = bool(node.get("input_forget", 0))
    peepholes = given[7] if len(given) > 7 else None
    if peepholes is not None:
        _check_shape(node, "P", peepholes, (inputs.directions, 3 * hidden))
        peepholes = jnp.asarray(peepholes, inputs.x.dtype)

    def make_cell(r: Any, rb: Any, fns: list[Activation], p: Any) -> Any:
        f, g, h_fn = fns

        def cell(xt: Any, states: tuple[Any, ...]) -> tuple[Any, ...]:
            h, c = states
            pre = xt + h @ r.T + rb  # gates i, o, f, c
            pre_i, pre_o = pre[:, :hidden], pre[:, hidden : 2 * hidden]
            pre_f, pre_c = pre[:, 2 * hidden : 3 * hidden], pre[:, 3 * hidden :]
            if p is not None:
                pre_i = pre_i + p[:hidden] * c
                pre_f = pre_f + p[2 * hidden :] * c
            i = f(clip(pre_i))
            forget = 1 - i if coupled else f(clip(pre_f))
            c_new = forget * c + i * g(clip(pre_c))
            if p is not None:
                pre_o = pre_o + p[hidden : 2 * hidden] * c_new
            o = f(clip(pre_o))
            return o * h_fn(c_new), c_new

        return cell

    activations = _activations(node, ["Sigmoid", "Tanh", "Tanh"], inputs.directions)
    return _run(node, inputs, activations, make_cell, 4, (peepholes,))
