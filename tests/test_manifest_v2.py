"""Schema v2 manifests: start offsets, per-request options, blocks, and the line-by-line
validator (docs/manifest.md)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchbench.errors import ManifestError
from batchbench.plan import manifest as manifest_module
from batchbench.plan.manifest import (
    BLOCK_ROLES,
    Manifest,
    parse_manifest,
    validate_manifest,
)

# The manifest parser and validator are pure Python: no compiled module or twin serves them
# (the pure-twin pass would run the same code again; see the marker in conftest).
pytestmark = pytest.mark.native_pass_only

SOURCE = "p.jsonl"
CONTEXT = f"invalid trajectory plan at {SOURCE}"
ROLES_LISTED = "tool_definition, system, user, assistant, tool, tool_call"


def req(prompt: Any = 100, output: Any = 20, **extra: Any) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "output_tokens": output, **extra}


def blk(seed: Any = "s", tokens: Any = 10, role: Any = "user", **extra: Any) -> dict[str, Any]:
    return {"seed": seed, "tokens": tokens, "role": role, **extra}


def traj(*requests: Any, ident: Any = "t1", version: Any = 2, **extra: Any) -> dict[str, Any]:
    return {"schema_version": version, "trajectory_id": ident, "requests": list(requests), **extra}


def jsonl(*lines: dict[str, Any] | str) -> bytes:
    return b"".join(
        (json.dumps(line) if isinstance(line, dict) else line).encode() + b"\n" for line in lines
    )


def parse(*lines: dict[str, Any] | str) -> Manifest:
    data = jsonl(*lines)
    m = parse_manifest(data, SOURCE)
    # The line-by-line validator accepts the same file and builds the same columns.
    checked, errors = validate_manifest(data, SOURCE)
    assert errors == []
    assert checked is not None
    assert everything(checked) == everything(m)
    return m


def error(*lines: dict[str, Any] | str) -> str:
    """The first error of a file, which the fast path, the checked path and the
    line-by-line validator must all report identically."""
    data = jsonl(*lines)
    with pytest.raises(ManifestError) as caught:
        parse_manifest(data, SOURCE)
    with pytest.raises(ManifestError) as checked:
        manifest_module._parse(data, SOURCE, "", fast=False)
    assert str(checked.value) == str(caught.value)
    _, errors = validate_manifest(data, SOURCE)
    assert errors[0] == str(caught.value)
    return str(caught.value)


def everything(m: Manifest) -> dict[str, Any]:
    out: dict[str, Any] = {"ids": list(m.trajectory_ids), "schema_version": m.schema_version}
    for name in (
        "line_numbers",
        "request_offsets",
        "prompt_tokens",
        "output_tokens",
        "delay_after_ms",
        "reset_before",
        "start_after_ms",
        "overhead_tokens",
        "stream",
        "max_tokens",
        "recorded_start_after_ms",
        "block_offsets",
        "block_seed",
        "block_tokens",
        "block_role",
        "block_live",
        "schema_versions",
    ):
        out[name] = getattr(m, name).tolist()
    out["block_seeds"] = list(m.block_seeds)
    out["has_start_offsets"] = m.has_start_offsets
    out["seed_redefinitions"] = list(m.seed_redefinitions)
    return out


def role(name: str) -> int:
    return BLOCK_ROLES.index(name)


# --- every field as written -----------------------------------------------------------------

AGENT_A = traj(
    req(
        1100,
        40,
        delay_after_ms=200,
        recorded_start_after_ms=0,
        blocks=[
            blk("tools-v1", 600, "tool_definition"),
            blk("sys-v1", 420, "system"),
            blk("a-u1", 64, "user"),
        ],
    ),
    req(
        1300,
        60,
        stream=True,
        max_tokens=1024,
        overhead_tokens=12,
        recorded_start_after_ms=1500,
        blocks=[
            blk("tools-v1", 600, "tool_definition"),
            blk("sys-v1", 420, "system"),
            blk("a-u1", 64, "user"),
            blk("a-r1", 40, "assistant", live=True),
            blk("a-c1", 20, "tool_call"),
            blk("a-t1", 90, "tool", live=False),
            blk("a-u2", 30, "user"),
        ],
    ),
    ident="agent-a",
)
AGENT_B = traj(
    req(
        1050,
        10,
        stream=False,
        blocks=[
            blk("tools-v1", 600, "tool_definition"),
            blk("sys-v1", 420, "system"),
            blk("b-u1", 0, "user"),
        ],
    ),
    ident="agent-b",
    start_after_ms=750,
)


def test_every_v2_field_is_parsed_as_written():
    m = parse(AGENT_A, AGENT_B)
    assert everything(m) == {
        "ids": ["agent-a", "agent-b"],
        "schema_version": 2,
        "line_numbers": [1, 2],
        "request_offsets": [0, 2, 3],
        "prompt_tokens": [1100, 1300, 1050],
        "output_tokens": [40, 60, 10],
        "delay_after_ms": [200, 0, 0],
        "reset_before": [False, False, False],
        "start_after_ms": [0, 750],
        "overhead_tokens": [-1, 12, -1],
        "stream": [-1, 1, 0],
        "max_tokens": [0, 1024, 0],
        "recorded_start_after_ms": [0, 1500, -1],
        "block_offsets": [0, 3, 10, 13],
        "block_seed": [0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 0, 1, 7],
        "block_tokens": [600, 420, 64, 600, 420, 64, 40, 20, 90, 30, 600, 420, 0],
        "block_role": [0, 1, 2, 0, 1, 2, 3, 5, 4, 2, 0, 1, 2],
        "block_live": [False] * 6 + [True] + [False] * 6,
        "schema_versions": [2, 2],
        "block_seeds": ["tools-v1", "sys-v1", "a-u1", "a-r1", "a-c1", "a-t1", "a-u2", "b-u1"],
        "has_start_offsets": True,
        "seed_redefinitions": [],
    }


def test_block_roles_and_their_codes():
    assert BLOCK_ROLES == ("tool_definition", "system", "user", "assistant", "tool", "tool_call")
    m = parse(traj(req(blocks=[blk(f"s{i}", i, name) for i, name in enumerate(BLOCK_ROLES)])))
    assert m.block_role.tolist() == [0, 1, 2, 3, 4, 5]
    assert m.block_tokens.tolist() == [0, 1, 2, 3, 4, 5]


def test_column_dtypes_and_lengths():
    m = parse(AGENT_A, AGENT_B)
    assert m.start_after_ms.dtype == np.int64
    assert m.overhead_tokens.dtype == np.int64
    assert m.stream.dtype == np.int8
    assert m.max_tokens.dtype == np.int64
    assert m.recorded_start_after_ms.dtype == np.int64
    assert m.block_offsets.dtype == np.int64
    assert m.block_seed.dtype == np.int32
    assert m.block_tokens.dtype == np.uint32
    assert m.block_role.dtype == np.uint8
    assert m.block_live.dtype == np.bool_
    assert m.schema_versions.dtype == np.uint8
    assert (m.n_requests, m.n_blocks) == (3, 13)


def test_blocks_of_gives_the_rows_of_a_requests_blocks():
    m = parse(traj(req(1, 1), ident="plain", version=1), AGENT_A)
    assert [m.blocks_of(r) for r in range(3)] == [slice(0, 0), slice(0, 3), slice(3, 10)]
    assert m.blocks_of(-1) == slice(3, 10)
    assert m.block_tokens[m.blocks_of(1)].tolist() == [600, 420, 64]
    for bad in (3, -4):
        with pytest.raises(IndexError):
            m.blocks_of(bad)


def test_block_tokens_reach_the_uint32_maximum():
    m = parse(traj(req(blocks=[blk(tokens=2**32 - 1)])))
    assert m.block_tokens.tolist() == [2**32 - 1]


# --- v1 and v2 together, and v1-only defaults -----------------------------------------------


def test_v1_only_file_has_every_v2_column_with_absent_values():
    m = parse(traj(req(), req(130, 1), ident="a", version=1), traj(req(), ident="b", version=1))
    assert m.schema_version == 1
    assert m.schema_versions.tolist() == [1, 1]
    assert m.start_after_ms.tolist() == [0, 0]
    assert m.overhead_tokens.tolist() == [-1, -1, -1]
    assert m.stream.tolist() == [-1, -1, -1]
    assert m.max_tokens.tolist() == [0, 0, 0]
    assert m.recorded_start_after_ms.tolist() == [-1, -1, -1]
    assert m.block_offsets.tolist() == [0, 0, 0, 0]
    for column, dtype in (
        (m.block_seed, np.int32),
        (m.block_tokens, np.uint32),
        (m.block_role, np.uint8),
        (m.block_live, np.bool_),
    ):
        assert (column.tolist(), column.dtype) == ([], dtype)
    assert (m.block_seeds, m.has_start_offsets, m.seed_redefinitions) == ([], False, [])
    assert m.stream.dtype == np.int8 and m.block_offsets.dtype == np.int64


def test_a_manifest_built_without_v2_columns_gets_them_filled():
    m = Manifest(
        source="s",
        sha256="",
        schema_version=1,
        trajectory_ids=["a"],
        line_numbers=np.array([1], dtype=np.int32),
        request_offsets=np.array([0, 2], dtype=np.int64),
        prompt_tokens=np.array([5, 9], dtype=np.uint32),
        output_tokens=np.array([1, 1], dtype=np.uint32),
        delay_after_ms=np.zeros(2, dtype=np.int64),
        reset_before=np.zeros(2, dtype=np.bool_),
    )
    assert m.overhead_tokens.tolist() == [-1, -1]
    assert m.block_offsets.tolist() == [0, 0, 0]
    assert m.schema_versions.tolist() == [1]
    assert m.blocks_of(1) == slice(0, 0)


def test_mixed_file_pads_v1_rows_and_reports_the_highest_version():
    m = parse(
        traj(req(10, 1), req(20, 1), ident="v1-first", version=1),
        "",
        traj(req(5, 1, overhead_tokens=3, blocks=[blk("x", 2, "user")]), ident="v2"),
        traj(req(7, 1), ident="v1-last", version=1),
        traj(req(8, 2, max_tokens=9), ident="v2-plain", start_after_ms=0),
    )
    assert m.schema_version == 2
    assert m.schema_versions.tolist() == [1, 2, 1, 2]
    assert m.line_numbers.tolist() == [1, 3, 4, 5]
    assert m.overhead_tokens.tolist() == [-1, -1, 3, -1, -1]
    assert m.max_tokens.tolist() == [0, 0, 0, 0, 9]
    assert m.stream.tolist() == [-1] * 5
    assert m.recorded_start_after_ms.tolist() == [-1] * 5
    assert m.block_offsets.tolist() == [0, 0, 0, 1, 1, 1]
    assert m.start_after_ms.tolist() == [0, 0, 0, 0]
    assert m.has_start_offsets  # set to 0, which is still set


def test_v2_lines_need_no_v2_fields():
    m = parse(traj(req(100, 20), req(150, 5)))
    assert (m.schema_version, m.prompt_tokens.tolist()) == (2, [100, 150])
    assert m.block_offsets.tolist() == [0, 0, 0]


# --- nulls ----------------------------------------------------------------------------------


def test_null_optional_fields_count_as_absent_in_v2():
    m = parse(
        traj(
            req(
                100,
                20,
                reset_before=None,
                delay_after_ms=None,
                overhead_tokens=None,
                stream=None,
                max_tokens=None,
                recorded_start_after_ms=None,
                blocks=[blk("a", 3, "assistant", live=None)],
            ),
            req(120, 1, blocks=[blk("a", 3, "assistant")]),
            start_after_ms=None,
            metadata=None,
        ),
        traj(req(100, 20, blocks=None), req(90, 1, blocks=None, reset_before=True), ident="t2"),
    )
    assert m.overhead_tokens.tolist() == [-1, -1, -1, -1]
    assert m.stream.tolist() == [-1, -1, -1, -1]
    assert m.max_tokens.tolist() == [0, 0, 0, 0]
    assert m.recorded_start_after_ms.tolist() == [-1, -1, -1, -1]
    assert m.block_live.tolist() == [False, False]
    assert m.block_offsets.tolist() == [0, 1, 2, 2, 2]
    assert m.reset_before.tolist() == [False, False, False, True]
    assert (m.start_after_ms.tolist(), m.has_start_offsets) == ([0, 0], False)


def test_null_blocks_count_as_omitted_for_the_all_or_none_rule():
    assert error(traj(req(blocks=[blk()]), req(130, 1, blocks=None))) == (
        f"{CONTEXT}:1: request 2 must define blocks because the trajectory's first request does"
    )


# --- reset_before ---------------------------------------------------------------------------


def test_reset_before_on_the_first_v2_request_is_accepted_and_stored_false():
    m = parse(
        traj(req(500, 20, reset_before=True), req(100, 5, reset_before=True)),
        traj(req(50, 5, reset_before=True, blocks=[blk()]), ident="b"),
    )
    assert m.reset_before.tolist() == [False, True, False]


def test_reset_before_on_the_first_v1_request_is_still_rejected():
    assert error(traj(req(reset_before=True), version=1)) == (
        f"{CONTEXT}:1: the first request cannot set reset_before"
    )


# --- rejections, verbatim -------------------------------------------------------------------

BLOCKS = "request 1 blocks are invalid"
INT = "must be a non-negative integer, found"


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        (traj(req(), req(200, 1, max_tokens=0)), "request 2 max_tokens must be greater than zero"),
        (traj(req(blocks=[])), f"{BLOCKS}: blocks must contain at least one block"),
        (traj(req(blocks=[blk("a"), blk("")])), f"{BLOCKS}: block 2 seed must not be empty"),
        (
            traj(req(blocks=[blk(role="user", live=True)])),
            f"{BLOCKS}: block 1 is live but has role user; only assistant blocks can be live",
        ),
        (
            traj(req(blocks=[blk(role="tool_call", live=True)])),
            f"{BLOCKS}: block 1 is live but has role tool_call; only assistant blocks can be live",
        ),
        (
            traj(req(blocks=[blk(), blk(role="robot")])),
            f'{BLOCKS}: block 2 role: unknown variant "robot", expected one of {ROLES_LISTED}',
        ),
        (
            traj(req(blocks=[blk(role="Assistant")])),
            f'{BLOCKS}: block 1 role: unknown variant "Assistant", expected one of {ROLES_LISTED}',
        ),
        (
            traj(req(blocks=[blk(text="hi")])),
            f'{BLOCKS}: block 1 has unknown field "text"; expected one of seed, tokens, role, live',
        ),
        (traj(req(blocks=[blk(tokens=True)])), f"{BLOCKS}: block 1 field tokens {INT} true"),
        (traj(req(blocks=[blk(tokens=1.0)])), f"{BLOCKS}: block 1 field tokens {INT} float 1.0"),
        (
            traj(req(blocks=[blk(tokens=-1)])),
            f"{BLOCKS}: block 1 field tokens {INT} negative integer -1",
        ),
        (traj(req(blocks=[blk(tokens="9")])), f"{BLOCKS}: block 1 field tokens {INT} a string"),
        (traj(req(blocks=[blk(tokens=None)])), f"{BLOCKS}: block 1 field tokens {INT} null"),
        (
            traj(req(blocks=[blk(tokens=2**32)])),
            f"{BLOCKS}: block 1 field tokens must be at most 4294967295, found 4294967296",
        ),
        (
            traj(req(blocks=[blk(seed=5)])),
            f"{BLOCKS}: block 1 field seed must be a string, found integer 5",
        ),
        (
            traj(req(blocks=[blk(seed=None)])),
            f"{BLOCKS}: block 1 field seed must be a string, found null",
        ),
        (
            traj(req(blocks=[blk(role=3)])),
            f"{BLOCKS}: block 1 field role must be a string, found integer 3",
        ),
        (
            traj(req(blocks=[blk(role=["user"])])),
            f"{BLOCKS}: block 1 field role must be a string, found an array",
        ),
        (
            traj(req(blocks=[blk(role="assistant", live="yes")])),
            f"{BLOCKS}: block 1 field live must be a boolean, found a string",
        ),
        (
            traj(req(blocks=[blk(role="assistant", live=1)])),
            f"{BLOCKS}: block 1 field live must be a boolean, found integer 1",
        ),
        (
            traj(req(blocks=[blk(), "user"])),
            f"{BLOCKS}: block 2 must be a JSON object, found a string",
        ),
        (
            traj(req(blocks=[{"tokens": 1, "role": "user"}])),
            f"{BLOCKS}: block 1 is missing required field seed",
        ),
        (
            traj(req(blocks=[{"seed": "a", "role": "user"}])),
            f"{BLOCKS}: block 1 is missing required field tokens",
        ),
        (
            traj(req(blocks=[{"seed": "a", "tokens": 1, "live": False}])),
            f"{BLOCKS}: block 1 is missing required field role",
        ),
        (
            traj(req(blocks=[blk()]), req(130, 1)),
            "request 2 must define blocks because the trajectory's first request does",
        ),
        (
            traj(req(), req(130, 1, blocks=[blk()])),
            "request 2 must omit blocks because the trajectory's first request does not",
        ),
        (
            traj(req(blocks={"seed": "a"})),
            "request 1 field blocks must be an array, found an object",
        ),
        (
            traj(req(overhead_tokens=-1)),
            f"request 1 field overhead_tokens {INT} negative integer -1",
        ),
        (traj(req(overhead_tokens=2.0)), f"request 1 field overhead_tokens {INT} float 2.0"),
        (traj(req(stream=1)), "request 1 field stream must be a boolean, found integer 1"),
        (traj(req(stream="true")), "request 1 field stream must be a boolean, found a string"),
        (traj(req(max_tokens=1.5)), f"request 1 field max_tokens {INT} float 1.5"),
        (traj(req(max_tokens=True)), f"request 1 field max_tokens {INT} true"),
        (
            traj(req(recorded_start_after_ms=-5)),
            f"request 1 field recorded_start_after_ms {INT} negative integer -5",
        ),
        (
            traj(req(recorded_start_after_ms="1234")),
            f"request 1 field recorded_start_after_ms {INT} a string",
        ),
        (
            traj(req(recorded_start_after_ms=12.5)),
            f"request 1 field recorded_start_after_ms {INT} float 12.5",
        ),
        (traj(req(), start_after_ms=1.0), f"start_after_ms {INT} float 1.0"),
        (traj(req(), start_after_ms=True), f"start_after_ms {INT} true"),
        (traj(req(), start_after_ms=-750), f"start_after_ms {INT} negative integer -750"),
        (
            traj(req(), start_after_ms=2**63),
            "start_after_ms must be at most 9223372036854775807, found 9223372036854775808",
        ),
        (
            traj(req(typo=1)),
            'request 1 has unknown field "typo"; expected one of prompt_tokens, output_tokens, '
            "reset_before, delay_after_ms, overhead_tokens, stream, max_tokens, blocks, "
            "recorded_start_after_ms",
        ),
        (
            traj(req(), typo=1),
            'unknown field "typo"; expected one of schema_version, trajectory_id, '
            "start_after_ms, requests, metadata",
        ),
    ],
)
def test_v2_rejections_verbatim(line, cause):
    assert error(traj(req(), ident="first"), "", line) == f"{CONTEXT}:3: {cause}"


def test_an_empty_block_list_on_a_later_request():
    assert error(traj(req(blocks=[blk()]), req(130, 1, blocks=[]))) == (
        f"{CONTEXT}:1: request 2 blocks are invalid: blocks must contain at least one block"
    )


def test_zero_block_tokens_and_whitespace_seeds_are_accepted():
    m = parse(traj(req(blocks=[blk(" ", 0), blk("\t", 0, "system")])))
    assert (m.block_seeds, m.block_tokens.tolist()) == ([" ", "\t"], [0, 0])


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("overhead_tokens", 7),
        ("stream", False),
        ("max_tokens", 64),
        ("blocks", [{"anything": True}]),
        ("recorded_start_after_ms", 1234),
    ],
)
def test_v1_lines_still_reject_v2_request_fields(name, value):
    assert error(traj(req(), ident="v2"), traj(req(), req(200, 1, **{name: value}), version=1)) == (
        f"{CONTEXT}:2: request 2 field {name} requires schema_version 2"
    )


def test_v1_lines_still_reject_start_after_ms():
    assert error(traj(req(), start_after_ms=750, version=1)) == (
        f"{CONTEXT}:1: start_after_ms requires schema_version 2"
    )


# --- validation order -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        # Block structure (every request) before any request's values.
        (
            traj(req(0, 1, blocks=[blk()]), req(5, 1, blocks=[blk(role="robot")])),
            "request 2 blocks are invalid: block 1 role: unknown variant",
        ),
        # A request's own fields and missing fields before its blocks' structure.
        (
            traj(req("x", 1, blocks=[blk(role="robot")])),
            "request 1 field prompt_tokens must be a non-negative integer",
        ),
        (
            traj({"output_tokens": 1, "blocks": [blk(role="robot")]}),
            "request 1 is missing required field prompt_tokens",
        ),
        # Within a block, document order, then missing fields.
        (
            traj(req(blocks=[{"role": "robot", "tokens": "x", "seed": "a"}])),
            f"{BLOCKS}: block 1 role: unknown variant",
        ),
        (
            traj(req(blocks=[{"tokens": "x", "role": "robot", "seed": "a"}])),
            f"{BLOCKS}: block 1 field tokens must be",
        ),
        (
            traj(req(blocks=[{"live": 3, "seed": "a"}])),
            f"{BLOCKS}: block 1 field live must be a boolean",
        ),
        (traj(req(blocks=[{"seed": "", "tokens": 1}])), f"{BLOCKS}: block 1 is missing"),
        # Blocks in order, seed before live within a block.
        (
            traj(req(blocks=[blk(role="user", live=True), blk("")])),
            f"{BLOCKS}: block 1 is live",
        ),
        (
            traj(req(blocks=[blk("", role="user", live=True)])),
            f"{BLOCKS}: block 1 seed must not be empty",
        ),
        # Per request: prompt, output, max_tokens, blocks presence, blocks, then growth.
        (traj(req(0, 0, max_tokens=0)), "request 1 prompt_tokens must be greater than zero"),
        (traj(req(1, 0, max_tokens=0)), "request 1 output_tokens must be greater than zero"),
        (
            traj(req(max_tokens=0, blocks=[])),
            "request 1 max_tokens must be greater than zero",
        ),
        (
            traj(req(blocks=[blk()]), req(1, 1, max_tokens=0)),
            "request 2 max_tokens must be greater than zero",
        ),
        (
            traj(req(blocks=[blk("")]), req(1, 1)),
            f"{BLOCKS}: block 1 seed must not be empty",
        ),
        (
            traj(req(100, 20), req(110, 1), req(200, 1, blocks=[blk()])),
            "request 2 prompt_tokens (110) cannot follow",
        ),
        (
            traj(req(100, 20), req(200, 1, blocks=[blk()]), req(110, 1)),
            "request 2 must omit blocks",
        ),
        # The v2-field scan of a v1 line comes after structure, before values.
        (
            traj(req(0, 1), req(5, 1, stream=True), version=1),
            "request 2 field stream requires schema_version 2",
        ),
    ],
)
def test_validation_order(line, cause):
    assert error(line).startswith(f"{CONTEXT}:1: {cause}")


def test_duplicate_ids_come_last():
    assert error(traj(req(), ident="d"), traj(req(0, 1), ident="d")) == (
        f"{CONTEXT}:2: request 1 prompt_tokens must be greater than zero"
    )
    assert error(traj(req(), ident="d", version=1), traj(req(blocks=[blk()]), ident="d")) == (
        f'{CONTEXT}:2: duplicate trajectory_id "d"'
    )


# --- growth feasibility ---------------------------------------------------------------------


def growth(n: int, prompt: int, content: int, needed: int) -> str:
    return (
        f"{CONTEXT}:1: request {n} prompt_tokens ({prompt}) cannot follow the preceding prompt "
        "and output; set reset_before=true to model compaction or reset: next content "
        f"({content}) is smaller than current content plus output ({needed})"
    )


def test_growth_honours_a_requests_own_overhead():
    # Contents 100, 120, 160: each at least the previous content plus output.
    m = parse(traj(req(100, 20), req(130, 10, overhead_tokens=10), req(170, 5, overhead_tokens=10)))
    assert m.overhead_tokens.tolist() == [-1, 10, 10]
    assert error(traj(req(100, 20), req(125, 1, overhead_tokens=10))) == growth(2, 125, 115, 120)


def test_growth_without_an_own_overhead_inherits_the_previous_one():
    assert parse(traj(req(100, 20, overhead_tokens=10), req(120, 1)))
    assert error(traj(req(100, 20, overhead_tokens=10), req(115, 5))) == growth(2, 115, 105, 110)
    # The inherited overhead keeps going over several appended requests.
    assert error(traj(req(100, 20, overhead_tokens=10), req(120, 5), req(124, 1))) == (
        growth(3, 124, 114, 115)
    )


def test_growth_after_a_reset_starts_from_zero_overhead():
    assert parse(traj(req(100, 20, overhead_tokens=10), req(50, 5, reset_before=True), req(55, 1)))
    assert error(
        traj(req(100, 20, overhead_tokens=10), req(50, 5, reset_before=True), req(54, 1))
    ) == growth(3, 54, 54, 55)
    # A reset request's own overhead still wins.
    assert error(
        traj(req(100, 20), req(50, 5, reset_before=True, overhead_tokens=8), req(49, 1))
    ) == growth(3, 49, 41, 47)


def test_growth_of_a_plain_v2_line_matches_v1():
    assert error(traj(req(100, 20), req(110, 5))) == growth(2, 110, 110, 120)


def test_block_plans_skip_growth_feasibility():
    m = parse(traj(req(1000, 50, blocks=[blk("a", 990)]), req(30, 5, blocks=[blk("b", 25)])))
    assert m.prompt_tokens.tolist() == [1000, 30]
    assert m.reset_before.tolist() == [False, False]


# --- seeds ----------------------------------------------------------------------------------


def test_seeds_are_interned_across_trajectories_in_first_seen_order():
    m = parse(
        traj(req(blocks=[blk("sys", 5, "system"), blk("u1")]), ident="a"),
        traj(req(blocks=[blk("u2"), blk("sys", 5, "system")]), ident="b"),
        traj(req(1, 1), ident="c"),
        traj(req(blocks=[blk("sys", 5, "system"), blk("u1"), blk("u2")]), ident="d"),
    )
    assert m.block_seeds == ["sys", "u1", "u2"]
    assert m.block_seed.tolist() == [0, 1, 2, 0, 0, 1, 2]
    assert m.block_offsets.tolist() == [0, 2, 4, 4, 7]


def test_seed_redefinition_is_recorded_once_per_trajectory():
    m = parse(
        traj(
            req(blocks=[blk("a", 10)]),
            req(blocks=[blk("a", 10), blk("b", 3)]),
            req(blocks=[blk("a", 11), blk("b", 4)]),  # the first redefinition: request 3
            req(blocks=[blk("a", 12, "system")]),
            ident="first",
        ),
        traj(req(blocks=[blk("a", 99, "tool")]), ident="other"),  # another trajectory: fine
        traj(req(blocks=[blk("c", 1), blk("c", 1, "assistant")]), ident='q"uote'),
    )
    assert m.seed_redefinitions == [(0, 3, "a"), (2, 1, "c")]
    assert m.seed_redefinition_warnings() == [
        'warning: trajectory "first" request 3: block seed "a" is redefined with different '
        "tokens or role; reusing its first content",
        'warning: trajectory "q\\"uote" request 1: block seed "c" is redefined with different '
        "tokens or role; reusing its first content",
    ]
    # The first definition is what the columns keep for each block, as written.
    assert m.block_tokens.tolist() == [10, 10, 3, 11, 4, 12, 99, 1, 1]


def test_a_reset_starts_the_seed_definitions_over():
    m = parse(
        traj(
            req(blocks=[blk("a", 10)]),
            req(blocks=[blk("a", 20)], reset_before=True),
            req(blocks=[blk("a", 20)]),
        )
    )
    assert m.seed_redefinitions == []
    m = parse(
        traj(
            req(blocks=[blk("a", 10)], reset_before=True),  # first request: nothing to drop
            req(blocks=[blk("a", 20)]),
        )
    )
    assert m.seed_redefinitions == [(0, 2, "a")]


# --- validate_manifest ----------------------------------------------------------------------


def test_validate_manifest_reports_every_bad_line_in_order():
    data = jsonl(
        traj(req(), ident="ok"),
        "{bad json",
        "",
        traj(req(blocks=[blk(role="robot")]), ident="bad-role"),
        traj(req(), ident="ok"),
        traj(req(0, 1), ident="bad-prompt"),
        traj(req(), ident="bad-prompt"),  # the bad line above did not claim its id
        traj(req(), req(130, 1, stream=True), version=1, ident="v1"),
        traj(req(), ident="ok2"),
    )
    manifest, errors = validate_manifest(data, SOURCE)
    assert manifest is None
    assert errors[0].startswith(f"{CONTEXT}:2: invalid JSON at column 2: ")  # orjson's words
    assert errors[1:] == [
        f'{CONTEXT}:4: request 1 blocks are invalid: block 1 role: unknown variant "robot", '
        f"expected one of {ROLES_LISTED}",
        f'{CONTEXT}:5: duplicate trajectory_id "ok"',
        f"{CONTEXT}:6: request 1 prompt_tokens must be greater than zero",
        f"{CONTEXT}:8: request 2 field stream requires schema_version 2",
    ]
    # The ordinary parser stops at the first of them.
    with pytest.raises(ManifestError) as caught:
        parse_manifest(data, SOURCE)
    assert str(caught.value) == errors[0]


def test_validate_manifest_returns_the_hashed_manifest_of_a_valid_file():
    data = jsonl(AGENT_A, traj(req(), version=1, ident="plain"), AGENT_B)
    manifest, errors = validate_manifest(data, SOURCE)
    assert errors == []
    assert manifest is not None
    assert manifest.sha256 == hashlib.sha256(data).hexdigest()
    assert (manifest.source, manifest.trajectory_ids) == (SOURCE, ["agent-a", "plain", "agent-b"])
    assert everything(manifest) == everything(parse_manifest(data, SOURCE))


@pytest.mark.parametrize("data", [b"", b"\n  \n"])
def test_validate_manifest_of_an_empty_file(data):
    assert validate_manifest(data, SOURCE) == (
        None,
        [f"trajectory plan file {SOURCE} contains no trajectory plans"],
    )


# --- properties -----------------------------------------------------------------------------

odd_values = st.sampled_from([None, True, False, 0, 1, -1, 1.0, "", "x", [], {}, 2**32, "robot"])


@st.composite
def near_valid_v2_lines(draw) -> dict[str, Any]:
    """v2 trajectories, block plans or not, that are often valid and otherwise slightly off."""
    with_blocks = draw(st.booleans())
    requests = []
    prompt = draw(st.integers(1, 50))
    for n in range(draw(st.integers(1, 4))):
        request: dict[str, Any] = {
            "prompt_tokens": prompt,
            "output_tokens": draw(st.integers(1, 9)),
        }
        if with_blocks != (draw(st.integers(0, 19)) == 0):
            blocks = []
            for _ in range(draw(st.integers(0 if draw(st.integers(0, 9)) == 0 else 1, 3))):
                block: dict[str, Any] = {
                    "seed": draw(st.sampled_from(["a", "b", "c"])),
                    "tokens": draw(st.integers(0, 3)),
                    "role": draw(st.sampled_from(BLOCK_ROLES)),
                }
                if draw(st.integers(0, 3)) == 0:
                    block["live"] = draw(st.booleans())
                if draw(st.integers(0, 9)) == 0:
                    block[draw(st.sampled_from(["seed", "tokens", "role", "live", "x"]))] = draw(
                        odd_values
                    )
                blocks.append(block)
            request["blocks"] = blocks
        for name in ("overhead_tokens", "stream", "max_tokens", "recorded_start_after_ms"):
            if draw(st.integers(0, 3)) == 0:
                valid = st.booleans() if name == "stream" else st.integers(0, 20)
                request[name] = draw(valid) if draw(st.integers(0, 9)) else draw(odd_values)
        if n and draw(st.integers(0, 4)) == 0:
            request["reset_before"] = True
        requests.append(request)
        prompt = max(1, prompt + draw(st.integers(-5, 40)))
    line: dict[str, Any] = {
        "schema_version": 2,
        "trajectory_id": draw(st.sampled_from("abc")),
        "requests": requests,
    }
    if draw(st.booleans()):
        line["start_after_ms"] = draw(
            st.integers(0, 1000) if draw(st.integers(0, 9)) else odd_values
        )
    return line


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(near_valid_v2_lines() | st.just(traj(req(), version=1)), min_size=1, max_size=4))
def test_parser_and_validator_agree_on_near_valid_v2_lines(lines):
    data = b"\n".join(json.dumps(line).encode() for line in lines)
    manifest, errors = validate_manifest(data, "fuzz")
    try:
        parsed = parse_manifest(data, "fuzz", hashlib.sha256(data).hexdigest())
    except ManifestError as exc:
        assert manifest is None
        assert errors[0] == str(exc)
        assert all(message.startswith("invalid trajectory plan at fuzz:") for message in errors)
        assert all("\n" not in message for message in errors)
        with pytest.raises(ManifestError) as checked:
            manifest_module._parse(data, "fuzz", "", fast=False)
        assert str(checked.value) == str(exc)
        return
    assert errors == []
    assert manifest is not None
    assert everything(manifest) == everything(parsed)
    assert len(manifest.block_tokens) == manifest.n_blocks
    assert len(manifest.block_offsets) == manifest.n_requests + 1
