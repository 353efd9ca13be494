"""SIGINT and SIGTERM while ``onnx-optax train`` runs: save after the step, or quit."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any


class Interrupt:
    """SIGINT and SIGTERM handlers: the first asks the loop to save and stop after its step.

    A second signal while training (a long compilation, a slow step) quits at
    once without saving; while saving, signals wait for the save to end.
    """

    def __init__(self, say: Callable[[str], None]) -> None:
        self.signal: int | None = None
        self.saving = False
        self._say = say
        self._previous: dict[int, Any] = {}

    def _handle(self, number: int, frame: FrameType | None) -> None:
        del frame
        if self.signal is None:
            self.signal = number
            self._say(
                f"{signal.Signals(number).name}: saving after this step "
                "(again to quit without saving)"
            )
        elif not self.saving:
            raise KeyboardInterrupt

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
