"""The array helpers the op families share: dtypes, axes, shapes, sizes, indices.

Whether a value is static and which dtype JAX holds for it are ``values``'s
(:func:`~onnx_optax._src.ops.values.is_static`, ``canonical``); the helpers here
build on them: numpy or jax.numpy for a computation (``xp_of``, ``xp_sized``),
an axis or axes in range, dtypes that must agree, shapes that must broadcast or
multiply (``matmul_shape``), the attribute checks several families share.

Shape-valued inputs (``Op.static``: Reshape's shape, Slice's starts, Reduce
axes, ...) are numpy arrays known at trace time; ops whose inputs are all numpy
compute with numpy and return numpy (``xp_of``), so shape arithmetic such as
``Shape -> Gather -> Concat -> Reshape`` folds while tracing and a whole graph
compiles into one XLA computation. A helper used by one family alone lives in
that family's module, not here.

Sizes: every op that computes a new shape checks it with :func:`check_size`
(or :func:`broadcast_check`) against ``Node.max_bytes`` before numpy or XLA
allocates it. Indices: :func:`checked_indices` refuses an index outside its
axis while tracing when it is static, and otherwise records a run-time check
(:func:`check_at_run`): the graph collects those (:func:`collect_run_checks`),
returns them beside its outputs (:class:`RunChecks`) and raises the first that
failed after the run (:func:`raise_failed`), naming the node; nothing is
clamped silently.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import canonical, is_static


def xp_of(*values: Any) -> Any:
    """numpy when every given value is static (shape arithmetic), else jax.numpy."""
    return np if all(v is None or is_static(v) for v in values) else jnp


def cast_to(x: Any, dtype: Any) -> Any:
    if is_static(x):
        return np.asarray(x).astype(dtype)
    return x.astype(canonical(dtype))


def int_list(value: Any) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


def norm_axis(axis: int, rank: int, where: str) -> int:
    """``axis`` in ``[-rank, rank)``, counted from the end when negative; a scalar has none.

    onnxruntime refuses every axis of a scalar (Concat, Split, Gather, ArgMax,
    LayerNormalization, a reduction's axes), as this does.
    """
    if not -rank <= axis < rank:
        raise ValueError(f"{where}: axis {axis} is out of range for rank {rank}")
    return axis % rank


def norm_axes(axes: Sequence[int], rank: int, where: str) -> tuple[int, ...]:
    out = tuple(norm_axis(int(a), rank, where) for a in axes)
    if len(set(out)) != len(out):
        raise ValueError(f"{where}: repeated axes {list(axes)}")
    return out


def same_dtype(node: Node, *values: Any) -> None:
    dtypes = {canonical(v.dtype) for v in values if v is not None}
    if len(dtypes) > 1:
        raise TypeError(
            f"{node.where}: inputs have dtypes {sorted(map(str, dtypes))}; they must be of one type"
        )


def broadcast_check(node: Node, *values: Any) -> tuple[int, ...]:
    """The shape the values broadcast to, its size checked (in the widest input dtype)."""
    given = [v for v in values if v is not None]
    try:
        shape = np.broadcast_shapes(*(np.shape(v) for v in given))
    except ValueError:
        shapes = [list(np.shape(v)) for v in given]
        raise ValueError(f"{node.where}: input shapes {shapes} do not broadcast") from None
    if given:
        widest = max((np.dtype(v.dtype) for v in given), key=lambda d: d.itemsize)
        check_size(node, shape, widest)
    return tuple(shape)


def check_size(node: Node, shape: Sequence[Any], dtype: Any, what: str = "output") -> None:
    """Refuses a tensor of ``shape`` larger than the node's limit, counted in Python ints.

    Called before numpy allocates a computed shape or XLA is handed one (an
    element count beyond int64 aborts XLA), with the limit keyword to raise it.
    """
    dims = [int(d) for d in shape]
    size = math.prod(dims) * np.dtype(dtype).itemsize
    if size > node.max_bytes:
        raise ValueError(
            f"{node.where}: its {what} of shape {dims} ({np.dtype(dtype)}) would take {size} "
            f"bytes, over the limit of {node.max_bytes} bytes per tensor; raise it with "
            "limits=Limits(tensor_bytes=...) if the model is yours"
        )


# Results of static values up to this many elements are computed on the host while tracing;
# larger ones are staged on the device (never a host allocation, never a literal).
HOST_FOLD_ELEMENTS = 1 << 16


def xp_sized(node: Node, shape: Sequence[int], dtype: Any, *values: Any) -> Any:
    """numpy for a small result of static values (shape arithmetic folds while tracing),
    else jax.numpy, after checking the result's size against the node's limit.

    A large result of constants is staged into the computation like any other, so
    the host never allocates it while tracing (16 GiB of MatMul from two constant
    vectors was a MemoryError) nor does it become a literal in the compiled program.
    """
    check_size(node, shape, dtype)
    small = math.prod(int(d) for d in shape) <= HOST_FOLD_ELEMENTS
    return xp_of(*values) if small else jnp


def is_int(x: Any) -> bool:
    return bool(np.issubdtype(np.dtype(x.dtype), np.integer))


def axes_of(node: Node, axes: Any) -> list[int] | None:
    """Axes from the input (newer opsets) or the attribute (older), None if neither."""
    if axes is not None:
        return int_list(axes)
    value = node.get("axes")
    return None if value is None else [int(a) for a in value]


def check_broadcasts_to(node: Node, name: str, value: Any, shape: Sequence[int]) -> None:
    """Refuses ``value`` unless it broadcasts to ``shape`` one way (the result keeps ``shape``)."""
    target = tuple(int(d) for d in shape)
    try:
        fits = np.broadcast_shapes(target, tuple(np.shape(value))) == target
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"{node.where}: {name} of shape {list(np.shape(value))} does not broadcast to "
            f"{list(target)}"
        )


def matmul_shape(node: Node, a: Any, b: Any) -> list[int]:
    """numpy.matmul's output shape, computed before anything is multiplied."""
    sa, sb = list(np.shape(a)), list(np.shape(b))
    if not sa or not sb or (sa[-1] != (sb[-2] if len(sb) > 1 else sb[0])):
        raise ValueError(f"{node.where}: MatMul of shapes {sa} and {sb} do not match")
    try:
        batch = np.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2]))
    except ValueError:
        raise ValueError(
            f"{node.where}: MatMul of shapes {sa} and {sb}: their batch dimensions do not broadcast"
        ) from None
    return [*batch, *sa[-2:-1], *(sb[-1:] if len(sb) > 1 else [])]


def int_shape(value: Any) -> list[int]:
    """A shape as Python ints."""
    return [int(d) for d in np.shape(value)]


def wide_float(dtype: Any) -> np.dtype:
    """float32 for 16-bit floats, the dtype itself otherwise."""
    return np.dtype(np.float32) if np.dtype(dtype).itemsize < 4 else np.dtype(dtype)


def default_scale(node: Node, head_size: int) -> float:
    """``1 / sqrt(head_size)``, the scale when none is given."""
    if head_size < 1:
        raise ValueError(
            f"{node.where}: a head size of {head_size} gives no default scale 1 / sqrt(size); "
            "give the scale attribute"
        )
    return 1 / math.sqrt(head_size)


# ----------------------------------------------------------------------------- indices


class RunCheck(NamedTuple):
    """A condition only known when the graph runs: whether it failed, and a value that did."""

    failed: Any  # shape=(), bool
    value: Any  # shape=(), the first offending value (for the message)


# The run-time checks of the graph being traced, by message (None: nobody collects).
_RUN_CHECKS: contextvars.ContextVar[dict[str, RunCheck] | None] = contextvars.ContextVar(
    "run_checks", default=None
)


@contextlib.contextmanager
def collect_run_checks() -> Iterator[dict[str, RunCheck]]:
    """Collects the run-time checks that the ops traced inside record, by message."""
    checks: dict[str, RunCheck] = {}
    token = _RUN_CHECKS.set(checks)
    try:
        yield checks
    finally:
        _RUN_CHECKS.reset(token)


def record_run_checks(checks: Mapping[str, RunCheck]) -> None:
    """Adds ``checks`` to those being collected (a message seen twice fails if either does)."""
    collected = _RUN_CHECKS.get()
    if collected is None:
        return
    for message, check in checks.items():
        seen = collected.get(message)
        if seen is not None:
            check = RunCheck(
                seen.failed | check.failed, jnp.where(seen.failed, seen.value, check.value)
            )
        collected[message] = check


def check_at_run(message: str, bad: Any, values: Any) -> None:
    """Raises ``message`` ('{}': the first offending value) where ``bad`` holds, once known.

    ``bad`` and ``values`` are arrays of one shape. Known values (an eager run)
    are checked now; traced ones are recorded for the graph, which returns them
    beside its outputs and raises after the run (:func:`raise_failed`).
    """
    if not isinstance(bad, jax.core.Tracer):
        found = np.asarray(values)[np.asarray(bad)]
        if found.size:
            raise ValueError(message.format(found.flat[0]))
        return
    flat = jnp.reshape(bad, -1)
    if flat.shape[0] == 0:  # no element can fail (and argmax of nothing is an error)
        return
    first = jnp.argmax(flat)
    record_run_checks({message: RunCheck(flat[first], jnp.reshape(values, -1)[first])})


@jax.tree_util.register_pytree_node_class
class RunChecks:
    """The run-time checks of a traced graph, returned beside its outputs (a pytree).

    One flag per message in one array (``failed``, shape=(n,), bool), so the host
    reads them all in one transfer after the run; ``values`` holds the first
    offending value of each, read only for the message of one that failed.
    """

    def __init__(self, messages: tuple[str, ...], failed: Any, values: tuple[Any, ...]) -> None:
        self.messages = messages  # static: the pytree's structure
        self.failed = failed
        self.values = values

    @classmethod
    def of(cls, checks: Mapping[str, RunCheck]) -> RunChecks:
        """The checks collected while tracing (:func:`collect_run_checks`), in their order."""
        flags = [check.failed for check in checks.values()]
        failed = jnp.stack(flags) if flags else np.zeros(0, bool)
        return cls(tuple(checks), failed, tuple(check.value for check in checks.values()))

    def __len__(self) -> int:
        return len(self.messages)

    def tree_flatten(self) -> tuple[tuple[Any, tuple[Any, ...]], tuple[str, ...]]:
        return (self.failed, self.values), self.messages

    @classmethod
    def tree_unflatten(cls, messages: tuple[str, ...], children: Any) -> RunChecks:
        return cls(messages, *children)


def raise_failed(checks: RunChecks) -> None:
    """After a run, on the host: the first check that failed, as a ValueError naming its node."""
    if not len(checks):
        return
    failed = np.asarray(checks.failed)
    if failed.any():
        first = int(np.argmax(failed))
        raise ValueError(checks.messages[first].format(np.asarray(checks.values[first]).item()))


def checked_indices(node: Node, indices: Any, dim: int, what: str) -> Any:
    """``indices`` into an axis of ``dim``, negative ones (from ``-dim``) counted from the end.

    An index outside ``[-dim, dim)`` is an error naming the node: while tracing
    when the indices are static, else after the run.
    """
    int_check(node, indices, what)
    check_at_run(
        f"{node.where}: {what} hold {{}}, outside [{-dim}, {dim})",
        (indices < -dim) | (indices >= dim),
        indices,
    )
    return xp_of(indices).where(indices < 0, indices + dim, indices)


def checked_labels(node: Node, labels: Any, classes: int, ignore: int | None) -> None:
    """Class labels: each in ``[0, classes)`` or the loss's ``ignore_index``, as for indices."""
    int_check(node, labels, "labels")
    bad = (labels < 0) | (labels >= classes)
    if ignore is not None:
        bad = bad & (labels != ignore)
    but = "" if ignore is None else f" and not the ignore_index {ignore}"
    check_at_run(f"{node.where}: labels hold {{}}, outside [0, {classes}){but}", bad, labels)


def int_check(node: Node, values: Any, what: str) -> None:
    if not is_int(values):
        raise TypeError(f"{node.where}: {what} must be integers, got {values.dtype}")


def flag(node: Node, name: str, default: int = 0) -> bool:
    """A 0-or-1 attribute as a bool; any other value is refused naming the node, as
    onnxruntime refuses it (CumSum's exclusive and reverse, Mod's fmod)."""
    value = node.get(name, default)
    if value not in (0, 1):
        raise ValueError(f"{node.where}: {name} {value} must be 0 or 1")
    return bool(value)


def check_vector(node: Node, value: Any, name: str, scalar: bool = False) -> None:
    """A shape-like input (Reshape's shape, Slice's starts, a Reduce's axes, ...) must be 1-D,
    or also a scalar where ``scalar``, as onnxruntime's kernels require; None passes."""
    if value is not None and not (np.ndim(value) == 1 or (scalar and np.ndim(value) == 0)):
        kind = "1-D or a scalar" if scalar else "1-D"
        raise ValueError(f"{node.where}: {name} of shape {list(np.shape(value))} must be {kind}")


def check_scalar_like(node: Node, value: Any, name: str) -> None:
    """A one-value input (Range's bounds, Trilu's k, DFT's dft_length): a scalar or a 1-D
    tensor of one value, as onnxruntime's kernels require; None passes."""
    if value is not None and (np.ndim(value) > 1 or np.size(value) != 1):
        raise ValueError(
            f"{node.where}: {name} of shape {list(np.shape(value))} must be a scalar or hold "
            "one value in 1-D"
        )
