"""What the commands of ``onnx-optax`` share: exit statuses, :class:`UsageError`, the
one-line error messages, and reading and writing a model through the package's one
loading layer and one writer.

Every command module of the wing imports this one; it imports none of them.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import traceback
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from onnx_optax._src.extras import require
from onnx_optax._src.write import check_destination

if TYPE_CHECKING:
    import onnx

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 128 + 2  # SIGINT, as a shell reports it
# The most characters of an error message (a stranger's names can be megabytes long).
MESSAGE_CHARACTERS = 2000
# Set (to anything but ""), an exception no check foresaw leaves main with its traceback.
TRACEBACK_VARIABLE = "ONNX_OPTAX_TRACEBACK"

# The key of a model's metadata_props where train keeps its position (see cli/trainer.py).
POSITION_KEY = "onnx_optax.train"


class Commands(Protocol):
    """The subcommands of the ``onnx-optax`` parser, where each command adds its own."""

    def add_parser(
        self, name: str, *, help: str | None = ..., description: str | None = ...
    ) -> argparse.ArgumentParser:
        """A new command ``name`` (its line in the list, its own help's text)."""
        ...


class UsageError(Exception):
    """A command's arguments cannot work (exit status 2); the message says why."""


def writable_file(path: str, what: str) -> None:
    """Raises :class:`UsageError` unless ``path`` can be written: checked before the work.

    The write itself checks again (the file system may change meanwhile).
    """
    try:
        check_destination(path, what)
    except ValueError as error:
        raise UsageError(str(error)) from None


def file_key(path: str) -> str:
    """The file ``path`` names: its folder resolved, its own name kept (a link there is
    replaced by the write, never followed)."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(os.path.realpath(folder), name)


def drop_position(model: onnx.ModelProto) -> bool:
    """Removes train's position from ``model``'s metadata_props; whether it held one.

    A model that ``attach`` makes, or an inference model, has no run of ``train`` to resume.
    """
    kept = [(p.key, p.value) for p in model.metadata_props if p.key != POSITION_KEY]
    if len(kept) == len(model.metadata_props):
        return False
    del model.metadata_props[:]
    for key, value in kept:
        model.metadata_props.add(key=key, value=value)
    return True


def write_model(model: onnx.ModelProto, path: str) -> None:
    """Writes ``model`` through the package's one writer; its refusals are usage errors."""
    from onnx_optax.training._export import save_model

    try:
        save_model(model, path, None, {})
    except (ValueError, OSError) as error:
        raise UsageError(str(error)) from None


def training_module() -> ModuleType:
    """:mod:`onnx_optax.training`, or the missing-extra error naming the onnx extra."""
    (training,) = require("onnx-optax training", "onnx", "onnx_optax.training")
    return training


def read_model(training: ModuleType, path: str) -> onnx.ModelProto:
    """The model at ``path``, read and checked by ``training.load`` (the one loading layer);
    a file that is missing or cannot be read is a usage error."""
    if not pathlib.Path(path).is_file():
        raise UsageError(f"cannot read the model {path!r}: no such file")
    try:
        model: onnx.ModelProto = training.load(path)
        return model
    except Exception as error:  # a stranger's file: any parse failure is a usage error
        raise UsageError(f"cannot read the model {path!r}: {error}") from None


def one_line(text: str, limit: int = MESSAGE_CHARACTERS) -> str:
    """``text`` as one line of at most about ``limit`` characters: control characters
    (a newline in a stranger's tensor name) escaped, the middle of a long text left out."""
    if len(text) > limit:
        text = (
            f"{text[: limit // 2]} ... [{len(text) - limit} characters] ... {text[-limit // 2 :]}"
        )
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def unforeseen(error: Exception) -> str:
    """One line for an exception no check turned into a usage error: its type, the line of
    onnx_optax that raised it, its message (for a bug report), never a traceback."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if f"{os.sep}onnx_optax{os.sep}" in f.filename] or frames[-1:]
    where = f" at {os.path.basename(ours[-1].filename)}:{ours[-1].lineno}" if ours else ""
    message = one_line(str(error), MESSAGE_CHARACTERS // 2)
    return (
        f"unexpected {type(error).__name__}{where}{': ' if message else ''}{message} (please "
        f"report it; {TRACEBACK_VARIABLE}=1 shows its traceback)"
    )
