"""Errors a graph raises: whatever running a node raises, as a promised error naming
the node; an unsupported op named; too much work refused before anything is traced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from onnx_optax._src.graph.support import GRADIENT_WORK, is_supported
from onnx_optax._src.onnx_nodes import (
    DOMAIN,
    LISTED,
    UnsupportedOperatorError,
    describe,
    shown,
)
from onnx_optax._src.ops import (
    ADVICE,
    ML_DOMAIN,
    REGISTRY,
    domain_of,
)

PROMISED = (TypeError, ValueError, NotImplementedError)


def wrap(where: str, error: Exception, *, always: bool = False) -> Exception:
    """A promised error (TypeError, ValueError, NotImplementedError) naming the node.

    One that names a node already (raised by a node inside a Gradient, or by the
    step itself) is returned as it is; another is rebuilt with the node's name in
    front, of its own type when that type takes a message alone, else of the
    promised type it derives from. ``always``: prefixed even then (an error inside a
    subgraph, named by its node there, prefixed with the node holding the subgraph).
    """
    message = str(error)
    if message.startswith("node ") and not always:
        return error
    message = f"{where}: {message}"
    try:
        wrapped = type(error)(message)
    except Exception:  # a subclass with another signature (JAX's tracer errors)
        wrapped = None
    if wrapped is None or str(wrapped) != message:
        wrapped = next(kind for kind in PROMISED if isinstance(error, kind))(message)
    return wrapped


def _unexpected(where: str, error: Exception) -> ValueError:
    """Any other exception raised while running a node, as a ValueError naming it."""
    if isinstance(error, MemoryError):
        return ValueError(
            f"{where}: ran out of host memory while computing it ({error or 'MemoryError'}); "
            "lower limits=Limits(tensor_bytes=...) to have such a tensor refused by name"
        )
    return ValueError(f"{where}: cannot run it: {type(error).__name__}: {error}")


@contextlib.contextmanager
def node_errors(where: str) -> Iterator[None]:
    """The one boundary around running a node: whatever it raises ends in a promised error.

    TypeError, ValueError and NotImplementedError are given the node's name (see
    :func:`wrap`); any other ``Exception`` (ZeroDivisionError, IndexError,
    KeyError, OverflowError, RecursionError, MemoryError: a model's numbers
    reaching an op's arithmetic) becomes a ValueError naming the node, the original
    kept as ``__cause__``. MemoryError is included: the model chose the size that
    failed, so the caller gets the node to blame rather than a bare MemoryError.
    What is not an ``Exception`` (KeyboardInterrupt, SystemExit) passes untouched.
    """
    try:
        yield
    except PROMISED as error:
        wrapped = wrap(where, error)
        if wrapped is error:
            raise
        raise wrapped from None
    except Exception as error:
        raise _unexpected(where, error) from error


def unsupported_error(nodes: Sequence[Any], opsets: Mapping[str, int]) -> UnsupportedOperatorError:
    """One error naming the unsupported (domain, op, opset) among ``nodes``: how many,
    and the first LISTED of them (sorted)."""
    found = sorted(
        {
            (node.domain or "ai.onnx", node.op_type, opsets.get(domain_of(node), 0))
            for node in nodes
            if not is_supported(node)
        }
    )
    first = next(node for node in nodes if not is_supported(node))
    ops = ", ".join(f"{shown(d)}.{shown(op)} (opset {v})" for d, op, v in found[:LISTED])
    if len(found) > LISTED:
        ops += f" and {len(found) - LISTED:,} more"
    advice = "".join(f" {ADVICE[op]}." for d, op, _ in found if d == ML_DOMAIN and op in ADVICE)
    runs = ", ".join(f"{len(table)} ops of {d or 'ai.onnx'}" for d, table in REGISTRY.items())
    return UnsupportedOperatorError(
        f"{describe(first)}: unsupported op {shown(first.op_type)} in domain "
        f"'{shown(first.domain or 'ai.onnx')}'; the graph needs {len(found)} unsupported "
        f"op(s): {ops}."
        f"{advice} onnx_optax runs {runs} (see docs/onnx-ops.md), and Adagrad, Adam, "
        f"Momentum and Gradient of '{DOMAIN}'"
    )


def too_much_work(what: str, work: int, limit: int, *, at_least: bool = False) -> ValueError:
    """A trace of more node runs than the limit (``Limits.traced_nodes``), refused by name."""
    return ValueError(
        f"{what} runs {'at least ' if at_least else ''}{work} nodes (a node inside a "
        f"Gradient counts {GRADIENT_WORK} times per level of Gradient around it: its "
        "forward, tangent and transpose are traced), more than the limit of "
        f"{limit}; raise it with limits=Limits(traced_nodes=...) if the "
        "model is yours"
    )
