"""A session's inference: the inference graph's outputs with the current weights."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from onnx_optax.training._combined import Inference, check_feeds
from onnx_optax.training._dropout import switched_off
from onnx_optax.training._session_placement import Placement


class Inferring(Placement):
    """The inference graph run on the session's devices, compiled once per set of outputs."""

    _model: onnx.ModelProto
    _inference: dict[tuple[str, ...], Inference]  # by output names

    def run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """The inference graph's ``outputs`` (default: all) with the current initializers.

        Only the nodes those outputs need run, compiled once per set of
        outputs and feed signature: the current initializers are arguments of
        the compiled function, not constants in it, so a :meth:`step` between
        two runs needs no new compilation. The feeds those outputs need are
        checked as the graph declares them (names, dtypes, shapes); others
        are ignored. Runs on JAX's default device, or with ``devices=`` on the
        session's devices, reading the weights in their layout there.
        """
        if outputs is not None and (
            isinstance(outputs, str)
            or not isinstance(outputs, Sequence)
            or not all(isinstance(n, str) for n in outputs)
        ):
            raise TypeError(f"outputs must be a list of output names or None; got {outputs!r}")
        names = (
            tuple(o.name for o in self._model.graph.output) if outputs is None else tuple(outputs)
        )
        inference = self._inference.get(names)
        if inference is None:
            inference = Inference(self._model, self._dtypes, names, switched_off(self._model.graph))
            self._inference[names] = inference
        feeds = check_feeds(
            "Session.run", f"the graph of outputs {list(names)}", inference.feeds, inputs, {}
        )
        values = inference.function({**feeds, **{n: self._state[n] for n in inference.state}})
        return dict(zip(inference.function.output_names, values, strict=True))
