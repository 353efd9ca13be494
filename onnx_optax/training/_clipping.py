"""Global-norm clipping of the gradients as ONNX ops, as ``optax.clip_by_global_norm`` does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_optax._src import checks


def clip_by_global_norm_nodes(
    grads: Sequence[str], max_norm: Any, names: Callable[[str], str], dtype: Any
) -> tuple[list[onnx.NodeProto], list[str]]:
    """Nodes clipping ``grads`` to global norm ``max_norm``, and the clipped tensors' names.

    With ``norm = sqrt(sum of every gradient's squared elements)``, each
    gradient ``g`` becomes ``g`` if ``norm < max_norm`` and
    ``g / norm * max_norm`` otherwise (so zero gradients stay zero). ``dtype``
    is the gradients' (the norm and ``max_norm`` are computed in it, as optax
    does). ``max_norm=None`` writes nothing and returns ``grads``.
    """
    if max_norm is None:
        return [], list(grads)
    limit = checks.stored_number("attach", "clip_global_norm", max_norm, positive=True)
    nodes: list[onnx.NodeProto] = []

    def node(op_type: str, inputs: Sequence[str], base: str, **attributes: Any) -> str:
        output = names(f"clip_global_norm/{base}")
        nodes.append(helper.make_node(op_type, list(inputs), [output], **attributes))
        return output

    squares = [node("ReduceSumSquare", [g], f"{g}.square", keepdims=0) for g in grads]
    norm = node("Sqrt", [node("Sum", squares, "square")], "norm")
    limit_tensor = numpy_helper.from_array(np.asarray(limit, dtype))
    max_norm_name = node("Constant", [], "max_norm", value=limit_tensor)
    keep = node("Less", [norm, max_norm_name], "keep")
    clipped = []
    for g in grads:
        scaled = node("Mul", [node("Div", [g, norm], f"{g}.unit"), max_norm_name], f"{g}.scaled")
        clipped.append(node("Where", [keep, g, scaled], f"{g}.clipped"))
    return nodes, clipped
