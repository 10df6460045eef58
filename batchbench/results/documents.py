"""The fidelity document: one model (``FidelityFigures``) and the two JSON views of it.

The two views write different keys on purpose:

- ``fidelity_results_view`` is the ``fidelity`` section of the results JSON, for people
  and their scripts: derived figures (exact share, mean drift, histograms keyed by the
  drift as text and sorted), plus the server's cached tokens and the learned framing.
- ``fidelity_shard_view`` is the ``live.fidelity`` part of a shard's raw data, for the
  merge: raw counters that add up across shards (the sum of drifts, not their mean;
  histograms as pairs). ``fidelity_from_shard_view`` reads it back, ``add_fidelity`` adds
  shards together; the oracle's timings travel as an array beside it.

Both views keep the keys, order and values earlier versions wrote, so files written by
them still load and new files stay byte-identical.

Documents are plain dataclasses rather than msgspec or pydantic models: neither is a
dependency of the package, orjson already writes the JSON, and a document needs no
validation beyond what its reader checks (a damaged shard is reported by
``batchbench.scale.partial``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

from batchbench.results.recording import DriftFigures, FidelityFigures


def drift_results_view(figures: DriftFigures) -> dict[str, Any]:
    """One drift distribution as the results JSON shows it."""
    return {
        "requests": figures.requests,
        "exact": figures.exact,
        "exact_percent": figures.exact_percent,
        "mean_abs_drift": figures.mean_abs,
        "max_abs_drift": figures.max_abs if figures.requests else None,
        "histogram": {str(k): v for k, v in sorted(figures.histogram.items())},
    }


def fidelity_results_view(
    fidelity: FidelityFigures, server_cached_tokens: int | None, framing: dict | None
) -> dict[str, Any]:
    """The fidelity section of the results JSON: figures, drift histograms and drift by
    turn index (0-based request number within its trajectory)."""
    return {
        "prompt": drift_results_view(fidelity.prompt),
        "output": drift_results_view(fidelity.output),
        "prompt_by_turn": {
            str(turn): drift_results_view(figures)
            for turn, figures in sorted(fidelity.prompt_by_turn.items())
        },
        "corrected_requests": fidelity.corrected_requests,
        "correction_limited_requests": fidelity.limited_requests,
        "inexact_tool_blocks": fidelity.inexact_tool_blocks,
        "oracle_queries": fidelity.oracle_queries,
        "oracle_seconds_total": sum(fidelity.oracle_seconds),
        "explainable_cached_input_tokens": fidelity.explainable_cached_tokens,
        "server_cached_input_tokens": server_cached_tokens,
        "framing": framing,
    }


# Counters of FidelityFigures that shards add up, in the order the shard view writes them.
FIDELITY_COUNTERS = (
    "corrected_requests",
    "limited_requests",
    "oracle_queries",
    "explainable_cached_tokens",
    "inexact_tool_blocks",
)


def drift_shard_view(figures: DriftFigures) -> dict[str, Any]:
    """One drift distribution as raw counters."""
    return {
        "requests": figures.requests,
        "exact": figures.exact,
        "abs_sum": figures.abs_sum,
        "max_abs": figures.max_abs,
        "histogram": [[drift, count] for drift, count in figures.histogram.items()],
    }


def fidelity_shard_view(fidelity: FidelityFigures) -> dict[str, Any]:
    """The fidelity a shard hands to the merge (its oracle timings go as an array)."""
    return {
        "prompt": drift_shard_view(fidelity.prompt),
        "output": drift_shard_view(fidelity.output),
        "prompt_by_turn": [
            [turn, drift_shard_view(figures)] for turn, figures in fidelity.prompt_by_turn.items()
        ],
        **{name: getattr(fidelity, name) for name in FIDELITY_COUNTERS},
    }


def drift_from_shard_view(document: dict[str, Any]) -> DriftFigures:
    return DriftFigures(
        requests=int(document["requests"]),
        exact=int(document["exact"]),
        abs_sum=int(document["abs_sum"]),
        max_abs=int(document["max_abs"]),
        histogram={int(drift): int(count) for drift, count in document["histogram"]},
    )


def fidelity_from_shard_view(
    document: dict[str, Any], oracle_seconds: list[float] | None = None
) -> FidelityFigures:
    """The figures ``fidelity_shard_view`` wrote, with the oracle timings beside them."""
    return FidelityFigures(
        prompt=drift_from_shard_view(document["prompt"]),
        output=drift_from_shard_view(document["output"]),
        prompt_by_turn={
            int(turn): drift_from_shard_view(figures)
            for turn, figures in document["prompt_by_turn"]
        },
        oracle_seconds=list(oracle_seconds or ()),
        **{name: int(document[name]) for name in FIDELITY_COUNTERS},
    )


def _add_drift(part: DriftFigures, into: DriftFigures) -> None:
    into.requests += part.requests
    into.exact += part.exact
    into.abs_sum += part.abs_sum
    into.max_abs = max(into.max_abs, part.max_abs)
    for drift, count in part.histogram.items():
        into.histogram[drift] = into.histogram.get(drift, 0) + count


def add_fidelity(parts: list[FidelityFigures]) -> FidelityFigures:
    """Several shards' fidelity as one run's: counters and histograms added, turns in
    order, oracle timings joined in shard order."""
    total = FidelityFigures()
    for part in parts:
        _add_drift(part.prompt, total.prompt)
        _add_drift(part.output, total.output)
        for turn, figures in part.prompt_by_turn.items():
            _add_drift(figures, total.prompt_by_turn.setdefault(turn, DriftFigures()))
        for name in FIDELITY_COUNTERS:
            setattr(total, name, getattr(total, name) + getattr(part, name))
        total.oracle_seconds.extend(part.oracle_seconds)
    total.prompt_by_turn = dict(sorted(total.prompt_by_turn.items()))
    return total


# -- the results JSON, written ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ManifestSection:
    """Which manifest a run replayed (all None for a sampled workload's path and hash)."""

    path: str | None
    sha256: str | None
    schema_version: int | None
    sources: list[dict[str, Any]] | None  # per (format, file): trajectories, requests


@dataclass(frozen=True, slots=True)
class ConfigurationSection:
    """The run's configuration as the results JSON states it, fields in written order."""

    model: str | None
    tokenizer_model: str | None
    tokenizer_file: str
    endpoint: str | None
    host: str | None
    workload_mode: str
    agents: int
    max_active_agents: int | None
    admission: str
    time_scale: float
    replay_initial_overhead_tokens: int | None
    replay_turn_overhead_tokens: int | None
    sglang: bool
    ignore_eos: bool
    stream: bool
    dp_rank_perfect_routing_num: int | None
    user_tagging: bool
    seed: int | None
    content_salt: str
    prompt_correction: bool
    replay_reasoning: str
    prompt_oracle: str
    chat_template: str | None
    calibration: dict | None


@dataclass(frozen=True, slots=True)
class FailureRow:
    """A failed agent: where it stopped and why."""

    agent_id: int
    trajectory_id: str
    invocation: int
    error: str


@dataclass(frozen=True, slots=True)
class LiveSections:
    """What only a live run adds to the results JSON."""

    fidelity: dict[str, Any]  # ``fidelity_results_view``
    ranks: list[dict[str, Any]]
    client_health: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class ShardSection:
    """A shard's ``shard`` section: which shard it is, where its raw data and events files
    are (names beside the results JSON) and when its clock started."""

    index: int
    count: int
    data: str  # the raw data file's name
    data_path: str  # and its path as written
    wall_origin: float
    agent_events: str | None
    request_events: str | None


@dataclass(frozen=True, slots=True)
class SummaryDocument:
    """The results JSON as the run writes it (``--results-json``); ``to_json`` keeps the
    key order earlier versions wrote. ``sections`` are the finished run's further sections
    (the measured window, distributions, time series, server metrics, ...; built by
    ``batchbench.results.sections`` and the merge), added after the summary's own keys; a
    key they share with the summary keeps the summary's place and takes their value."""

    batchbench_version: str
    timestamp: str
    interrupted: bool
    interrupted_by: str | None
    dry_run: bool
    manifest: ManifestSection
    configuration: ConfigurationSection
    metrics: dict[str, Any]  # ``Summary.as_dict``: the CSV's columns by name
    failures: tuple[FailureRow, ...]
    live: LiveSections | None
    sections: dict[str, Any] = field(default_factory=dict)
    shard: ShardSection | None = None

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "batchbench_version": self.batchbench_version,
            "timestamp": self.timestamp,
            "interrupted": self.interrupted,
            "interrupted_by": self.interrupted_by,
            "dry_run": self.dry_run,
            "manifest": asdict(self.manifest),
            "configuration": asdict(self.configuration),
            "metrics": self.metrics,
            "failures": [asdict(failure) for failure in self.failures],
        }
        if self.live is not None:
            document["fidelity"] = self.live.fidelity
            document["ranks"] = self.live.ranks
            if self.live.client_health is not None:
                document["client_health"] = self.live.client_health
        document.update(self.sections)
        if self.shard is not None:
            document["shard"] = asdict(self.shard)
        return document

    def to_dict(self) -> dict[str, Any]:
        """The results JSON document (``to_json``; the name the Python API uses)."""
        return self.to_json()

    @classmethod
    def read(cls, document: dict[str, Any]) -> SummaryDocument:
        """A results JSON document (``to_json``'s output, parsed) as typed sections; the
        keys beyond the summary's own go to ``sections`` in their order, so ``to_json``
        gives the document back. A field the document lacks (an earlier version's) is
        None."""
        live = None
        if "fidelity" in document or "ranks" in document:
            live = LiveSections(
                fidelity=document.get("fidelity"),  # type: ignore[arg-type]
                ranks=document.get("ranks"),  # type: ignore[arg-type]
                client_health=document.get("client_health"),
            )
        failures = document.get("failures")
        shard = document.get("shard")
        own = {*_SUMMARY_KEYS, *(_LIVE_KEYS if live is not None else ()), "shard"}
        return cls(
            batchbench_version=document.get("batchbench_version"),  # type: ignore[arg-type]
            timestamp=document.get("timestamp"),  # type: ignore[arg-type]
            interrupted=document.get("interrupted"),  # type: ignore[arg-type]
            interrupted_by=document.get("interrupted_by"),
            dry_run=document.get("dry_run"),  # type: ignore[arg-type]
            manifest=section_from(ManifestSection, document.get("manifest")),
            configuration=section_from(ConfigurationSection, document.get("configuration")),
            metrics=_mapping(document.get("metrics")),
            failures=tuple(
                section_from(FailureRow, row)
                for row in (failures if isinstance(failures, list) else [])
                if isinstance(row, dict)
            ),
            live=live,
            sections={key: value for key, value in document.items() if key not in own},
            shard=section_from(ShardSection, shard) if isinstance(shard, dict) else None,
        )

    @property
    def window(self) -> WindowView:
        """The measured window (live runs; every figure None when there is none)."""
        return WindowView.read(self.sections.get("window"))


_SUMMARY_KEYS = (
    "batchbench_version",
    "timestamp",
    "interrupted",
    "interrupted_by",
    "dry_run",
    "manifest",
    "configuration",
    "metrics",
    "failures",
)
_LIVE_KEYS = ("fidelity", "ranks", "client_health")
_Section = TypeVar("_Section")


def section_from(kind: type[_Section], document: Any) -> _Section:
    """A section dataclass from a JSON object, field by field (a missing one is None: the
    document's reader checked the kinds it needs, as ``batchbench report`` does)."""
    values = document if isinstance(document, dict) else {}
    return kind(**{spec.name: values.get(spec.name) for spec in fields(kind)})  # type: ignore[arg-type]


# -- the measured window, read back ---------------------------------------------------------
def json_number(value: Any) -> int | float | None:
    """A JSON number as it is (bools are not numbers here), else None."""
    return None if isinstance(value, bool) or not isinstance(value, int | float) else value


def json_text(value: Any) -> str | None:
    """A JSON string as it is, else None."""
    return value if isinstance(value, str) else None


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class OutcomeView:
    """One SLO outcome of a window (``ObjectiveOutcome`` as the JSON holds it), every
    figure optional: a document of an earlier version, or a hand-edited one, may lack it.
    Numbers stay as the JSON wrote them (an integer stays an integer)."""

    objective: str | None
    metric: str | None
    verdict: str | None
    quantile: int | float | None
    limit_ms: int | float | None
    value_ms: int | float | None
    value_low_ms: int | float | None
    value_high_ms: int | float | None
    samples: int | float | None
    within: int | float | None
    attainment: int | float | None
    attainment_low: int | float | None
    attainment_high: int | float | None
    # The share of samples the bound needs (a document before speed floors: quantile).
    required: int | float | None = None
    limit_tokens_per_second: int | float | None = None
    value_tokens_per_second: int | float | None = None
    value_low_tokens_per_second: int | float | None = None
    value_high_tokens_per_second: int | float | None = None

    @classmethod
    def read(cls, document: dict[str, Any]) -> OutcomeView:
        objective = document.get("objective")
        numbers = {name: json_number(document.get(name)) for name in _OUTCOME_NUMBERS}
        if numbers["required"] is None:
            numbers["required"] = numbers["quantile"]
        return cls(
            objective=None if objective is None else str(objective),
            metric=json_text(document.get("metric")),
            verdict=json_text(document.get("verdict")),
            **numbers,
        )


_OUTCOME_NUMBERS = (
    "quantile",
    "limit_ms",
    "value_ms",
    "value_low_ms",
    "value_high_ms",
    "samples",
    "within",
    "attainment",
    "attainment_low",
    "attainment_high",
    "required",
    "limit_tokens_per_second",
    "value_tokens_per_second",
    "value_low_tokens_per_second",
    "value_high_tokens_per_second",
)


@dataclass(frozen=True, slots=True)
class WindowView:
    """The results JSON ``window`` section (``WindowFigures.as_dict``) as readers use it:
    the capacity search, its table and the HTML report read a window through this,
    whichever version wrote it; a figure the document lacks is None."""

    requests: int | float | None
    failed_requests: int | float | None
    duration_seconds: int | float | None
    requests_per_second: int | float | None
    output_tokens_per_second: int | float | None
    cache_hit_percent: int | float | None
    good_requests_per_second: int | float | None
    goodput_ratio: int | float | None
    good_trajectories_per_minute: int | float | None
    latency: dict[str, dict[str, Any]]  # metric -> its statistics, as written
    output_speed: dict[str, dict[str, Any]]  # "requests"/"agents" -> statistics, tokens/s
    slo: tuple[OutcomeView, ...]
    slo_verdict: str | None
    client_verdict: str | None
    client_reason: str | None
    server_verdict: str | None
    server_reason: str | None

    @classmethod
    def read(cls, document: Any) -> WindowView:
        window = _mapping(document)
        slo = window.get("slo")
        client, server = _mapping(window.get("client")), _mapping(window.get("server"))
        goodput = _mapping(window.get("goodput"))
        return cls(
            requests=json_number(window.get("requests")),
            failed_requests=json_number(window.get("failed_requests")),
            duration_seconds=json_number(window.get("duration_seconds")),
            requests_per_second=json_number(window.get("requests_per_second")),
            output_tokens_per_second=json_number(window.get("output_tokens_per_second")),
            cache_hit_percent=json_number(window.get("cache_hit_percent")),
            good_requests_per_second=json_number(goodput.get("good_requests_per_second")),
            goodput_ratio=json_number(goodput.get("goodput_ratio")),
            good_trajectories_per_minute=json_number(goodput.get("good_trajectories_per_minute")),
            latency={
                key: stats
                for key, stats in _mapping(window.get("latency")).items()
                if isinstance(stats, dict)
            },
            output_speed={
                key: stats
                for key, stats in _mapping(window.get("output_speed")).items()
                if isinstance(stats, dict)
            },
            slo=tuple(
                OutcomeView.read(outcome)
                for outcome in (slo if isinstance(slo, list) else [])
                if isinstance(outcome, dict)
            ),
            slo_verdict=json_text(window.get("slo_verdict")),
            client_verdict=json_text(client.get("verdict")),
            client_reason=json_text(client.get("reason")),
            server_verdict=json_text(server.get("verdict")),
            server_reason=json_text(server.get("reason")),
        )

    def percentile(self, metric: str, label: str) -> int | float | None:
        """A latency percentile (``ttft_ms``, ``p99``) in ms, None when not measured."""
        stats = self.latency.get(metric)
        return None if stats is None else json_number(_mapping(stats.get("percentiles")).get(label))


@dataclass(frozen=True, slots=True)
class DriftView:
    """One side (prompt or output) of the results JSON's fidelity section, read back."""

    requests: int | float | None
    exact: int | float | None
    exact_percent: int | float | None
    mean_abs_drift: int | float | None
    max_abs_drift: int | float | None

    @classmethod
    def read(cls, document: Any) -> DriftView | None:
        """None when the side is not there."""
        if not isinstance(document, dict):
            return None
        return cls(
            requests=json_number(document.get("requests")),
            exact=json_number(document.get("exact")),
            exact_percent=json_number(document.get("exact_percent")),
            mean_abs_drift=json_number(document.get("mean_abs_drift")),
            max_abs_drift=json_number(document.get("max_abs_drift")),
        )
