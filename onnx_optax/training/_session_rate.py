"""A session's learning rate: R of the next step, and the stored scale that changes it."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from onnx_optax._src import checks
from onnx_optax._src.graph import to_jax
from onnx_optax.training._metrics import shortest_float
from onnx_optax.training._rate import Rate, scale_reaching
from onnx_optax.training._session_placement import Placement


class LearningRate(Placement):
    """R between steps, as onnxruntime-training's ``optimizer.set_learning_rate`` sets it."""

    _rate: Rate
    _fixed: dict[str, np.ndarray]  # the initializers no binding writes
    _constants: list[dict[str, Any]]  # each entry's constants, as its steps read them
    _model: onnx.ModelProto

    @property
    def learning_rate(self) -> float | None:
        """R of the next step: computed as the model computes it, at the current T.

        The shortest number that reads back as R in R's dtype (0.01, not
        0.009999999776). None when R is not computed from T and constants
        alone (it is fed, or the model has several optimizer nodes).
        """
        rate = self._rate
        if rate.unscaled is None:
            return None
        value = rate.unscaled(self._count())
        if rate.scale:
            value = value * self._fixed[rate.scale]
        return shortest_float(value)

    @property
    def learning_rate_scale(self) -> float | None:
        """The factor on R stored in the model: ``R = (learning rate at T) * scale``.

        ``attach`` stores 1. Setting it (a finite number >= 0) multiplies R
        from the next step on (with a schedule, every later value of it) and
        keeps the parameters, V, H and T; the step is not compiled again, and
        :meth:`save` and :meth:`to_model` keep the value. None for a model
        without a scale (attached by an earlier onnx_optax, or made by another
        tool): setting it then raises ValueError saying why.
        """
        if not self._rate.scale:
            return None
        return float(self._fixed[self._rate.scale])

    @learning_rate_scale.setter
    def learning_rate_scale(self, value: float) -> None:
        where = "Session.learning_rate_scale"
        name = self._scale_name(where)
        number = checks.stored_number(where, "the scale", value)
        if number < 0:
            raise ValueError(f"{where}: the scale must be >= 0, got {number}")
        self._set_scale(where, np.asarray(number, self._fixed[name].dtype))

    def set_learning_rate(self, value: float) -> None:
        """Sets the scale so that R of the next step (at the current T) is ``value``.

        As onnxruntime-training's ``optimizer.set_learning_rate``: parameters,
        V, H and T are kept, and nothing is compiled again. With a schedule,
        the whole rest of the schedule is scaled by the same factor (R keeps
        following its shape); :attr:`learning_rate_scale` says by how much.
        ``value`` is rounded to R's dtype, and the scale is chosen so that R
        equals that number exactly where one exists.

        Raises:
          ValueError: the model has no learning-rate scale (see
            :attr:`learning_rate_scale`), R at this T is 0 before the scale
            (a warmup's start: no scale reaches ``value``), or ``value`` is
            not a finite number >= 0.
        """
        where = "Session.set_learning_rate"
        name = self._scale_name(where)
        rate = self._rate
        if rate.unscaled is None:
            raise ValueError(f"{where}: {rate.why}")
        number = checks.stored_number(where, "the learning rate", value)
        if number < 0:
            raise ValueError(f"{where}: the learning rate must be >= 0, got {number}")
        count = self._count()
        unscaled = np.asarray(rate.unscaled(count), self._fixed[name].dtype)
        if unscaled == 0 or not np.isfinite(unscaled):
            raise ValueError(
                f"{where}: R before the scale is {unscaled} at T = {count} (the schedule's "
                f"value there), which no scale turns into {number}; set learning_rate_scale "
                "instead"
            )
        self._set_scale(where, scale_reaching(unscaled, number))

    def _count(self) -> int:
        name = self._rate.count
        return int(self._current(name) if name in self._state else self._fixed[name])

    def _scale_name(self, where: str) -> str:
        if not self._rate.scale:
            raise ValueError(f"{where}: {self._rate.why}")
        return self._rate.scale

    def _set_scale(self, where: str, scale: np.ndarray) -> None:
        """Writes ``scale`` where the steps and :meth:`save` read it (no recompilation)."""
        if not np.isfinite(scale) or scale < 0:
            raise ValueError(f"{where}: the scale would be {scale}, which is not finite and >= 0")
        name = self._rate.scale
        self._fixed[name] = scale
        for constants in self._constants:
            if name in constants:
                constants[name] = self._place(to_jax(f"initializer '{name}'", scale))
        for init in self._model.graph.initializer:
            if init.name == name:
                init.CopyFrom(numpy_helper.from_array(scale, name))
