"""Where a run of ``onnx-optax train`` stands (:class:`Position`), saved as JSON in the
model's ``metadata_props`` under :data:`~onnx_optax.cli.common.POSITION_KEY`, and read
back as a stranger's text: bounded, each field checked, one line naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from onnx_optax._src.limits import MAX_COUNT, MAX_POSITION_CHARS
from onnx_optax.cli.common import POSITION_KEY, UsageError

# Characters of a value a message quotes.
_QUOTED = 40


def quoted(value: object) -> str:
    """``value`` for a one-line message: its ``repr`` cut short; an array or object described."""
    if isinstance(value, list | dict):  # never the repr of a stranger's nesting
        return f"a JSON {'array' if isinstance(value, list) else 'object'} of {len(value)} items"
    if isinstance(value, str) and len(value) > _QUOTED:
        value = value[:_QUOTED]
    text = repr(value)
    return text if len(text) <= _QUOTED else text[: _QUOTED - 3] + "..."


class _Refused(ValueError):
    """JSON that parses, refused while parsing (a repeated key)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"the key {quoted(key)} appears twice in an object")
            seen.add(key)
    return value


def parse_json(text: str) -> Any:
    """``text`` as JSON, or a ValueError of one bounded line.

    Objects with a repeated key and nesting deeper than the interpreter's
    stack are refused (NaN and Infinity are read as floats, for the caller's
    checks of each field); the caller bounds the length of ``text`` first, so
    the work is linear in it.
    """
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("it nests too deep to be what train writes") from None
    except _Refused:
        raise
    except ValueError as error:  # JSONDecodeError; an integer of over 4,300 digits
        raise ValueError(f"it is not JSON: {str(error)[:200]}") from None


def _count(name: str, value: Any, least: int = 0) -> int:
    """``value``, a field of the position, as a count in [least, MAX_COUNT]; else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"field '{name}': {quoted(value)} is not an integer")
    if not least <= value <= MAX_COUNT:
        raise ValueError(f"field '{name}': {quoted(value)} is not in [{least}, 2**63 - 1]")
    return value


@dataclasses.dataclass
class Position:
    """Where a run of ``train`` stands; saved as JSON with the model."""

    epoch: int = 0  # the epoch of the next batch
    start: int = 0  # rows of that epoch already taken
    step: int = 0  # steps ``train`` has run on this model, all runs together
    run_start: int = 0  # ``step`` when the current run began
    goal: int = 0  # ``step`` when the current run ends
    seconds: float = 0.0  # spent in the current run
    # What the position means: the same data and options give the same batches.
    rows: int = 0
    batch_size: int = 0
    shuffle: bool = False
    seed: int = 0
    drop_last: bool = False
    axes: dict[str, int] = dataclasses.field(default_factory=dict)

    def options(self) -> tuple[Any, ...]:
        return (self.rows, self.batch_size, self.shuffle, self.seed, self.drop_last, self.axes)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Position:
        """The position in ``text``, or a ValueError of one bounded line naming the field.

        Every field is checked as ``train`` writes it: counts in [0, 2**63 - 1]
        (rows and batch size from 1), seconds finite and >= 0, the flags
        booleans, the axes names and integers, and the fields together (the
        step between the run's start and goal, the rows taken a whole number
        of batches short of the rows), so a position read here starts a run
        that ``batches`` accepts.
        """
        if not isinstance(text, str) or len(text) > MAX_POSITION_CHARS:
            size = len(text) if isinstance(text, str) else type(text).__name__
            raise ValueError(
                f"it is {size} characters, more than the {MAX_POSITION_CHARS} train writes"
            )
        value = parse_json(text)
        if not isinstance(value, dict):
            raise ValueError(f"it is a JSON {type(value).__name__}, not an object")
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise ValueError(f"field {quoted(unknown[0])} is not one train writes")
        missing = [name for name in fields if name not in value]
        if missing:
            raise ValueError(f"field '{missing[0]}' is missing")
        counts = {
            name: _count(name, value[name], 1 if name in ("rows", "batch_size") else 0)
            for name in (
                "epoch",
                "start",
                "step",
                "run_start",
                "goal",
                "rows",
                "batch_size",
                "seed",
            )
        }
        seconds = value["seconds"]
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 <= seconds < math.inf
        ):
            raise ValueError(f"field 'seconds': {quoted(seconds)} is not a number >= 0")
        for name in ("shuffle", "drop_last"):
            if not isinstance(value[name], bool):
                raise ValueError(f"field '{name}': {quoted(value[name])} is not true or false")
        axes = value["axes"]
        if not isinstance(axes, dict):
            raise ValueError(f"field 'axes': {quoted(axes)} is not an object")
        for name, axis in axes.items():
            if isinstance(axis, bool) or not isinstance(axis, int) or not -64 <= axis < 64:
                raise ValueError(
                    f"field 'axes': the axis of {quoted(name)}, {quoted(axis)}, is not an "
                    "integer in [-64, 64)"
                )
        position = cls(
            **counts,
            seconds=float(seconds),
            shuffle=value["shuffle"],
            drop_last=value["drop_last"],
            axes=axes,
        )
        p = position
        if not p.run_start <= p.step <= p.goal:
            raise ValueError(
                f"fields 'run_start', 'step' and 'goal': {p.run_start}, {p.step} and "
                f"{p.goal} are not in order"
            )
        if p.batch_size > p.rows:
            raise ValueError(
                f"field 'batch_size': {p.batch_size} is more than the {p.rows} rows (field 'rows')"
            )
        if p.start >= p.rows:
            raise ValueError(
                f"field 'start': {p.start} is not below the {p.rows} rows (field 'rows')"
            )
        if p.start % p.batch_size:
            raise ValueError(
                f"field 'start': {p.start} is not a whole number of batches of {p.batch_size} "
                "(field 'batch_size')"
            )
        if p.drop_last and p.rows - p.start < p.batch_size:
            raise ValueError(
                f"field 'start': {p.start} leaves no whole batch of {p.batch_size} of the "
                f"{p.rows} rows, and 'drop_last' is true"
            )
        return position


def saved_position(model: Any, path: str) -> Position | None:
    """The position a train saved in ``model`` (read from ``path``), checked; None if none.

    A position that is not one train writes is a UsageError naming the model,
    the metadata entry and the field.
    """
    values = [p.value for p in model.metadata_props if p.key == POSITION_KEY]
    if not values:
        return None
    where = f"{path}: metadata '{POSITION_KEY}' (where a train stopped)"
    if len(values) > 1:
        raise UsageError(f"{where} appears {len(values)} times")
    try:
        return Position.from_json(values[0])
    except ValueError as error:
        raise UsageError(f"{where}: {error}") from None
