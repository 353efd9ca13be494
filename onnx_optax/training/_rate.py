"""Where a session's R comes from: the learning-rate scale attach stores, R before it."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import onnx

from onnx_optax._src.onnx_graph import rate_scale
from onnx_optax.training._metrics import optimizer_of, rate_function


def scale_reaching(unscaled: np.ndarray, number: float) -> np.ndarray:
    """The scale, in ``unscaled``'s dtype, for which ``unscaled * scale`` is ``number`` rounded
    to that dtype: the quotient rounded, or a neighbour of it where that one misses."""
    want = np.asarray(number, unscaled.dtype)
    scale = np.asarray(number / float(unscaled), unscaled.dtype)
    for candidate in (scale, *_neighbours(scale)):
        if unscaled * candidate == want:
            return candidate
    return scale


def _neighbours(value: np.ndarray) -> list[np.ndarray]:
    """The numbers of ``value``'s dtype just above and below it (none for dtypes numpy lacks)."""
    try:
        return [np.nextafter(value, limit, dtype=value.dtype) for limit in (np.inf, -np.inf)]
    except TypeError:
        return []


class Rate:
    """Where a session's R comes from: its scale, and R before the scale as a function of T."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self._model = model
        self.scale = ""  # the scale initializer's name; "" when there is none
        self.count = ""  # T's name
        self._base: tuple[int, str] | None = None  # the entry and R before the scale
        found, why = optimizer_of(model)
        if found is None:
            self.why = f"the learning rate cannot be changed: {why}"
            return
        index, node = found
        rate, self.count = node.input[0], node.input[1]
        scaled = rate_scale(model, model.training_info[index].algorithm, rate)
        if scaled is None:
            self._base = index, rate
            self.why = (
                f"the model stores no learning-rate scale: R ('{rate}') of its optimizer node "
                "is not the product of a value and a scalar initializer that only it reads "
                "(attach writes one, 'R.scale'; this model was attached by an earlier "
                "onnx_optax or made by another tool). Attaching its inference model again "
                "(session.to_inference_model()) gives one, with V, H and T started anew"
            )
        else:
            self._base = index, scaled[0]
            self.scale, self.why = scaled[1], ""

    @functools.cached_property
    def unscaled(self) -> Callable[[int], np.ndarray] | None:
        """R before the scale (R itself without one) as a function of T; None when it is not
        computed from T and constants (``why`` then says why)."""
        if self._base is None:
            return None
        function, why = rate_function(self._model, self._base[0], self._base[1], self.count)
        if function is None:
            self.why = f"R cannot be computed: {why}"
        return function
