"""The results JSON's sections beyond the summary: the measured window, latency
distributions for CDF charts, the time series and per-rank figures (client routing, or
the server's own metrics when the client does not route)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from batchbench.results.formatting import rank_order
from batchbench.results.metrics import percentile
from batchbench.results.recording import RankFigures
from batchbench.results.window import Window, WindowFigures, WindowInputs, distribution

DISTRIBUTION_KEYS = ("ttft_ms", "itl_ms", "e2e_ms")


def rank_rows(
    ranks: Sequence[RankFigures], inputs: WindowInputs, server_metrics: dict | None
) -> tuple[list[dict], str | None]:
    """(rows, source): per DP rank from the client's routing when it routes, else from the
    server's metrics when they name ranks; ([], None) when neither knows."""
    if ranks:
        samples = inputs.samples
        by_rank: dict[int, list[float]] = {}
        for i in range(len(samples)):
            rank, ttft_ms = samples.rank[i], samples.ttft_ms[i]
            if rank >= 0 and samples.ok[i] and not math.isnan(ttft_ms):
                by_rank.setdefault(rank, []).append(ttft_ms)
        rows = []
        for index, figures in enumerate(ranks):
            ttfts = sorted(by_rank.get(index, ()))
            rows.append(
                {
                    "rank": index,
                    **figures.as_row(),
                    "ttft_p50_ms": percentile(ttfts, 0.5),
                    "ttft_p99_ms": percentile(ttfts, 0.99),
                }
            )
        return rows, "client"
    concepts = (server_metrics or {}).get("concepts") or {}
    requests = concepts.get("requests") or {}
    labels = [label for label in requests if label != "all"]
    if not labels:
        return [], None

    def value(concept: str, label: str) -> float | None:
        found = (concepts.get(concept) or {}).get(label)
        return found if isinstance(found, int | float) else None

    def ttft(label: str, key: str) -> float | None:
        found = (concepts.get("ttft_seconds") or {}).get(label)
        if isinstance(found, dict) and isinstance(found.get(key), int | float):
            return found[key] * 1000.0
        return None

    rows = []
    for label in sorted(labels, key=rank_order):
        prompt, cached_share = (
            value("prompt_tokens", label),
            value("prefix_cache_hit_percent", label),
        )
        rows.append(
            {
                "rank": _rank_number(label),
                "label": label,  # the metrics' own name: "<url> <rank>" over several pages
                "trajectories": None,
                "requests": value("requests", label),
                "input_tokens": prompt,
                "output_tokens": value("generation_tokens", label),
                "cached_tokens": (
                    round(prompt * cached_share / 100.0)
                    if prompt is not None and cached_share is not None
                    else None
                ),
                "ttft_p50_ms": ttft(label, "p50"),
                "ttft_p99_ms": ttft(label, "p99"),
            }
        )
    return rows, "server"


def _rank_number(label: str) -> int:
    """The ``rank`` field of a server-reported row: its number, or 2^30 for a label that
    names no number."""
    return int(label) if label.isdigit() else 1 << 30


def distributions(inputs: WindowInputs, window: WindowFigures) -> dict:
    """CDF points of TTFT, ITL and request latency over the window."""
    rows = Window(inputs, window.start_seconds, window.end_seconds)
    return {key: distribution(rows.values(key)) for key in DISTRIBUTION_KEYS}
