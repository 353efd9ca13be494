"""One way out: every file the package writes goes through :func:`write_files`.

A file is written new, under a unique temporary name in its destination's
folder (created with ``O_CREAT | O_EXCL`` and, where the OS has it,
``O_NOFOLLOW``), flushed and fsynced, then renamed onto the destination with
``os.replace``. So a symbolic link at the destination is replaced by the new
file, its target never opened; an interrupted write leaves the previous file
as it was and no temporary file behind; a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO, TypeAlias

# What a file holds: its bytes, or a function that writes them to the open file.
Content: TypeAlias = bytes | bytearray | memoryview | Callable[[BinaryIO], object]

_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)


def check_destination(path: str | os.PathLike[str], what: str = "the file") -> Path:
    """``path`` as a Path, or a ValueError saying why no file can be written there.

    Its folder must exist and be writable, and ``path`` must not be a folder
    (a symbolic link there is fine: writing replaces the link, not its target).
    The CLI calls this before any work; :func:`write_files` calls it again.
    """
    path = Path(path)
    folder = path.parent
    refused = f"cannot write {what} {str(path)!r}"
    if not folder.is_dir():
        why = "is not a folder" if folder.exists() else "does not exist"
        raise ValueError(f"{refused}: the folder {str(folder)!r} {why}")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{refused}: the folder {str(folder)!r} is read-only")
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            raise ValueError(f"{refused}: it is a folder")
    return path


def _new_file(path: Path, content: Content) -> Path:
    """Writes ``content`` to a new temporary file beside ``path``; returns its name.

    On any exception the temporary file is removed; an OSError names ``path``.
    """
    for _ in range(100):
        temporary = path.parent / f".{path.name[:100]}.{secrets.token_hex(6)}.tmp"
        try:
            descriptor = os.open(temporary, _FLAGS, 0o666)
            break
        except FileExistsError:
            continue
        except OSError as error:
            raise type(error)(error.errno, error.strerror, str(path)) from None
    else:  # pragma: no cover - 100 collisions of 48 random bits
        raise FileExistsError(f"cannot create a temporary file beside {str(path)!r}")
    try:
        with os.fdopen(descriptor, "wb") as file:
            if callable(content):
                content(file)
            else:
                file.write(content)
            file.flush()
            os.fsync(file.fileno())
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(error, OSError) and error.errno is not None:
            raise type(error)(error.errno, error.strerror, str(path)) from None
        raise
    return temporary


def _sync_folder(folder: Path) -> None:
    """Makes the renames in ``folder`` durable, where the OS can (POSIX); best effort."""
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def write_files(
    files: Sequence[tuple[str | os.PathLike[str], Content]], *, what: str = "the file"
) -> None:
    """Writes each ``(path, content)``: all new beside their destinations, then renamed in order.

    Every file is written in full before the first rename, so a failure while
    writing (an exception from ``content``, a full disk, an interrupt) leaves
    every destination as it was. Renaming one after another, a file that
    another references (a model's external data) goes first.

    Raises:
      ValueError: a folder is missing or read-only, or a destination is a folder
        (nothing is written then). OSError from the file system names the
        destination, not the temporary file.
    """
    paths = [check_destination(path, what) for path, _ in files]
    pending: list[tuple[Path, Path]] = []
    try:
        for path, (_, content) in zip(paths, files, strict=True):
            pending.append((_new_file(path, content), path))
        while pending:
            temporary, path = pending[0]
            try:
                os.replace(temporary, path)
            except OSError as error:
                raise type(error)(error.errno, error.strerror, str(path)) from None
            pending.pop(0)
    finally:
        for temporary, _ in pending:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
    for folder in dict.fromkeys(path.parent for path in paths):
        _sync_folder(folder)


def write_file(path: str | os.PathLike[str], content: Content, *, what: str = "the file") -> None:
    """Writes one file through :func:`write_files`; ``content`` is bytes or ``f(file)``.

    Example:
      >>> import pathlib, shutil, tempfile
      >>> folder = pathlib.Path(tempfile.mkdtemp())
      >>> write_file(folder / "a.txt", b"one")
      >>> write_file(folder / "a.txt", lambda file: file.write(b"two"))
      >>> (folder / "a.txt").read_bytes(), sorted(p.name for p in folder.iterdir())
      (b'two', ['a.txt'])
      >>> shutil.rmtree(folder)
    """
    write_files([(path, content)], what=what)
