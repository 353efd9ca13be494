"""Signal ops of ai.onnx: DFT, STFT, the Hann, Hamming and Blackman windows, MelWeightMatrix.

A complex tensor is a real one with a trailing axis of 2 (real, imaginary); a
real signal has a trailing axis of 1. DFT and STFT compute with ``jnp.fft`` (a
real signal with the real FFT) in the input's precision (float32 for narrower
floats), as numpy does, and are differentiable in their signal. The windows and
the mel matrix depend on their static inputs alone, so they are computed on the
host while tracing (constants of the compiled graph).
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src.onnx_tensors import tensor_dtype
from onnx_optax._src.ops.arrays import check_scalar_like, check_size, int_check, norm_axis
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import canonical

# ----------------------------------------------------------------------------- helpers


def _scalar(node: Node, value: Any, name: str) -> int:
    """A one-element integer input (static) as an int."""
    int_check(node, value, name)
    if np.size(value) != 1:
        raise ValueError(f"{node.where}: {name} must hold one value, got shape {np.shape(value)}")
    return int(np.asarray(value).reshape(()))


def _work_dtype(x: Any) -> np.dtype:
    """float32 for float16/bfloat16/float32, else x's dtype (double)."""
    dtype = np.dtype(x.dtype)
    return canonical(dtype if dtype.itemsize >= 8 else np.float32)


def _forward(values: Any, length: int, axis: int, onesided: bool) -> Any:
    """The DFT of ``values`` cut or zero-padded to ``length``: a real signal through the
    real FFT (its Nyquist bin exactly real), the full spectrum then completed by its
    symmetry ``X[L - k] = conj(X[k])``."""
    if jnp.iscomplexobj(values):
        spectrum = jnp.fft.fft(values, n=length, axis=axis)
        return spectrum.take(jnp.arange(length // 2 + 1), axis=axis) if onesided else spectrum
    half = jnp.fft.rfft(values, n=length, axis=axis)
    if onesided:
        return half
    mirrored = jnp.flip(half.take(jnp.arange(1, length - length // 2), axis=axis), axis=axis)
    return jnp.concatenate([half, jnp.conj(mirrored)], axis=axis)


def _complex(node: Node, x: Any) -> Any:
    """The values of ``[..., 1]`` (real) or ``[..., 2]`` (real, imaginary) as complex."""
    if np.ndim(x) < 2 or x.shape[-1] not in (1, 2):
        raise ValueError(
            f"{node.where}: input of shape {list(np.shape(x))} must end in an axis of 1 (real) "
            "or 2 (real and imaginary parts)"
        )
    x = jnp.asarray(x).astype(_work_dtype(x))
    if x.shape[-1] == 1:
        return x[..., 0]
    return lax.complex(x[..., 0], x[..., 1])


def _pairs(values: Any, dtype: Any) -> Any:
    """Complex values as real ``[..., 2]`` of ``dtype``."""
    return jnp.stack([jnp.real(values), jnp.imag(values)], axis=-1).astype(canonical(dtype))


# ----------------------------------------------------------------------------- DFT


def _dft_axis(node: Node, x: Any, axis: Any) -> int:
    """The signal axis: the attribute (opsets 17 to 19, default 1) or the input (opset 20,
    default -2), never the trailing complex axis."""
    if node.opset < 20:
        given = int(node.get("axis", 1))
    else:
        given = -2 if axis is None or np.size(axis) == 0 else _scalar(node, axis, "axis")
    rank = np.ndim(x)
    found = norm_axis(given, rank, node.where)
    if found == rank - 1:
        raise ValueError(
            f"{node.where}: axis {given} is the trailing (real, imaginary) axis of an input of "
            f"rank {rank}; the signal axis must come before it"
        )
    return found


@register("DFT", static=(1, 2))
def _dft(node: Node, x: Any, dft_length: Any = None, axis: Any = None) -> Any:
    """``y[k] = sum_n x[n] exp(-2 pi i k n / L)`` along the signal axis (``exp(+...) / L``
    when ``inverse``), the signal zero-padded or cut to ``L = dft_length`` (default: its
    length). ``onesided``: forward, the ``L // 2 + 1`` first bins; inverse, the real
    signal of length L (default ``2 * (bins - 1)``) whose one-sided spectrum x is
    (numpy's irfft), with a trailing axis of 1."""
    inverse, onesided = bool(node["inverse"]), bool(node["onesided"])
    where = _dft_axis(node, x, axis)
    values = _complex(node, x)
    if inverse and onesided and x.shape[-1] != 2:  # onnx's shape inference refuses it too
        raise ValueError(
            f"{node.where}: an inverse one-sided DFT takes a complex input (a last axis of 2), "
            f"got shape {list(x.shape)}"
        )
    if dft_length is None or np.size(dft_length) == 0:
        length = 2 * (x.shape[where] - 1) if inverse and onesided else x.shape[where]
    else:
        check_scalar_like(node, dft_length, "dft_length")  # onnxruntime: a 2-D one is refused
        length = _scalar(node, dft_length, "dft_length")
    if length < 1:
        raise ValueError(f"{node.where}: dft_length is {length}; it must be positive")
    out = list(x.shape)
    out[where] = length // 2 + 1 if onesided and not inverse else length
    check_size(node, out, _work_dtype(x))
    if inverse and onesided:
        signal = jnp.fft.irfft(values, n=length, axis=where)
        return signal[..., None].astype(canonical(x.dtype))
    if inverse:
        return _pairs(jnp.fft.ifft(values, n=length, axis=where), x.dtype)
    return _pairs(_forward(values, length, where, onesided), x.dtype)


@register("STFT", static=(1, 3))
def _stft(
    node: Node, signal: Any, frame_step: Any, window: Any = None, frame_length: Any = None
) -> Any:
    """Frames ``t`` of the signal ``[batch, length, 1 or 2]``, starting every ``frame_step``,
    each times ``window`` and DFT-ed: ``[batch, frames, bins, 2]``, ``frames = 1 +
    (length - frame_length) // frame_step``, ``bins = frame_length // 2 + 1`` when
    ``onesided`` (a real signal only) else ``frame_length``."""
    if np.ndim(signal) != 3:
        raise ValueError(
            f"{node.where}: signal of shape {list(np.shape(signal))} must be [batch, length, 1 "
            "or 2]"
        )
    values = _complex(node, signal)
    step = _scalar(node, frame_step, "frame_step")
    if window is not None and np.ndim(window) != 1:
        raise ValueError(f"{node.where}: window of shape {list(np.shape(window))} must be 1-D")
    if frame_length is not None:
        size = _scalar(node, frame_length, "frame_length")
        if window is not None and window.shape[0] != size:
            raise ValueError(
                f"{node.where}: window of length {window.shape[0]} does not match frame_length "
                f"{size}"
            )
    else:
        size = signal.shape[1] if window is None else window.shape[0]
    onesided = bool(node["onesided"])
    if onesided and signal.shape[-1] == 2:
        raise ValueError(f"{node.where}: onesided=1 needs a real signal (a trailing axis of 1)")
    length = signal.shape[1]
    if step < 1 or not 1 <= size <= length:
        raise ValueError(
            f"{node.where}: frame_step {step} must be positive and frame_length {size} within "
            f"the signal's length {length}"
        )
    frames = 1 + (length - size) // step
    bins = size // 2 + 1 if onesided else size
    check_size(node, [signal.shape[0], frames, bins, 2], _work_dtype(signal))
    starts = np.arange(frames) * step
    framed = values[:, starts[:, None] + np.arange(size)]  # [batch, frames, size]
    if window is not None:
        weights = jnp.asarray(window).astype(_work_dtype(signal))
        if jnp.iscomplexobj(framed):
            weights = lax.complex(weights, jnp.zeros_like(weights))
        framed = framed * weights
    return _pairs(_forward(framed, size, framed.ndim - 1, onesided), signal.dtype)


# ----------------------------------------------------------------------------- windows


def _window(
    name: str, terms: tuple[float, ...]
) -> Any:  # the op: sum_k (-1)^k a_k cos(2 pi k n / N)
    def run(node: Node, size: Any) -> Any:
        length = _scalar(node, size, "size")
        if length < 0:
            raise ValueError(f"{node.where}: size is {length}; it must be non-negative")
        dtype = tensor_dtype(node["output_datatype"], node.where)
        check_size(node, [length], dtype)
        period = length if node["periodic"] else length - 1
        n = np.arange(length, dtype=np.float64)
        phase = 2 * math.pi * n / period if period > 0 else np.zeros(length)
        values = sum((-1) ** k * a * np.cos(k * phase) for k, a in enumerate(terms))
        return np.asarray(values, np.float64).astype(dtype)

    run.__name__ = f"_{name.lower()}"
    run.__doc__ = (
        f"{name} of ``size`` N: ``w[n] = sum_k (-1)^k a_k cos(2 pi k n / M)``, ``a = {terms}``, "
        "``M = N`` when ``periodic`` else ``N - 1``, in ``output_datatype`` (a symmetric "
        "window of size 1 is its value at n = 0, not the formula's 0/0)."
    )
    return run


register("HannWindow", static=(0,))(_window("HannWindow", (0.5, 0.5)))
register("HammingWindow", static=(0,))(_window("HammingWindow", (25 / 46, 21 / 46)))
register("BlackmanWindow", static=(0,))(_window("BlackmanWindow", (0.42, 0.5, 0.08)))


# ----------------------------------------------------------------------------- mel


def _hertz_to_mel(hertz: float) -> float:
    return 2595 * math.log10(1 + hertz / 700)


@register("MelWeightMatrix", static=(0, 1, 2, 3, 4))
def _mel_weight_matrix(
    node: Node, mel_bins: Any, dft_length: Any, sample_rate: Any, lower: Any, upper: Any
) -> Any:
    """``[dft_length // 2 + 1, num_mel_bins]`` triangular filters: ``num_mel_bins + 2``
    points evenly spaced in mel (``2595 log10(1 + f / 700)``) from ``lower_edge_hertz``
    (by steps of ``(mel(upper) - mel(lower)) / (num_mel_bins + 2)``), back to hertz, to
    the spectrogram bin ``floor((dft_length + 1) f / sample_rate)``; filter i rises from
    point i to point i + 1 and falls to point i + 2 (the spec's formula)."""
    bins, length = _scalar(node, mel_bins, "num_mel_bins"), _scalar(node, dft_length, "dft_length")
    rate = _scalar(node, sample_rate, "sample_rate")
    low, high = (float(np.asarray(v).reshape(())) for v in (lower, upper))
    if bins < 1 or length < 1 or rate < 1 or not 0 <= low < high:
        raise ValueError(
            f"{node.where}: num_mel_bins {bins}, dft_length {length} and sample_rate {rate} "
            f"must be positive and 0 <= lower_edge_hertz {low} < upper_edge_hertz {high}"
        )
    dtype = tensor_dtype(node["output_datatype"], node.where)
    spectrum = length // 2 + 1
    # onnxruntime: the bin of upper_edge_hertz, in float32, within the spectrum
    top = int(np.floor(np.float32(length + 1) * np.float32(high) / np.float32(rate)))
    if top >= spectrum:
        raise ValueError(
            f"{node.where}: upper_edge_hertz {high} falls in bin {top}, past the {spectrum} "
            f"spectrogram bins (sample_rate {rate}, dft_length {length})"
        )
    check_size(node, [spectrum, bins], dtype)
    step = (_hertz_to_mel(high) - _hertz_to_mel(low)) / (bins + 2)
    mels = np.arange(bins + 2) * step + _hertz_to_mel(low)
    hertz = 700 * np.expm1(mels / 2595 * math.log(10))
    points = ((length + 1) * hertz // rate).astype(np.int64)
    if points[-1] >= spectrum:
        raise ValueError(
            f"{node.where}: upper_edge_hertz {high} lies past the last of the {spectrum} "
            f"spectrogram bins (sample_rate {rate}, dft_length {length})"
        )
    out = np.zeros((spectrum, bins))
    j = np.arange(spectrum)
    for i in range(bins):
        left, center, right = points[i : i + 3]
        if center == left:
            out[center, i] = 1
        else:
            rising = (j >= left) & (j <= center)
            out[rising, i] = (j[rising] - left) / (center - left)
        if right > center:
            falling = (j >= center) & (j < right)
            out[falling, i] = (right - j[falling]) / (right - center)
    return out.astype(dtype)
