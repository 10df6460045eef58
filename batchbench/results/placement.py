"""Where each rank's requests were actually served, next to where the client sent them.

With perfect routing the per-rank table counts a request under the rank the client asked
for. A gateway that ignores the rank header (smg's default ``cache_aware`` policy does)
spreads the requests over its workers anyway, and the table would still look balanced. When
the replies name the worker that served them (smg's ``x-smg-routed-worker-id``), these
lines show per rank the worker that usually served it, the requests served elsewhere
(misplaced) and the agents that moved between workers, and warn when the placement was
not the one asked for. Without such a header they say that the figures are the client's
intended placement.
"""

from __future__ import annotations

from collections.abc import Sequence

from batchbench.results.recording import RankFigures

SMG_TARGET_HEADER = "x-smg-target-worker"
SMG_HINT = (
    "its policy may not honour it (smg's default cache_aware does not); "
    "use --policy consistent_hashing"
)


def placement_lines(
    ranks: Sequence[RankFigures], worker_header: str, rank_headers: Sequence[str]
) -> list[str]:
    """The placement table under the per-rank table, and a warning when a rank's requests
    reached more than one worker or two ranks shared one; one line saying the figures are
    intended placement when no reply named its worker."""
    if not any(rank.workers for rank in ranks):
        return [
            f"Per-rank figures are the client's intended placement: no reply named the "
            f"worker that served it ({worker_header})"
        ]
    lines = [f"Per-rank placement (the worker each reply named in {worker_header}):"]
    header = ("rank", "usual_worker", "served", "misplaced", "switching_agents", "switches")
    rows = [
        (str(i), r.usual_worker or "-", str(r.placed), str(r.misplaced),
         str(r.switching_agents), str(r.switches))
        for i, r in enumerate(ranks)
    ]  # fmt: skip
    widths = [max(len(h), *(len(row[c]) for row in rows)) for c, h in enumerate(header)]
    lines.append("  " + "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        lines.append("  " + "  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))
    warning = misplacement_warning(ranks, rank_headers)
    if warning is not None:
        lines.append(warning)
    return lines


def misplacement_warning(ranks: Sequence[RankFigures], rank_headers: Sequence[str]) -> str | None:
    """One line naming what went astray and its likely cause, or None when every rank was
    served by one worker of its own."""
    misplaced = sum(rank.misplaced for rank in ranks)
    placed = sum(rank.placed for rank in ranks)
    switching = sum(rank.switching_agents for rank in ranks)
    owners: dict[str, list[int]] = {}
    for index, rank in enumerate(ranks):
        if rank.usual_worker is not None:
            owners.setdefault(rank.usual_worker, []).append(index)
    shared = [(worker, indices) for worker, indices in owners.items() if len(indices) > 1]
    if not misplaced and not shared:
        return None
    found = []
    if misplaced:
        found.append(
            f"{misplaced} of {placed} requests were served by a worker other than their "
            f"rank's usual one, {switching} {'agent' if switching == 1 else 'agents'} "
            f"switched workers"
        )
    for worker, indices in shared:
        found.append(f"ranks {', '.join(map(str, indices))} share their usual worker {worker}")
    named = ", ".join(rank_headers) if rank_headers else "the rank header"
    if SMG_TARGET_HEADER in rank_headers:
        cause = f"the gateway ignored {named}: {SMG_HINT}"
    else:
        cause = f"the server ignored {named}"
    return f"Warning: {'; '.join(found)}: {cause}"


def rank_layout_lines(workers: Sequence[str | None] | None, worker_header: str) -> list[str]:
    """The banner's rank -> worker layout from the preflight probes, when they ran."""
    if workers is None:
        return []
    if all(worker is None for worker in workers):
        return [
            f"Rank layout: {len(workers)} rank probes answered; no reply named its worker "
            f"({worker_header})"
        ]
    pairs = ", ".join(f"{i} -> {worker or 'not named'}" for i, worker in enumerate(workers))
    lines = [
        f"Rank layout (preflight probes): {pairs}",
        "  (smg numbers its workers in registration order, which can change when the "
        "gateway restarts)",
    ]
    named = [worker for worker in workers if worker is not None]
    if len(set(named)) < len(named):
        lines.append(
            "  (several ranks reached one worker: the gateway may ignore the rank header, "
            "or have fewer workers than ranks)"
        )
    return lines


def probe_lines(probes: dict[str, int] | None) -> list[str]:
    """The banner's count of the chat requests sent before the run (perfect routing): the
    servers' own counters include them, and a per-rank comparison must take them out."""
    if probes is None:
        return []
    total = sum(probes.values())
    return [
        f"Probes before the run: {total} (preflight {probes['preflight']} and calibration "
        f"{probes['calibration']} with rank 0's headers; rank layout "
        f"{probes['rank_layout']}, one per rank)"
    ]


def rank_health_lines(ranks: Sequence[RankFigures], failover: str) -> list[str]:
    """Under the placement table: the ranks seen down (when, why), the failed agents per
    rank, and what --rank-failover did with a down rank's agents; nothing when every rank
    stayed up and no agent failed."""
    down = [(i, rank) for i, rank in enumerate(ranks) if rank.down_reason]
    failed = sum(rank.failed_agents for rank in ranks)
    moved = sum(rank.moved_agents for rank in ranks)
    if not down and not failed and not moved:
        return []
    lines = []
    if down:
        named = ", ".join(
            f"rank {i} from {rank.down_at_seconds:.2f} s ({rank.down_reason})" for i, rank in down
        )
        lines.append(f"Down ranks: {named}")
    lines.append(
        "Failed agents per rank: "
        + ", ".join(f"rank {i}: {rank.failed_agents}" for i, rank in enumerate(ranks))
    )
    if failover == "rehash":
        if moved:
            completed = sum(rank.moved_completed for rank in ranks)
            left = ", ".join(
                f"{rank.moved_agents} of rank {i}"
                for i, rank in enumerate(ranks)
                if rank.moved_agents
            )
            lines.append(
                f"Rank failover (rehash): {moved} {'agent' if moved == 1 else 'agents'} "
                f"({left}) moved on to a live rank with their routing key; {completed} of "
                f"them completed"
            )
    elif down:
        lines.append(
            "Rank failover: none (--rank-failover rehash moves a down rank's agents on to a "
            "live rank)"
        )
    return lines
