"""Trajectory provenance: which file and row of a public trace each request came from.

``batchbench import`` records it in a trajectory's free-form ``metadata`` as
``metadata.source``: ``{"format": str, "file": str, "rows": [int, ...]}`` (``files``, a
list parallel to ``rows``, instead of ``file`` when the requests come from several files;
further keys such as ``origins`` or ``branch_of_row`` are not read). The manifest rules
keep ``metadata`` ignored, so any other value is simply not provenance, never an error:
a run carries what it recognises into its outputs (docs/outputs.md) and nothing else.

The loader keeps two per-request columns (``source_rows``, ``source_ids``) and one list
of distinct (format, file) pairs; ``summarize`` turns them into the results JSON's
``manifest.sources``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_I64_MAX = 2**63 - 1

# One trajectory's provenance: (format, one file or a file per request, a row per request).
Provenance = tuple[str, str | list[str], list[int]]


def provenance_of(metadata: Any, requests: int) -> Provenance | None:
    """``metadata.source`` when it has the shape above with one row per request (of
    ``requests``); None for anything else."""
    if type(metadata) is not dict:
        return None
    source = metadata.get("source")
    if type(source) is not dict:
        return None
    name, rows = source.get("format"), source.get("rows")
    if type(name) is not str or type(rows) is not list or len(rows) != requests:
        return None
    if not all(type(row) is int and 0 <= row <= _I64_MAX for row in rows):
        return None
    file, files = source.get("file"), source.get("files")
    if type(file) is str and files is None:
        return name, file, rows
    if (
        file is None
        and type(files) is list
        and len(files) == requests
        and all(type(each) is str for each in files)
    ):
        return name, files, rows
    return None


def summarize(
    sources: list[tuple[str, str]], source_ids: np.ndarray, request_offsets: np.ndarray
) -> list[dict[str, Any]]:
    """Per (format, file), in first-seen order: the trajectories with a request from it
    (a trajectory drawn from several files counts once in each) and its requests."""
    if not sources:
        return []
    ids = np.asarray(source_ids, dtype=np.int64)
    offsets = np.asarray(request_offsets, dtype=np.int64)
    trajectory = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
    kept = ids >= 0
    ids, trajectory = ids[kept], trajectory[kept]
    requests = np.bincount(ids, minlength=len(sources))
    pairs = np.unique(trajectory * len(sources) + ids)
    trajectories = np.bincount(pairs % len(sources), minlength=len(sources))
    return [
        {
            "format": name,
            "file": file,
            "trajectories": int(trajectories[index]),
            "requests": int(requests[index]),
        }
        for index, (name, file) in enumerate(sources)
    ]
