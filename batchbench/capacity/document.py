"""The capacity document (``capacity.json``): written through ``CapacityDocument`` and read
back, for a resume, through ``CapacityView``.

Plain dataclasses like ``batchbench.results.documents`` (the same reasons: orjson writes
the JSON and no validation beyond the reader's checks is needed). ``to_json`` keeps the
keys, order and values earlier versions wrote; ``CapacityView`` accepts a document of any
earlier version, a missing section reading as None.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from batchbench.capacity.render import Answer
from batchbench.capacity.search import StepRecord
from batchbench.results.documents import ManifestSection, section_from

KIND = "capacity"


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """The document's "search" object: the bounds and the window the search was run with."""

    min_agents: int
    max_agents: int
    resolution: int
    warmup_seconds: float
    window_seconds: float | None
    window_trajectories: int | None
    max_extensions: int
    sweep: int | None = None  # --sweep N: N caps measured instead of a search

    def to_json(self) -> dict[str, Any]:
        settings = asdict(self)
        if self.sweep is None:  # a search's document keeps the keys it always had
            del settings["sweep"]
        return settings


@dataclass(frozen=True, slots=True)
class CapacityDocument:
    """``capacity.json`` as a search writes it after every step; ``steps`` holds the
    finished steps and, while a search runs, the attempt about to be extended."""

    batchbench_version: str
    timestamp: str
    slo: tuple[str, ...]
    goodput_thresholds_ms: dict[str, float] | None
    configuration: dict[str, Any]  # ``RunConfig.options()``
    manifest: ManifestSection | None
    search: SearchSettings
    steps: tuple[StepRecord, ...]
    answer: Answer
    goodput_thresholds_tokens_per_second: dict[str, float] | None = None  # speed floors
    # why the search ended before its steps decided ("max-time"), or None
    stop_reason: str | None = None
    # the probe's estimate before the first step: probe_seconds, agents and one entry per
    # objective (samples needed, samples per second, step and search seconds, cheaper
    # alternatives); None when no probe ran
    estimate: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "batchbench_version": self.batchbench_version,
            "timestamp": self.timestamp,
            "slo": list(self.slo),
            "goodput_thresholds_ms": self.goodput_thresholds_ms,
            "goodput_thresholds_tokens_per_second": self.goodput_thresholds_tokens_per_second,
            "configuration": self.configuration,
            "manifest": None if self.manifest is None else asdict(self.manifest),
            "search": self.search.to_json(),
            "steps": [step.as_dict() for step in self.steps],
            "answer": self.answer.as_dict(),
            "stop_reason": self.stop_reason,
            "estimate": self.estimate,
        }

    def to_dict(self) -> dict[str, Any]:
        """The capacity document (``to_json``; the name the Python API uses)."""
        return self.to_json()

    @classmethod
    def read(cls, document: dict[str, Any]) -> CapacityDocument:
        """A capacity document (``to_json``'s output, parsed) as typed sections; ValueError
        names a step entry that is not one. A field the document lacks is None."""
        manifest = _mapping(document.get("manifest"))
        search = _mapping(document.get("search"))
        answer = _mapping(document.get("answer"))
        slo = document.get("slo")
        steps = document.get("steps")
        return cls(
            batchbench_version=document.get("batchbench_version"),  # type: ignore[arg-type]
            timestamp=document.get("timestamp"),  # type: ignore[arg-type]
            slo=tuple(slo) if isinstance(slo, list) else (),
            goodput_thresholds_ms=_mapping(document.get("goodput_thresholds_ms")),
            configuration=_mapping(document.get("configuration")) or {},
            manifest=None if manifest is None else section_from(ManifestSection, manifest),
            search=section_from(SearchSettings, search),
            steps=tuple(
                StepRecord.from_dict(entry) if isinstance(entry, dict) else _not_a_step(entry)
                for entry in (steps if isinstance(steps, list) else [])
            ),
            answer=section_from(Answer, answer),
            goodput_thresholds_tokens_per_second=_mapping(
                document.get("goodput_thresholds_tokens_per_second")
            ),
            stop_reason=_text(document.get("stop_reason")),
            estimate=_mapping(document.get("estimate")),
        )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _mapping(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _not_a_step(entry: Any) -> StepRecord:
    raise ValueError(f"a step entry that is not an object ({type(entry).__name__})")


@dataclass(frozen=True, slots=True)
class CapacityView:
    """A capacity document read back to resume its search. ``configuration`` and
    ``search`` stay mappings (a resume compares them key by key, whatever keys the writing
    version had); a section the document lacks is None, and so is a step entry that is
    not an object."""

    configuration: dict[str, Any] | None
    search: dict[str, Any] | None
    manifest_sha256: str | None
    steps: tuple[dict[str, Any], ...]

    @staticmethod
    def is_capacity(document: Any) -> bool:
        """Whether a parsed JSON value is a capacity document at all."""
        return isinstance(document, dict) and document.get("kind") == KIND

    @classmethod
    def read(cls, document: dict[str, Any]) -> CapacityView:
        manifest = _mapping(document.get("manifest")) or {}
        steps = document.get("steps")
        sha256 = manifest.get("sha256")  # any other value than a string counts as changed
        return cls(
            configuration=_mapping(document.get("configuration")),
            search=_mapping(document.get("search")),
            manifest_sha256=None if sha256 is None else str(sha256),
            steps=tuple(
                entry
                for entry in (steps if isinstance(steps, list) else [])
                if isinstance(entry, dict)
            ),
        )


def step_window(document: Any) -> dict[str, Any] | None:
    """A step's results JSON ``window`` section, None when the document has none."""
    return _mapping(document.get("window")) if isinstance(document, dict) else None
