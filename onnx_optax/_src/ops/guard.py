"""Registering an op: :func:`register` puts a family's function into the registry behind
the one guard every op runs behind (:func:`guarded`).

The guard matches a node's inputs' types against the schema's type constraints
at the node's opset (``attributes.check_input_types``: ``Pad`` of an int32
tensor with a float ``constant_value`` is refused, never cast), turns a host
allocation that fails while the graph is traced into a ``ValueError`` naming
the node and the limit, and silences numpy's floating-point warnings, as XLA
computes without them. ``REGISTRY[domain][op_type].fn`` is the guarded function.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from onnx_optax._src.ops.attributes import check_input_types
from onnx_optax._src.ops.registry import REGISTRY, STANDARD_DOMAINS, Node, Op


def register(
    *names: str,
    static: tuple[int, ...] = (),
    domain: str = "",
    check: Callable[[Node], None] | None = None,
    prefer_static: tuple[int, ...] = (),
) -> Callable[..., Any]:
    """Registers ``fn(node, *inputs)`` as the op(s) ``names`` of ``domain``."""
    domain = "" if domain in STANDARD_DOMAINS else domain
    table = REGISTRY.setdefault(domain, {})

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            table[name] = Op(
                guarded(name, domain, fn), static, check=check, prefer_static=prefer_static
            )
        return fn

    return wrap


def guarded(op_type: str, domain: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` behind the schema's type constraints, with host memory errors named.

    Constants computed with numpy while tracing compute as XLA does, silently: a
    division by zero, an overflow, a NaN cast to an integer or the mean of an
    empty axis give inf, NaN or whatever the cast gives, without numpy's
    RuntimeWarning (an exception where warnings are errors, as under pytest).
    """

    def run(node: Node, *inputs: Any) -> Any:
        check_input_types(node, op_type, domain, inputs)
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "Mean of empty slice"
                return fn(node, *inputs)
        except MemoryError:
            raise ValueError(
                f"{node.where}: the host ran out of memory computing its output while the graph "
                f"was traced (the limit allows {node.max_bytes} bytes per tensor); lower it "
                "with limits=Limits(tensor_bytes=...) to have such a node refused first"
            ) from None

    run.__name__ = run.__qualname__ = getattr(fn, "__name__", op_type)
    run.__doc__ = fn.__doc__
    return run
