"""Optional dependencies: one message that names the extra and how to install it."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtraError(ModuleNotFoundError):
    """An optional dependency is not installed; the message says which extra brings it."""


def install_hint(extra: str) -> str:
    """The two ways to install ``extra``: from the package index and from a clone."""
    return f'pip install "onnx-optax[{extra}]" (from a clone: pip install ".[{extra}]")'


def missing_extra(feature: str, extra: str, error: ImportError) -> MissingExtraError:
    """The error to raise ``from error`` when ``feature`` cannot import its dependency.

    Example:
      >>> error = missing_extra("interop", "onnx", ModuleNotFoundError("No module named 'onnx'"))
      >>> str(error).split(": ", 1)[0], 'pip install ".[onnx]"' in str(error)
      ('interop needs the onnx extra', True)
    """
    return MissingExtraError(
        f"{feature} needs the {extra} extra: {install_hint(extra)}; {error}", name=error.name
    )


def require(feature: str, extra: str, *modules: str) -> list[ModuleType]:
    """Imports ``modules``, or raises :class:`MissingExtraError` naming ``extra``."""
    try:
        return [importlib.import_module(module) for module in modules]
    except ImportError as error:
        raise missing_extra(feature, extra, error) from error
