"""Manifest parsing, validation messages and identity (docs/manifest.md)."""

from __future__ import annotations

import errno
import gc
import hashlib
import io
import json
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchbench.errors import BatchbenchError, ManifestError
from batchbench.plan import manifest as manifest_module
from batchbench.plan.manifest import Manifest, hash_manifest, load_manifest, parse_manifest

# The manifest parser and validator are pure Python: no compiled module or twin serves them
# (the pure-twin pass would run the same code again; see the marker in conftest).
pytestmark = pytest.mark.native_pass_only

CONTEXT = "invalid trajectory plan at plans.jsonl"


def req(prompt: Any = 100, output: Any = 20, **extra: Any) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "output_tokens": output, **extra}


def traj(*requests: dict[str, Any], ident: Any = "t1", version: Any = 1, **extra: Any) -> dict:
    return {"schema_version": version, "trajectory_id": ident, "requests": list(requests), **extra}


def jsonl(*lines: dict[str, Any] | str | bytes) -> bytes:
    """Join objects (serialized) and raw lines with ``\\n``."""
    out = []
    for line in lines:
        if isinstance(line, dict):
            out.append(json.dumps(line).encode())
        elif isinstance(line, str):
            out.append(line.encode())
        else:
            out.append(line)
    return b"\n".join(out) + b"\n"


def parse(*lines: dict[str, Any] | str | bytes, source: str = "plans.jsonl") -> Manifest:
    return parse_manifest(jsonl(*lines), source)


def error(*lines: dict[str, Any] | str | bytes, source: str = "plans.jsonl") -> str:
    data = jsonl(*lines)
    with pytest.raises(ManifestError) as caught:
        parse_manifest(data, source)
    # The full validator alone must agree with the fast path on every error.
    with pytest.raises(ManifestError) as checked:
        manifest_module._parse(data, source, "", fast=False)
    assert str(checked.value) == str(caught.value)
    return str(caught.value)


def columns(m: Manifest) -> dict[str, list]:
    return {
        "ids": list(m.trajectory_ids),
        "lines": m.line_numbers.tolist(),
        "offsets": m.request_offsets.tolist(),
        "prompt": m.prompt_tokens.tolist(),
        "output": m.output_tokens.tolist(),
        "delay": m.delay_after_ms.tolist(),
        "reset": m.reset_before.tolist(),
    }


# --- order and physical line numbers -----------------------------------------------------


def test_requests_and_trajectories_keep_manifest_order():
    m = parse(
        traj(req(300, 5), req(310, 7, delay_after_ms=40), req(400, 1), ident="b"),
        traj(req(50, 9), ident="a"),
    )
    assert columns(m) == {
        "ids": ["b", "a"],
        "lines": [1, 2],
        "offsets": [0, 3, 4],
        "prompt": [300, 310, 400, 50],
        "output": [5, 7, 1, 9],
        "delay": [0, 40, 0, 0],
        "reset": [False, False, False, False],
    }


def test_blank_and_whitespace_only_lines_are_skipped_but_counted():
    m = parse("", " \t ", traj(req(), ident="a"), "\r", "", traj(req(), ident="b"), "   ")
    assert m.trajectory_ids == ["a", "b"]
    assert m.line_numbers.tolist() == [3, 6]


def test_error_line_number_counts_blank_lines():
    assert error("", traj(req(100, 20)), traj(req(100, 0), ident="t2")) == (
        f"{CONTEXT}:3: request 1 output_tokens must be greater than zero"
    )


def test_unicode_whitespace_only_line_is_blank():
    m = parse("\u00a0\u3000 ", traj(req()))
    assert m.line_numbers.tolist() == [2]


def test_mixed_crlf_line_endings():
    line = json.dumps(traj(req(), ident="a")).encode()
    other = json.dumps(traj(req(7, 1), ident="b")).encode()
    data = line + b"\r\n\r\n" + other + b"\n \r\n" + json.dumps(traj(req(1, 1), ident="c")).encode()
    m = parse_manifest(data, "crlf.jsonl")
    assert m.trajectory_ids == ["a", "b", "c"]
    assert m.line_numbers.tolist() == [1, 3, 5]
    assert m.prompt_tokens.tolist() == [100, 7, 1]
    bad = line + b"\r\n\r\n" + json.dumps(traj(req(0, 1), ident="b")).encode() + b"\r\n"
    with pytest.raises(
        ManifestError, match=r"^invalid trajectory plan at crlf\.jsonl:3: request 1 prompt"
    ):
        parse_manifest(bad, "crlf.jsonl")


# --- resets and growth feasibility ---------------------------------------------------------


def test_explicit_reset_may_shrink_the_prompt():
    m = parse(traj(req(1000, 50), req(200, 10, reset_before=True), req(210, 3)))
    assert m.prompt_tokens.tolist() == [1000, 200, 210]
    assert m.reset_before.tolist() == [False, True, False]


@pytest.mark.parametrize("following", [150, 140, 120])
def test_growth_accepts_at_least_prompt_plus_output(following):
    m = parse(traj(req(100, 20), req(following, 5)))
    assert m.prompt_tokens.tolist() == [100, following]


def test_growth_rejects_a_shrinking_prompt_with_the_exact_message():
    assert error(traj(req(100, 20), req(110, 5))) == (
        f"{CONTEXT}:1: request 2 prompt_tokens (110) cannot follow the preceding prompt and "
        "output; set reset_before=true to model compaction or reset: next content (110) is "
        "smaller than current content plus output (120)"
    )


def test_growth_is_checked_against_the_adjacent_request_after_a_reset():
    assert error(traj(req(500, 20), req(100, 20, reset_before=True), req(119, 1))) == (
        f"{CONTEXT}:1: request 3 prompt_tokens (119) cannot follow the preceding prompt and "
        "output; set reset_before=true to model compaction or reset: next content (119) is "
        "smaller than current content plus output (120)"
    )


def test_implicit_prompt_reduction_names_fixture_source():
    message = error(traj(req(100, 20), req(90, 5)), source="fixture")
    assert "fixture:1" in message
    assert "set reset_before=true" in message
    assert message.startswith("invalid trajectory plan at fixture:1: request 2 prompt_tokens (90)")


# --- duplicate ids, empty files, unsupported versions, unknown fields ----------------------


def test_duplicate_trajectory_id():
    assert error(traj(req(), ident="dup"), "", traj(req(), ident="dup")) == (
        f'{CONTEXT}:3: duplicate trajectory_id "dup"'
    )


def test_duplicate_trajectory_id_is_escaped_on_one_line():
    assert error(traj(req(), ident='a"\nb'), traj(req(), ident='a"\nb')) == (
        f'{CONTEXT}:2: duplicate trajectory_id "a\\"\\nb"'
    )


@pytest.mark.parametrize("data", [b"", b"\n", b" \n\t\r\n\n"])
def test_empty_input_has_no_trajectory_plans(data):
    with pytest.raises(ManifestError) as caught:
        parse_manifest(data, "empty.jsonl")
    assert str(caught.value) == "trajectory plan file empty.jsonl contains no trajectory plans"


@pytest.mark.parametrize("version", [0, 3, 99])
def test_unsupported_schema_version(version):
    assert error(traj(req(), version=version)) == (
        f"{CONTEXT}:1: unsupported schema_version {version}; expected one of [1, 2]"
    )


def test_unknown_trajectory_field():
    assert error(traj(req(), typo=1)) == (
        f'{CONTEXT}:1: unknown field "typo"; expected one of '
        "schema_version, trajectory_id, requests, metadata"
    )


def test_unknown_request_field():
    assert error(traj(req(), req(200, 1, typo=True))) == (
        f'{CONTEXT}:1: request 2 has unknown field "typo"; expected one of '
        "prompt_tokens, output_tokens, reset_before, delay_after_ms"
    )


# --- schema v2 fields in a v1 line --------------------------------------------------------


def test_start_after_ms_requires_schema_version_2():
    assert error(traj(req(), start_after_ms=5)) == (
        f"{CONTEXT}:1: start_after_ms requires schema_version 2"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("overhead_tokens", 7),
        ("stream", True),
        ("max_tokens", 64),
        ("blocks", []),
        ("recorded_start_after_ms", 1234),
    ],
)
def test_v2_request_field_requires_schema_version_2(name, value):
    assert error(traj(req(), req(200, 1, **{name: value}))) == (
        f"{CONTEXT}:1: request 2 field {name} requires schema_version 2"
    )


def test_v2_field_report_order():
    everything = {"recorded_start_after_ms": 1, "blocks": [], "max_tokens": 1, "stream": False}
    # Within a request the documented order wins over document order.
    assert error(traj(req(**everything))).endswith(
        "request 1 field stream requires schema_version 2"
    )
    # Requests in order, and this scan comes before the per-request value checks.
    assert error(traj(req(0, 1), req(200, 1, overhead_tokens=3), req(300, 1, stream=True))) == (
        f"{CONTEXT}:1: request 2 field overhead_tokens requires schema_version 2"
    )
    # The trajectory-level field first.
    assert error(traj(req(stream=True), start_after_ms=0)) == (
        f"{CONTEXT}:1: start_after_ms requires schema_version 2"
    )


def test_schema_version_2_lines_are_accepted_next_to_v1_lines():
    m = parse(traj(req(), ident="v1"), traj(req(), ident="v2", version=2))
    assert m.trajectory_ids == ["v1", "v2"]
    assert m.schema_version == 2
    assert m.schema_versions.tolist() == [1, 2]


# --- validation messages verbatim ---------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        (traj(req(), ident=""), "trajectory_id must not be empty"),
        (traj(req(), ident=" \t\u00a0"), "trajectory_id must not be empty"),
        (traj(), "requests must contain at least one request"),
        (traj(req(), req(0, 1)), "request 2 prompt_tokens must be greater than zero"),
        (traj(req(), req(200, 0)), "request 2 output_tokens must be greater than zero"),
        (traj(req(0, 0)), "request 1 prompt_tokens must be greater than zero"),
        (traj(req(reset_before=True)), "the first request cannot set reset_before"),
    ],
)
def test_validation_messages_verbatim(line, cause):
    assert error(line) == f"{CONTEXT}:1: {cause}"


def test_per_request_checks_run_in_request_order():
    # The growth error of request 2 comes before the zero output of request 3.
    assert error(traj(req(100, 20), req(101, 1), req(300, 0))).startswith(
        f"{CONTEXT}:1: request 2 prompt_tokens (101) cannot follow"
    )


# --- type errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "found"),
    [
        (True, "true"),
        (False, "false"),
        (1.0, "float 1.0"),
        (2.5, "float 2.5"),
        ("100", "a string"),
        (-1, "negative integer -1"),
        (None, "null"),
        ([100], "an array"),
        ({"n": 1}, "an object"),
    ],
)
def test_integer_fields_reject_non_integers(value, found):
    assert error(traj(req(), req(value, 1))) == (
        f"{CONTEXT}:1: request 2 field prompt_tokens must be a non-negative integer, found {found}"
    )


def test_token_counts_above_uint32_are_rejected():
    assert error(traj(req(100, 2**32))) == (
        f"{CONTEXT}:1: request 1 field output_tokens must be at most 4294967295, found 4294967296"
    )
    assert parse(traj(req(2**32 - 1, 1))).prompt_tokens.tolist() == [2**32 - 1]


def test_integer_beyond_64_bits_is_rejected():
    assert error(
        '{"schema_version":1,"trajectory_id":"t","requests":[{"prompt_tokens":'
        '18446744073709551616,"output_tokens":1}]}'
    ) == (
        f"{CONTEXT}:1: request 1 field prompt_tokens must be a non-negative integer, "
        "found float 1.8446744073709552e+19 (integers must fit in 64 bits)"
    )


INT = "must be a non-negative integer, found"
BOOL = "must be a boolean, found"
R1 = "request 1 field"


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        (traj(req(), ident=5), "trajectory_id must be a string, found integer 5"),
        (traj(req(), ident=None), "trajectory_id must be a string, found null"),
        ({**traj(), "requests": {"a": 1}}, "requests must be an array, found an object"),
        ({**traj(), "requests": None}, "requests must be an array, found null"),
        (traj(req(), version="1"), f"schema_version {INT} a string"),
        (traj(req(), version=True), f"schema_version {INT} true"),
        (traj(req(), version=1.0), f"schema_version {INT} float 1.0"),
        (traj(req(), version=None), f"schema_version {INT} null"),
        (traj(req(), start_after_ms=-5), f"start_after_ms {INT} negative integer -5"),
        (traj(req(output=None)), f"{R1} output_tokens {INT} null"),
        (traj(req(reset_before=1)), f"{R1} reset_before {BOOL} integer 1"),
        (traj(req(reset_before="true")), f"{R1} reset_before {BOOL} a string"),
        (traj(req(delay_after_ms=1.5)), f"{R1} delay_after_ms {INT} float 1.5"),
        (traj(req(delay_after_ms=False)), f"{R1} delay_after_ms {INT} false"),
        (
            traj(req(delay_after_ms=2**63)),
            f"{R1} delay_after_ms must be at most 9223372036854775807, found 9223372036854775808",
        ),
        (traj(req(stream=1)), f"{R1} stream {BOOL} integer 1"),
        (traj(req(blocks={})), f"{R1} blocks must be an array, found an object"),
    ],
)
def test_type_errors_name_field_and_expected_type(line, cause):
    assert error(line) == f"{CONTEXT}:1: {cause}"


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        ({"trajectory_id": "t", "requests": [req()]}, "missing required field schema_version"),
        ({"schema_version": 1, "requests": [req()]}, "missing required field trajectory_id"),
        ({"schema_version": 1, "trajectory_id": "t"}, "missing required field requests"),
        (traj({"output_tokens": 1}), "request 1 is missing required field prompt_tokens"),
        (traj(req(), {"prompt_tokens": 200}), "request 2 is missing required field output_tokens"),
    ],
)
def test_missing_required_fields(line, cause):
    assert error(line) == f"{CONTEXT}:1: {cause}"


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        ("[1, 2]", "a trajectory plan must be a JSON object, found an array"),
        ('"text"', "a trajectory plan must be a JSON object, found a string"),
        ("42", "a trajectory plan must be a JSON object, found integer 42"),
        ("null", "a trajectory plan must be a JSON object, found null"),
        (traj(req(), 7), "request 2 must be a JSON object, found integer 7"),
        (traj(req(), [100, 20]), "request 2 must be a JSON object, found an array"),
    ],
)
def test_non_object_values(line, cause):
    assert error(line) == f"{CONTEXT}:1: {cause}"


def test_invalid_json_has_context_and_column():
    assert error(traj(req()), '{"schema_version": 1,}') == (
        f"{CONTEXT}:2: invalid JSON at column 21: trailing comma is not allowed"
    )


def test_invalid_utf8_has_context():
    assert error(b'{"schema_version": 1, "trajectory_id": "\xff"}') == (
        f"{CONTEXT}:1: line is not valid UTF-8 (byte 41)"
    )


def test_error_is_a_batchbench_error_with_the_whole_chain():
    with pytest.raises(BatchbenchError, match=r"^invalid trajectory plan at p:1: "):
        parse_manifest(b"{", "p")


# --- null optional fields count as absent; metadata ---------------------------------------


def test_null_optional_fields_count_as_absent():
    m = parse(
        traj(
            req(100, 20, reset_before=None, delay_after_ms=None, stream=None, blocks=None),
            req(
                130,
                1,
                overhead_tokens=None,
                max_tokens=None,
                recorded_start_after_ms=None,
                delay_after_ms=3,
            ),
            start_after_ms=None,
            metadata=None,
        )
    )
    assert columns(m) == {
        "ids": ["t1"],
        "lines": [1],
        "offsets": [0, 2],
        "prompt": [100, 130],
        "output": [20, 1],
        "delay": [0, 3],
        "reset": [False, False],
    }


@pytest.mark.parametrize("metadata", [{"a": [1, {"b": None}]}, [1, "x"], "note", 3.5, True])
def test_metadata_is_allowed_and_ignored(metadata):
    with_meta = parse(traj(req(), req(150, 3), metadata=metadata))
    without = parse(traj(req(), req(150, 3)))
    assert columns(with_meta) == columns(without)


# --- the Manifest value ---------------------------------------------------------------------


def test_manifest_columns_dtypes_and_helpers():
    m = parse_manifest(
        jsonl(traj(req(), req(150, 1), ident="a"), traj(req(9, 9), ident="b")), "s", "ab"
    )
    assert (m.source, m.sha256, m.schema_version) == ("s", "ab", 1)
    assert (len(m), m.n_requests) == (2, 3)
    assert m.requests_of(0) == slice(0, 2)
    assert m.requests_of(1) == slice(2, 3)
    assert m.requests_of(-1) == slice(2, 3)
    with pytest.raises(IndexError):
        m.requests_of(2)
    assert m.prompt_tokens[m.requests_of(0)].tolist() == [100, 150]
    assert m.line_numbers.dtype == np.int32
    assert m.request_offsets.dtype == np.int64
    assert m.prompt_tokens.dtype == np.uint32
    assert m.output_tokens.dtype == np.uint32
    assert m.delay_after_ms.dtype == np.int64
    assert m.reset_before.dtype == np.bool_


def test_loaded_v1_manifest_stays_within_24_bytes_per_request(tmp_path):
    rows = []
    for t in range(200):
        prompt, requests = 1000, []
        for i in range(100):
            requests.append(req(prompt, 50, delay_after_ms=i))
            prompt += 50 + 200
        rows.append(traj(*requests, ident=f"trajectory-{t:06d}"))
    path = tmp_path / "big.jsonl"
    path.write_bytes(jsonl(*rows))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        m = load_manifest(str(path))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert m.n_requests == 20_000
    assert held / m.n_requests <= 24, held / m.n_requests


# --- identity and files ---------------------------------------------------------------------


def test_hash_is_sha256_of_raw_bytes(tmp_path):
    data = bytes(range(256)) * 1000 + b"\r\n tail"  # several 64 KiB chunks, CRLF kept raw
    path = tmp_path / "plans.jsonl"
    path.write_bytes(data)
    assert hash_manifest(str(path)) == hashlib.sha256(data).hexdigest()


def test_hash_of_empty_file(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    assert hash_manifest(str(path)) == hashlib.sha256(b"").hexdigest()


def test_hash_open_error(tmp_path):
    path = str(tmp_path / "missing.jsonl")
    with pytest.raises(ManifestError) as caught:
        hash_manifest(path)
    assert str(caught.value) == f"failed to open {path} for hashing: No such file or directory"


def test_hash_read_error(tmp_path, monkeypatch):
    path = tmp_path / "plans.jsonl"
    path.write_bytes(b"x" * 10)

    class Failing(io.BufferedReader):
        def read(self, size=-1):
            raise OSError(errno.EIO, "Input/output error")

    def failing_open(name, mode="r"):
        assert mode == "rb"
        return Failing(io.FileIO(name, "r"))

    monkeypatch.setattr(manifest_module, "open", failing_open, raising=False)
    with pytest.raises(ManifestError) as caught:
        hash_manifest(str(path))
    assert str(caught.value) == f"failed to hash {path}: Input/output error"


def test_load_unreadable_file(tmp_path):
    path = str(tmp_path / "nope.jsonl")
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    assert str(caught.value) == (
        f"failed to open trajectory plan file {path}: No such file or directory"
    )


def test_load_uses_path_as_source_and_hashes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = jsonl(traj(req(), ident="a"), traj(req(100, 0), ident="b"))
    Path("plans.jsonl").write_bytes(jsonl(traj(req(), ident="a")))
    m = load_manifest("plans.jsonl")
    assert m.source == "plans.jsonl"
    assert m.sha256 == hashlib.sha256(Path("plans.jsonl").read_bytes()).hexdigest()
    assert load_manifest("plans.jsonl", sha256="given").sha256 == "given"
    Path("bad.jsonl").write_bytes(data)
    with pytest.raises(ManifestError, match=r"^invalid trajectory plan at bad\.jsonl:2: request 1"):
        load_manifest("bad.jsonl")


# --- properties -----------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)

# Values that are valid somewhere, invalid elsewhere, or at the edges of the column types.
field_values = st.one_of(
    st.sampled_from([None, True, False, 0, 1, 2, 1.0, -1, "", " ", "x", [], {}, 2**32, 2**63]),
    st.integers(min_value=0, max_value=300),
    json_values,
)
request_keys = st.sampled_from([*manifest_module._REQUEST_FIELD_KINDS, "typo", "metadata"])
trajectory_keys = st.sampled_from(
    ["schema_version", "trajectory_id", "requests", "start_after_ms", "metadata", "typo"]
)


@st.composite
def near_valid_lines(draw) -> dict[str, Any]:
    """Trajectory objects that are often valid and otherwise wrong in one or two places."""
    requests = []
    prompt = draw(st.integers(1, 50))
    for _ in range(draw(st.integers(1, 4)) if draw(st.integers(0, 9)) else 0):
        output = draw(st.integers(1, 30)) if draw(st.integers(0, 9)) else 0
        request: dict[str, Any] = {"prompt_tokens": prompt, "output_tokens": output}
        if draw(st.integers(0, 3)) == 0:
            request[draw(request_keys)] = draw(field_values)
        if draw(st.integers(0, 9)) == 0:
            request.pop(draw(st.sampled_from(["prompt_tokens", "output_tokens"])), None)
        requests.append(request)
        prompt += output + draw(st.sampled_from([-1, 0, 0, 3, 10]))
    line: dict[str, Any] = {
        "schema_version": 1 if draw(st.integers(0, 9)) else draw(st.sampled_from([2, 3])),
        "trajectory_id": draw(st.sampled_from("abcdef")) if draw(st.integers(0, 9)) else " ",
        "requests": requests,
    }
    if draw(st.integers(0, 4)) == 0:
        line[draw(trajectory_keys)] = draw(field_values)
    return line


def _outcome(data: bytes, fast: bool) -> tuple[str, Any]:
    try:
        return "ok", columns(manifest_module._parse(data, "fuzz", "", fast=fast))
    except ManifestError as exc:
        return "error", str(exc)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_only_raise_manifest_error(data):
    fast = _outcome(data, fast=True)
    assert fast == _outcome(data, fast=False)
    if fast[0] == "error":
        assert fast[1].startswith(("invalid trajectory plan at fuzz:", "trajectory plan file fuzz"))


@settings(max_examples=300, deadline=None)
@given(st.lists(json_values, min_size=1, max_size=3))
def test_random_json_values_only_raise_manifest_error(values):
    data = b"\n".join(json.dumps(v).encode() for v in values)
    assert _outcome(data, fast=True) == _outcome(data, fast=False)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(near_valid_lines(), min_size=1, max_size=3))
def test_near_valid_lines_fast_path_matches_full_validator(lines):
    data = b"\n".join(json.dumps(line).encode() for line in lines)
    fast = _outcome(data, fast=True)
    assert fast == _outcome(data, fast=False)
    if fast[0] == "error":
        assert "\n" not in fast[1]


@st.composite
def valid_manifests(draw) -> tuple[bytes, dict[str, list]]:
    """A serialized valid manifest (with blank lines, CRLF, nulls, metadata) and its columns."""
    expected: dict[str, list] = {
        k: [] for k in ("ids", "lines", "offsets", "prompt", "output", "delay", "reset")
    }
    expected["offsets"].append(0)
    chunks: list[bytes] = []
    line_number = 0
    for t in range(draw(st.integers(1, 5))):
        for _ in range(draw(st.integers(0, 2))):
            chunks.append(draw(st.sampled_from([b"", b"  ", b"\t", b"\r"])))
            line_number += 1
        requests = []
        prompt = draw(st.integers(1, 2**31))
        for i in range(draw(st.integers(1, 6))):
            reset = i > 0 and draw(st.booleans())
            if reset:
                prompt = draw(st.integers(1, 2**20))
            output = draw(st.integers(1, 2**20))
            delay = draw(st.integers(0, 2**63 - 1) | st.just(0))
            request: dict[str, Any] = {"output_tokens": output, "prompt_tokens": prompt}
            if reset or draw(st.booleans()):
                request["reset_before"] = reset
            elif draw(st.booleans()):
                request["reset_before"] = None
            if delay or draw(st.booleans()):
                request["delay_after_ms"] = delay
            if draw(st.booleans()):
                request[draw(st.sampled_from(manifest_module._V2_REQUEST_FIELDS))] = None
            requests.append(request)
            expected["prompt"].append(prompt)
            expected["output"].append(output)
            expected["delay"].append(delay)
            expected["reset"].append(reset)
            prompt += output + draw(st.integers(0, 1000))  # stays below 2**32 by construction
        ident = f"{t}:" + draw(st.text(max_size=5))
        line: dict[str, Any] = {"requests": requests, "trajectory_id": ident, "schema_version": 1}
        if draw(st.booleans()):
            line["metadata"] = draw(json_values)
        if draw(st.booleans()):
            line["start_after_ms"] = None
        chunks.append(json.dumps(line, ensure_ascii=draw(st.booleans())).encode())
        line_number += 1
        expected["ids"].append(ident)
        expected["lines"].append(line_number)
        expected["offsets"].append(len(expected["prompt"]))
    ending = draw(st.sampled_from([b"\n", b"\r\n"]))
    return ending.join(chunks) + draw(st.sampled_from([b"", ending])), expected


@settings(max_examples=200, deadline=None)
@given(valid_manifests())
def test_round_trip_of_valid_manifests(case):
    data, expected = case
    m = parse_manifest(data, "round-trip", "h")
    assert columns(m) == expected
    assert (m.source, m.sha256, m.schema_version) == ("round-trip", "h", 1)
    assert columns(manifest_module._parse(data, "round-trip", "h", fast=False)) == expected
