"""Session reconstruction from cumulative block hashes (COMPAT §7.5).

A request's parent is the latest earlier request of the same principal, at most the link
window earlier, whose whole chain is a strict prefix of its own chain (its leaf appears in
this chain before this chain's own leaf). Only in-window requests form trajectories; a
request whose parent is missing or lies before the window is a root.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from batchbench.ingest.rows import Row
from batchbench.ingest.window import Window


@dataclass(slots=True)
class Session:
    """One trajectory's requests in sort order; ``prewindow`` when its root's parent lies
    before the window (the conversation began earlier)."""

    requests: list[Row]
    prewindow: bool = False
    links: int = field(default=0)


def reconstruct(rows: Iterable[Row], window: Window) -> list[Session]:
    """Trajectories of the rows (any order), ordered by their first request."""
    ordered = sorted(rows, key=Row.sort_key)
    latest: dict[str, dict[str, int]] = {}  # principal -> leaf -> index of latest request
    session_of: list[Session | None] = [None] * len(ordered)
    sessions: list[Session] = []
    for index, row in enumerate(ordered):
        leaves = latest.setdefault(row.principal_id, {})
        parent = -1
        for digest in row.chain[:-1]:
            candidate = leaves.get(digest, -1)
            if candidate > parent and row.ts_us - ordered[candidate].ts_us <= window.link_window_us:
                parent = candidate
        if row.chain:
            leaves[row.chain[-1]] = index
        if not window.holds(row.ts_us):
            continue
        parent_session = session_of[parent] if parent >= 0 else None
        if parent_session is not None:
            parent_session.requests.append(row)
            parent_session.links += 1
            session_of[index] = parent_session
        else:
            session = Session([row], prewindow=parent >= 0)
            sessions.append(session)
            session_of[index] = session
    return sessions
