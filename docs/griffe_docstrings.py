"""A griffe extension that reads the package's docstrings as mkdocstrings renders them.

The docstrings are written for ``help()``, doctest and Sphinx: cross references
as roles (``:func:`plan```), math as ``:math:`` roles and ``.. math::`` blocks,
warnings as ``.. warning::`` blocks, and an ``Example:`` heading. Markdown would
show the roles and directives as literal text, and griffe's Google parser takes
``Example:`` for an admonition (so a doctest's output lines would be read as
Markdown). Here each cross-reference role becomes the code span of its target
(without the leading ``~``), math becomes arithmatex's ``$...$`` and ``$$...$$``
(a ``.. math::`` block in an ``aligned`` environment, as Sphinx aligns it), a
warning becomes a Material ``!!! warning`` admonition, and ``Example:`` becomes
griffe's ``Examples:`` section, rendered as code.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|meth|attr|mod|data|obj|exc):`~?([^`]+)`")
_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_EXAMPLE = re.compile(r"^(\s*)Example:$", flags=re.MULTILINE)
# A directive line and the block indented under it (blank lines included).
_DIRECTIVE = re.compile(
    r"^(?P<indent>[ ]*)\.\. (?P<name>math|warning)::[ ]*\n"
    r"(?P<body>(?:(?P=indent)[ ]+\S.*\n|[ ]*\n)*)",
    flags=re.MULTILINE,
)


def _directive(match: re.Match[str]) -> str:
    indent, name = match["indent"], match["name"]
    body = textwrap.dedent(match["body"]).strip("\n")
    if name == "math":
        lines = ["$$", r"\begin{aligned}", body, r"\end{aligned}", "$$"]
    else:
        lines = ["!!! warning", textwrap.indent(body, "    ")]
    return textwrap.indent("\n".join(lines), indent) + "\n\n"


def as_markdown(text: str) -> str:
    """One docstring's text with the Sphinx constructs above written as Markdown."""
    text = _DIRECTIVE.sub(_directive, text + "\n").rstrip("\n")
    text = _MATH_ROLE.sub(r"$\1$", text)
    text = _ROLE.sub(r"`\1`", text)
    return _EXAMPLE.sub(r"\1Examples:", text)


class DocstringsAsRendered(griffe.Extension):
    """Rewrites every docstring griffe loads with :func:`as_markdown`."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        del kwargs
        if obj.docstring is not None:
            obj.docstring.value = as_markdown(obj.docstring.value)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """The top-level package, which ``on_object`` does not see (as_markdown is idempotent)."""
        self.on_object(obj=pkg, **kwargs)
