"""What a manifest's workload looks like, before anything is run: ``batchbench import`` and
``batchbench export-plans`` print it (``format_description``) and ``--describe-html``
draws it (``batchbench.report.workload``). It reads the plans the importer writes (schema
v2 dicts, docs/manifest.md) in one pass plus one over the requests in arrival order:
O(requests log requests + block references), and what it keeps is O(bins), not
O(requests).

Definitions (also in docs/import.md, "The workload description"):

- **Arrival** of a request, in ms on the manifest's clock: the first request of a
  trajectory arrives at its ``start_after_ms`` (0 when absent). A later request arrives at
  ``start_after_ms + recorded_start_after_ms - (the first request's
  recorded_start_after_ms)`` when both requests record one (the recording's own spacing,
  whatever the recording's origin); otherwise at its predecessor's arrival plus the
  predecessor's ``delay_after_ms`` (0 when absent), as if every request took no time. The
  requests of a trajectory run one after another, so a request never arrives before its
  predecessor (an earlier value is raised to the predecessor's). Requests arriving at the
  same time are taken in file order.
- **Percentiles** are nearest-rank (``distribution.Percentiles``): of prompt tokens and
  output tokens per request, of requests per trajectory, and of ``delay_after_ms`` over
  every request followed by another in its trajectory (absent counts as 0).
- **Block tokens** are the sums of the blocks' ``tokens``; a request's
  ``overhead_tokens`` (its template framing) belongs to no block. The **shared** share is
  the part of all block tokens in blocks whose seed occurs in two or more trajectories;
  the **live** share the part in blocks marked ``live``. Both are None without blocks.
- **Perfect prefix cache hit rate**: the requests are served in arrival order by an
  infinite, token-exact prefix cache (``prefixcache.PrefixCache``); the rate is the hit
  tokens over the counted tokens of all requests.
  A request with blocks counts its block tokens and hits the tokens of the longest prefix
  of its blocks that an earlier prompt (or reply) began with. Blocks are compared by
  content identity, as a run generates them: a block is its seed, except the reply a live
  block takes. The first live block of a request (not the first request, not a
  ``reset_before`` request) whose seed the trajectory has not used since its last reset
  is the reply to the previous request, identity (trajectory, that request); every later
  block of the trajectory with that seed (until a reset) is the same reply. Each request,
  once served, caches its prompt followed by its reply, so a reply is cached only after
  the request it answers has run.
  A request without blocks (the growth model) counts its ``prompt_tokens`` and, when it
  extends its predecessor (it is not the first request nor a ``reset_before`` one), hits
  the predecessor's prompt plus reply: min(prompt + output of the predecessor, its own
  prompt); otherwise nothing. Prompts without blocks share nothing across trajectories.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from batchbench.ingest.distribution import (
    Histogram,
    Percentiles,
    linear_histogram,
    log_histogram,
    nice_width,
    percentiles,
)
from batchbench.ingest.prefixcache import PrefixCache

# The arrivals timeline has at most about this many bins, each at least a second.
TIMELINE_BINS = 300
MISSING = "n/a"  # a figure without data, spelled as batchbench.results.formatting does


@dataclass(frozen=True, slots=True)
class Timeline:
    """Arrivals in consecutive bins of ``bin_ms`` from time 0: the requests arriving in each
    bin, and the perfect cache's cumulative hit rate over the requests arrived by the bin's
    end (None while no token has been counted)."""

    bin_ms: int
    requests: tuple[int, ...]
    cache_hit_rate: tuple[float | None, ...]


@dataclass(frozen=True, slots=True)
class WorkloadDescription:
    """The figures of one workload (see the module's definitions)."""

    trajectories: int
    multi_request_trajectories: int  # with two requests or more
    requests: int
    block_requests: int  # requests with blocks; the others follow the growth model
    prompt_tokens: int
    output_tokens: int
    block_tokens: int
    shared_block_tokens: int  # in blocks whose seed two or more trajectories use
    live_block_tokens: int
    cache_hit_tokens: int
    cache_counted_tokens: int
    first_arrival_ms: float | None
    last_arrival_ms: float | None
    prompt: Percentiles  # prompt tokens per request (ISL)
    output: Percentiles  # output tokens per request (OSL)
    turns: Percentiles  # requests per trajectory
    delay_ms: Percentiles  # delay_after_ms of requests followed by another
    prompt_histogram: Histogram
    output_histogram: Histogram
    turns_histogram: Histogram
    delay_histogram: Histogram  # positive delays only, on a log scale
    zero_delays: int
    timeline: Timeline

    @property
    def shared_share(self) -> float | None:
        return self.shared_block_tokens / self.block_tokens if self.block_tokens else None

    @property
    def live_share(self) -> float | None:
        return self.live_block_tokens / self.block_tokens if self.block_tokens else None

    @property
    def cache_hit_rate(self) -> float | None:
        counted = self.cache_counted_tokens
        return self.cache_hit_tokens / counted if counted else None

    def to_dict(self) -> dict[str, Any]:
        """Every figure as JSON types (the shares and the hit rate included)."""
        data = asdict(self)
        data["shared_share"] = self.shared_share
        data["live_share"] = self.live_share
        data["cache_hit_rate"] = self.cache_hit_rate
        return data


class _Reader:
    """The first pass, in file order: per-request figures and the blocks' totals. The
    cache then serves the requests in arrival order, reading their blocks again from the
    plans (kept by reference), so nothing per block reference is held in between."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.prompts: list[int] = []
        self.outputs: list[int] = []
        self.turns: list[int] = []
        self.delays: list[float] = []
        # Without blocks, the tokens the request hits (the growth model); None: blocks.
        self.grown: list[int | None] = []
        self.trajectories: list[Sequence[Mapping[str, Any]]] = []
        self.firsts: list[int] = []  # the position of each trajectory's first request
        self.block_tokens = self.live_tokens = self.block_requests = 0
        self.seed_owner: dict[str, int] = {}  # first trajectory using the seed, -1: several
        self.seed_tokens: dict[str, int] = {}

    def trajectory(self, t: int, plan: Mapping[str, Any]) -> None:
        requests = plan["requests"]
        self.trajectories.append(requests)
        self.firsts.append(len(self.prompts))
        self.turns.append(len(requests))
        start = plan.get("start_after_ms") or 0
        first_recorded = requests[0].get("recorded_start_after_ms")
        arrival: float = start
        previous: Mapping[str, Any] | None = None
        for request in requests:
            if previous is not None:
                delay = previous.get("delay_after_ms") or 0
                self.delays.append(delay)
                recorded = request.get("recorded_start_after_ms")
                if recorded is not None and first_recorded is not None:
                    arrival = max(arrival, start + recorded - first_recorded)
                else:
                    arrival += delay
            self.arrivals.append(arrival)
            prompt = request["prompt_tokens"]
            self.prompts.append(prompt)
            self.outputs.append(request["output_tokens"])
            blocks = request.get("blocks")
            if blocks:
                self._blocks(t, blocks)
                self.grown.append(None)
            elif previous is not None and not request.get("reset_before"):
                grown = previous["prompt_tokens"] + previous["output_tokens"]
                self.grown.append(min(grown, prompt))
            else:
                self.grown.append(0)
            previous = request

    def _blocks(self, t: int, blocks: Sequence[Mapping[str, Any]]) -> None:
        self.block_requests += 1
        owners, totals = self.seed_owner, self.seed_tokens
        for block in blocks:
            seed, size = block["seed"], block["tokens"]
            self.block_tokens += size
            if block.get("live"):
                self.live_tokens += size
            owner = owners.setdefault(seed, t)
            if owner != t and owner != -1:
                owners[seed] = -1
            totals[seed] = totals.get(seed, 0) + size


def _serve_blocks(
    cache: PrefixCache, t: int, k: int, request: Mapping[str, Any], kept: dict[str, Hashable]
) -> tuple[int, int]:
    """Serve request ``k`` of trajectory ``t``: (tokens hit, tokens counted). ``kept`` maps
    the trajectory's seeds to their identities since its last reset."""
    reset = bool(request.get("reset_before"))
    if reset:
        kept.clear()
    reply_waiting = k > 0 and not reset
    identities: list[Hashable] = []
    sizes: list[int] = []
    for block in request["blocks"]:
        seed = block["seed"]
        identity = kept.get(seed)
        if identity is None:
            if reply_waiting and block.get("live"):
                identity = (t, k - 1)
                reply_waiting = False
            else:
                identity = seed
            kept[seed] = identity
        identities.append(identity)
        sizes.append(block["tokens"])
    hit, node = cache.serve(identities, sizes)
    cache.extend(node, (t, k))
    return hit, sum(sizes)


def _timeline(reader: _Reader) -> tuple[Timeline, int, int]:
    """Serve every request in arrival order: the timeline, hit tokens and counted tokens."""
    arrivals = reader.arrivals
    if not arrivals:
        return Timeline(nice_width(1000), (), ()), 0, 0
    bin_ms = nice_width(max(max(arrivals) / TIMELINE_BINS, 1000))
    bins = int(max(arrivals) // bin_ms) + 1
    requests, hits, counted = [0] * bins, [0] * bins, [0] * bins
    cache = PrefixCache()
    kept: dict[int, dict[str, Hashable]] = {}  # by trajectory, until its last request
    for j in sorted(range(len(arrivals)), key=arrivals.__getitem__):
        b = int(arrivals[j] // bin_ms)
        requests[b] += 1
        grown = reader.grown[j]
        if grown is not None:
            hits[b] += grown
            counted[b] += reader.prompts[j]
            continue
        t = bisect_right(reader.firsts, j) - 1
        k = j - reader.firsts[t]
        trajectory = reader.trajectories[t]
        seeds = kept.pop(t, {}) if k + 1 == len(trajectory) else kept.setdefault(t, {})
        hit, count = _serve_blocks(cache, t, k, trajectory[k], seeds)
        hits[b] += hit
        counted[b] += count
    rates: list[float | None] = []
    hit_total = counted_total = 0
    for hit, count in zip(hits, counted, strict=True):
        hit_total += hit
        counted_total += count
        rates.append(hit_total / counted_total if counted_total else None)
    return Timeline(bin_ms, tuple(requests), tuple(rates)), hit_total, counted_total


def describe(plans: Iterable[Mapping[str, Any]]) -> WorkloadDescription:
    """The description of schema v2 plans (dicts as the importer writes them, valid)."""
    reader = _Reader()
    for t, plan in enumerate(plans):
        reader.trajectory(t, plan)
    timeline, hit_tokens, counted_tokens = _timeline(reader)
    prompts, outputs = sorted(reader.prompts), sorted(reader.outputs)
    turns, delays = sorted(reader.turns), sorted(reader.delays)
    zero_delays = bisect_right(delays, 0)
    shared = sum(
        tokens for seed, tokens in reader.seed_tokens.items() if reader.seed_owner[seed] == -1
    )
    arrivals = reader.arrivals
    return WorkloadDescription(
        trajectories=len(turns),
        multi_request_trajectories=len(turns) - bisect_right(turns, 1),
        requests=len(prompts),
        block_requests=reader.block_requests,
        prompt_tokens=sum(prompts),
        output_tokens=sum(outputs),
        block_tokens=reader.block_tokens,
        shared_block_tokens=shared,
        live_block_tokens=reader.live_tokens,
        cache_hit_tokens=hit_tokens,
        cache_counted_tokens=counted_tokens,
        first_arrival_ms=min(arrivals) if arrivals else None,
        last_arrival_ms=max(arrivals) if arrivals else None,
        prompt=percentiles(prompts),
        output=percentiles(outputs),
        turns=percentiles(turns),
        delay_ms=percentiles(delays),
        prompt_histogram=linear_histogram(prompts),
        output_histogram=linear_histogram(outputs),
        turns_histogram=linear_histogram(turns),
        delay_histogram=log_histogram(delays[zero_delays:]),
        zero_delays=zero_delays,
        timeline=timeline,
    )


# -- the text -------------------------------------------------------------------------------


def count(value: float | None) -> str:
    """A count or size with thousands separators (one decimal when not whole)."""
    if value is None:
        return MISSING
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:,.1f}"


def seconds(ms: float | None) -> str:
    """A time in ms as seconds with one decimal: ``3215469`` -> ``3,215.5 s``."""
    return MISSING if ms is None else f"{ms / 1000:,.1f} s"


def share(value: float | None) -> str:
    """A ratio in 0..1 as a percentage with one decimal: ``0.9167`` -> ``91.7%``."""
    return MISSING if value is None else f"{value * 100:.1f}%"


def _counted(n: int, one: str, many: str) -> str:
    return f"{count(n)} {one if n == 1 else many}"


PERCENTILE_ROWS = (
    ("prompt tokens", "prompt"),
    ("output tokens", "output"),
    ("requests/trajectory", "turns"),
    ("delay_after_ms", "delay_ms"),
)
PERCENTILE_COLUMNS = ("count", "p50", "p90", "p99", "max")


def format_description(desc: WorkloadDescription) -> str:
    """The description in at most 12 lines of text, numbers aligned."""
    lines = [
        f"workload: {_counted(desc.requests, 'request', 'requests')} in "
        f"{_counted(desc.trajectories, 'trajectory', 'trajectories')} "
        f"({count(desc.multi_request_trajectories)} with more than one request)",
        f"arrivals: from {seconds(desc.first_arrival_ms)} to {seconds(desc.last_arrival_ms)} "
        "after the start",
        f"tokens: {count(desc.prompt_tokens)} prompt, {count(desc.output_tokens)} output",
    ]
    if desc.block_requests:
        lines.append(
            f"blocks: {count(desc.block_tokens)} tokens in "
            f"{_counted(desc.block_requests, 'request', 'requests')}; "
            f"{share(desc.shared_share)} shared by 2+ trajectories, {share(desc.live_share)} live"
        )
    else:
        lines.append("blocks: none (each prompt grows by its predecessor's prompt and reply)")
    lines.append(
        f"perfect prefix cache, in arrival order: {share(desc.cache_hit_rate)} of prompt "
        f"tokens hit ({count(desc.cache_hit_tokens)} of {count(desc.cache_counted_tokens)})"
    )
    rows = [["", *PERCENTILE_COLUMNS]]
    for label, name in PERCENTILE_ROWS:
        figures: Percentiles = getattr(desc, name)
        rows.append([label, *(count(getattr(figures, column)) for column in PERCENTILE_COLUMNS)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  " + "  ".join(cells).rstrip())
    return "\n".join(lines)
