"""Several ``--server-metrics`` endpoints (one per engine, and/or the gateway) as one
results-JSON ``server_metrics`` document.

With one endpoint the document is that endpoint's own, unchanged. With several, each
endpoint's document is kept whole under ``endpoints`` (in the order given, each with its
own time series: endpoints are scraped at their own instants, so their series share no
time axis and the top-level ``series`` is left empty), and the top-level ``concepts`` hold
every endpoint's ranks with the endpoint's URL in front (``"<url>"`` for its ``all``,
``"<url> <rank>"`` for a named rank), so that every reader of one document (the console,
the report, the per-rank table) shows each endpoint labelled by its URL and none of them
is dropped or added into another.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def endpoint_label(url: str, rank: str) -> str:
    """The key of an endpoint's rank in the combined document."""
    return url if rank == "all" else f"{url} {rank}"


def combined_document(documents: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One ``server_metrics`` document of the endpoints' documents (see the module text)."""
    if len(documents) == 1:
        return documents[0]
    concepts: dict[str, dict[str, Any]] = {}
    for document in documents:
        url = document["url"]
        for concept, by_rank in document["concepts"].items():
            merged = concepts.setdefault(concept, {})
            for rank, value in by_rank.items():
                merged[endpoint_label(url, rank)] = value
    first = documents[0]
    errors = [d["last_error"] for d in documents if d["last_error"]]
    return {
        "url": ", ".join(d["url"] for d in documents),
        "interval_seconds": first["interval_seconds"],
        "scrapes": sum(d["scrapes"] for d in documents),
        "failed_scrapes": sum(d["failed_scrapes"] for d in documents),
        "last_error": errors[-1] if errors else None,
        "file": first["file"],
        "window": first["window"],
        "dialect": ", ".join(d["dialect"] for d in documents),
        "concepts": concepts,
        "series": {name: ({} if name != "t" else []) for name in first["series"]},
        "endpoints": list(documents),
    }
