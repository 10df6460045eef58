"""What one shard (or worker) measured, raw, so that shards merge exactly.

Merged percentiles must equal the percentiles of the union of every sample, so a shard
keeps its raw samples rather than a summary: every request's row, every TTFT, gap, TPOT
and latency, the event-loop lag samples and the time series, as compact arrays, plus the
counters, per-trajectory records and the run's identity. A worker hands this to its
parent through a pipe; a shard run writes it beside its results JSON as
``<results>.shard.npz`` (numpy's archive of raw arrays, read back with
``allow_pickle=False``; the structured part is one JSON document inside it).
"""

from __future__ import annotations

import os
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from batchbench import __version__
from batchbench.errors import BatchbenchError
from batchbench.results.recording import Recorder

FORMAT = 1
# RunConfig fields that differ between the shards of one run, or only say where files go.
PER_SHARD_FIELDS = frozenset(
    {
        "shard",
        "workers",
        "start_at",
        "results_csv",
        "results_json",
        "agent_events_jsonl",
        "request_events_jsonl",
        "server_metrics",
        "server_metrics_jsonl",
        "report_html",
        "progress",
        "api_key",
    }
)
SAMPLE_COLUMNS = (
    "start_s",
    "latency_ms",
    "ttft_ms",
    "itl_mean_ms",
    "tpot_ms",
    "ok",
    "good",
    "rank",
    "agent",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "gap_first",
    "gap_count",
)
SERIES_COLUMNS = ("t", "active_agents", "in_flight", "settled", "output_tokens")
STREAM_COLUMNS = ("ttft_ms", "itl_ms", "tpot_ms")


@dataclass
class ShardData:
    """One shard's raw measurements: ``meta`` is JSON, ``arrays`` are flat numeric arrays."""

    meta: dict[str, Any]
    arrays: dict[str, Any] = field(default_factory=dict)

    @property
    def shard(self) -> tuple[int, int]:
        index, count = self.meta["shard"]
        return int(index), int(count)

    def array(self, name: str) -> np.ndarray:
        value = self.arrays.get(name)
        if value is None:
            return np.zeros(0)
        return value if isinstance(value, np.ndarray) else np.frombuffer(value, value.typecode)


def _typed(column: Any) -> np.ndarray:
    """An ``array``/``bytearray`` column as a numpy array without copying."""
    if isinstance(column, bytearray | bytes):
        return np.frombuffer(column, dtype=np.uint8)
    return np.frombuffer(column, dtype=column.typecode) if len(column) else _empty(column)


def _empty(column: array) -> np.ndarray:
    return np.zeros(0, dtype=np.dtype(column.typecode))


def capture(
    meta: dict[str, Any],
    recorder: Any | None,
) -> ShardData:
    """``meta`` (identity, counters, records) plus the recorder's raw arrays."""
    arrays: dict[str, Any] = {}
    if recorder is not None:
        samples = recorder.samples
        for name in SAMPLE_COLUMNS:
            arrays[f"samples.{name}"] = _typed(getattr(samples, name))
        for name in SERIES_COLUMNS:
            arrays[f"series.{name}"] = _typed(getattr(recorder.series, name))
        for name in STREAM_COLUMNS:
            arrays[f"stream.{name}"] = _typed(getattr(recorder.stream, name))
        arrays["latencies_ms"] = _typed(recorder.latencies_ms)
        arrays["lag_ms"] = _typed(recorder.lag_ms)
        oracle = recorder.fidelity.oracle_seconds
        arrays["oracle_seconds"] = np.asarray(oracle, dtype=np.float64)
    meta = dict(meta, format=FORMAT, version=__version__)
    return ShardData(meta, arrays)


def data_path(results_json: str) -> str:
    """Where a shard's raw data goes: beside its results JSON."""
    path = Path(results_json)
    return str(path.with_name(path.stem + ".shard.npz"))


def save(data: ShardData, path: str) -> None:
    """Write atomically (a half-written file never carries the final name)."""
    partial = f"{path}.partial"
    try:
        with open(partial, "wb") as handle:
            # Any: mypy would match ndarray values against savez's keyword allow_pickle.
            arrays: dict[str, Any] = {
                name: np.ascontiguousarray(value) for name, value in data.arrays.items()
            }
            np.savez(handle, meta=np.frombuffer(orjson.dumps(data.meta), dtype=np.uint8), **arrays)
        os.replace(partial, path)
    except OSError as exc:
        raise BatchbenchError(f"failed to write {path}: {exc.strerror or exc}") from None


_ZIP_MAGIC = b"PK\x03\x04"


def load(path: str) -> ShardData:
    """Read a shard's raw data; one-line errors for a missing, foreign or damaged file."""
    try:
        with open(path, "rb") as handle:
            start = handle.read(len(_ZIP_MAGIC))
        if start != _ZIP_MAGIC:  # numpy would take it for a pickle
            raise BatchbenchError(f"{path}: damaged shard data (not a zip archive)")
        with np.load(path, allow_pickle=False) as archive:
            names = list(archive.files)
            if "meta" not in names:
                raise BatchbenchError(f"{path}: not a batchbench shard file (no meta)")
            meta = orjson.loads(archive["meta"].tobytes())
            arrays = {name: archive[name] for name in names if name != "meta"}
    except BatchbenchError:
        raise
    except FileNotFoundError:
        raise BatchbenchError(f"{path}: no such file (the shard's raw data)") from None
    except IsADirectoryError:
        raise BatchbenchError(f"{path}: is a directory, not a shard file") from None
    except PermissionError as exc:
        raise BatchbenchError(f"{path}: {exc.strerror or exc}") from None
    except Exception as exc:  # whatever a damaged file's bytes make numpy or zipfile raise
        raise BatchbenchError(f"{path}: damaged shard data ({_reason(exc)})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise BatchbenchError(
            f"{path}: shard format {meta.get('format') if isinstance(meta, dict) else '?'} "
            f"is not {FORMAT} (written by another batchbench version)"
        )
    problem = array_problem(arrays, live=bool(meta.get("live")))
    if problem is not None:
        raise BatchbenchError(f"{path}: damaged shard data ({problem})")
    return ShardData(meta, arrays)


def _reason(exc: Exception) -> str:
    """The library's one-line reason, or the exception's kind when it gives none."""
    text = " ".join(str(exc).split())
    return text if text else type(exc).__name__


def expected_arrays() -> dict[str, np.dtype]:
    """Every array a live shard writes, with its dtype: what ``capture`` makes of an empty
    recorder, so the check follows the recorder's columns."""
    return {name: value.dtype for name, value in capture({}, Recorder()).arrays.items()}


# Arrays that are columns of one table: every array of a group has one length.
_TABLES = ("samples.", "series.")


def array_problem(arrays: dict[str, np.ndarray], live: bool) -> str | None:
    """What is wrong with a shard's arrays (None: nothing): a missing array (a live
    shard has them all), another dtype or shape, columns of one table of different
    lengths, or request rows whose streamed gaps lie outside the gap samples."""
    expected = expected_arrays()
    for name, dtype in expected.items():
        value = arrays.get(name)
        if value is None:
            if live:
                return f"no array {name}"
            continue
        if value.dtype != dtype:
            return f"{name} is {value.dtype}, expected {dtype}"
        if value.ndim != 1:
            return f"{name} has {value.ndim} dimensions, expected 1"
    for prefix in _TABLES:
        columns = [
            (name, len(arrays[name]))
            for name in expected
            if name.startswith(prefix) and name in arrays
        ]
        for name, size in columns[1:]:
            if size != columns[0][1]:
                return (
                    f"{name} has {size} values but {columns[0][0]} has {columns[0][1]}: "
                    "columns of one table differ in length"
                )
    first, count = arrays.get("samples.gap_first"), arrays.get("samples.gap_count")
    gaps = arrays.get("stream.itl_ms")
    if first is not None and count is not None and gaps is not None and len(first):
        ends = first.astype(np.int64) + count.astype(np.int64)
        if bool((first < 0).any() or (count < 0).any() or (ends > len(gaps)).any()):
            return f"samples.gap_first/gap_count point outside the {len(gaps)} stream.itl_ms values"
    return None
