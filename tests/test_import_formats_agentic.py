"""The agentic trace readers (weka, tracelab, ragpulse, claude-code): the exact Records of
hand-written fixtures, one exact error message per format, and invariants on the real
public samples when they are present (``BATCHBENCH_TRACES``, else ``../shared/traces``
beside the repository)."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from realtraces import traces_folder

from batchbench.errors import InputError
from batchbench.ingest.formats import claude_code, ragpulse, tracelab, weka
from batchbench.ingest.record import FormatOptions, Record, Segment

# Pure Python that no compiled module serves: the pure-twin pass would repeat it as is.
pytestmark = pytest.mark.native_pass_only

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"
OPTIONS = FormatOptions()


def test_modules_name_and_summarize_their_format() -> None:
    assert [m.NAME for m in (weka, tracelab, ragpulse, claude_code)] == [
        "weka",
        "tracelab",
        "ragpulse",
        "claude-code",
    ]
    for module in (weka, tracelab, ragpulse, claude_code):
        assert module.SUMMARY and "\n" not in module.SUMMARY


# --- weka -------------------------------------------------------------------------------


def test_weka_fixture_records() -> None:
    path = str(FIXTURES / "weka" / "trace_small.json")
    common: dict[str, Any] = {"source": path, "block_size": 64, "hash_scope": "file"}
    main = {**common, "session": "trace_small", "model": "claude-opus-4-5-20251101"}
    sub = {**common, "session": "trace_small/sub1", "model": "claude-haiku-4-5-20251001"}
    main_prefix = (("tool_definition", 100), ("system", 50))
    sub_prefix = (("tool_definition", 80), ("system", 20))
    # The sub-agent returned at 10.5 after 8 s: it started at 2.5, as request 0 ended.
    assert list(weka.read(path, OPTIONS)) == [
        Record(
            **main, row=1, time_s=0.0, input_tokens=200, output_tokens=30, latency_s=2.5,
            idle_before_s=0.0, hash_ids=(1, 2, 3), prefix_roles=main_prefix, stream=False,
            origin="requests[0]",
        ),
        Record(
            **sub, row=2, time_s=2.5, input_tokens=130, output_tokens=10, latency_s=1.0,
            idle_before_s=0.0, hash_ids=(4, 5), prefix_roles=sub_prefix, stream=False,
            origin="requests[1].requests[0]",
        ),
        Record(
            **sub, row=3, time_s=6.0, input_tokens=150, output_tokens=40, latency_s=4.0,
            idle_before_s=2.5, hash_ids=(4, 5), prefix_roles=sub_prefix, stream=True,
            origin="requests[1].requests[1]",
        ),
        Record(
            **main, row=4, time_s=21.0, input_tokens=300, output_tokens=20, latency_s=None,
            idle_before_s=18.5, hash_ids=(1, 2, 3, 6), prefix_roles=main_prefix, stream=True,
            origin="requests[2]",
        ),
        # A prompt shorter than tools + system keeps the tool span whole and clips the system.
        Record(
            **main, row=5, time_s=60.0, input_tokens=120, output_tokens=5, latency_s=1.25,
            idle_before_s=38.0, hash_ids=(7,), prefix_roles=(("tool_definition", 100), ("system", 20)),
            stream=False, origin="requests[3]",
        ),
    ]  # fmt: skip


def test_weka_block_size_option_overrides_the_file() -> None:
    path = str(FIXTURES / "weka" / "trace_small.json")
    records = list(weka.read(path, FormatOptions(block_size=32)))
    assert {r.block_size for r in records} == {32}


def test_weka_trajectory_key_drops_json_and_compression() -> None:
    assert weka.trajectory_key("traces/trace_0291.json.zst") == "trace_0291"
    assert weka.trajectory_key("trace_0007.json") == "trace_0007"


def test_weka_bad_field_names_the_request(tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / "weka" / "trace_small.json").read_text())
    doc["requests"][1]["requests"][1]["in"] = "150"
    path = tmp_path / "trace_bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as caught:
        list(weka.read(str(path), OPTIONS))
    assert str(caught.value) == (
        f'{path}: requests[1].requests[1]: field "in" must be a non-negative integer, got a string'
    )


def _weka_requests(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every request of a WEKA document, sub-agents' included, walked independently."""
    found = []
    for entry in entries:
        if entry["type"] == "subagent":
            found.extend(_weka_requests(entry["requests"]))
        else:
            found.append(entry)
    return found


def test_weka_real_samples_keep_every_request() -> None:
    folder = traces_folder("weka")
    files = sorted(folder.glob("trace_*.json"))
    subagents = 0
    think: list[float] = []
    for file in files:
        doc = json.loads(file.read_text())
        raw = _weka_requests(doc["requests"])
        records = list(weka.read(str(file), OPTIONS))
        assert len(records) == len(raw)
        assert [r.row for r in records] == list(range(1, len(raw) + 1))
        assert sum(r.input_tokens for r in records) == sum(q["in"] for q in raw)
        assert sum(r.output_tokens for r in records) == sum(q["out"] for q in raw)
        totals = doc["totals"]
        main = [r for r in records if r.session == file.stem]
        assert sum(r.input_tokens for r in main) == totals["parent_tokens"]["input"]
        assert sum(r.output_tokens for r in main) == totals["parent_tokens"]["output"]
        spawned = [e for e in doc["requests"] if e["type"] == "subagent"]
        subagents += len(spawned)
        assert len({r.session for r in records}) == 1 + len(spawned)
        for record, request in zip(records, raw, strict=True):
            assert len(record.hash_ids or ()) == request["in"] // 64
            assert sum(size for _, size in record.prefix_roles) <= record.input_tokens
        think.extend(q["think_time"] for q in raw if "think_time" in q)
    assert (len(files), subagents, sum(1 for _ in think)) == (56, 6, 2407)
    assert statistics.median(think) == 8.0


def test_weka_real_subagents_start_at_their_spawn() -> None:
    file = traces_folder("weka") / "trace_0291.json"
    records = list(weka.read(str(file), OPTIONS))
    by_session = Counter(r.session for r in records)
    assert by_session == {"trace_0291": 20, "trace_0291/sub1": 5, "trace_0291/sub2": 7}
    first = next(r for r in records if r.session == "trace_0291/sub1")
    assert (round(first.time_s, 6), first.origin, first.row) == (
        1101.357,  # returned at 1148.013 after 46.656 s; request 15 ended at 1100.64
        "requests[16].requests[0]",
        17,
    )
    assert first.prefix_roles == (("tool_definition", 7401), ("system", 1465))
    # Every sub-agent of the sample starts within a second of its parent request's end.
    gaps = []
    for file in sorted(traces_folder("weka").glob("trace_*.json")):
        parent_end, seen = 0.0, set()
        for record in weka.read(str(file), OPTIONS):
            if record.session == file.stem:
                parent_end = record.time_s + (record.latency_s or 0.0)
            elif record.session not in seen:
                seen.add(record.session)
                gaps.append(record.time_s - parent_end)
    assert len(gaps) == 6 and all(0.0 <= gap < 1.0 for gap in gaps)
    parent_ids = {i for r in records if r.session == "trace_0291" for i in r.hash_ids or ()}
    sub_ids = {i for r in records if r.session != "trace_0291" for i in r.hash_ids or ()}
    assert parent_ids.isdisjoint(sub_ids)


# --- tracelab ---------------------------------------------------------------------------

CLAUDE_SESSION = "claude:5f0c2a9e-1b7d-4c3e-9a61-2f8e7d4b3c10"
CODEX_SESSION = "codex:0b8e4d2f-7a13-4c59-b6e2-91d3f5a8c7e4"


def test_tracelab_fixture_records() -> None:
    path = str(FIXTURES / "tracelab" / "round_trace.jsonl")
    claude: dict[str, Any] = {"source": path, "session": CLAUDE_SESSION, "model": "claude-opus-4-8"}
    codex: dict[str, Any] = {"source": path, "session": CODEX_SESSION, "model": "gpt-5-codex"}
    assert list(tracelab.read(path, OPTIONS)) == [
        # Ends at the last tool call, not at the tool results.
        Record(**claude, row=1, time_s=1780308000.0, end_s=1780308005.25, input_tokens=1000,
               output_tokens=120),
        # Ends at its text; the usage report after it is not model output.
        Record(**codex, row=2, time_s=1774080000.0, end_s=1774080002.0, input_tokens=500,
               output_tokens=80),
        # Starts at its last tool result; 1300 - 1000 - 120 tokens split 300:100 by characters.
        Record(**claude, row=3, time_s=1780308010.0, end_s=1780308014.0, input_tokens=1300,
               output_tokens=50, new_segments=(Segment("tool", 135), Segment("tool", 45))),
        # The prompt shrank (the turn's reasoning was dropped): no growth to label.
        Record(**codex, row=4, time_s=1774080060.0, end_s=1774080063.0, input_tokens=560,
               output_tokens=60),
        Record(**claude, row=5, time_s=1780308060.0, end_s=1780308062.0, input_tokens=1400,
               output_tokens=30, new_segments=(Segment("user", 50),)),
        # No input event: starts at its first event; growth without a part to give it to.
        Record(**codex, row=6, time_s=1774080120.0, end_s=1774080121.5, input_tokens=700,
               output_tokens=40),
    ]  # fmt: skip


def test_tracelab_bad_timestamp_names_line_and_field(tmp_path: Path) -> None:
    lines = (FIXTURES / "tracelab" / "round_trace.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["timing_events"][2]["timestamp"] = "yesterday"
    path = tmp_path / "round_trace.jsonl"
    path.write_text("\n".join([lines[0], json.dumps(row)]) + "\n")
    with pytest.raises(InputError) as caught:
        list(tracelab.read(str(path), OPTIONS))
    assert str(caught.value) == (
        f"{path}:2: field \"timing_events[2].timestamp\" is not an RFC 3339 timestamp: 'yesterday'"
    )


def test_tracelab_real_sample() -> None:
    path = traces_folder("tracelab") / "round_trace.jsonl"
    raw = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    records = list(tracelab.read(str(path), OPTIONS))
    assert len(records) == len(raw) == 19
    assert Counter(r.session for r in records) == Counter(q["session_id"] for q in raw)
    assert len({r.session for r in records}) == 2
    assert sum(r.input_tokens for r in records) == sum(q["input_tokens_total"] for q in raw)
    assert sum(r.output_tokens for r in records) == sum(q["output_tokens"] for q in raw)
    previous_end: dict[str | None, float] = {}
    for record in records:
        assert record.end_s is not None and record.end_s >= record.time_s
        if record.session in previous_end:  # tool time lies between rounds, never inside
            assert record.time_s >= previous_end[record.session]
        previous_end[record.session] = record.end_s
        if record.new_segments:
            assert {s.role for s in record.new_segments} <= {"tool", "user"}


# --- ragpulse ---------------------------------------------------------------------------


def test_ragpulse_fixture_records() -> None:
    path = str(FIXTURES / "ragpulse" / "0_trace.jsonl")
    first = "1757476916095-abcdefgh1234"
    second = "1757476927914-ijklmnop5678"
    system = [Segment("system", 512, "sys_prompt:100")]
    assert list(ragpulse.read(path, OPTIONS)) == [
        Record(source=path, row=1, time_s=12.0, input_tokens=700, output_tokens=90,
               session=first, segments=(
                   *system, Segment("system", 40, "sys_prompt:101"),
                   Segment("user", 120, "passage:0"), Segment("user", 11, "history:200"),
                   Segment("user", 9, "user_input:300"), Segment("user", 8))),
        # The parts sum to input_length exactly: no remainder segment.
        Record(source=path, row=2, time_s=40.0, input_tokens=1379, output_tokens=120,
               session=second, segments=(
                   *system, Segment("system", 38, "sys_prompt:102"),
                   Segment("user", 95, "passage:1"), Segment("user", 120, "passage:0"),
                   Segment("user", 11, "history:200"), Segment("user", 512, "web_search:250"),
                   Segment("user", 77, "web_search:251"), Segment("user", 14, "user_input:301"))),
        Record(source=path, row=3, time_s=35.0, input_tokens=927, output_tokens=64,
               session=first, segments=(
                   *system, Segment("system", 40, "sys_prompt:101"),
                   Segment("user", 210, "passage:2"), Segment("user", 150, "history:201"),
                   Segment("user", 6, "user_input:302"), Segment("user", 9))),
    ]  # fmt: skip


def _ragpulse_copy(tmp_path: Path) -> Path:
    for table in (FIXTURES / "ragpulse").iterdir():
        (tmp_path / table.name).write_bytes(table.read_bytes())
    return tmp_path / "0_trace.jsonl"


def test_ragpulse_unknown_id_names_line_field_and_table(tmp_path: Path) -> None:
    trace = _ragpulse_copy(tmp_path)
    trace.write_text(trace.read_text().replace('"passages_ids": [2]', '"passages_ids": [9]'))
    with pytest.raises(InputError) as caught:
        list(ragpulse.read(str(trace), OPTIONS))
    assert str(caught.value) == (
        f'{trace}:3: field "hash_ids.passages_ids" names id 9, which 2_passages.jsonl does not list'
    )


def test_ragpulse_missing_side_table(tmp_path: Path) -> None:
    trace = _ragpulse_copy(tmp_path)
    (tmp_path / "3_history.jsonl").unlink()
    with pytest.raises(InputError) as caught:
        list(ragpulse.read(str(trace), OPTIONS))
    assert str(caught.value) == (
        f"{tmp_path / '3_history.jsonl'}: RAGPulse side table not found "
        "(it must lie beside the trace)"
    )


def test_ragpulse_side_tables_share_the_trace_extension() -> None:
    assert ragpulse.side_table_path("data/0_trace.jsonl.gz", "2_passages") == (
        "data/2_passages.jsonl.gz"
    )


def test_ragpulse_real_sample() -> None:
    folder = traces_folder("ragpulse")
    raw = [
        json.loads(line)
        for line in (folder / "0_trace.jsonl").read_text().splitlines()
        if line.strip()
    ]
    records = list(ragpulse.read(str(folder / "0_trace.jsonl"), OPTIONS))
    assert len(records) == len(raw) == 7106
    assert sum(r.input_tokens for r in records) == sum(q["input_length"] for q in raw)
    assert sum(r.output_tokens for r in records) == sum(q["output_length"] for q in raw)
    assert len({r.session for r in records}) == 3990
    remainders = []
    for record, row in zip(records, raw, strict=True):
        segments = record.segments or ()
        assert sum(s.tokens for s in segments) == record.input_tokens
        keyed = [s for s in segments if s.key is not None]
        assert len(keyed) == sum(len(ids) for ids in row["hash_ids"].values())
        remainders.append(record.input_tokens - sum(s.tokens for s in keyed))
    # The template's framing: never zero, 6 to 12 tokens, median 9.
    assert (min(remainders), max(remainders), statistics.median(remainders)) == (6, 12, 9)


# --- claude-code ------------------------------------------------------------------------

SESSION = "7c1e4b2a-93d5-4f08-b6a1-2e5d8c9f0a34"


def test_claude_code_fixture_records() -> None:
    path = str(FIXTURES / "claude-code" / "session.jsonl")
    opus: dict[str, Any] = {"source": path, "session": SESSION, "model": "claude-opus-4-1-20250805"}
    side: dict[str, Any] = {
        "source": path,
        "session": f"{SESSION}/sidechain/s-0001",
        "model": "claude-sonnet-4-5-20250929",
    }
    assert list(claude_code.read(path, OPTIONS)) == [
        # Two entries (thinking, tool_use) of one response: the last one's usage and time.
        Record(**opus, row=3, time_s=1762246800.0, end_s=1762246804.0, input_tokens=5003,
               output_tokens=150, origin="msg_01AbCd"),
        Record(**side, row=6, time_s=1762246805.0, end_s=1762246807.0, input_tokens=2004,
               output_tokens=40, origin="msg_01SiDe"),
        # 2062 - 2004 - 40 tokens of Grep output; the hook entry before it links the chain.
        Record(**side, row=9, time_s=1762246807.5, end_s=1762246809.0, input_tokens=2062,
               output_tokens=80, new_segments=(Segment("tool", 18),), origin="msg_01SiDf"),
        Record(**opus, row=11, time_s=1762246809.2, end_s=1762246812.0, input_tokens=5404,
               output_tokens=60, new_segments=(Segment("tool", 251),), origin="msg_02EfGh"),
        # 91 new tokens split 58:18 by characters (Edit result, then the user's text); the
        # copy of msg_02EfGh written after it and the synthetic error entry are skipped.
        Record(**opus, row=14, time_s=1762246820.0, end_s=1762246823.0, input_tokens=5555,
               output_tokens=25, new_segments=(Segment("tool", 69), Segment("user", 22)),
               origin="msg_03IjKl"),
    ]  # fmt: skip


def test_claude_code_agent_id_names_the_sidechain(tmp_path: Path) -> None:
    base = {"isSidechain": True, "sessionId": "s-2", "agentId": "a9f4657", "userType": "external"}
    entries = [
        {**base, "parentUuid": None, "type": "user", "uuid": "u1",
         "timestamp": "2025-11-04T09:00:00Z", "message": {"role": "user", "content": "look"}},
        {**base, "parentUuid": "u1", "type": "assistant", "uuid": "a1",
         "timestamp": "2025-11-04T09:00:02Z",
         "message": {"id": "msg_x", "role": "assistant", "model": "claude-haiku-4-5",
                     "content": [], "usage": {"input_tokens": 700, "output_tokens": 9}}},
    ]  # fmt: skip
    path = tmp_path / "agent-a9f4657.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    assert list(claude_code.read(str(path), OPTIONS)) == [
        Record(
            source=str(path),
            row=2,
            time_s=1762246800.0,
            end_s=1762246802.0,
            input_tokens=700,
            output_tokens=9,
            session="s-2/sidechain/a9f4657",
            model="claude-haiku-4-5",
            origin="msg_x",
        )
    ]


def test_claude_code_bad_usage_names_line_and_field(tmp_path: Path) -> None:
    lines = (FIXTURES / "claude-code" / "session.jsonl").read_text().splitlines()
    entry = json.loads(lines[3])
    entry["message"]["usage"]["output_tokens"] = "150"
    lines[3] = json.dumps(entry)
    path = tmp_path / "session.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as caught:
        list(claude_code.read(str(path), OPTIONS))
    assert str(caught.value) == (
        f'{path}:4: field "message.usage.output_tokens" must be a non-negative integer, '
        "got a string"
    )
