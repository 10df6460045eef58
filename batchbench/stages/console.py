"""Where a run's console text goes while it runs (the command line passes one)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class RunOutput(Protocol):
    """Standard output and standard error of a run."""

    def lines(self, lines: Iterable[str]) -> None:
        """Standard-output lines: calibration results and the configuration banner."""

    def warning(self, text: str) -> None:
        """One warning line for standard error."""


class Silent:
    """A run's output when the caller gives none: the library prints nothing."""

    def lines(self, lines: Iterable[str]) -> None:
        pass

    def warning(self, text: str) -> None:
        pass
