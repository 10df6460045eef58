"""The JSON part of a shard's raw data (``ShardData.meta``) as typed records.

``snapshot`` writes a shard through ``ShardDocument.to_meta`` and the merge reads it back
through ``ShardDocument.from_meta``, so neither walks dict chains. ``to_meta`` writes the
keys in the order earlier versions wrote them (the shard file stays byte-identical);
``from_meta`` reads files of earlier versions too: keys they did not write yet read as
their defaults. The wire form stays a plain dict (``ShardData.meta``): workers send it
through a pipe and the damage checks look at it before it is trusted.

Plain dataclasses (see ``batchbench.results.documents`` for why not msgspec or pydantic).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from batchbench.results.documents import fidelity_from_shard_view, fidelity_shard_view
from batchbench.results.failures import ErrorTally
from batchbench.results.lifecycle import EngineResult, TrajectoryRecord
from batchbench.results.recording import FidelityFigures, RankFigures
from batchbench.results.summary import RunSetup

# TrajectoryRecord fields, in the order a record row lists them.
RECORD_FIELDS = (
    "agent_id",
    "routing_slot",
    "scheduled_at",
    "admitted_at",
    "finished_at",
    "loop_seconds",
    "completed",
    "interrupted",
    "finish_sequence",
)


@dataclass(frozen=True, slots=True)
class EngineDocument:
    """What the engine measured: one row per trajectory and the admission figures."""

    records: tuple[TrajectoryRecord, ...]
    total_duration: float
    max_active_agents: int
    last_agent_admitted_at: float
    late_admissions: int
    max_admission_lag: float

    @classmethod
    def of(cls, engine: EngineResult) -> EngineDocument:
        return cls(
            tuple(engine.records),
            engine.total_duration,
            engine.max_active_agents,
            engine.last_agent_admitted_at,
            engine.late_admissions,
            engine.max_admission_lag,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "records": [[getattr(r, name) for name in RECORD_FIELDS] for r in self.records],
            "total_duration": self.total_duration,
            "max_active_agents": self.max_active_agents,
            "last_agent_admitted_at": self.last_agent_admitted_at,
            "late_admissions": self.late_admissions,
            "max_admission_lag": self.max_admission_lag,
        }

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> EngineDocument:
        records = tuple(
            TrajectoryRecord(
                int(agent),
                int(slot),
                scheduled,
                admitted,
                finished,
                loop_s,
                bool(completed),
                bool(interrupted),
                int(seq),
            )
            for agent, slot, scheduled, admitted, finished, loop_s, completed, interrupted, seq in (
                document["records"]
            )
        )
        return cls(
            records,
            document["total_duration"],
            int(document["max_active_agents"]),
            document["last_agent_admitted_at"],
            int(document["late_admissions"]),
            document["max_admission_lag"],
        )


@dataclass(frozen=True, slots=True)
class TotalsDocument:
    """A recorder's counters: every numeric ``RunTotals`` field by name, the failed
    attempts by kind, and the failed agents."""

    scalars: dict[str, int | float]
    errors: ErrorTally
    failures: tuple[tuple[Any, ...], ...]

    @classmethod
    def of(cls, totals: Any) -> TotalsDocument:
        scalars = {
            spec.name: getattr(totals, spec.name)
            for spec in dataclasses.fields(totals)
            if isinstance(getattr(totals, spec.name), int | float)
        }
        return cls(scalars, totals.errors, tuple(tuple(f) for f in totals.failures))

    def to_json(self) -> dict[str, Any]:
        errors = self.errors
        return {
            "scalars": self.scalars,
            "errors": {
                "counts": errors.counts,
                "statuses": [[status, count] for status, count in errors.statuses.items()],
                "examples": errors.examples,
            },
            "failures": [list(failure) for failure in self.failures],
        }

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> TotalsDocument:
        tally = document["errors"]
        errors = ErrorTally(
            counts={kind: int(count) for kind, count in tally["counts"].items()},
            statuses={int(status): int(count) for status, count in tally["statuses"]},
            examples=dict(tally["examples"]),
        )
        return cls(dict(document["scalars"]), errors, tuple(tuple(f) for f in document["failures"]))


@dataclass(frozen=True, slots=True)
class LiveShard:
    """What only a live shard has: its recorder's counters and how the run ended."""

    totals: TotalsDocument
    server_cached_tokens: int | None
    ranks: tuple[RankFigures, ...]
    started_agents: tuple[int, ...]
    peak_in_flight: int
    cpu_seconds: float
    wall_seconds: float
    series_interval: float
    fidelity: FidelityFigures  # without the oracle timings (an array beside the document)
    framing: dict[str, Any] | None
    interrupted_by: str | None
    exit_status: int
    finished_by: str | None
    window_end: float | None
    server_metrics: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        return {
            "totals": self.totals.to_json(),
            "server_cached_tokens": self.server_cached_tokens,
            "ranks": [dataclasses.asdict(rank) for rank in self.ranks],
            "started_agents": list(self.started_agents),
            "peak_in_flight": self.peak_in_flight,
            "cpu_seconds": self.cpu_seconds,
            "wall_seconds": self.wall_seconds,
            "series_interval": self.series_interval,
            "fidelity": fidelity_shard_view(self.fidelity),
            "framing": self.framing,
            "interrupted_by": self.interrupted_by,
            "exit_status": self.exit_status,
            "finished_by": self.finished_by,
            "window_end": self.window_end,
            "server_metrics": self.server_metrics,
        }

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> LiveShard:
        cached = document["server_cached_tokens"]
        return cls(
            totals=TotalsDocument.from_json(document["totals"]),
            server_cached_tokens=None if cached is None else int(cached),
            ranks=tuple(RankFigures.from_json(rank) for rank in document["ranks"]),
            started_agents=tuple(int(a) for a in document["started_agents"]),
            peak_in_flight=int(document["peak_in_flight"]),
            cpu_seconds=float(document["cpu_seconds"]),
            wall_seconds=float(document["wall_seconds"]),
            series_interval=float(document["series_interval"]),
            fidelity=fidelity_from_shard_view(document["fidelity"]),
            framing=document.get("framing"),
            interrupted_by=document.get("interrupted_by"),
            exit_status=int(document.get("exit_status") or 0),
            finished_by=document.get("finished_by"),
            window_end=document.get("window_end"),
            server_metrics=document.get("server_metrics"),
        )


@dataclass(frozen=True, slots=True)
class ShardDocument:
    """A finished shard's identity, configuration and measurements (not its raw arrays)."""

    shard: tuple[int, int]  # index, count
    planned: tuple[int, int]  # trajectories, requests it owned
    config: dict[str, Any]  # ``snapshot.config_fields``: RunConfig as JSON-ready data
    setup: RunSetup
    wall_origin: float  # Unix time of the shard's clock start
    engine: EngineDocument
    lifecycle: tuple[dict[str, Any], ...]  # agent lifecycle events, as written
    live: LiveShard | None  # None: a dry run
    processes: int | None = None  # client processes behind it (None: not written, one)
    dry_run_lines: tuple[str, ...] | None = None  # a dry run's lines, when written

    @property
    def process_count(self) -> int:
        return 1 if self.processes is None else self.processes

    def to_meta(self) -> dict[str, Any]:
        """The wire form, before ``capture`` stamps the format and version."""
        return {
            "shard": list(self.shard),
            "planned": list(self.planned),
            "config": self.config,
            "setup": dataclasses.asdict(self.setup),
            "wall_origin": self.wall_origin,
            "engine": self.engine.to_json(),
            "lifecycle": list(self.lifecycle),
            "live": self.live.to_json() if self.live is not None else None,
        }

    def trailing_meta(self) -> dict[str, Any]:
        """The keys written after ``capture`` stamps the format (where earlier versions
        wrote them): only those that are set."""
        trailing: dict[str, Any] = {}
        if self.processes is not None:
            trailing["processes"] = self.processes
        if self.dry_run_lines is not None:
            trailing["dry_run_lines"] = list(self.dry_run_lines)
        return trailing

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> ShardDocument:
        index, count = meta["shard"]
        trajectories, requests = meta["planned"]
        live = meta.get("live")
        return cls(
            shard=(int(index), int(count)),
            planned=(int(trajectories), int(requests)),
            config=dict(meta["config"]),
            setup=RunSetup(**meta["setup"]),
            wall_origin=float(meta["wall_origin"]),
            engine=EngineDocument.from_json(meta["engine"]),
            lifecycle=tuple(meta["lifecycle"]),
            live=LiveShard.from_json(live) if live else None,
            processes=int(meta["processes"]) if "processes" in meta else None,
            dry_run_lines=tuple(meta["dry_run_lines"]) if "dry_run_lines" in meta else None,
        )


@dataclass(frozen=True, slots=True)
class ShardIdentity:
    """What says which run a shard belongs to: all ``check_shards`` reads, so that it
    judges a set of shards before any of them is read whole."""

    shard: tuple[int, int]  # index, count
    config: dict[str, Any]
    manifest_sha256: str | None
    live: bool

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> ShardIdentity:
        index, count = meta["shard"]
        return cls(
            (int(index), int(count)),
            dict(meta["config"]),
            meta["setup"]["manifest_sha256"],
            bool(meta.get("live")),
        )
