"""The types of the fields the report reads, checked when a document is loaded, so that a
malformed document is one line naming the file and the field (``f.json: window.slo must be
a list, not a number (5)``) instead of a traceback from deep inside a table or a chart.

Only what the report reads is checked; other keys may hold anything (newer or older
batchbench versions add and drop fields). ``null`` is accepted everywhere: it is how the
documents say "absent", and every section of the page handles an absent figure."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from batchbench.errors import BatchbenchError


@dataclass(frozen=True)
class Scalar:
    """A JSON scalar kind: ``name`` says it in the error ("a number")."""

    name: str
    test: Callable[[Any], bool]


@dataclass(frozen=True)
class Obj:
    """A JSON object: ``fields`` checked by name, ``rest`` (when set) for every other key
    (maps keyed by rank, percentile or concept)."""

    fields: dict[str, Spec] = field(default_factory=dict)
    rest: Spec | None = None
    name: str = "an object"


@dataclass(frozen=True)
class Arr:
    """A JSON list whose every element is ``item``."""

    item: Spec
    name: str = "a list"


@dataclass(frozen=True)
class Either:
    """The first of ``options`` whose kind matches the value."""

    options: tuple[Spec, ...]
    name: str


Spec = Scalar | Obj | Arr | Either | None  # None: anything

NUMBER = Scalar("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool))
STRING = Scalar("a string", lambda v: isinstance(v, str))
BOOLEAN = Scalar("true or false", lambda v: isinstance(v, bool))


def numbers(names: str) -> dict[str, Spec]:
    """Number fields, named in one whitespace-separated string."""
    return dict.fromkeys(names.split(), NUMBER)


def same(names: str, spec: Spec) -> dict[str, Spec]:
    """Fields of one spec, named in one whitespace-separated string."""
    return dict.fromkeys(names.split(), spec)


NUMBER_LIST = Arr(NUMBER, "a list of numbers")
LATENCY = Obj({"percentiles": Obj(rest=NUMBER)})
OBJECTIVE = Obj(
    {
        **same("objective metric verdict", STRING),
        **numbers(
            "quantile limit_ms value_ms value_low_ms value_high_ms samples within "
            "attainment attainment_low attainment_high required limit_tokens_per_second "
            "value_tokens_per_second value_low_tokens_per_second value_high_tokens_per_second"
        ),
    }
)
VERDICT = Obj(same("verdict reason", STRING))
WINDOW = Obj(
    {
        **numbers(
            "requests failed_requests duration_seconds requests_per_second "
            "output_tokens_per_second cache_hit_percent"
        ),
        "latency": Obj(same("ttft_ms itl_ms e2e_ms", LATENCY)),
        "goodput": Obj(
            numbers("good_requests_per_second goodput_ratio good_trajectories_per_minute")
        ),
        "slo": Arr(OBJECTIVE),
        "slo_verdict": STRING,
        "output_speed": Obj(same("requests agents", LATENCY)),
        "client": VERDICT,
        "server": VERDICT,
        "request_tokens": Obj(same("input output", Obj(numbers("mean p50 p90")))),
    }
)
DISTRIBUTION = Obj(same("values fractions", NUMBER_LIST))
FIDELITY_SIDE = Obj(
    {
        **numbers("requests exact exact_percent mean_abs_drift max_abs_drift"),
        "histogram": Obj(rest=NUMBER),
    }
)
STATISTICS = Obj(numbers("mean min p50 p90 p99 max"))
ENDPOINT_METRICS = Obj(
    {
        **same("url dialect", STRING),
        **numbers("interval_seconds scrapes failed_scrapes"),
        "series": Obj(
            {
                "t": NUMBER_LIST,
                **same("kv_cache_usage running_requests waiting_requests", Obj(rest=NUMBER_LIST)),
            }
        ),
        "concepts": Obj(rest=Obj(rest=Either((NUMBER, STATISTICS), "a number or an object"))),
    }
)
# Several --server-metrics: each endpoint's own document under "endpoints".
SERVER_METRICS = Obj({**ENDPOINT_METRICS.fields, "endpoints": Arr(ENDPOINT_METRICS)})
COMMON: dict[str, Spec] = {
    **same("kind timestamp batchbench_version interrupted_by", STRING),
    **same("interrupted dry_run", BOOLEAN),
    "manifest": Obj(same("path sha256", STRING)),
    "configuration": Obj(),
}
RUN = Obj(
    {
        **COMMON,
        "metrics": Obj(
            {
                "verdict": STRING,
                **numbers(
                    "total_requests failed_requests total_duration_seconds requests_per_second "
                    "output_tokens_per_second ttft_p50_ms ttft_p99_ms inter_token_latency_p50_ms "
                    "inter_token_latency_p99_ms latency_p50_ms latency_p99_ms "
                    "server_cached_input_tokens total_input_tokens"
                ),
            }
        ),
        "window": WINDOW,
        "distributions": Obj(same("ttft_ms itl_ms e2e_ms", DISTRIBUTION)),
        "timeseries": Obj(
            same(
                "t active_agents in_flight requests_per_second output_tokens_per_second",
                NUMBER_LIST,
            )
        ),
        "ranks": Arr(
            Obj(numbers("rank requests input_tokens cached_tokens ttft_p50_ms ttft_p99_ms"))
        ),
        "ranks_source": STRING,
        "fidelity": Obj(same("prompt output", FIDELITY_SIDE)),
        "server_metrics": SERVER_METRICS,
    }
)
STEP = Obj(
    {
        **numbers("agents extensions"),
        **same("results_json phase verdict note", STRING),
        "window": WINDOW,
    }
)
CAPACITY = Obj(
    {
        **COMMON,
        "slo": Arr(STRING, "a list of strings"),
        "steps": Arr(STEP),
        "answer": Obj({"text": STRING, **numbers("agents breaking_agents"), "concluded": BOOLEAN}),
    }
)


class Mismatch(Exception):
    """A value of the wrong kind at a path (inside check only)."""

    def __init__(self, path: str, expected: str, value: Any) -> None:
        super().__init__(f"{path or 'the document'} must be {expected}, not {describe(value)}")


def check(document: dict[str, Any], spec: Obj, where: str) -> None:
    """Raise BatchbenchError ``where: path must be X, not Y`` at the first mismatch."""
    try:
        _check(document, spec, "")
    except Mismatch as exc:
        raise BatchbenchError(f"{where}: {exc}") from None


def _matches(value: Any, spec: Spec) -> bool:
    """Whether ``value`` is of ``spec``'s kind (its contents are not looked at)."""
    if spec is None or value is None:
        return True
    if isinstance(spec, Scalar):
        return spec.test(value)
    if isinstance(spec, Obj):
        return isinstance(value, dict)
    if isinstance(spec, Arr):
        return isinstance(value, list)
    return any(_matches(value, option) for option in spec.options)


def _check(value: Any, spec: Spec, path: str) -> None:
    if spec is None or value is None:
        return
    if not _matches(value, spec):
        raise Mismatch(path, spec.name, value)
    if isinstance(spec, Obj):
        for key, item in value.items():
            inner = spec.fields.get(key, spec.rest) if isinstance(key, str) else spec.rest
            if inner is not None:
                _check(item, inner, _join(path, key))
    elif isinstance(spec, Arr):
        for index, item in enumerate(value):
            _check(item, spec.item, f"{path}[{index}]")
    elif isinstance(spec, Either):
        _check(value, next(o for o in spec.options if _matches(value, o)), path)


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,39}")


def _join(path: str, key: Any) -> str:
    """``path.key``, or ``path["key"]`` (JSON-quoted, shortened) for keys that would not read
    as one name on one line."""
    if isinstance(key, str) and _PLAIN_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{short(key)}]"


def short(value: Any) -> str:
    """A scalar as JSON on one line, at most about 40 characters."""
    try:
        data = orjson.dumps(value).decode()
    except TypeError:  # a key or value no JSON document holds (built in memory)
        data = type(value).__name__
    return data if len(data) <= 40 else data[:37] + "..."


def describe(value: Any) -> str:
    """What a value is, for an error: ``a number (5)``, ``a string ("x")``, ``a list``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"a number ({short(value)})"
    if isinstance(value, str):
        return f"a string ({short(value)})"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
