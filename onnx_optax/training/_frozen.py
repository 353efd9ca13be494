"""Which initializers are weights: what ``attach`` trains and what ``check`` refuses to see trained.

An initializer is *not a weight* when it is not a float tensor (integer and
bool tensors: indices, shapes, counts), or when every use of it in the
inference graph is one of

* a statistic: BatchNormalization's running mean and variance (inputs 3 and 4),
  which the inference graph reads as constants and no gradient should move;
* a shape-like input: an input position that the op registry marks as read
  while tracing (``Op.static`` in ``onnx_ops``: Reshape's shape, Slice's
  starts/ends/axes/steps, Pad's pads and axes, Expand's shape, Tile's repeats,
  ConstantOfShape's shape, Range's start/limit/delta, Squeeze/Unsqueeze/Split/
  ReduceX axes or splits). An op added to the registry with its ``static``
  positions is covered without a change here.

Uses are followed through ``Identity``, ``Cast`` and ``CastLike`` (input 0),
which pass the value on: a float initializer cast to int64 for a Reshape is
shape data. An initializer that is also a graph output, or that any other
input position reads, is a weight, and so is one that nothing reads.
(onnx_optax's runtime knows only integer initializers while tracing, so a
float one read as a shape does not run here at all; naming it is still the
clearer error.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from onnx_optax._src.onnx_nodes import describe
from onnx_optax._src.onnx_ops import OPS, STANDARD_DOMAINS

# Input positions that hold statistics, not weights.
STATISTICS = {"BatchNormalization": {3: "running mean", 4: "running variance"}}
# Ops whose input 0 passes its value on (unchanged or converted): uses are followed through them.
PASS_THROUGH = ("Identity", "Cast", "CastLike")


def _is_float(value: np.ndarray) -> bool:
    return bool(np.issubdtype(value.dtype, np.floating))


def not_weights(graph: onnx.GraphProto, values: Mapping[str, np.ndarray]) -> dict[str, str]:
    """The initializers of ``graph`` that are not weights, each with the reason, in words."""
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, position))
    outputs = {o.name for o in graph.output}

    def reasons(name: str) -> list[str] | None:
        """Why each use of ``name`` is no weight's use; None if some use reads it as data.

        A worklist, not recursion: a chain of pass-through nodes may be long
        (or, in a malformed graph, a cycle).
        """
        found: list[str] = []
        todo, seen = [name], {name}
        while todo:
            current = todo.pop()
            if current in outputs:
                return None
            for node, position in consumers.get(current, []):
                op = node.op_type if node.domain in STANDARD_DOMAINS else None
                if op in PASS_THROUGH and position == 0:
                    if not node.output:
                        return None
                    if node.output[0] not in seen:
                        seen.add(node.output[0])
                        todo.append(node.output[0])
                elif position in STATISTICS.get(op or "", {}):
                    found.append(
                        f"the {STATISTICS[op or ''][position]} (input {position}) of "
                        f"{describe(node)}"
                    )
                elif op in OPS and position in OPS[op].static:
                    found.append(f"read as a shape (input {position} of {describe(node)})")
                else:
                    return None
        return found

    result = {}
    for name, value in values.items():
        if not _is_float(value):
            result[name] = f"of dtype {value.dtype} (not a float)"
            continue
        why = reasons(name)
        if why:
            result[name] = " and ".join(dict.fromkeys(why))
    return result


def _names(argument: str, names: Sequence[str], values: Mapping[str, np.ndarray]) -> list[str]:
    if isinstance(names, str | bytes) or not isinstance(names, Sequence):
        raise TypeError(
            f"{argument}= takes a list of initializer names, got {type(names).__name__} "
            f"{names!r}" + (f"; write [{names!r}]" if isinstance(names, str) else "")
        )
    names = list(names)
    twice = sorted(n for n, k in Counter(names).items() if k > 1)
    if twice:
        raise ValueError(f"{argument}= names {twice} more than once")
    unknown = [n for n in names if n not in values]
    if unknown:
        raise ValueError(
            f"{argument} {unknown} are not initializers of the model's graph; its initializers "
            f"are {list(values)[:20]}" + (" ..." if len(values) > 20 else "")
        )
    return names


def select(
    graph: onnx.GraphProto,
    values: Mapping[str, np.ndarray],
    trainable: Sequence[str] | None,
    frozen: Sequence[str] | None,
) -> list[str]:
    """The initializers ``attach`` trains, in the order given (default: the graph's order).

    ``trainable`` names exactly those; ``frozen`` trains every weight but
    those; neither trains every weight (see :func:`not_weights`). Raises a
    ``ValueError`` naming the culprit for both arguments given, an unknown or
    repeated name, a ``trainable`` name that is not a weight, or nothing left
    to train; a ``TypeError`` for a single string instead of a list.
    """
    if trainable is not None and frozen is not None:
        raise ValueError(
            "pass trainable= (exactly these) or frozen= (every weight but these), not both"
        )
    excluded = not_weights(graph, values)
    weights = [n for n in values if n not in excluded]
    if trainable is not None:
        chosen = _names("trainable", trainable, values)
        bad = [f"'{n}' is {excluded[n]}" for n in chosen if n in excluded]
        if bad:
            raise ValueError(
                f"trainable names initializers that are not weights: {'; '.join(bad)}. "
                "A gradient step would corrupt them; leave them out"
            )
        if not chosen:
            raise ValueError("nothing to train: trainable= is empty")
        return chosen
    if frozen is not None:
        kept = set(_names("frozen", frozen, values))
        chosen = [n for n in weights if n not in kept]
        if not chosen:
            raise ValueError(
                f"nothing to train: frozen= freezes every weight of the model ({weights})"
            )
        return chosen
    if not weights:
        raise ValueError(
            "nothing to train: the model has no float initializer that is a weight"
            + (
                f" ({', '.join(f'{n!r} is {why}' for n, why in excluded.items())})"
                if excluded
                else ""
            )
        )
    return weights


def trained_non_weights(
    where: str, node: onnx.NodeProto, xs: Sequence[str], excluded: Mapping[str, str]
) -> list[str]:
    """``check``'s messages for a Gradient whose ``xs`` include initializers that are no weights."""
    return [
        f"{where}: {describe(node)}: xs '{x}' is {excluded[x]}, not a weight; an optimizer "
        "would move it by its gradient: leave it out of xs (attach's default does)"
        for x in xs
        if x in excluded
    ]
