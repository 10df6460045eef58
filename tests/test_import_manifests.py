"""``batchbench import`` end to end: every format's hand-written fixture becomes an exact
manifest, derived by hand from the fixture and the rules of docs/import.md (sessions,
blocks, the tail rule, growth, branches, seeds, delays, provenance), plus the exact
summary of one hashed and one arrival-only import and the ``--describe-html`` page.

Seeds in brief (docs/import.md, "Blocks"): ``h<id>`` a hash unit (``h<file>.<id>`` when
the ids are file-scoped), ``s:<key>`` a keyed segment, ``n<uid>`` a request's own content
and ``n<uid>.<k>`` its k-th labelled part, ``r<uid>`` the reply of request ``uid``
(``live`` within a trajectory), ``r<uid>.<next>`` a reply folded with the next request's
new content; a branch's first request keeps its parent's leading hash units and keyed
segments, then holds the rest of the parent's prompt, its reply and the new content in
one ``n<uid>``; ``uid`` numbers the kept requests in arrival order from 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchbench.cli.import_trace import run

# Pure Python that no compiled module serves: the pure-twin pass would repeat it as is.
pytestmark = pytest.mark.native_pass_only

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"

Plan = dict[str, Any]


def imported(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fmt: str,
    *inputs: str,
    flags: tuple[str, ...] = (),
) -> tuple[list[Plan], str]:
    """The manifest ``batchbench import`` writes for fixture files, and what it printed."""
    out = tmp_path / "manifest.jsonl"
    paths = [str(FIXTURES / fmt / name) for name in inputs]
    assert run([fmt, *paths, "-o", str(out), *flags]) == 0
    printed = capsys.readouterr().out
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()], printed


def block(seed: str, tokens: int, role: str = "user", live: bool = False) -> dict[str, Any]:
    made: dict[str, Any] = {"seed": seed, "role": role, "tokens": tokens}
    if live:
        made["live"] = True
    return made


def request(
    prompt: int,
    output: int,
    recorded: int,
    blocks: list[dict[str, Any]],
    delay: int | None = None,
    reset: bool = False,
    stream: bool | None = None,
) -> dict[str, Any]:
    made: dict[str, Any] = {"prompt_tokens": prompt, "output_tokens": output}
    if delay is not None:
        made["delay_after_ms"] = delay
    if reset:
        made["reset_before"] = True
    if stream is not None:
        made["stream"] = stream
    made["recorded_start_after_ms"] = recorded
    made["blocks"] = blocks
    return made


def plan(
    ident: str, start: int, requests: list[dict[str, Any]], fmt: str, file: str, rows: list[int],
    **extra: Any,
) -> Plan:  # fmt: skip
    source: dict[str, Any] = {"format": fmt, "file": file, "rows": rows, **extra}
    return {
        "schema_version": 2,
        "trajectory_id": ident,
        "start_after_ms": start,
        "requests": requests,
        "metadata": {"source": source},
    }


# --- mooncake ---------------------------------------------------------------------------

MOONCAKE_SMALL = [
    # 1100 tokens in ids 0, 1, 2 (1 and 2 always together: one unit). The prompt must end
    # in its own block of at least 32 tokens: the last unit (588 tokens) becomes n0.
    plan("requests.jsonl:1", 0, [request(1100, 52, 0, [block("h0", 512), block("n0", 588)])],
         "mooncake", "requests.jsonl", [1]),
    # Row 2 (no output tokens) is dropped; row 4's only id is its whole prompt: all new.
    plan("requests.jsonl:4", 3000, [request(512, 8, 3000, [block("n1", 512)])],
         "mooncake", "requests.jsonl", [4]),
    plan("requests.jsonl:5", 4250, [request(40, 12, 4250, [block("n2", 40)])],
         "mooncake", "requests.jsonl", [5]),
]  # fmt: skip

SYSTEM = block("h0", 512, "system")  # id 0: followed by 1, 10, 20 and 40, the shared prefix
# Units come from the requests written from their ids: rows 4 and 5 grow row 1 (repeating
# its blocks), so ids 1 and 2 always come together, one unit, row 1's tail: n0.
A1 = [SYSTEM, block("n0", 788)]
A2 = [*A1, block("r0", 200, "assistant", live=True), block("n3", 300)]
B1 = [SYSTEM, block("h10", 512), block("n1", 76)]
MOONCAKE_GROWTH = [
    # Rows 1, 4, 5: 1300 -> 1800 (reply 200 + 300 new) -> 1970 (reply 150 + 20 new: folded).
    plan("session_growth.jsonl:1", 0, [
        request(1300, 200, 0, A1, delay=10000),
        request(1800, 150, 10000, A2, delay=5000),
        request(1970, 100, 15000, [*A2, block("r3.4", 170, "assistant")]),
    ], "mooncake", "session_growth.jsonl", [1, 4, 5]),
    plan("session_growth.jsonl:2", 2000, [
        request(1100, 300, 2000, B1, delay=6000),
        request(1800, 120, 8000, [*B1, block("r1", 300, "assistant", live=True), block("n2", 400)]),
    ], "mooncake", "session_growth.jsonl", [2, 3]),
    # Row 6 is row 2's second child: a branch that keeps the hash blocks; row 2's own 76
    # tokens, its 300-token reply and 250 new are one block of the branch's own: 1650 - 1024.
    plan("session_growth.jsonl:6", 20000, [
        request(1650, 80, 20000, [SYSTEM, block("h10", 512), block("n5", 626)]),
    ], "mooncake", "session_growth.jsonl", [6], branch_of_row=2),
    # Rows 7 and 8 share ids 20, 21 (always together: one unit of 1024) but row 7's full
    # blocks reach past them: two sessions, no link.
    plan("session_growth.jsonl:7", 30000, [
        request(2100, 50, 30000, [SYSTEM, block("h20", 1024), block("n6", 564)]),
    ], "mooncake", "session_growth.jsonl", [7]),
    plan("session_growth.jsonl:8", 31000, [
        request(1600, 40, 31000, [SYSTEM, block("h20", 1024), block("n7", 64)]),
    ], "mooncake", "session_growth.jsonl", [8]),
    plan("session_growth.jsonl:9", 40000, [
        request(800, 60, 40000, [SYSTEM, block("n8", 288)]),
    ], "mooncake", "session_growth.jsonl", [9]),
]  # fmt: skip


def test_mooncake_small_fixture(tmp_path, capsys) -> None:
    plans, _ = imported(tmp_path, capsys, "mooncake", "requests.jsonl")
    assert plans == MOONCAKE_SMALL


GROWTH_FLAGS = ("--shared-prefix-followers", "4")


BRANCHED = ("session_growth.jsonl:2", "session_growth.jsonl:6")  # row 2 and its branch


def test_mooncake_sessions_from_hash_chains(tmp_path, capsys) -> None:
    plans, _ = imported(tmp_path, capsys, "mooncake", "session_growth.jsonl", flags=GROWTH_FLAGS)
    assert [plan for plan in plans if plan["trajectory_id"] not in BRANCHED] == [
        plan for plan in MOONCAKE_GROWTH if plan["trajectory_id"] not in BRANCHED
    ]


def test_a_mooncake_branch_keeps_the_hash_blocks_it_shares(tmp_path, capsys) -> None:
    plans, _ = imported(tmp_path, capsys, "mooncake", "session_growth.jsonl", flags=GROWTH_FLAGS)
    assert plans == MOONCAKE_GROWTH


def test_the_summary_of_a_hashed_import(tmp_path, capsys) -> None:
    _, printed = imported(tmp_path, capsys, "mooncake", "session_growth.jsonl", flags=GROWTH_FLAGS)
    out = tmp_path / "manifest.jsonl"
    # Units over the 5 roots: 17 ids in 13 blocks (h0 in each; row 1 n0; row 2 h10, n1;
    # rows 7, 8 h20 and a tail; row 9 n8).
    # Shared: h0 (512) in all 9 requests, h10 (512) in rows 2, 3, 6, h20 (1024) in rows 7, 8.
    # Cache hits in arrival order: row 2 h0 512; row 3 its parent's prompt and reply 1,400;
    # row 4 1,500; row 5 row 4's prompt 1,800; row 6 h0 + h10 1,024; rows 7, 9 h0; row 8
    # h0 + h20 1,536: 8,796. Live: 200 twice and 300.
    assert printed.splitlines() == [
        f"wrote 6 trajectories (9 requests) to {out}",
        "  rows read       9; dropped: none",
        "  trajectories    6, 2 of more than one request",
        "  lineage         roots 5, links 3, branches 1, idle splits 0, resets 0 "
        "(hash-prefix links 4, shared-prefix ids 1)",
        "  blocks          2 requests grown from their predecessor with its live reply, 1 with "
        "reply and new content as one block; hash ids 17 collapsed into 13 blocks",
        "  tokens          prompt 14,120 (58.0% in blocks other trajectories share), output "
        "1,100; equal to the input's",
        "  delays          uncapped (latency model none)",
        "workload: 9 requests in 6 trajectories (2 with more than one request)",
        "arrivals: from 0.0 s to 40.0 s after the start",
        "tokens: 14,120 prompt, 1,100 output",
        "blocks: 14,120 tokens in 9 requests; 58.0% shared by 2+ trajectories, 5.0% live",
        "perfect prefix cache, in arrival order: 62.3% of prompt tokens hit (8,796 of 14,120)",
        "                       count    p50     p90     p99     max",
        "  prompt tokens            9  1,650   2,100   2,100   2,100",
        "  output tokens            9    100     300     300     300",
        "  requests/trajectory      6      1       3       3       3",
        "  delay_after_ms           3  6,000  10,000  10,000  10,000",
    ]


# --- bailian ----------------------------------------------------------------------------

BAILIAN_SMALL = [
    plan("qwen_chat_blksz_16.jsonl:1", 0, [
        # 40 tokens: every unit joins the tail (at least 32 tokens of its own).
        request(40, 13, 0, [block("n0", 40)], delay=14136),
        # Row 3 continues chat 159 but adds only 30 tokens, too few for the new message's
        # framing: written from its own content, with a reset; its tail keeps room for
        # the framing of the block before it (32 + 8), so it takes the whole prompt.
        request(70, 9, 14136, [block("n2", 70)], reset=True),
    ], "bailian", "qwen_chat_blksz_16.jsonl", [1, 3]),
    plan("qwen_chat_blksz_16.jsonl:2", 386, [request(16, 4, 386, [block("n1", 16)])],
         "bailian", "qwen_chat_blksz_16.jsonl", [2]),
    # A 5-token prompt is raised to 16 (--min-prompt-tokens): framing alone exceeds it.
    plan("qwen_chat_blksz_16.jsonl:5", 18886, [request(16, 2, 18886, [block("n3", 16)])],
         "bailian", "qwen_chat_blksz_16.jsonl", [5]),
]  # fmt: skip

X1 = [block("h0.1", 64), block("n0", 86)]  # ids 1-4 (a shared system prompt), then 86 new
X2 = [*X1, block("r0", 60, "assistant", live=True), block("n2", 90)]
BAILIAN_GROWTH = [
    plan("conversations.jsonl:1", 0, [
        request(150, 60, 0, X1, delay=20000),
        request(300, 40, 20000, X2, delay=15000),
        request(360, 30, 35000, [*X2, block("r2.3", 60, "assistant")]),  # 20 new: folded
    ], "bailian", "conversations.jsonl", [1, 3, 4]),
    # Its parent (chat 77) is not in the file: a root of its own content.
    plan("conversations.jsonl:2", 10000, [
        request(500, 100, 10000, [block("h0.1", 64), block("n1", 436)]),
    ], "bailian", "conversations.jsonl", [2]),
    # Chat 4 is chat 1's second child (a regenerated reply): the shared system prompt, then
    # chat 1's 86 own tokens, its 60-token reply and 50 new as one block: 260 - 64.
    plan("conversations.jsonl:5", 40000, [
        request(260, 25, 40000, [block("h0.1", 64), block("n4", 196)]),
    ], "bailian", "conversations.jsonl", [5], branch_of_row=1),
]  # fmt: skip


def test_bailian_small_fixture(tmp_path, capsys) -> None:
    plans, _ = imported(tmp_path, capsys, "bailian", "qwen_chat_blksz_16.jsonl")
    assert plans == BAILIAN_SMALL


def test_bailian_parent_keys_growth_branch_and_missing_parent(tmp_path, capsys) -> None:
    plans, _ = imported(tmp_path, capsys, "bailian", "conversations.jsonl")
    assert plans == BAILIAN_GROWTH


def conversations(file: int, uid: list[int], inputs: int = 1) -> list[Plan]:
    """BAILIAN_GROWTH as file ``file`` of an import of ``inputs`` files gives it: hash
    seeds qualified by the file, and ``uid[k]`` the place of the file's k-th request among
    all kept requests (a branch names its parent's file when several are read)."""
    branch_file = {"branch_of_file": "conversations.jsonl"} if inputs > 1 else {}
    x1 = [block(f"h{file}.1", 64), block(f"n{uid[0]}", 86)]
    x2 = [*x1, block(f"r{uid[0]}", 60, "assistant", live=True), block(f"n{uid[2]}", 90)]
    repeat = f"#{file}" if file else ""
    return [
        plan(f"conversations.jsonl:1{repeat}", 0, [
            request(150, 60, 0, x1, delay=20000),
            request(300, 40, 20000, x2, delay=15000),
            request(360, 30, 35000, [*x2, block(f"r{uid[2]}.{uid[3]}", 60, "assistant")]),
        ], "bailian", "conversations.jsonl", [1, 3, 4]),
        plan(f"conversations.jsonl:2{repeat}", 10000, [
            request(500, 100, 10000, [block(f"h{file}.1", 64), block(f"n{uid[1]}", 436)]),
        ], "bailian", "conversations.jsonl", [2]),
        plan(f"conversations.jsonl:5{repeat}", 40000, [
            request(260, 25, 40000, [block(f"h{file}.1", 64), block(f"n{uid[4]}", 196)]),
        ], "bailian", "conversations.jsonl", [5], branch_of_row=1, **branch_file),
    ]  # fmt: skip


def test_bailian_ids_and_chat_ids_mean_nothing_across_files(tmp_path, capsys) -> None:
    """Two files numbered alike (here the same file twice): equal hash ids are other
    content (``h0.1`` and ``h1.1``), chat ids name requests of their own file only, and
    equal trajectory ids are numbered. Requests interleave by arrival, the first file
    first at equal times."""
    assert conversations(0, [0, 1, 2, 3, 4]) == BAILIAN_GROWTH  # the helper, alone
    plans, _ = imported(tmp_path, capsys, "bailian", "conversations.jsonl", "conversations.jsonl")
    first, second = conversations(0, [0, 2, 4, 6, 8], 2), conversations(1, [1, 3, 5, 7, 9], 2)
    assert plans == [plan for pair in zip(first, second, strict=True) for plan in pair]


def test_bailian_first_turns_are_roots_whatever_their_ids(tmp_path, capsys) -> None:
    """A trace that names parents by key links by key alone: a first turn whose ids share
    a prefix with another conversation's is still a first turn."""
    plans, _ = imported(tmp_path, capsys, "bailian", "first_turns.jsonl")
    assert plans == [
        plan("first_turns.jsonl:1", 0, [request(110, 40, 0, [block("n0", 110)])],
             "bailian", "first_turns.jsonl", [1]),
        plan("first_turns.jsonl:2", 5000, [
            request(300, 30, 5000, [block("h0.1", 96), block("n1", 204)]),
        ], "bailian", "first_turns.jsonl", [2]),
    ]  # fmt: skip


# --- weka -------------------------------------------------------------------------------

# Prompts this small cannot keep their tool definitions apart: a prompt's own tail keeps
# room for the tool section (128 tokens) and the framing (trace_short_growth keeps them).
W0 = [block("n0", 200)]
WEKA = [
    plan("trace_small", 0, [
        request(200, 30, 0, W0, delay=18500, stream=False),
        request(300, 20, 21000, [
            *W0, block("r0", 30, "assistant", live=True), block("n3", 70),
        ], delay=38000, stream=True),
        # A compaction (120 < 300 tokens): its own content.
        request(120, 5, 60000, [block("n4", 120)], reset=True, stream=False),
    ], "weka", "trace_small.json", [1, 4, 5],
       origins=["requests[0]", "requests[2]", "requests[3]"]),
    # The sub-agent starts at 10.5 - 8 s; its second prompt adds 20 tokens: a reset.
    plan("trace_small/sub1", 2500, [
        request(130, 10, 2500, [block("n1", 130)], delay=2500, stream=False),
        request(150, 40, 6000, [block("n2", 150)], reset=True, stream=True),
    ], "weka", "trace_small.json", [2, 3],
       origins=["requests[1].requests[0]", "requests[1].requests[1]"]),
]  # fmt: skip


def test_weka_fixture(tmp_path, capsys) -> None:
    plans, _ = imported(tmp_path, capsys, "weka", "trace_small.json")
    assert plans == WEKA


def test_weka_growth_within_one_hash_block(tmp_path, capsys) -> None:
    """A session's request that adds 50 tokens within its last hash block (the same full
    ids) continues its predecessor: the session key says so."""
    plans, _ = imported(tmp_path, capsys, "weka", "trace_short_growth.json")
    # Ids 1-2 are the tool definitions, id 3 the system prompt; id 4 joins the prompt's own
    # tail, which keeps room for the framing of two blocks and the tool section (176).
    first = [block("h0.1", 128, "tool_definition"), block("h0.3", 64, "system"), block("n0", 228)]
    assert plans == [
        plan("trace_short_growth", 0, [
            request(420, 12, 0, first, delay=1000, stream=False),
            request(470, 20, 3000, [
                *first, block("r0", 12, "assistant", live=True), block("n1", 38),
            ], stream=False),
        ], "weka", "trace_short_growth.json", [1, 2], origins=["requests[0]", "requests[1]"]),
    ]  # fmt: skip


# --- tracelab ---------------------------------------------------------------------------

CODEX = "codex:0b8e4d2f-7a13-4c59-b6e2-91d3f5a8c7e4"
CLAUDE = "claude:5f0c2a9e-1b7d-4c3e-9a61-2f8e7d4b3c10"
CODEX_2 = [block("n0", 500), block("r0.1", 60, "assistant")]  # grew 60 < reply 80: folded
CLAUDE_2 = [
    block("n3", 1000), block("r3", 120, "assistant", live=True),
    block("n4.0", 135, "tool"), block("n4.1", 45, "tool"),
]  # fmt: skip
TRACELAB = [
    # Codex's rows come first (March); the origin is their first arrival.
    plan(CODEX, 0, [
        request(500, 80, 0, [block("n0", 500)], delay=58000),
        request(560, 60, 60000, CODEX_2, delay=57000),
        request(700, 40, 120000, [*CODEX_2, block("r1", 60, "assistant", live=True),
                                  block("n2", 80)]),
    ], "tracelab", "round_trace.jsonl", [2, 4, 6]),
    # Delays run from the last model output to the next round's last input event.
    plan(CLAUDE, 6228000000, [
        request(1000, 120, 6228000000, [block("n3", 1000)], delay=4750),
        request(1300, 50, 6228010000, CLAUDE_2, delay=46000),
        request(1400, 30, 6228060000, [*CLAUDE_2, block("r4", 50, "assistant", live=True),
                                       block("n5.0", 50)]),
    ], "tracelab", "round_trace.jsonl", [1, 3, 5]),
]  # fmt: skip


def test_tracelab_fixture(tmp_path, capsys) -> None:
    plans, _ = imported(tmp_path, capsys, "tracelab", "round_trace.jsonl")
    assert plans == TRACELAB


# --- azure ------------------------------------------------------------------------------

AZURE_2023 = [
    plan("conv_2023.csv:1", 0, [request(374, 44, 0, [block("n0", 374)])],
         "azure", "conv_2023.csv", [1]),
    # Row 2 has no output: dropped. 18:16:00.000001 - 18:15:46.68059 = 13.319411 s.
    plan("conv_2023.csv:3", 13319, [request(96, 310, 13319, [block("n1", 96)])],
         "azure", "conv_2023.csv", [3]),
]  # fmt: skip
AZURE_2024 = [
    plan("code_2024.csv:1", 0, [request(1452, 3, 0, [block("n0", 1452)])],
         "azure", "code_2024.csv", [1]),
    plan("code_2024.csv:2", 42, [request(584, 3, 42, [block("n1", 584)])],
         "azure", "code_2024.csv", [2]),
    # 02:01:00.5+02:00 is 60.5 s after midnight UTC.
    plan("code_2024.csv:3", 60500, [request(862, 38, 60500, [block("n2", 862)])],
         "azure", "code_2024.csv", [3]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "expected"), [("conv_2023.csv", AZURE_2023), ("code_2024.csv", AZURE_2024)]
)
def test_azure_fixtures(tmp_path, capsys, name: str, expected: list[Plan]) -> None:
    plans, _ = imported(tmp_path, capsys, "azure", name)
    assert plans == expected


def test_the_summary_of_an_arrival_only_import(tmp_path, capsys) -> None:
    _, printed = imported(tmp_path, capsys, "azure", "conv_2023.csv")
    out = tmp_path / "manifest.jsonl"
    assert printed.splitlines() == [
        f"wrote 2 trajectories (2 requests) to {out}",
        "  rows read       3; dropped: 1 no output tokens",
        "  trajectories    2, 0 of more than one request",
        "  lineage         roots 2, links 0, branches 0, idle splits 0, resets 0",
        "  blocks          0 requests grown from their predecessor with its live reply, 0 with "
        "reply and new content as one block",
        "  tokens          prompt 470 (0.0% in blocks other trajectories share), output 354; "
        "equal to the rows kept; the dropped rows held 2,048 prompt and 0 output tokens",
        "  delays          uncapped (latency model none)",
        "workload: 2 requests in 2 trajectories (0 with more than one request)",
        "arrivals: from 0.0 s to 13.3 s after the start",
        "tokens: 470 prompt, 354 output",
        "blocks: 470 tokens in 2 requests; 0.0% shared by 2+ trajectories, 0.0% live",
        "perfect prefix cache, in arrival order: 0.0% of prompt tokens hit (0 of 470)",
        "                       count  p50  p90  p99  max",
        "  prompt tokens            2   96  374  374  374",
        "  output tokens            2   44  310  310  310",
        "  requests/trajectory      2    1    1    1    1",
        "  delay_after_ms           0  n/a  n/a  n/a  n/a",
    ]


# --- burstgpt ---------------------------------------------------------------------------

BURSTGPT_1 = [
    plan("burstgpt_1.csv:1", 0, [request(472, 18, 0, [block("n0", 472)])],
         "burstgpt", "burstgpt_1.csv", [1]),
    plan("burstgpt_1.csv:3", 113500, [request(417, 276, 113500, [block("n1", 417)])],
         "burstgpt", "burstgpt_1.csv", [3]),
]  # fmt: skip
BURSTGPT_3 = [
    # Session 1001: 120 -> 190 tokens is the reply (35) and 35 new; the delay runs from
    # the recorded end (0 + 3.25 s elapsed) to the next arrival (9 s).
    plan("1001", 0, [
        request(120, 35, 0, [block("n0", 120)], delay=5750),
        request(190, 48, 9000, [block("n0", 120), block("r0", 35, "assistant", live=True),
                                block("n2", 35)]),
    ], "burstgpt", "burstgpt_3.csv", [1, 3]),
    plan("burstgpt_3.csv:2", 2500, [request(800, 60, 2500, [block("n1", 800)])],
         "burstgpt", "burstgpt_3.csv", [2]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "expected"), [("burstgpt_1.csv", BURSTGPT_1), ("burstgpt_3.csv", BURSTGPT_3)]
)
def test_burstgpt_fixtures(tmp_path, capsys, name: str, expected: list[Plan]) -> None:
    plans, _ = imported(tmp_path, capsys, "burstgpt", name)
    assert plans == expected


# --- ragpulse ---------------------------------------------------------------------------


def segment(key: str, tokens: int, role: str = "user") -> dict[str, Any]:
    return block(f"s:{key}", tokens, role)


RAG_SYSTEM = segment("sys_prompt:100", 512, "system")
RAGPULSE = [
    # Whole-prompt segments: the second turn restates its context, without a reset. Each
    # prompt ends in a block of its own of at least 32 tokens (the absorber of the
    # template's framing): its last segments join the keyless remainder until it is
    # (8 + 9 + 11 + 120 = 148; 9 + 6 + 150 = 165; no remainder: 14 + 77 = 91).
    plan("1757476916095-abcdefgh1234", 0, [
        request(700, 90, 0, [
            RAG_SYSTEM, segment("sys_prompt:101", 40, "system"), block("n0", 148),
        ], delay=23000),
        request(927, 64, 23000, [
            RAG_SYSTEM, segment("sys_prompt:101", 40, "system"), segment("passage:2", 210),
            block("n1", 165),
        ]),
    ], "ragpulse", "0_trace.jsonl", [1, 3]),
    plan("1757476927914-ijklmnop5678", 28000, [
        request(1379, 120, 28000, [
            RAG_SYSTEM, segment("sys_prompt:102", 38, "system"), segment("passage:1", 95),
            segment("passage:0", 120), segment("history:200", 11),
            segment("web_search:250", 512), block("n2", 91),
        ]),
    ], "ragpulse", "0_trace.jsonl", [2]),
]  # fmt: skip


def test_ragpulse_fixture(tmp_path, capsys) -> None:
    plans, _ = imported(tmp_path, capsys, "ragpulse", "0_trace.jsonl")
    assert plans == RAGPULSE


# --- claude-code ------------------------------------------------------------------------

SESSION = "7c1e4b2a-93d5-4f08-b6a1-2e5d8c9f0a34"
MAIN_2 = [block("n0", 5003), block("r0", 150, "assistant", live=True), block("n3.0", 251, "tool")]
CLAUDE_CODE = [
    plan(SESSION, 0, [
        request(5003, 150, 0, [block("n0", 5003)], delay=5200),
        request(5404, 60, 9200, MAIN_2, delay=8000),
        # The 22-token user turn joins the 69-token tool result before it: the prompt ends
        # in a block of its own of at least 32 tokens (mixed roles: user).
        request(5555, 25, 20000, [
            *MAIN_2, block("r3", 60, "assistant", live=True), block("n4", 91),
        ]),
    ], "claude-code", "session.jsonl", [3, 11, 14],
       origins=["msg_01AbCd", "msg_02EfGh", "msg_03IjKl"]),
    # The sub-agent's second prompt adds 18 tokens after a 40-token reply: folded.
    plan(f"{SESSION}/sidechain/s-0001", 5000, [
        request(2004, 40, 5000, [block("n1", 2004)], delay=500),
        request(2062, 80, 7500, [block("n1", 2004), block("r1.2", 58, "assistant")]),
    ], "claude-code", "session.jsonl", [6, 9], origins=["msg_01SiDe", "msg_01SiDf"]),
]  # fmt: skip


def test_claude_code_fixture(tmp_path, capsys) -> None:
    plans, _ = imported(tmp_path, capsys, "claude-code", "session.jsonl")
    assert plans == CLAUDE_CODE


# --- the page ---------------------------------------------------------------------------


def test_describe_html_writes_a_page(tmp_path, capsys) -> None:
    page = tmp_path / "workload.html"
    _, printed = imported(
        tmp_path, capsys, "weka", "trace_small.json", flags=("--describe-html", str(page))
    )
    assert printed.splitlines()[-1] == f"wrote the workload description to {page}"
    assert page.stat().st_size > 0
    assert "plotly" in page.read_text(encoding="utf-8")
