"""The progress of ``onnx-optax train`` on stderr: a tqdm bar on a terminal, else lines."""

from __future__ import annotations

import sys

from onnx_optax.cli.common import one_line


class Progress:
    """A tqdm bar on a terminal; otherwise a line at each logged step; nothing with --quiet."""

    def __init__(self, quiet: bool, total: int, done: int) -> None:
        from tqdm import tqdm

        self.bar_on = not quiet and sys.stderr.isatty()
        self.lines = not quiet and not self.bar_on
        self.bar = tqdm(
            total=total,
            initial=done,
            unit="step",
            file=sys.stderr,
            disable=not self.bar_on,
            dynamic_ncols=True,
            smoothing=0.1,
        )

    def say(self, text: str) -> None:
        """A line on stderr that does not break the bar."""
        text = one_line(text)
        if self.bar_on:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        self.bar.close()
