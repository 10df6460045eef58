"""What a live run measured, as the finishing stage reads it: from this process's agents,
or rebuilt from shards (``batchbench.scale.merge``) or a dead worker's files (``salvage``).

Kept apart from the client so that a merge reads it without loading the driver."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from batchbench.results.lifecycle import EngineResult
from batchbench.results.recording import Recorder


class FramingSource(Protocol):
    """What the results read of a run's framing: the live ``Framing``, or a merged or
    salvaged run's record of it (``batchbench.scale.merge.LearnedFraming``)."""

    def learned(self) -> dict[str, Any] | None: ...


@dataclass
class LiveRun:
    """A live run's engine result and recorder, and how it ended. Mutable: a ``--workers``
    parent marks a merged run interrupted when the signal reached it, not the workers."""

    engine: EngineResult
    recorder: Recorder
    interrupted_by: str | None
    exit_status: int
    framing: FramingSource
    finished_by: str | None = None  # "duration" or "window": the run's planned end
    window_end: float | None = None  # benchmark-clock seconds where measurement stopped
    server_metrics: dict | None = None
    wall_origin: float | None = None  # Unix time of the benchmark clock's start
