"""The rows file of ``batchbench record``: exact row bytes, ids that continue across
restarts, a line cut short by a crash cut off, and rows a full disk refuses counted."""

from __future__ import annotations

import os

import orjson
import pytest

from batchbench.ingest.rows import parse_row
from batchbench.record.sink import Row, RowSink, timestamp

# No compiled module serves this code, and the simulator's are covered elsewhere: the
# pure-twin pass would repeat it as is.
pytestmark = pytest.mark.native_pass_only


def row(correlation: str) -> Row:
    return Row(
        ts_us=1_796_464_800_123_456,
        principal_id="anonymous",
        correlation_id=correlation,
        model="m",
        chain=["00" * 16, "ff" * 16],
        block_roles=["system", "user"],
        block_tokens=[5, 3],
        prompt_tokens=17,
        completion_tokens=2,
        stream=True,
        max_tokens=None,
        duration_ms=12.5,
    )


LINE = (
    b'{"ts":"2026-12-05T10:00:00.123456Z","principal_id":"anonymous","correlation_id":'
    b'"000000000000","model":"m","chain":["00000000000000000000000000000000",'
    b'"ffffffffffffffffffffffffffffffff"],"block_roles":["system","user"],"block_tokens":'
    b'[5,3],"prompt_tokens":17,"completion_tokens":2,"stream":true,"max_tokens":null,'
    b'"duration_ms":12.5}\n'
)


def test_timestamps_are_rfc3339_utc_with_microseconds():
    assert timestamp(1_796_464_800_123_456) == "2026-12-05T10:00:00.123456Z"
    assert timestamp(1_796_464_800_000_001) == "2026-12-05T10:00:00.000001Z"


def test_a_row_is_one_line_export_plans_reads(tmp_path):
    path = tmp_path / "rows.jsonl"
    sink = RowSink(str(path))
    assert sink.correlation_id() == "000000000000"
    sink.write(row("000000000000"))
    sink.close()
    assert path.read_bytes() == LINE
    parsed = parse_row(LINE, 1, "rows.jsonl")
    assert (parsed.ts_us, parsed.chain, parsed.block_tokens) == (
        1_796_464_800_123_456,
        ("00" * 16, "ff" * 16),
        (5, 3),
    )
    assert sink.summary() == f"recorded 1 requests to {path}"


def test_ids_continue_after_a_restart_and_a_cut_line_is_cut_off(tmp_path):
    """Rows are written as requests finish, so ids need not be in order: the next one is
    past the largest. A line a crash cut short is taken out (export-plans reads every
    line as a row)."""
    path = tmp_path / "rows.jsonl"
    later = LINE.replace(b'"000000000000"', b'"000000000005"')
    path.write_bytes(later + LINE + b'{"ts":"2026-12-05T10:00:01')  # cut by a crash
    sink = RowSink(str(path))
    assert path.read_bytes() == later + LINE
    assert sink.correlation_id() == "000000000006"
    assert sink.correlation_id() == "000000000007"
    sink.write(row("000000000007"))
    sink.write(row("000000000006"))
    sink.close()
    lines = path.read_bytes().split(b"\n")
    assert lines[:2] == [later[:-1], LINE[:-1]]
    assert [orjson.loads(line)["correlation_id"] for line in lines[2:4]] == [
        "000000000007",
        "000000000006",
    ]
    assert lines[4:] == [b""]
    parsed = [parse_row(line, n, "rows.jsonl").correlation_id for n, line in enumerate(lines[:4])]
    assert parsed == ["000000000005", "000000000000", "000000000007", "000000000006"]


def test_a_row_that_cannot_be_encoded_is_counted_lost(tmp_path):
    path = tmp_path / "rows.jsonl"
    sink = RowSink(str(path))
    sink.write(row("\udcff"))  # a lone surrogate is no UTF-8
    sink.write(row("000000000001"))
    sink.close()
    assert (sink.written, sink.lost) == (1, 1)
    assert path.read_bytes().count(b"\n") == 1


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_rows_a_full_disk_refuses_are_counted(tmp_path):
    path = tmp_path / "rows.jsonl"
    sink = RowSink(str(path))
    sink.write(row("000000000000"))
    sink.close()
    sink.handle = open("/dev/full", "wb", buffering=0)  # noqa: SIM115 - a real ENOSPC
    sink.write(row("000000000001"))
    sink.write(row("000000000002"))
    sink.close()
    assert (sink.written, sink.lost) == (1, 2)
    assert sink.summary() == f"recorded 1 requests to {path} (2 rows lost: No space left on device)"
