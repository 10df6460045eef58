"""The shared import pipeline (``batchbench.ingest.importer`` and its lineage, units,
blockbuild and timing modules), driven through a test-local format whose reader yields
hand-built records (tests/toyformat.py). Every expected plan is written out in full."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import orjson
import pytest
from toyformat import MC, MOONCAKE_OPTIONS, block, hashed, install, mooncake_records, record

from batchbench.errors import InputError
from batchbench.ingest.importer import (
    ImportOptions,
    ImportStats,
    build_plans,
    check_options,
    import_trace,
)
from batchbench.ingest.record import FormatOptions, Segment

# Pure Python that no compiled module serves: the pure-twin pass would repeat it as is.
pytestmark = pytest.mark.native_pass_only

Plan = dict[str, Any]


@pytest.fixture
def toy(monkeypatch):
    return install(monkeypatch)


def run_import(tmp_path: Path, *inputs: str, **options: Any) -> tuple[ImportStats, list[Plan]]:
    """Import with the toy format, and check the written file holds the returned plans."""
    output = tmp_path / "out.jsonl"
    stats, plans = import_trace(
        ImportOptions(format="toy", inputs=inputs, output=str(output), **options)
    )
    assert [orjson.loads(line) for line in output.read_bytes().splitlines()] == plans
    return stats, plans


def source(file: str, rows: list[int], **more: Any) -> dict[str, Any]:
    return {"source": {"format": "toy", "file": file, "rows": rows, **more}}


def h1() -> dict[str, Any]:
    """The globally shared first block of the Mooncake-style fixture (a system prompt)."""
    return block("h1", 100, "system")


# --- Mooncake-style sessions rebuilt from hash-prefix chains -----------------------------

MOONCAKE_PLANS: list[Plan] = [
    {
        "schema_version": 2,
        "trajectory_id": "mc.jsonl:1",
        "start_after_ms": 0,
        "requests": [
            # Ids 10 and 11 always come together: one block named by the first. The 50
            # tokens past the ids end the prompt in a block of its own.
            {
                "prompt_tokens": 350,
                "output_tokens": 50,
                "delay_after_ms": 10000,
                "recorded_start_after_ms": 0,
                "blocks": [h1(), block("h10", 200), block("n0", 50)],
            },
            {
                "prompt_tokens": 480,
                "output_tokens": 40,
                "delay_after_ms": 10000,
                "recorded_start_after_ms": 10000,
                "blocks": [
                    h1(),
                    block("h10", 200),
                    block("n0", 50),
                    block("r0", 50, "assistant", live=True),
                    block("n2", 80),
                ],
            },
            {
                "prompt_tokens": 700,
                "output_tokens": 30,
                "recorded_start_after_ms": 20000,
                "blocks": [
                    h1(),
                    block("h10", 200),
                    block("n0", 50),
                    block("r0", 50, "assistant", live=True),
                    block("n2", 80),
                    block("r2", 40, "assistant", live=True),
                    block("n4", 180),
                ],
            },
        ],
        "metadata": source("mc.jsonl", [1, 3, 5]),
    },
    {
        "schema_version": 2,
        "trajectory_id": "mc.jsonl:2",
        "start_after_ms": 5000,
        "requests": [
            {
                "prompt_tokens": 250,
                "output_tokens": 20,
                "delay_after_ms": 10000,
                "recorded_start_after_ms": 5000,
                "blocks": [h1(), block("h20", 100), block("n1", 50)],
            },
            {
                "prompt_tokens": 350,
                "output_tokens": 20,
                "recorded_start_after_ms": 15000,
                "blocks": [
                    h1(),
                    block("h20", 100),
                    block("n1", 50),
                    block("r1", 20, "assistant", live=True),
                    block("n3", 80),
                ],
            },
        ],
        "metadata": source("mc.jsonl", [2, 4]),
    },
    {
        # The regenerated reply: the hash units of B1's prompt keep their seeds; the rest
        # of B1's prompt (50), B1's reply (20) and the new content (70) are one block of
        # the branch's own: 340 - 200 = 140 tokens.
        "schema_version": 2,
        "trajectory_id": "mc.jsonl:6",
        "start_after_ms": 25000,
        "requests": [
            {
                "prompt_tokens": 340,
                "output_tokens": 10,
                "recorded_start_after_ms": 25000,
                "blocks": [h1(), block("h20", 100), block("n5", 140)],
            },
        ],
        "metadata": source("mc.jsonl", [6], branch_of_row=2),
    },
    {
        "schema_version": 2,
        "trajectory_id": "mc.jsonl:7",
        "start_after_ms": 28000,
        "requests": [
            {
                "prompt_tokens": 450,
                "output_tokens": 10,
                "recorded_start_after_ms": 28000,
                # A1's 50-token block, its 50-token reply and 50 new: 450 - 300.
                "blocks": [h1(), block("h10", 200), block("n6", 150)],
            },
        ],
        "metadata": source("mc.jsonl", [7], branch_of_row=1),
    },
    {
        "schema_version": 2,
        "trajectory_id": "mc.jsonl:8",
        "start_after_ms": 35000,
        "requests": [
            {
                "prompt_tokens": 150,
                "output_tokens": 10,
                "recorded_start_after_ms": 35000,
                "blocks": [h1(), block("n7", 50)],
            },
        ],
        "metadata": source("mc.jsonl", [8]),
    },
    {
        "schema_version": 2,
        "trajectory_id": "mc.jsonl:9",
        "start_after_ms": 40000,
        "requests": [
            {
                "prompt_tokens": 300,
                "output_tokens": 10,
                "recorded_start_after_ms": 40000,
                "blocks": [h1(), block("h30", 100), block("n8", 100)],
            },
        ],
        "metadata": source("mc.jsonl", [9]),
    },
    {
        "schema_version": 2,
        "trajectory_id": "mc.jsonl:10",
        "start_after_ms": 45000,
        "requests": [
            {
                "prompt_tokens": 350,
                "output_tokens": 10,
                "recorded_start_after_ms": 45000,
                "blocks": [h1(), block("h95", 100), block("n9", 150)],
            },
        ],
        "metadata": source("mc.jsonl", [10]),
    },
    {
        # G1 ends in its ids: the trailing unit (80-81) joins the new content, which must
        # hold 32 tokens.
        "schema_version": 2,
        "trajectory_id": "mc.jsonl:11",
        "start_after_ms": 50000,
        "requests": [
            {
                "prompt_tokens": 300,
                "output_tokens": 50,
                "recorded_start_after_ms": 50000,
                "blocks": [h1(), block("n10", 200)],
            },
        ],
        "metadata": source("mc.jsonl", [11]),
    },
    {
        # G2 adds 20 tokens to G1's prompt (< 32), too few for a message: not G1's child
        # but a root, from its own ids. Its 20-token id 82 is not enough for the tail, so
        # the unit 80-81 joins it too.
        "schema_version": 2,
        "trajectory_id": "mc.jsonl:12",
        "start_after_ms": 55000,
        "requests": [
            {
                "prompt_tokens": 320,
                "output_tokens": 20,
                "recorded_start_after_ms": 55000,
                "blocks": [h1(), block("n11", 220)],
            },
        ],
        "metadata": source("mc.jsonl", [12]),
    },
    {
        # H2 adds 20 tokens after H1's reply (< 32): reply and them are one plain block.
        "schema_version": 2,
        "trajectory_id": "mc.jsonl:13",
        "start_after_ms": 60000,
        "requests": [
            {
                "prompt_tokens": 200,
                "output_tokens": 40,
                "delay_after_ms": 5000,
                "recorded_start_after_ms": 60000,
                "blocks": [h1(), block("n12", 100)],
            },
            {
                "prompt_tokens": 260,
                "output_tokens": 10,
                "recorded_start_after_ms": 65000,
                "blocks": [h1(), block("n12", 100), block("r12.13", 60, "assistant")],
            },
        ],
        "metadata": source("mc.jsonl", [13, 14]),
    },
    {
        "schema_version": 2,
        "trajectory_id": "mc.jsonl:15",
        "start_after_ms": 70000,
        "requests": [
            {
                "prompt_tokens": 250,
                "output_tokens": 10,
                "recorded_start_after_ms": 70000,
                "blocks": [h1(), block("h70", 100), block("n14", 50)],
            },
        ],
        "metadata": source("mc.jsonl", [15]),
    },
    {
        "schema_version": 2,
        "trajectory_id": "mc.jsonl:16",
        "start_after_ms": 130000,
        "requests": [
            {
                "prompt_tokens": 300,
                "output_tokens": 10,
                "recorded_start_after_ms": 130000,
                # F1's 50-token block, its 10-token reply and 40 new: 300 - 200.
                "blocks": [h1(), block("h70", 100), block("n15", 100)],
            },
        ],
        "metadata": source("mc.jsonl", [16], split_of_row=15),
    },
    {
        "schema_version": 2,
        "trajectory_id": "mc.jsonl:17",
        "start_after_ms": 140000,
        "requests": [
            {
                "prompt_tokens": 350,
                "output_tokens": 10,
                "recorded_start_after_ms": 140000,
                "blocks": [h1(), block("h60", 200), block("n16", 50)],
            },
        ],
        "metadata": source("mc.jsonl", [17]),
    },
    {
        # 33 is followed by 34 here and by 36 in K2: it ends its unit (34-35 is the tail).
        "schema_version": 2,
        "trajectory_id": "mc.jsonl:18",
        "start_after_ms": 150000,
        "requests": [
            {
                "prompt_tokens": 400,
                "output_tokens": 10,
                "recorded_start_after_ms": 150000,
                "blocks": [h1(), block("h33", 100), block("n17", 200)],
            },
        ],
        "metadata": source("mc.jsonl", [18]),
    },
    {
        "schema_version": 2,
        "trajectory_id": "mc.jsonl:19",
        "start_after_ms": 160000,
        "requests": [
            {
                "prompt_tokens": 400,
                "output_tokens": 10,
                "recorded_start_after_ms": 160000,
                "blocks": [h1(), block("h33", 100), block("n18", 200)],
            },
        ],
        "metadata": source("mc.jsonl", [19]),
    },
    {
        # E1 is more than the link window earlier: no link, the prompt from its own ids.
        "schema_version": 2,
        "trajectory_id": "mc.jsonl:20",
        "start_after_ms": 3800000,
        "requests": [
            {
                "prompt_tokens": 400,
                "output_tokens": 10,
                "recorded_start_after_ms": 3800000,
                "blocks": [h1(), block("h60", 200), block("n19", 100)],
            },
        ],
        "metadata": source("mc.jsonl", [20]),
    },
]


def test_mooncake_sessions_are_rebuilt_from_hash_prefix_chains(tmp_path, toy) -> None:
    toy[MC] = mooncake_records()
    stats, plans = run_import(tmp_path, MC, **MOONCAKE_OPTIONS)
    assert plans == MOONCAKE_PLANS
    assert (stats.links, stats.branches, stats.splits, stats.resets) == (4, 2, 1, 0)
    assert stats.lineage == {
        "session links": 0,
        "parent-key links": 0,
        "hash-prefix links": 7,
        "parents not found": 0,
        "shared-prefix ids": 1,
    }
    counts = stats.blocks
    # Three requests grow their predecessor with its live reply, one folds it (H2); the two
    # branches and the split start from their parent's hash units and one block of their
    # own. A hash link holds its parent's prompt and a message: none is too short to grow.
    assert (counts.grown, counts.branch_grown, counts.folded, counts.not_grown) == (3, 3, 1, 0)
    assert (counts.resized_seeds, counts.dropped_ids) == (0, 0)
    # The 13 roots are written from their ids: 38 ids in 30 units, counting each merged
    # tail as one; 9 trailing units (2 in G2) joined 8 requests' new content.
    assert (counts.hash_references, counts.units, counts.tails_merged) == (38, 30, 9)
    assert (stats.trajectories, stats.written, stats.multi_request) == (16, 16, 3)


FLAT = "traces/flat.jsonl"


def flat_records(n: int) -> list:
    """``n`` requests that begin with id 1 (a whole 1000-token block) and then differ in a
    partial block, the request's own tail; each is 50 tokens longer than the one before,
    room for a message, so only the shared-prefix rule keeps them apart."""
    return [
        record(FLAT, k + 1, float(k), 1050 + 50 * k, 10, hash_ids=(1, 100 + k), block_size=1000)
        for k in range(n)
    ]


def test_an_id_sixteen_ids_follow_is_the_shared_prefix_by_default(tmp_path, toy) -> None:
    """Sixteen requests: id 1 has sixteen different followers, so it cannot link them."""
    toy[FLAT] = flat_records(16)
    stats, plans = run_import(tmp_path, FLAT)
    assert plans == [
        {
            "schema_version": 2,
            "trajectory_id": f"flat.jsonl:{k + 1}",
            "start_after_ms": 1000 * k,
            "requests": [
                {
                    "prompt_tokens": 1050 + 50 * k,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 1000 * k,
                    "blocks": [block("h1", 1000, "system"), block(f"n{k}", 50 + 50 * k)],
                }
            ],
            "metadata": source("flat.jsonl", [k + 1]),
        }
        for k in range(16)
    ]
    assert stats.lineage["shared-prefix ids"] == 1 and stats.links == 0


def test_without_the_shared_prefix_rule_requests_chain_into_one_fake_session(tmp_path, toy) -> None:
    """Fifteen followers are not enough at the default of 16: every request then links
    to the previous one through the common first block, and grows it. (Only the first
    request is written from its ids: ids 1 and 100 always come together there, one unit,
    which is its tail.)"""
    toy[FLAT] = flat_records(15)
    stats, plans = run_import(tmp_path, FLAT)
    prompt = [block("n0", 1050)]
    requests: list[dict[str, Any]] = []
    for k in range(15):
        if k:
            prompt = [*prompt, block(f"r{k - 1}", 10, "assistant", live=True), block(f"n{k}", 40)]
        requests.append(
            {
                "prompt_tokens": 1050 + 50 * k,
                "output_tokens": 10,
                "delay_after_ms": 1000,
                "recorded_start_after_ms": 1000 * k,
                "blocks": prompt,
            }
        )
    del requests[-1]["delay_after_ms"]
    assert plans == [
        {
            "schema_version": 2,
            "trajectory_id": "flat.jsonl:1",
            "start_after_ms": 0,
            "requests": requests,
            "metadata": source("flat.jsonl", list(range(1, 16))),
        }
    ]
    assert (stats.links, stats.resets, stats.lineage["hash-prefix links"]) == (14, 0, 14)
    assert (stats.blocks.grown, stats.lineage["shared-prefix ids"]) == (14, 0)


RETRY = "traces/retry.jsonl"


def test_a_retry_or_an_edit_is_a_root_that_shares_the_hash_seeds(tmp_path, toy) -> None:
    """Row 2 repeats row 1's ids and size (a retry), row 3 is shorter and ends in another
    id (an edit): row 1's full blocks prefix both, but neither holds row 1's prompt and
    a message. Each is a root written from its own ids, and the unit of ids 1 and 10
    (always together) is the same seed in all three."""
    toy[RETRY] = [
        hashed(RETRY, 1, 0.0, (1, 10, 11), 250, 20),
        hashed(RETRY, 2, 5.0, (1, 10, 11), 250, 20),
        hashed(RETRY, 3, 10.0, (1, 10, 12), 240, 20),
    ]
    stats, plans = run_import(tmp_path, RETRY)
    assert plans == [
        {
            "schema_version": 2,
            "trajectory_id": f"retry.jsonl:{k + 1}",
            "start_after_ms": 5000 * k,
            "requests": [
                {
                    "prompt_tokens": size,
                    "output_tokens": 20,
                    "recorded_start_after_ms": 5000 * k,
                    "blocks": [block("h1", 200), block(f"n{k}", size - 200)],
                }
            ],
            "metadata": source("retry.jsonl", [k + 1]),
        }
        for k, size in enumerate((250, 250, 240))
    ]
    assert (stats.roots, stats.links, stats.lineage["hash-prefix links"]) == (3, 0, 0)


def test_a_retry_of_a_second_turn_branches_from_the_first(tmp_path, toy) -> None:
    """Row 3 repeats row 2 (a retry): not row 2's child, but, like row 2, a child of row 1
    (the latest earlier request whose full blocks prefix it, with room for a message),
    so a branch of row 1, as a regenerated reply is."""
    toy[RETRY] = [
        hashed(RETRY, 1, 0.0, (1, 10), 150, 20),
        hashed(RETRY, 2, 5.0, (1, 10, 11), 250, 20),
        hashed(RETRY, 3, 10.0, (1, 10, 11), 250, 20),
    ]
    stats, plans = run_import(tmp_path, RETRY)
    first = [block("n0", 150)]  # ids 1 and 10: one unit (row 1 alone is from its ids)
    assert plans == [
        {
            "schema_version": 2,
            "trajectory_id": "retry.jsonl:1",
            "start_after_ms": 0,
            "requests": [
                {
                    "prompt_tokens": 150,
                    "output_tokens": 20,
                    "delay_after_ms": 5000,
                    "recorded_start_after_ms": 0,
                    "blocks": first,
                },
                {
                    "prompt_tokens": 250,
                    "output_tokens": 20,
                    "recorded_start_after_ms": 5000,
                    "blocks": [*first, block("r0", 20, "assistant", live=True), block("n1", 80)],
                },
            ],
            "metadata": source("retry.jsonl", [1, 2]),
        },
        {
            "schema_version": 2,
            "trajectory_id": "retry.jsonl:3",
            "start_after_ms": 10000,
            "requests": [
                {
                    "prompt_tokens": 250,
                    "output_tokens": 20,
                    "recorded_start_after_ms": 10000,
                    # Row 1 shares no hash unit: its 150 tokens, its 20-token reply and
                    # 80 new are one block of the branch's own.
                    "blocks": [block("n2", 250)],
                }
            ],
            "metadata": source("retry.jsonl", [3], branch_of_row=1),
        },
    ]
    assert (stats.links, stats.branches, stats.lineage["hash-prefix links"]) == (1, 1, 2)


@pytest.mark.parametrize(
    ("size", "links", "plans"),
    [
        # 31 tokens more than row 1: a root, sharing id 1 with row 1 through its seed.
        (
            181,
            0,
            [
                [{"blocks": [block("h1", 100), block("n0", 50)], "prompt_tokens": 150}],
                [{"blocks": [block("h1", 100), block("n1", 81)], "prompt_tokens": 181}],
            ],
        ),
        # 32 more: row 1's child. Its 32 new tokens hold the reply (10) and too little
        # after it: folded. Row 1 alone is written from its ids: 1 and 10 one unit.
        (
            182,
            1,
            [
                [
                    {"blocks": [block("n0", 150)], "prompt_tokens": 150},
                    {
                        "blocks": [block("n0", 150), block("r0.1", 32, "assistant")],
                        "prompt_tokens": 182,
                    },
                ]
            ],
        ),
    ],
)
def test_a_hash_child_adds_at_least_min_new_tokens(tmp_path, toy, size, links, plans) -> None:
    toy[RETRY] = [
        hashed(RETRY, 1, 0.0, (1, 10), 150, 10),
        hashed(RETRY, 2, 1.0, (1, 11), size, 10),
    ]
    stats, written = run_import(tmp_path, RETRY)
    assert [
        [{"blocks": r["blocks"], "prompt_tokens": r["prompt_tokens"]} for r in plan["requests"]]
        for plan in written
    ] == plans
    assert (stats.lineage["hash-prefix links"], stats.links) == (links, links)


def file_scope_traces(toy, scope: str) -> tuple[str, str]:
    first, second = "day1/x.jsonl", "day2/y.jsonl"
    # 50 tokens past the ids: the ids' units are written, not merged into the tail.
    toy[first] = [hashed(first, 1, 0.0, (5, 6), 250, 10, hash_scope=scope)]
    toy[second] = [hashed(second, 1, 1.0, (5, 6, 7), 350, 10, hash_scope=scope)]
    return first, second


def test_file_scoped_ids_mean_nothing_across_files(tmp_path, toy) -> None:
    stats, plans = run_import(tmp_path, *file_scope_traces(toy, "file"))
    assert plans == [
        {
            "schema_version": 2,
            "trajectory_id": "x.jsonl:1",
            "start_after_ms": 0,
            "requests": [
                {
                    "prompt_tokens": 250,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 0,
                    "blocks": [block("h0.5", 200), block("n0", 50)],
                }
            ],
            "metadata": source("x.jsonl", [1]),
        },
        {
            "schema_version": 2,
            "trajectory_id": "y.jsonl:1",
            "start_after_ms": 1000,
            "requests": [
                {
                    "prompt_tokens": 350,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 1000,
                    "blocks": [block("h1.5", 300), block("n1", 50)],
                }
            ],
            "metadata": source("y.jsonl", [1]),
        },
    ]
    assert stats.links == 0


def test_global_ids_link_across_files(tmp_path, toy) -> None:
    stats, plans = run_import(tmp_path, *file_scope_traces(toy, "global"))
    assert plans == [
        {
            "schema_version": 2,
            "trajectory_id": "x.jsonl:1",
            "start_after_ms": 0,
            "requests": [
                {
                    "prompt_tokens": 250,
                    "output_tokens": 10,
                    "delay_after_ms": 1000,
                    "recorded_start_after_ms": 0,
                    "blocks": [block("h5", 200), block("n0", 50)],
                },
                {
                    "prompt_tokens": 350,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 1000,
                    "blocks": [
                        block("h5", 200),
                        block("n0", 50),
                        block("r0", 10, "assistant", live=True),
                        block("n1", 90),
                    ],
                },
            ],
            "metadata": {
                "source": {"format": "toy", "files": ["x.jsonl", "y.jsonl"], "rows": [1, 1]}
            },
        }
    ]
    assert stats.lineage["hash-prefix links"] == 1


def test_ids_past_the_prompt_are_dropped_and_block_size_reaches_the_reader(tmp_path, toy) -> None:
    toy["t.jsonl"] = [hashed("t.jsonl", 1, 0.0, (1, 2, 3, 4), 150, 10)]
    stats, plans = run_import(tmp_path, "t.jsonl", block_size=64)
    # Ids 1 and 2 (the 50-token partial block) are one unit, and the prompt's last: it is
    # the request's own new content. 3 and 4 are past the prompt.
    assert plans[0]["requests"][0]["blocks"] == [block("n0", 150)]
    counts = stats.blocks
    assert (counts.dropped_ids, counts.hash_references, counts.units) == (2, 2, 1)
    assert counts.tails_merged == 1
    assert toy.options == [FormatOptions(block_size=64)]


@pytest.mark.parametrize(
    ("min_new_tokens", "first", "second", "counts"),
    [
        # No tail rule: every unit is written, and id 30, a 50-token partial block in the
        # first request and whole in the second, gets a seed for its second size.
        (
            0,
            [block("h30", 50)],
            [block("h30~100:user", 100), block("h31", 100)],
            (3, 0, 1),
        ),
        # The default: each request's last unit is its own new content.
        (32, [block("n0", 50)], [block("h30", 100), block("n1", 100)], (3, 2, 0)),
    ],
)
def test_the_tail_rule_follows_min_new_tokens(
    tmp_path, toy, min_new_tokens, first, second, counts
) -> None:
    toy["c.jsonl"] = [
        hashed("c.jsonl", 1, 0.0, (30,), 50, 10),
        hashed("c.jsonl", 2, 1.0, (30, 31), 200, 10),
    ]
    stats, plans = run_import(tmp_path, "c.jsonl", min_new_tokens=min_new_tokens)
    assert [plan["requests"][0]["blocks"] for plan in plans] == [first, second]
    blocks = stats.blocks
    assert (blocks.units, blocks.tails_merged, blocks.resized_seeds) == counts
    assert (blocks.hash_references, stats.links) == (3, 0)


# --- explicit sessions, parent keys, segments, roles -------------------------------------

SESS = "traces/sess.jsonl"


def test_explicit_sessions_grow_with_new_segment_roles_and_split(tmp_path, toy) -> None:
    toy[SESS] = [
        record(SESS, 1, 0.0, 100, 20, session="s1"),
        record(SESS, 2, 1.0, 300, 30, session="s2"),
        record(
            SESS,
            3,
            2.0,
            200,
            10,
            session="s1",
            new_segments=(Segment("tool", 50),),
            origin="tool-loop",
        ),
        # 35 new tokens: 30 of the tool result, 5 of the 20-token user turn (clipped).
        record(
            SESS,
            4,
            3.0,
            245,
            10,
            session="s1",
            new_segments=(Segment("tool", 30), Segment("user", 20)),
        ),
        record(SESS, 5, 4.0, 310, 5, session="s2"),  # 10 more tokens: too short to grow
        record(SESS, 6, 100.0, 400, 10, session="s1", origin="sub"),  # 97 s idle: a split
    ]
    stats, plans = run_import(tmp_path, SESS, split_idle_ms=50000.0)
    # New content ends in a block of its own of at least 32 tokens (the absorber of the
    # template's framing): request 3's 30-token user remainder joins its 50-token tool
    # result, request 4's 5-token user turn its 30-token tool result (mixed roles: user).
    s1_prompt = [
        block("n0", 100),
        block("r0", 20, "assistant", live=True),
        block("n2", 80),
        block("r2", 10, "assistant", live=True),
        block("n3", 35),
    ]
    assert plans == [
        {
            "schema_version": 2,
            "trajectory_id": "s1",
            "start_after_ms": 0,
            "requests": [
                {
                    "prompt_tokens": 100,
                    "output_tokens": 20,
                    "delay_after_ms": 2000,
                    "recorded_start_after_ms": 0,
                    "blocks": s1_prompt[:1],
                },
                {
                    "prompt_tokens": 200,
                    "output_tokens": 10,
                    "delay_after_ms": 1000,
                    "recorded_start_after_ms": 2000,
                    "blocks": s1_prompt[:3],
                },
                {
                    "prompt_tokens": 245,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 3000,
                    "blocks": s1_prompt,
                },
            ],
            "metadata": source("sess.jsonl", [1, 3, 4], origins=[None, "tool-loop", None]),
        },
        {
            "schema_version": 2,
            "trajectory_id": "s2",
            "start_after_ms": 1000,
            "requests": [
                {
                    "prompt_tokens": 300,
                    "output_tokens": 30,
                    "delay_after_ms": 3000,
                    "recorded_start_after_ms": 1000,
                    "blocks": [block("n1", 300)],
                },
                {
                    "prompt_tokens": 310,
                    "output_tokens": 5,
                    "reset_before": True,
                    "recorded_start_after_ms": 4000,
                    "blocks": [block("n4", 310)],
                },
            ],
            "metadata": source("sess.jsonl", [2, 5]),
        },
        {
            # The split keeps the context: s1's prompt (245), its last reply (10) and the
            # new content (145), none of it a hash unit, so all one block of the split's
            # own: 400 tokens.
            "schema_version": 2,
            "trajectory_id": "s1#1",
            "start_after_ms": 100000,
            "requests": [
                {
                    "prompt_tokens": 400,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 100000,
                    "blocks": [block("n5", 400)],
                }
            ],
            "metadata": source("sess.jsonl", [6], origins=["sub"], split_of_row=4),
        },
    ]
    assert stats.lineage["session links"] == 4
    assert (stats.links, stats.splits, stats.resets) == (3, 1, 1)


def test_hashed_sessions_grow_when_their_ids_extend_and_reset_when_not(tmp_path, toy) -> None:
    """WEKA's shape: an explicit session, file-scoped ids, tool definitions and a system
    prompt first. The third request drops the conversation (a compaction). Each prompt
    ends in enough tokens of its own for the framing of its messages and the tool
    section (32 + 8 per block before it + 128)."""
    roles = (("tool_definition", 100), ("system", 100))
    fields: dict[str, Any] = {"session": "w", "hash_scope": "file", "prefix_roles": roles}
    toy["w.json"] = [
        hashed("w.json", 1, 0.0, (1, 2, 3), 380, 20, **fields),
        hashed("w.json", 2, 1.0, (1, 2, 3, 4), 480, 20, **fields),
        hashed("w.json", 3, 2.0, (1, 2), 380, 10, **fields),
    ]
    stats, plans = run_import(tmp_path, "w.json")
    prefix = [block("h0.1", 100, "tool_definition"), block("h0.2", 100, "system")]
    assert plans == [
        {
            "schema_version": 2,
            "trajectory_id": "w",
            "start_after_ms": 0,
            "requests": [
                {
                    "prompt_tokens": 380,
                    "output_tokens": 20,
                    "delay_after_ms": 1000,
                    "recorded_start_after_ms": 0,
                    "blocks": [*prefix, block("n0", 180)],
                },
                {
                    "prompt_tokens": 480,
                    "output_tokens": 20,
                    "delay_after_ms": 1000,
                    "recorded_start_after_ms": 1000,
                    "blocks": [
                        *prefix,
                        block("n0", 180),
                        block("r0", 20, "assistant", live=True),
                        block("n1", 80),
                    ],
                },
                {
                    "prompt_tokens": 380,
                    "output_tokens": 10,
                    "reset_before": True,
                    "recorded_start_after_ms": 2000,
                    "blocks": [*prefix, block("n2", 180)],
                },
            ],
            "metadata": source("w.json", [1, 2, 3]),
        }
    ]
    assert stats.lineage["session links"] == 2 and stats.lineage["hash-prefix links"] == 0


def test_a_session_mixing_hashed_and_unhashed_requests_grows_by_size(tmp_path, toy) -> None:
    """Row 2 records no hash ids and row 3 does again: where one side has no ids, only the
    sizes tell, and each holds its predecessor's prompt, reply and a message, so each
    grows (none resets)."""
    toy["m.jsonl"] = [
        hashed("m.jsonl", 1, 0.0, (1, 10), 250, 20, session="m"),
        record("m.jsonl", 2, 1.0, 400, 30, session="m"),
        hashed("m.jsonl", 3, 2.0, (1, 10, 11, 12, 13), 500, 10, session="m"),
    ]
    stats, plans = run_import(tmp_path, "m.jsonl")
    first = [block("h1", 200), block("n0", 50)]  # ids 1 and 10 always together: one unit
    second = [*first, block("r0", 20, "assistant", live=True), block("n1", 130)]
    assert plans == [
        {
            "schema_version": 2,
            "trajectory_id": "m",
            "start_after_ms": 0,
            "requests": [
                {
                    "prompt_tokens": 250,
                    "output_tokens": 20,
                    "delay_after_ms": 1000,
                    "recorded_start_after_ms": 0,
                    "blocks": first,
                },
                {
                    "prompt_tokens": 400,
                    "output_tokens": 30,
                    "delay_after_ms": 1000,
                    "recorded_start_after_ms": 1000,
                    "blocks": second,
                },
                {
                    "prompt_tokens": 500,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 2000,
                    "blocks": [*second, block("r1", 30, "assistant", live=True), block("n2", 70)],
                },
            ],
            "metadata": source("m.jsonl", [1, 2, 3]),
        }
    ]
    assert (stats.lineage["session links"], stats.resets, stats.blocks.grown) == (2, 0, 2)


BL = "traces/bl.jsonl"


def test_parent_keys_link_branch_and_count_missing_parents(tmp_path, toy) -> None:
    toy[BL] = [
        record(BL, 1, 0.0, 100, 10, key="a"),
        record(BL, 2, 1.0, 200, 10, key="b", parent="a"),
        record(BL, 3, 2.0, 150, 10, key="c", parent="zz"),  # no such request
        record(BL, 4, 3.0, 180, 10, key="d", parent="a"),  # a's second child
        record(BL, 5, 4000.0, 300, 10, key="e", parent="b"),  # b is past the link window
    ]
    stats, plans = run_import(tmp_path, BL, link_window_hours=1.0)
    assert plans == [
        {
            "schema_version": 2,
            "trajectory_id": "bl.jsonl:1",
            "start_after_ms": 0,
            "requests": [
                {
                    "prompt_tokens": 100,
                    "output_tokens": 10,
                    "delay_after_ms": 1000,
                    "recorded_start_after_ms": 0,
                    "blocks": [block("n0", 100)],
                },
                {
                    "prompt_tokens": 200,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 1000,
                    "blocks": [
                        block("n0", 100),
                        block("r0", 10, "assistant", live=True),
                        block("n1", 90),
                    ],
                },
            ],
            "metadata": source("bl.jsonl", [1, 2]),
        },
        {
            "schema_version": 2,
            "trajectory_id": "bl.jsonl:3",
            "start_after_ms": 2000,
            "requests": [
                {
                    "prompt_tokens": 150,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 2000,
                    "blocks": [block("n2", 150)],
                }
            ],
            "metadata": source("bl.jsonl", [3]),
        },
        {
            "schema_version": 2,
            "trajectory_id": "bl.jsonl:4",
            "start_after_ms": 3000,
            "requests": [
                {
                    "prompt_tokens": 180,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 3000,
                    # a's 100 tokens, its 10-token reply and 70 new: one block.
                    "blocks": [block("n3", 180)],
                }
            ],
            "metadata": source("bl.jsonl", [4], branch_of_row=1),
        },
        {
            "schema_version": 2,
            "trajectory_id": "bl.jsonl:5",
            "start_after_ms": 4000000,
            "requests": [
                {
                    "prompt_tokens": 300,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 4000000,
                    "blocks": [block("n4", 300)],
                }
            ],
            "metadata": source("bl.jsonl", [5]),
        },
    ]
    assert stats.lineage == {
        "session links": 0,
        "parent-key links": 2,
        "hash-prefix links": 0,
        "parents not found": 2,
        "shared-prefix ids": 0,
    }
    assert (stats.links, stats.branches) == (1, 1)


def test_a_branch_keeps_the_shared_blocks_only_up_to_its_parents_first_own_block(
    tmp_path, toy
) -> None:
    """Row 3 branches from row 1, whose prompt is a keyed system prompt, 50 tokens of its
    own, a keyed tool result, 70 more of its own (a tail of four messages needs 32 + 3 x 8
    = 56). The branch keeps the system prompt; the keyed tool result comes after a block of
    row 1's own, so it joins the rest of row 1's prompt (180), its reply (10) and the new
    content (60) in one block: 350 - 100."""
    segments = (
        Segment("system", 100, "sys"),
        Segment("user", 50),
        Segment("tool", 60, "doc"),
        Segment("user", 70),
    )
    toy["kb.jsonl"] = [
        record("kb.jsonl", 1, 0.0, 280, 10, key="a", segments=segments),
        record("kb.jsonl", 2, 1.0, 330, 10, key="b", parent="a"),
        record("kb.jsonl", 3, 2.0, 350, 10, key="c", parent="a"),
    ]
    stats, plans = run_import(tmp_path, "kb.jsonl")
    assert plans[0]["requests"][0]["blocks"] == [
        block("s:sys", 100, "system"),
        block("n0.1", 50),
        block("s:doc", 60, "tool"),
        block("n0.3", 70),
    ]
    assert plans[1] == {
        "schema_version": 2,
        "trajectory_id": "kb.jsonl:3",
        "start_after_ms": 2000,
        "requests": [
            {
                "prompt_tokens": 350,
                "output_tokens": 10,
                "recorded_start_after_ms": 2000,
                "blocks": [block("s:sys", 100, "system"), block("n2", 250)],
            }
        ],
        "metadata": source("kb.jsonl", [3], branch_of_row=1),
    }
    assert (len(plans), stats.branches) == (2, 1)
    assert (stats.blocks.grown, stats.blocks.branch_grown, stats.blocks.folded) == (1, 1, 0)


SEG = "traces/seg.jsonl"


def test_whole_prompt_segments_never_reset_and_share_keyed_seeds(tmp_path, toy) -> None:
    toy[SEG] = [
        record(
            SEG, 1, 0.0, 160, 10, session="u",
            segments=(Segment("system", 100, "sys"), Segment("user", 60)),
        ),
        # Each prompt ends in 60 tokens of its own (the absorber of the template's
        # framing: 32, plus 8 for each of the two messages before it), so the keyed
        # question before it stays shared.
        record(
            SEG, 2, 1.0, 260, 10, session="u",
            segments=(
                Segment("system", 100, "sys"), Segment("assistant", 0), Segment("user", 100, "q"),
                Segment("user", 60),
            ),
        ),
        record(
            SEG, 3, 2.0, 240, 10, session="v",
            segments=(Segment("system", 80, "sys"), Segment("user", 100, "q"), Segment("user", 60)),
        ),
    ]  # fmt: skip
    stats, plans = run_import(tmp_path, SEG)
    assert plans == [
        {
            "schema_version": 2,
            "trajectory_id": "u",
            "start_after_ms": 0,
            "requests": [
                {
                    "prompt_tokens": 160,
                    "output_tokens": 10,
                    "delay_after_ms": 1000,
                    "recorded_start_after_ms": 0,
                    "blocks": [block("s:sys", 100, "system"), block("n0.1", 60)],
                },
                {
                    "prompt_tokens": 260,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 1000,
                    "blocks": [block("s:sys", 100, "system"), block("s:q", 100), block("n1.3", 60)],
                },
            ],
            "metadata": source("seg.jsonl", [1, 2]),
        },
        {
            "schema_version": 2,
            "trajectory_id": "v",
            "start_after_ms": 2000,
            "requests": [
                {
                    "prompt_tokens": 240,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 2000,
                    "blocks": [
                        block("s:sys~80:system", 80, "system"),
                        block("s:q", 100),
                        block("n2.2", 60),
                    ],
                }
            ],
            "metadata": source("seg.jsonl", [3]),
        },
    ]
    assert (stats.resets, stats.blocks.grown, stats.blocks.resized_seeds) == (0, 0, 1)
    assert stats.shared_prompt_tokens == 200  # s:q in both trajectories


def test_prefix_roles_label_blocks_and_units_stop_at_a_role_boundary(tmp_path, toy) -> None:
    """Ids 1-4 always come together; the tool definitions span 150 tokens, the system
    prompt the next 100: a block takes the role of its first token. The 200 tokens past
    the ids are the prompt's own tail, room enough for the framing of three messages and
    the tool section (32 + 3 x 8 + 128), so id 4's unit is written too."""
    roles = (("tool_definition", 150), ("system", 100))
    toy["w.json"] = [hashed("w.json", 1, 0.0, (1, 2, 3, 4), 600, 10, prefix_roles=roles)]
    _stats, plans = run_import(tmp_path, "w.json")
    assert plans == [
        {
            "schema_version": 2,
            "trajectory_id": "w.json:1",
            "start_after_ms": 0,
            "requests": [
                {
                    "prompt_tokens": 600,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 0,
                    "blocks": [
                        block("h1", 200, "tool_definition"),
                        block("h3", 100, "system"),
                        block("h4", 100),
                        block("n0", 200),
                    ],
                }
            ],
            "metadata": source("w.json", [1]),
        }
    ]


def test_the_link_window_and_the_idle_split_include_their_bound(tmp_path, toy) -> None:
    """A parent exactly the link window earlier is linked; an idle gap exactly
    --split-idle-ms long does not split."""
    toy["b.jsonl"] = [
        record("b.jsonl", 1, 0.0, 100, 10, key="a"),
        record("b.jsonl", 2, 3600.0, 200, 10, key="b", parent="a"),
        hashed("b.jsonl", 3, 4000.0, (1, 2), 200, 10),
        hashed("b.jsonl", 4, 7600.0, (1, 2, 3), 300, 10),
    ]
    stats, plans = run_import(tmp_path, "b.jsonl", link_window_hours=1.0, split_idle_ms=3600000.0)
    assert [plan["metadata"]["source"]["rows"] for plan in plans] == [[1, 2], [3, 4]]
    assert [delays(plan) for plan in plans] == [[3600000, None], [3600000, None]]
    assert (stats.links, stats.splits) == (2, 0)
    stats, plans = run_import(tmp_path, "b.jsonl", link_window_hours=0.999, split_idle_ms=1.0)
    assert [plan["metadata"]["source"]["rows"] for plan in plans] == [[1], [2], [3], [4]]
    assert stats.lineage["parents not found"] == 1 and stats.links == 0


def test_the_idle_split_measures_the_recorded_idle_gap(tmp_path, toy) -> None:
    """The split measures the gap the delay records: row 2 comes 60 s after row 1 but
    records 5 s of idle (row 1 ran long), so it links; row 3 comes 10 s after row 2 but
    records 40 s of idle, more than --split-idle-ms: a split."""
    toy["i.jsonl"] = [
        record("i.jsonl", 1, 0.0, 100, 10, session="s"),
        record("i.jsonl", 2, 60.0, 200, 10, session="s", idle_before_s=5.0),
        record("i.jsonl", 3, 70.0, 300, 10, session="s", idle_before_s=40.0),
    ]
    stats, plans = run_import(tmp_path, "i.jsonl", split_idle_ms=30000.0)
    assert plans == [
        {
            "schema_version": 2,
            "trajectory_id": "s",
            "start_after_ms": 0,
            "requests": [
                {
                    "prompt_tokens": 100,
                    "output_tokens": 10,
                    "delay_after_ms": 5000,
                    "recorded_start_after_ms": 0,
                    "blocks": [block("n0", 100)],
                },
                {
                    "prompt_tokens": 200,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 60000,
                    "blocks": [
                        block("n0", 100),
                        block("r0", 10, "assistant", live=True),
                        block("n1", 90),
                    ],
                },
            ],
            "metadata": source("i.jsonl", [1, 2]),
        },
        {
            "schema_version": 2,
            "trajectory_id": "s#1",
            "start_after_ms": 70000,
            "requests": [
                {
                    "prompt_tokens": 300,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 70000,
                    # Row 2's 200 tokens, its 10-token reply and 90 new: one block.
                    "blocks": [block("n2", 300)],
                }
            ],
            "metadata": source("i.jsonl", [3], split_of_row=2),
        },
    ]
    assert (stats.links, stats.splits, stats.branches) == (1, 1, 0)


# --- time ---------------------------------------------------------------------------------

TIME = "traces/time.jsonl"


def timed_records() -> list:
    """One session whose requests record their end in each way a trace can."""
    return [
        record(TIME, 1, 100.0, 100, 11, session="s", end_s=102.0, latency_s=5.0),  # end wins
        record(TIME, 2, 105.0, 300, 11, session="s", latency_s=1.5),
        record(TIME, 3, 110.0, 500, 11, session="s", idle_before_s=0.25),
        record(TIME, 4, 120.0, 700, 11, session="s"),
        record(TIME, 5, 130.0, 900, 11, session="s"),
    ]


def delays(plan: Plan) -> list[int | None]:
    return [request.get("delay_after_ms") for request in plan["requests"]]


def starts(plan: Plan) -> list[int]:
    return [request["recorded_start_after_ms"] for request in plan["requests"]]


def test_delays_run_end_to_start_from_what_the_trace_records(tmp_path, toy) -> None:
    toy[TIME] = timed_records()
    stats, plans = run_import(tmp_path, TIME)
    prompt = [
        block("n0", 100),
        block("r0", 11, "assistant", live=True),
        block("n1", 189),
        block("r1", 11, "assistant", live=True),
        block("n2", 189),
        block("r2", 11, "assistant", live=True),
        block("n3", 189),
        block("r3", 11, "assistant", live=True),
        block("n4", 189),
    ]
    # 105 - 102 (end_s); idle_before_s 0.25; 120 - 110 and 130 - 120 (no end: latency 0).
    assert plans == [
        {
            "schema_version": 2,
            "trajectory_id": "s",
            "start_after_ms": 0,
            "requests": [
                {
                    "prompt_tokens": 100,
                    "output_tokens": 11,
                    "delay_after_ms": 3000,
                    "recorded_start_after_ms": 0,
                    "blocks": prompt[:1],
                },
                {
                    "prompt_tokens": 300,
                    "output_tokens": 11,
                    "delay_after_ms": 250,
                    "recorded_start_after_ms": 5000,
                    "blocks": prompt[:3],
                },
                {
                    "prompt_tokens": 500,
                    "output_tokens": 11,
                    "delay_after_ms": 10000,
                    "recorded_start_after_ms": 10000,
                    "blocks": prompt[:5],
                },
                {
                    "prompt_tokens": 700,
                    "output_tokens": 11,
                    "delay_after_ms": 10000,
                    "recorded_start_after_ms": 20000,
                    "blocks": prompt[:7],
                },
                {
                    "prompt_tokens": 900,
                    "output_tokens": 11,
                    "recorded_start_after_ms": 30000,
                    "blocks": prompt,
                },
            ],
            "metadata": source("time.jsonl", [1, 2, 3, 4, 5]),
        }
    ]
    assert stats.capped_delays == 0


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("none", [3000, 250, 10000, 10000, None]),
        ("fixed:500", [3000, 250, 9500, 9500, None]),
        # 100 ms to the first token, then 10 per token after it: 200 ms for 11 tokens.
        ("linear:100,10", [3000, 250, 9800, 9800, None]),
    ],
)
def test_the_latency_model_applies_only_where_no_end_is_recorded(
    tmp_path, toy, model, expected
) -> None:
    toy[TIME] = timed_records()
    _stats, plans = run_import(tmp_path, TIME, latency_model=model)
    assert delays(plans[0]) == expected


def test_overlapping_requests_and_negative_idle_give_no_delay(tmp_path, toy) -> None:
    toy["o.jsonl"] = [
        record("o.jsonl", 1, 0.0, 100, 10, session="s", end_s=5.0),
        record("o.jsonl", 2, 2.0, 200, 10, session="s"),  # starts before the first ended
        record("o.jsonl", 3, 9.0, 300, 10, session="s", idle_before_s=-1.0),
    ]
    _stats, plans = run_import(tmp_path, "o.jsonl")
    assert delays(plans[0]) == [0, 0, None]


def test_max_delay_caps_and_counts(tmp_path, toy) -> None:
    toy[TIME] = timed_records()
    stats, plans = run_import(tmp_path, TIME, max_delay_ms=5000.0)
    assert delays(plans[0]) == [3000, 250, 5000, 5000, None]
    assert stats.capped_delays == 2


def test_time_scale_divides_offsets_and_delays_before_the_cap(tmp_path, toy) -> None:
    toy[TIME] = timed_records()
    stats, plans = run_import(tmp_path, TIME, start="90", time_scale=2.0, max_delay_ms=4000.0)
    assert plans[0]["start_after_ms"] == 5000
    assert starts(plans[0]) == [5000, 7500, 10000, 15000, 20000]
    assert delays(plans[0]) == [1500, 125, 4000, 4000, None]
    assert stats.capped_delays == 2


@pytest.mark.parametrize(
    ("window", "rows", "start_after_ms", "recorded"),
    [
        ({}, [1, 2, 3, 4, 5], 0, [0, 5000, 10000, 20000, 30000]),
        # Offsets are measured from --start, not from the earliest request.
        ({"start": "90"}, [1, 2, 3, 4, 5], 10000, [10000, 15000, 20000, 30000, 40000]),
        ({"start": "105"}, [2, 3, 4, 5], 0, [0, 5000, 15000, 25000]),
        ({"end": "120"}, [1, 2, 3], 0, [0, 5000, 10000]),  # --end is exclusive
        ({"first_seconds": 15.0}, [1, 2, 3], 0, [0, 5000, 10000]),
        ({"start": "101", "first_seconds": 10.0}, [2, 3], 4000, [4000, 9000]),
    ],
)
def test_the_window_keeps_rows_and_sets_the_origin(
    tmp_path, toy, window, rows, start_after_ms, recorded
) -> None:
    toy[TIME] = timed_records()
    stats, plans = run_import(tmp_path, TIME, **window)
    (plan,) = plans
    assert plan["metadata"]["source"]["rows"] == rows
    assert (plan["start_after_ms"], starts(plan)) == (start_after_ms, recorded)
    outside = 5 - len(rows)
    assert stats.dropped == ({"outside the window": outside} if outside else {})
    kept = [100, 300, 500, 700, 900]
    assert stats.kept_prompt_tokens == sum(kept[row - 1] for row in rows)
    assert (stats.kept_output_tokens, stats.input_prompt_tokens) == (11 * len(rows), 2500)


EPOCH = 1767225600.0  # 2026-01-01T00:00:00Z


@pytest.mark.parametrize(
    ("start", "end"),
    [
        ("2026-01-01T00:00:05Z", "2026-01-01T00:00:10Z"),
        ("2026-01-01T01:00:05+01:00", "2026-01-01 00:00:10"),  # an offset; no offset is UTC
        (str(EPOCH + 5), str(EPOCH + 10)),
    ],
)
def test_start_and_end_take_rfc3339_times_or_trace_seconds(tmp_path, toy, start, end) -> None:
    toy["wall.jsonl"] = [
        record("wall.jsonl", 1, EPOCH, 100, 10),
        record("wall.jsonl", 2, EPOCH + 5.5, 100, 10),
        record("wall.jsonl", 3, EPOCH + 10, 100, 10),
    ]
    stats, plans = run_import(tmp_path, "wall.jsonl", start=start, end=end)
    assert [(p["trajectory_id"], p["start_after_ms"]) for p in plans] == [("wall.jsonl:2", 500)]
    assert stats.dropped == {"outside the window": 2}


MIX = "traces/mix.jsonl"


def test_filters_and_drops_are_counted_by_reason_with_token_totals(tmp_path, toy) -> None:
    toy[MIX] = [
        record(MIX, 1, -1.0, 100, 10, model="m2"),  # before --start: the window comes first
        record(MIX, 2, 0.0, 100, 10, model="m1"),
        record(MIX, 3, 1.0, 100, 10, model="m2"),
        record(MIX, 4, 2.0, 100, 10),  # no model
        record(MIX, 5, 3.0, 0, 10, model="m1"),
        record(MIX, 6, 4.0, 100, 0, model="m1"),
        record(MIX, 7, 5.0, 0, 0, model="m1"),
        record(MIX, 8, 6.0, 200, 20, model="m1", stream=True),
    ]
    stats, plans = run_import(tmp_path, MIX, model="m1", start="0")
    assert plans == [
        {
            "schema_version": 2,
            "trajectory_id": "mix.jsonl:2",
            "start_after_ms": 0,
            "requests": [
                {
                    "prompt_tokens": 100,
                    "output_tokens": 10,
                    "recorded_start_after_ms": 0,
                    "blocks": [block("n0", 100)],
                }
            ],
            "metadata": source("mix.jsonl", [2]),
        },
        {
            "schema_version": 2,
            "trajectory_id": "mix.jsonl:8",
            "start_after_ms": 6000,
            "requests": [
                {
                    "prompt_tokens": 200,
                    "output_tokens": 20,
                    "stream": True,
                    "recorded_start_after_ms": 6000,
                    "blocks": [block("n1", 200)],
                }
            ],
            "metadata": source("mix.jsonl", [8]),
        },
    ]
    assert stats.rows == 8
    assert stats.dropped == {
        "outside the window": 1,
        "another model": 2,
        "no input tokens": 2,
        "no output tokens": 1,
    }
    assert (stats.input_prompt_tokens, stats.input_output_tokens) == (700, 70)
    assert (stats.kept_prompt_tokens, stats.kept_output_tokens) == (300, 30)
    assert (stats.prompt_tokens, stats.output_tokens, stats.requests) == (300, 30, 2)


# --- sampling, order, ids, provenance ------------------------------------------------------


def sample_key(seed: int, trajectory_id: str) -> int:
    """export-plans' rule, written out again: SHA-256 of "<seed>:<id>", first 16 hex."""
    return int(hashlib.sha256(f"{seed}:{trajectory_id}".encode()).hexdigest()[:16], 16)


def test_sampling_keeps_the_smallest_keys_deterministically(tmp_path, toy) -> None:
    toy["many.jsonl"] = [record("many.jsonl", r, float(r), 100, 10) for r in range(1, 21)]
    stats, plans = run_import(tmp_path, "many.jsonl", sample=0.25, seed=7)
    ids = [plan["trajectory_id"] for plan in plans]
    assert ids == ["many.jsonl:1", "many.jsonl:2", "many.jsonl:8", "many.jsonl:9", "many.jsonl:11"]
    every = [f"many.jsonl:{r}" for r in range(1, 21)]
    assert set(ids) == set(sorted(every, key=lambda i: sample_key(7, i))[:5])
    assert (stats.trajectories, stats.written, stats.requests) == (20, 5, 5)
    _stats, again = run_import(tmp_path, "many.jsonl", sample=0.25, seed=7)
    assert again == plans
    _stats, other = run_import(tmp_path, "many.jsonl", sample=0.25, seed=8)
    assert [plan["trajectory_id"] for plan in other] == [
        "many.jsonl:1", "many.jsonl:5", "many.jsonl:12", "many.jsonl:13", "many.jsonl:17",
    ]  # fmt: skip


def test_stratified_sampling_keeps_every_session_length(tmp_path, toy) -> None:
    rows = [record("st.jsonl", r, float(r), 100, 10) for r in range(1, 13)]
    for k in range(4):
        rows += [
            record("st.jsonl", 20 + 2 * k + n, 20.0 + k, 100, 10, session=f"p{k}") for n in (0, 1)
        ]
    rows += [record("st.jsonl", 30 + n, 30.0 + n, 100, 10, session="q") for n in range(4)]
    toy["st.jsonl"] = rows
    _stats, plans = run_import(tmp_path, "st.jsonl", sample=0.25, seed=3)
    # round(0.25 * 17) = 4 of all; stratified: 3 of 12 singles, 1 of 4 pairs, the 4-request one.
    assert sorted(p["trajectory_id"] for p in plans) == [
        "p3", "st.jsonl:12", "st.jsonl:2", "st.jsonl:3",
    ]  # fmt: skip
    _stats, plans = run_import(
        tmp_path, "st.jsonl", sample=0.25, seed=3, stratify_by_session_length=True
    )
    assert sorted(p["trajectory_id"] for p in plans) == [
        "p3", "q", "st.jsonl:12", "st.jsonl:2", "st.jsonl:3",
    ]  # fmt: skip


def test_output_is_sorted_by_start_then_id_and_repeated_ids_are_numbered(tmp_path, toy) -> None:
    first, second = "a/t.jsonl", "b/u.jsonl"
    toy[first] = [
        record(first, 9, 5.0, 100, 10),
        record(first, 10, 5.0, 100, 10),
        record(first, 1, 7.0, 100, 10, origin="main"),
    ]
    toy[second] = [record(second, 1, 3.0, 100, 10)]
    _stats, plans = run_import(tmp_path, first, second)
    # Ties in time go by id; ids of one name are numbered in trajectory order.
    assert [(p["trajectory_id"], p["start_after_ms"], p["metadata"]) for p in plans] == [
        ("u.jsonl:1", 0, source("u.jsonl", [1])),
        ("t.jsonl:10", 2000, source("t.jsonl", [10])),
        ("t.jsonl:9", 2000, source("t.jsonl", [9])),
        ("t.jsonl:1", 4000, source("t.jsonl", [1], origins=["main"])),
    ]


def test_two_inputs_of_one_name_are_refused(tmp_path, toy) -> None:
    toy["a/t.jsonl"] = [record("a/t.jsonl", 1, 0.0, 100, 10)]
    toy["b/t.jsonl"] = [record("b/t.jsonl", 1, 0.0, 100, 10)]
    with pytest.raises(InputError) as caught:
        run_import(tmp_path, "a/t.jsonl", "b/t.jsonl")
    assert str(caught.value) == (
        "two inputs are named t.jsonl (a/t.jsonl, b/t.jsonl): provenance names a file by its "
        "name; give each input once, under its own name"
    )


# --- errors ----------------------------------------------------------------------------------

BAD_OPTIONS = [
    ({"format": "nope"}, "unknown format 'nope'; expected one of mooncake, bailian, weka, "
     "tracelab, azure, burstgpt, ragpulse, claude-code, toy"),
    ({"inputs": ()}, "no input files"),
    ({"start": "yesterday"},
     "--start must be seconds on the trace's clock or an RFC 3339 time, got 'yesterday'"),
    ({"end": "soon"}, "--end must be seconds on the trace's clock or an RFC 3339 time, got 'soon'"),
    ({"start": "inf"}, "--start must be finite, got 'inf'"),
    ({"end": "nan"}, "--end must be finite, got 'nan'"),
    ({"start": "10", "end": "10"}, "--end must be after --start"),
    ({"end": "10", "first_seconds": 5.0}, "--first-seconds and --end cannot be used together"),
    ({"first_seconds": 0.0}, "--first-seconds must be a positive number of seconds"),
    ({"first_seconds": math.inf}, "--first-seconds must be a positive number of seconds"),
    *(
        ({"latency_model": text},
         f"--latency-model must be none, fixed:MS or linear:TTFT_MS,TPOT_MS, got {text!r}")
        for text in ("fast", "none:1", "fixed", "fixed:-1", "fixed:x", "linear:1", "linear:1,nan")
    ),
    *(({"time_scale": x}, "time scale must be a positive finite number") for x in (0.0, -1.0, math.inf, math.nan)),
    *(({"link_window_hours": x}, "--link-window-hours must be non-negative") for x in (-1.0, math.nan)),
    *(
        ({flag: x}, f"--{flag.replace('_', '-')} must be a non-negative number of milliseconds")
        for flag in ("max_delay_ms", "split_idle_ms")
        for x in (-1.0, math.inf, math.nan)
    ),
    ({"block_size": 0}, "--block-size must be a positive number of tokens"),
    ({"min_new_tokens": -1}, "--min-new-tokens must not be negative"),
    ({"min_prompt_tokens": -1}, "--min-prompt-tokens must not be negative"),
    ({"shared_prefix_followers": 1}, "--shared-prefix-followers must be at least 2"),
    *(({"sample": x}, "sample fraction must be between 0 and 1") for x in (-0.1, 1.5, math.nan)),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "message"), BAD_OPTIONS)
def test_every_bad_option_is_one_input_error(toy, changes, message) -> None:
    fields: dict[str, Any] = {"format": "toy", "inputs": ("t.jsonl",), "output": "o.jsonl"}
    with pytest.raises(InputError) as caught:
        check_options(ImportOptions(**{**fields, **changes}))
    assert str(caught.value) == message


def test_the_edges_of_the_options_are_accepted(toy) -> None:
    window, model = check_options(
        ImportOptions(
            format="toy", inputs=("t.jsonl",), output="o.jsonl", link_window_hours=0.0,
            max_delay_ms=0.0, split_idle_ms=0.0, min_new_tokens=0, shared_prefix_followers=2,
            sample=0.0, latency_model="linear:0,0", start="2026-01-01T00:00:00Z",
        )
    )  # fmt: skip
    assert (window.start_s, window.end_s, window.first_seconds) == (EPOCH, None, None)
    assert (model.ttft_ms, model.tpot_ms) == (0.0, 0.0)


def test_an_import_with_nothing_left_writes_nothing(tmp_path, toy) -> None:
    toy["z.jsonl"] = [record("z.jsonl", 1, 0.0, 0, 10), record("z.jsonl", 2, 1.0, 100, 0)]
    output = tmp_path / "out.jsonl"
    options = ImportOptions(format="toy", inputs=("z.jsonl",), output=str(output))
    with pytest.raises(InputError, match=r"^no trajectories to write from 2 rows$"):
        import_trace(options)
    assert not output.exists()
    toy["z.jsonl"] = [record("z.jsonl", 1, 0.0, 100, 10)]
    with pytest.raises(InputError, match=r"^no trajectories to write from 1 rows$"):
        import_trace(
            ImportOptions(format="toy", inputs=("z.jsonl",), output=str(output), sample=0.0)
        )
    assert list(tmp_path.iterdir()) == []


# --- seed variant names, numbered ids, shared tokens (defects the lead fixed) -------------


def test_a_key_met_with_three_roles_gets_three_seeds(tmp_path, toy) -> None:
    segments = (
        Segment("user", 50, "k"),
        Segment("tool", 50, "k"),
        Segment("tool_call", 50, "k"),
        Segment("user", 60),  # the prompt's own tail (32 + 3 x 8): the keyed blocks stay
    )
    toy["k.jsonl"] = [record("k.jsonl", 1, 0.0, 210, 10, segments=segments)]
    _stats, plans = run_import(tmp_path, "k.jsonl")
    blocks = plans[0]["requests"][0]["blocks"]
    assert [(b["seed"], b["role"]) for b in blocks] == [
        ("s:k", "user"),
        ("s:k~50:tool", "tool"),
        ("s:k~50:tool_call", "tool_call"),
        ("n0.3", "user"),
    ]


def test_trajectory_ids_stay_unique_when_a_session_key_looks_numbered(tmp_path, toy) -> None:
    toy["d.jsonl"] = [
        record("d.jsonl", 1, 0.0, 100, 10, session="x"),
        record("d.jsonl", 2, 100.0, 200, 10, session="x"),  # split: 100 s idle
        record("d.jsonl", 3, 200.0, 200, 10, session="x#1"),
    ]
    _stats, plans = run_import(tmp_path, "d.jsonl", split_idle_ms=1000.0)
    ids = [plan["trajectory_id"] for plan in plans]
    assert ids[0] == "x" and len(set(ids)) == 3
    # The split (100 s) takes "x#1" first; the session keyed "x#1" (200 s) the next name.
    assert ids == ["x", "x#1", "x#1#1"]


def test_shared_prompt_tokens_count_the_blocks_other_trajectories_also_send(tmp_path, toy) -> None:
    toy[MC] = mooncake_records()
    stats, _plans = run_import(tmp_path, MC, **MOONCAKE_OPTIONS)
    # h1 in all 20 requests, h10 in A's 3 and its branch, h20 in B's 2 and its branch, h70
    # in F1 and its split, h60 in E1 and E2, h33 in K1 and K2. Replies and new content
    # are one trajectory's each: live ones in theirs; a branch or split holds its
    # parent's other blocks and reply in one block of its own (n5, n6, n15).
    assert stats.shared_prompt_tokens == 2000 + 800 + 300 + 200 + 400 + 200


def test_the_progress_tick_hears_every_65536_rows(toy) -> None:
    toy["big.jsonl"] = [record("big.jsonl", r, 0.0, 0, 0) for r in range(1, 65538)]
    ticks: list[int] = []
    stats = ImportStats()
    options = ImportOptions(format="toy", inputs=("big.jsonl",), output="unused.jsonl")
    assert build_plans(options, stats, ticks.append) == []
    assert ticks == [65536]
    assert (stats.rows, stats.dropped) == (65537, {"no input tokens": 65537})
