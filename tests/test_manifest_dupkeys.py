"""A key written twice in one object is refused at every level, by the parser, by
``batchbench validate`` and by a run (orjson alone would keep the last value)."""

# ruff: noqa: UP031 - %-formatting keeps the JSON braces of these lines readable

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchbench.cli.main import run
from batchbench.errors import ManifestError
from batchbench.plan import manifest as manifest_module
from batchbench.plan.dupkeys import first_repeat
from batchbench.plan.manifest import parse_manifest

# Manifest parsing and `batchbench validate` are pure Python: no compiled module or twin
# (the pure-twin pass would run the same code again; see the marker in conftest).
pytestmark = pytest.mark.native_pass_only

V1 = '{"schema_version":1,"trajectory_id":"t","requests":[%s]}'
V2 = '{"schema_version":2,"trajectory_id":"t","requests":[%s]}'
REQ = '{"prompt_tokens":100,"output_tokens":5}'
BLOCK = '{"seed":"s","tokens":3,"role":"user"}'

CASES = [
    # (line, the message after "invalid trajectory plan at plans.jsonl:1: ")
    (V1 % '{"prompt_tokens":100,"prompt_tokens":5000,"output_tokens":5}',
     'request 1 has duplicate field "prompt_tokens"'),
    (V1 % f'{REQ},{{"prompt_tokens":200,"output_tokens":5,"output_tokens":6}}',
     'request 2 has duplicate field "output_tokens"'),
    ('{"schema_version":1,"trajectory_id":"a","trajectory_id":"b","requests":[%s]}' % REQ,
     'duplicate field "trajectory_id"'),
    ('{"schema_version":1,"schema_version":1,"trajectory_id":"a","requests":[%s]}' % REQ,
     'duplicate field "schema_version"'),
    (V2 % ('{"prompt_tokens":100,"output_tokens":5,"blocks":[%s,'
           '{"seed":"x","tokens":3,"role":"tool","tokens":4}]}' % BLOCK),
     'request 1 blocks are invalid: block 2 has duplicate field "tokens"'),
    ('{"schema_version":1,"trajectory_id":"t","metadata":{"a":{"b":[{"c":1,"c":2}]}},'
     '"requests":[%s]}' % REQ,
     'duplicate key "c" in metadata.a.b[0]'),
    ('{"schema_version":1,"trajectory_id":"t","metadata":{"x y":{"k":1,"k":1}},'
     '"requests":[%s]}' % REQ,
     'duplicate key "k" in metadata["x y"]'),
    # A repeat is reported before the values it hides: here a zero prompt.
    (V1 % '{"prompt_tokens":100,"output_tokens":5,"prompt_tokens":0}',
     'request 1 has duplicate field "prompt_tokens"'),
    (V1 % '{"prompt_tokens":100,"output_tokens":5,"extra":{"k":1,"k":2}}',
     'duplicate key "k" in request 1 field extra'),
    # Colons in strings make the count inconclusive; the repeat is still found.
    ('{"schema_version":1,"trajectory_id":"a:b","metadata":{"u":"http://h:1"},'
     '"requests":[{"prompt_tokens":100,"output_tokens":5,"output_tokens":5}]}',
     'request 1 has duplicate field "output_tokens"'),
    # An escape could hide a colon from the count: such lines are always checked.
    ('{"schema_version":1,"trajectory_id":"a\\u003a","requests":'
     '[{"prompt_tokens":100,"prompt_tokens":100,"output_tokens":5}]}',
     'request 1 has duplicate field "prompt_tokens"'),
    # The outermost object is reported first, then document order.
    ('{"schema_version":1,"trajectory_id":"t","requests":[{"prompt_tokens":1,'
     '"prompt_tokens":2,"output_tokens":5}],"requests":[%s]}' % REQ,
     'duplicate field "requests"'),
]  # fmt: skip


@pytest.mark.parametrize(("line", "message"), CASES)
def test_a_repeated_key_is_refused_by_both_validators(line, message):
    data = line.encode() + b"\n"
    for fast in (True, False):
        with pytest.raises(ManifestError) as caught:
            manifest_module._parse(data, "plans.jsonl", "", fast=fast)
        assert str(caught.value) == f"invalid trajectory plan at plans.jsonl:1: {message}"


@pytest.mark.parametrize(
    "line",
    [
        V1 % REQ,
        '{"schema_version":1,"trajectory_id":"a:b:c","requests":[%s]}' % REQ,
        '{"schema_version":1,"trajectory_id":"t","metadata":{"k:":"v:","l":[{"k":1}]},'
        '"requests":[%s]}' % REQ,
        '{"schema_version":1,"trajectory_id":"t\\"q","requests":[%s]}' % REQ,
        V2 % ('{"prompt_tokens":100,"output_tokens":5,"blocks":[%s,%s]}' % (BLOCK, BLOCK)),
        '{ "schema_version" : 1 , "trajectory_id" : "t" , "requests" : [ %s ] }' % REQ,
    ],
)
def test_lines_without_repeats_still_parse(line):
    manifest = parse_manifest(line.encode() + b"\n", "plans.jsonl")
    assert manifest.trajectory_ids == [manifest.trajectory_ids[0]]
    assert manifest.prompt_tokens.tolist() == [100] * manifest.n_requests


def test_validate_reports_each_repeat_with_its_line(tmp_path, capsys):
    path = tmp_path / "plans.jsonl"
    lines = [V1 % REQ, "", CASES[0][0], CASES[4][0].replace('"t"', '"u"'), CASES[5][0]]
    path.write_text("\n".join(lines) + "\n")
    assert run(["validate", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"Error: invalid trajectory plan at {path}:3: {CASES[0][1]}",
        f"Error: invalid trajectory plan at {path}:4: {CASES[4][1]}",
        f"Error: invalid trajectory plan at {path}:5: {CASES[5][1]}",
        f"{path}: 3 errors",
    ]


def test_a_run_refuses_a_repeated_key(tmp_path, capsys):
    path = tmp_path / "plans.jsonl"
    path.write_text(V1 % REQ + "\n" + CASES[0][0] + "\n")
    argv = ["--agent-plans-jsonl", str(path), "--tokenizer-model", "deepseek-v3", "--dry-run"]
    assert run(["agent", *argv]) == 1
    assert capsys.readouterr().err == (
        f"Error: invalid trajectory plan at {path}:2: {CASES[0][1]}\n"
    )


KEYS = st.sampled_from(["a", "b", "c:", "d"])
VALUES = st.recursive(
    st.integers(0, 9) | st.sampled_from(["x", "y:z", ""]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(st.tuples(KEYS, inner), max_size=4).map(lambda pairs: ("obj", pairs))
    ),
    max_leaves=12,
)


def render(value) -> str:
    """JSON text of a generated value, keeping repeated keys as written."""
    if isinstance(value, tuple):
        return "{" + ",".join(f'"{k}":{render(v)}' for k, v in value[1]) + "}"
    if isinstance(value, list):
        return "[" + ",".join(render(v) for v in value) + "]"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def repeats(value) -> bool:
    if isinstance(value, tuple):
        keys = [k for k, _ in value[1]]
        return len(set(keys)) != len(keys) or any(repeats(v) for _, v in value[1])
    if isinstance(value, list):
        return any(repeats(v) for v in value)
    return False


@settings(max_examples=200, deadline=None)
@given(VALUES)
def test_metadata_with_repeats_is_refused_exactly_when_a_key_repeats(metadata):
    line = '{"schema_version":1,"trajectory_id":"t","metadata":%s,"requests":[%s]}' % (
        render(metadata),
        REQ,
    )
    data = line.encode() + b"\n"
    if repeats(metadata):
        with pytest.raises(ManifestError, match="duplicate key"):
            parse_manifest(data, "p")
        assert first_repeat(data) is not None
    else:
        assert parse_manifest(data, "p").n_requests == 1
        assert first_repeat(data) is None
