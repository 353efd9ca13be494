"""The log of ``onnx-optax train`` (CSV, or JSON lines): written whole through the one
writer, and read back on resume as a stranger's file (bounded, every row checked)."""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
import stat
from typing import Any

from onnx_optax._src.limits import MAX_COUNT, MAX_LOG_BYTES, MAX_LOG_LINE
from onnx_optax._src.write import write_file
from onnx_optax.cli.common import UsageError
from onnx_optax.cli.position import parse_json, quoted

# A log file is rewritten at most this often (and at every save and at the end).
LOG_SECONDS = 5.0
# The columns a log may have, in the order train writes them.
LOG_COLUMNS = ("step", "epoch", "loss", "val_loss", "val_accuracy", "learning_rate", "seconds")


def _log_format(path: str) -> str:
    return "jsonl" if path.lower().endswith(".jsonl") else "csv"


def write_log(path: str, columns: list[str], rows: list[dict[str, Any]]) -> None:
    if _log_format(path) == "jsonl":
        text = "".join(json.dumps({c: row.get(c) for c in columns}) + "\n" for row in rows)
    else:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if row.get(c) is None else row[c] for c in columns])
        text = buffer.getvalue()
    write_file(path, text.encode(), what="the log")


def _log_number(name: str, value: Any) -> float | None:
    """A value of column ``name`` of a log row: a number (None where it may be left empty)."""
    if value is None and name in ("val_loss", "val_accuracy", "learning_rate"):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"field '{name}': {quoted(value)} is not a number")
    number = float(value)
    if name in ("epoch", "seconds") and not 0 <= number < math.inf:
        raise ValueError(f"field '{name}': {quoted(value)} is not a number >= 0")
    if name == "val_accuracy" and not 0 <= number <= 1:
        raise ValueError(f"field '{name}': {quoted(value)} is not in [0, 1]")
    return number  # a loss or a rate may be NaN or infinite: train logs what it computed


def _log_row(row: Any, previous: int) -> dict[str, Any]:
    """One row of a log as train writes it (a JSON object, or CSV by its header), checked."""
    if not isinstance(row, dict):
        raise ValueError(f"it is {quoted(row)}, not an object of the columns")
    unknown = [name for name in row if name not in LOG_COLUMNS]
    if unknown:
        raise ValueError(f"field {quoted(unknown[0])} is not a column train writes")
    missing = [n for n in ("step", "epoch", "loss", "seconds") if n not in row]
    if missing:
        raise ValueError(f"field '{missing[0]}' is missing")
    step = row["step"]
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= MAX_COUNT:
        raise ValueError(f"field 'step': {quoted(step)} is not an integer in [1, 2**63 - 1]")
    if step <= previous:
        raise ValueError(f"field 'step': {step} does not follow the step {previous} before it")
    return {"step": step, **{n: _log_number(n, row[n]) for n in LOG_COLUMNS[1:] if n in row}}


def _csv_fields(text: str) -> list[str]:
    try:
        (fields,) = list(csv.reader([text.rstrip("\r\n")], strict=True)) or [[]]
    except (csv.Error, ValueError) as error:
        raise ValueError(f"it is not a line of CSV: {str(error)[:100]}") from None
    return fields


def _csv_row(header: list[str], text: str) -> dict[str, Any]:
    fields = _csv_fields(text)
    if len(fields) != len(header):
        raise ValueError(f"it has {len(fields)} fields, the header {len(header)}")
    row: dict[str, Any] = {}
    for name, field in zip(header, fields, strict=True):
        try:
            row[name] = None if not field else int(field) if name == "step" else float(field)
        except ValueError:
            raise ValueError(f"field '{name}': {quoted(field)} is not a number") from None
    return row


def read_log(path: str, last: int) -> list[dict[str, Any]]:
    """The rows of the earlier log ``path`` up to step ``last``, for a resumed run.

    The log is a stranger's file too: it is read as train writes it, a line at a
    time (each at most :data:`MAX_LOG_LINE` bytes, all at most
    :data:`MAX_LOG_BYTES`), never through a symbolic link, and every row is
    checked (its columns, the step after the one before, the numbers). Raises
    UsageError naming the log, the line and the field.
    """
    where = f"the log {path!r}"
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        descriptor = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        if os.path.islink(path):
            raise UsageError(
                f"{where} is a symbolic link: train reads back only the log it wrote, a file "
                "(give another --log)"
            ) from None
        raise UsageError(f"cannot read {where}: {error.strerror}") from None
    rows: list[dict[str, Any]] = []
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise UsageError(f"cannot read {where}: it is not a file")
        jsonl = _log_format(path) == "jsonl"
        header: list[str] | None = None
        previous, size = 0, 0
        for number in itertools.count(1):
            line = file.readline(MAX_LOG_LINE + 1)
            if not line:
                break
            size += len(line)
            if size > MAX_LOG_BYTES:
                raise UsageError(
                    f"{where} is more than the {MAX_LOG_BYTES} bytes train reads back "
                    "(give another --log)"
                )
            try:
                if len(line) > MAX_LOG_LINE:
                    raise ValueError(f"it is longer than the {MAX_LOG_LINE} bytes of a row")
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError("it is not UTF-8") from None
                if not text.strip():
                    continue
                if jsonl:
                    row = _log_row(parse_json(text), previous)
                elif header is None:
                    header = _csv_fields(text)
                    needed = ("step", "epoch", "loss", "seconds")
                    if (
                        any(n not in LOG_COLUMNS for n in header)
                        or len(set(header)) != len(header)
                        or any(n not in header for n in needed)
                    ):
                        raise ValueError(
                            f"its header {quoted(','.join(header))} is not of the columns "
                            f"{','.join(LOG_COLUMNS)}, each once, with {','.join(needed)}"
                        )
                    continue
                else:
                    row = _log_row(_csv_row(header, text), previous)
            except ValueError as error:
                raise UsageError(f"{where}, line {number}: {error}") from None
            previous = row["step"]
            if row["step"] <= last:
                rows.append(row)
    return rows
