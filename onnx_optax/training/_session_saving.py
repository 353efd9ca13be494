"""A session's model written back: the training model, the inference model, a saved file."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

import onnx
from onnx import numpy_helper

from onnx_optax.training._dropout import switched_off
from onnx_optax.training._export import fold_casts, save_model, strip_training
from onnx_optax.training._session_placement import Placement


class Saving(Placement):
    """The model with the current state: as a proto, without the training, or as a file."""

    _model: onnx.ModelProto  # the bound initializers hold no data there

    def _with_state(self, strip: bool) -> onnx.ModelProto:
        model = onnx.ModelProto()
        model.CopyFrom(self._model)  # the bound initializers hold no data there
        if strip:
            strip_training(model)
            off = switched_off(model.graph)  # Dropout in inference mode
            for init in model.graph.initializer:
                if init.name in off:
                    init.CopyFrom(off[init.name])
        for init in model.graph.initializer:
            if init.name in self._state:
                init.CopyFrom(numpy_helper.from_array(self._current(init.name), init.name))
        if strip:  # float32 master weights back to the dtype the inference graph reads
            fold_casts(model, self._state)
        return model

    def to_model(self) -> onnx.ModelProto:
        """The model with the same graphs and every bound initializer's current value.

        protobuf cannot serialize a model above 2 GiB: :meth:`save` writes one
        with external data.
        """
        return self._with_state(strip=False)

    def to_inference_model(self) -> onnx.ModelProto:
        """The inference graph with the current weights, and nothing of the training.

        No ``training_info``, no optimizer state or T, no local function or
        opset import only the training used; the weights are bit-identical to
        :attr:`initializers`.
        """
        return self._with_state(strip=True)

    def save(
        self,
        path: str | os.PathLike[str],
        *,
        external_data: bool | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """Writes :meth:`to_model` to ``path``; ``Session(path)`` resumes bit-identically.

        Args:
          path: the ``.onnx`` file to write (its folder must exist).
          external_data: write every tensor of 1 KiB or more to
            ``<file name>.data`` beside it, as ONNX external data. None (the
            default) does so when the model would exceed protobuf's 2 GiB
            limit; False refuses such a model with a ValueError.
          metadata: entries to set in the saved model's ``metadata_props``
            (replacing those of the same key; the session's model is unchanged).

        Each file is written new in the folder and renamed into place (the
        data file first): a symbolic link at ``path`` or at its ``.data`` file
        is replaced, its target never written; a failure leaves the previous
        files as they were. A ``path`` that is a folder is a ValueError.
        """
        model = onnx.ModelProto()
        model.CopyFrom(self._model)  # the bound initializers hold no data there
        if metadata:
            kept = [(p.key, p.value) for p in model.metadata_props if p.key not in metadata]
            del model.metadata_props[:]
            for key, value in [*kept, *metadata.items()]:
                model.metadata_props.add(key=str(key), value=str(value))
        arrays = {n: functools.partial(self._current, n) for n in self._state}
        save_model(model, path, external_data, arrays)
