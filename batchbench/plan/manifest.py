"""Trajectory manifests: JSONL parsing, validation and SHA-256 identity (docs/manifest.md).

A manifest is stored columnar: one numpy column per request field, grouped per trajectory
by CSR offsets. Memory therefore scales with the number of trajectories (their ids) plus a
few bytes per request, instead of one Python object per request.

Validation order within a line, so that the first error reported is deterministic:

1. JSON syntax and UTF-8, then "the line is an object";
2. ``schema_version`` (present, an integer, supported) — the version decides the schema;
3. trajectory-level fields in document order (unknown fields, types), then missing ones;
4. ``trajectory_id`` not blank, ``start_after_ms`` in v1, ``requests`` not empty;
5. every request's structure (object, unknown fields, types, missing fields), in order;
6. v1 only: the first request using a schema v2 field;
7. per request, in order: positive prompt, positive output, no reset on the first request,
   growth feasibility against the previous request;
8. the ``trajectory_id`` is not a duplicate.

A fast path accepts well-formed v1 lines without building per-request state; anything it
does not accept is re-checked by the full validator, which alone produces error messages.
"""

from __future__ import annotations

import array
import hashlib
import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from batchbench.errors import ManifestError

SUPPORTED_SCHEMA_VERSIONS = (1, 2)
HASH_CHUNK_BYTES = 64 * 1024

# Token counts are stored as uint32 (no model has a 4-billion-token context); other
# integers as int64. Values beyond the column type are rejected, never wrapped.
_U32_MAX = 2**32 - 1
_I64_MAX = 2**63 - 1
_I32_MAX = 2**31 - 1

# Unicode White_Space, which is what the reference implementation trims (Rust's
# ``str::trim``); Python's ``str.strip()`` would also strip U+001C..U+001F.
_WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)

_V1_TRAJECTORY_FIELDS = ("schema_version", "trajectory_id", "requests", "metadata")
_TRAJECTORY_FIELDS = (*_V1_TRAJECTORY_FIELDS, "start_after_ms")
_V1_REQUEST_FIELDS = ("prompt_tokens", "output_tokens", "reset_before", "delay_after_ms")
# Schema v2 request fields, in the order a v1 line reports them (the first found wins).
_V2_REQUEST_FIELDS = (
    "overhead_tokens",
    "stream",
    "max_tokens",
    "blocks",
    "recorded_start_after_ms",
)
_REQUIRED_REQUEST_FIELDS = ("prompt_tokens", "output_tokens")

_UINT32, _UINT64, _BOOL, _ARRAY = "uint32", "uint64", "bool", "array"
_REQUEST_FIELD_KINDS = {
    "prompt_tokens": _UINT32,
    "output_tokens": _UINT32,
    "reset_before": _BOOL,
    "delay_after_ms": _UINT64,
    "overhead_tokens": _UINT64,
    "stream": _BOOL,
    "max_tokens": _UINT64,
    "blocks": _ARRAY,
    "recorded_start_after_ms": _UINT64,
}


@dataclass(eq=False)
class Manifest:
    """A parsed manifest: trajectory ids plus aligned per-request numpy columns.

    ``request_offsets`` is CSR: the requests of trajectory ``t`` are the rows
    ``request_offsets[t]:request_offsets[t + 1]`` of every request column.
    """

    source: str
    sha256: str
    schema_version: int  # the highest version present in the file
    trajectory_ids: list[str]
    line_numbers: np.ndarray  # int32, 1-based physical line of each trajectory
    request_offsets: np.ndarray  # int64, len(trajectory_ids) + 1
    prompt_tokens: np.ndarray  # uint32
    output_tokens: np.ndarray  # uint32
    delay_after_ms: np.ndarray  # int64
    reset_before: np.ndarray  # bool

    def __len__(self) -> int:
        return len(self.trajectory_ids)

    @property
    def n_requests(self) -> int:
        """Total requests over all trajectories."""
        return int(self.request_offsets[-1])

    def requests_of(self, trajectory: int) -> slice:
        """Rows of one trajectory's requests in the request columns."""
        count = len(self.trajectory_ids)
        index = trajectory + count if trajectory < 0 else trajectory
        if not 0 <= index < count:
            raise IndexError(f"trajectory index {trajectory} out of range for {count} trajectories")
        return slice(int(self.request_offsets[index]), int(self.request_offsets[index + 1]))


def check_manifest_opens(path: str) -> None:
    """Fail now, with the message hashing would give, when the manifest cannot be opened."""
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ManifestError(f"failed to open {path} for hashing: {_os_reason(exc)}") from exc


def hash_manifest(path: str) -> str:
    """SHA-256 of the file's raw bytes in lowercase hex, read in 64 KiB chunks."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - the open and the reads fail differently
    except OSError as exc:
        raise ManifestError(f"failed to open {path} for hashing: {_os_reason(exc)}") from exc
    digest = hashlib.sha256()
    with handle:
        try:
            while chunk := handle.read(HASH_CHUNK_BYTES):
                digest.update(chunk)
        except OSError as exc:
            raise ManifestError(f"failed to hash {path}: {_os_reason(exc)}") from exc
    return digest.hexdigest()


def load_manifest(path: str, sha256: str | None = None) -> Manifest:
    """Read and parse a manifest file; ``sha256`` defaults to the hash of the bytes read."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - the open and the read fail differently
    except OSError as exc:
        raise ManifestError(
            f"failed to open trajectory plan file {path}: {_os_reason(exc)}"
        ) from exc
    with handle:
        try:
            data = handle.read()
        except OSError as exc:
            raise ManifestError(
                f"failed to read trajectory plan file {path}: {_os_reason(exc)}"
            ) from exc
    if sha256 is None:
        sha256 = hashlib.sha256(data).hexdigest()
    return parse_manifest(data, path, sha256)


def parse_manifest(data: bytes, source: str, sha256: str = "") -> Manifest:
    """Parse manifest bytes; ``source`` names the file in messages, as the user gave it."""
    return _parse(data, source, sha256, fast=True)


def _parse(data: bytes, source: str, sha256: str, *, fast: bool) -> Manifest:
    """The parser; ``fast=False`` disables the fast path so tests can compare both."""
    builder = _Builder(fast=fast)
    for number, line in enumerate(io.BytesIO(data), 1):
        if not line.strip():
            continue
        try:
            builder.add_line(line, number)
        except ManifestError as exc:
            raise exc.with_context(f"invalid trajectory plan at {source}:{number}") from None
    if not builder.trajectory_ids:
        raise ManifestError(f"trajectory plan file {source} contains no trajectory plans")
    return builder.finish(source, sha256)


class _Builder:
    """Accumulates validated trajectories in compact ``array`` buffers."""

    def __init__(self, *, fast: bool) -> None:
        self.fast = fast
        self.trajectory_ids: list[str] = []
        self.seen: set[str] = set()
        self.schema_version = 0
        self.line_numbers = array.array("i")
        self.offsets = array.array("q", [0])
        self.prompt = array.array("I")
        self.output = array.array("I")
        self.delay = array.array("q")
        self.reset = array.array("B")

    def add_line(self, line: bytes, number: int) -> None:
        """Validate one non-blank line and append its trajectory; raises the bare cause."""
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            if _is_blank_text(line):
                return  # a line of non-ASCII Unicode whitespace only
            raise ManifestError(_json_cause(line, exc)) from None
        if type(obj) is not dict:
            raise ManifestError(f"a trajectory plan must be a JSON object, found {_describe(obj)}")
        version = self._schema_version(obj)
        ident, requests = self._trajectory_fields(obj)
        if not ident.strip(_WHITESPACE):
            raise ManifestError("trajectory_id must not be empty")
        if version == 1 and obj.get("start_after_ms") is not None:
            raise ManifestError("start_after_ms requires schema_version 2")
        if not requests:
            raise ManifestError("requests must contain at least one request")
        mark = len(self.prompt)
        if not (self.fast and self._add_requests_fast(requests)):
            self._truncate(mark)
            self._add_requests_checked(requests)
        if ident in self.seen:
            raise ManifestError(f"duplicate trajectory_id {_quote(ident)}")
        if number > _I32_MAX:
            raise ManifestError(f"line number {number} exceeds the supported {_I32_MAX} lines")
        self.seen.add(ident)
        self.trajectory_ids.append(ident)
        self.line_numbers.append(number)
        self.offsets.append(len(self.prompt))
        self.schema_version = max(self.schema_version, version)

    @staticmethod
    def _schema_version(obj: dict[str, Any]) -> int:
        """Check the version first: it decides which fields the line may have."""
        if "schema_version" not in obj:
            raise ManifestError("missing required field schema_version")
        version = _uint(obj["schema_version"], "schema_version", 2**64 - 1)
        if version not in SUPPORTED_SCHEMA_VERSIONS:
            raise ManifestError(f"unsupported schema_version {version}; expected one of [1, 2]")
        if version == 2:
            raise ManifestError("schema_version 2 is not supported yet")
        return version

    @staticmethod
    def _trajectory_fields(obj: dict[str, Any]) -> tuple[str, list[Any]]:
        """Unknown fields and types at trajectory level, in document order."""
        for key, value in obj.items():
            if key == "trajectory_id":
                if type(value) is not str:
                    raise ManifestError(f"trajectory_id must be a string, found {_describe(value)}")
            elif key == "requests":
                if type(value) is not list:
                    raise ManifestError(f"requests must be an array, found {_describe(value)}")
            elif key == "start_after_ms":
                if value is not None:
                    _uint(value, "start_after_ms", _I64_MAX)
            elif key not in _TRAJECTORY_FIELDS:
                raise ManifestError(
                    f"unknown field {_quote(key)}; expected one of "
                    + ", ".join(_V1_TRAJECTORY_FIELDS)
                )
        for key in ("trajectory_id", "requests"):
            if key not in obj:
                raise ManifestError(f"missing required field {key}")
        return obj["trajectory_id"], obj["requests"]

    def _add_requests_fast(self, requests: list[Any]) -> bool:
        """Append a plain, valid v1 request list; False (maybe half-appended) otherwise."""
        add_prompt = self.prompt.append
        add_output = self.output.append
        add_delay = self.delay.append
        add_reset = self.reset.append
        needed = -1  # the smallest prompt the next appended request may have
        for request in requests:
            if type(request) is not dict:
                return False
            prompt = request.get("prompt_tokens")
            output = request.get("output_tokens")
            if type(prompt) is not int or type(output) is not int:
                return False
            if not (0 < prompt <= _U32_MAX and 0 < output <= _U32_MAX):
                return False
            size = len(request)
            if size == 2:
                reset = False
                delay = 0
            else:
                reset = request.get("reset_before", False)
                delay = request.get("delay_after_ms", 0)
                if type(reset) is not bool or type(delay) is not int or not 0 <= delay <= _I64_MAX:
                    return False
                if size != 2 + ("reset_before" in request) + ("delay_after_ms" in request):
                    return False
            if reset:
                if needed < 0:
                    return False
            elif prompt < needed:
                return False
            needed = prompt + output
            add_prompt(prompt)
            add_output(output)
            add_delay(delay)
            add_reset(reset)
        return True

    def _add_requests_checked(self, requests: list[Any]) -> None:
        """Full validation in the documented order; the only source of request errors."""
        rows = [_request_fields(request, n) for n, request in enumerate(requests, 1)]
        for n, fields in enumerate(rows, 1):
            for name in _V2_REQUEST_FIELDS:
                if name in fields:
                    raise ManifestError(f"request {n} field {name} requires schema_version 2")
        needed = -1
        for n, fields in enumerate(rows, 1):
            prompt = fields["prompt_tokens"]
            output = fields["output_tokens"]
            reset = fields.get("reset_before", False)
            if prompt == 0:
                raise ManifestError(f"request {n} prompt_tokens must be greater than zero")
            if output == 0:
                raise ManifestError(f"request {n} output_tokens must be greater than zero")
            if n == 1 and reset:
                raise ManifestError("the first request cannot set reset_before")
            if n > 1 and not reset and prompt < needed:
                raise ManifestError(
                    f"request {n} prompt_tokens ({prompt}) cannot follow the preceding prompt "
                    "and output; set reset_before=true to model compaction or reset: "
                    f"next content ({prompt}) is smaller than current content plus output "
                    f"({needed})"
                )
            needed = prompt + output
        for fields in rows:
            self.prompt.append(fields["prompt_tokens"])
            self.output.append(fields["output_tokens"])
            self.delay.append(fields.get("delay_after_ms", 0))
            self.reset.append(fields.get("reset_before", False))

    def _truncate(self, mark: int) -> None:
        for column in (self.prompt, self.output, self.delay, self.reset):
            del column[mark:]

    def finish(self, source: str, sha256: str) -> Manifest:
        """Convert the buffers to exact-size numpy columns."""
        return Manifest(
            source=source,
            sha256=sha256,
            schema_version=self.schema_version,
            trajectory_ids=self.trajectory_ids,
            line_numbers=_column(self.line_numbers, np.int32),
            request_offsets=_column(self.offsets, np.int64),
            prompt_tokens=_column(self.prompt, np.uint32),
            output_tokens=_column(self.output, np.uint32),
            delay_after_ms=_column(self.delay, np.int64),
            reset_before=_column(self.reset, np.uint8).view(np.bool_),
        )


def _request_fields(request: Any, n: int) -> dict[str, Any]:
    """One request's present, type-checked fields (a null optional field counts as absent)."""
    if type(request) is not dict:
        raise ManifestError(f"request {n} must be a JSON object, found {_describe(request)}")
    fields: dict[str, Any] = {}
    for key, value in request.items():
        kind = _REQUEST_FIELD_KINDS.get(key)
        if kind is None:
            raise ManifestError(
                f"request {n} has unknown field {_quote(key)}; expected one of "
                + ", ".join(_V1_REQUEST_FIELDS)
            )
        if value is None and key not in _REQUIRED_REQUEST_FIELDS:
            continue
        label = f"request {n} field {key}"
        if kind == _UINT32:
            _uint(value, label, _U32_MAX)
        elif kind == _UINT64:
            _uint(value, label, _I64_MAX)
        elif kind == _BOOL:
            if type(value) is not bool:
                raise ManifestError(f"{label} must be a boolean, found {_describe(value)}")
        elif type(value) is not list:
            raise ManifestError(f"{label} must be an array, found {_describe(value)}")
        fields[key] = value
    for key in _REQUIRED_REQUEST_FIELDS:
        if key not in fields:
            raise ManifestError(f"request {n} is missing required field {key}")
    return fields


def _uint(value: Any, label: str, maximum: int) -> int:
    """A JSON integer in [0, maximum]; bools, floats (even 1.0) and strings are rejected."""
    if type(value) is not int or value < 0:
        raise ManifestError(f"{label} must be a non-negative integer, found {_describe(value)}")
    if value > maximum:
        raise ManifestError(f"{label} must be at most {maximum}, found {value}")
    return value


def _describe(value: Any) -> str:
    """A short, one-line description of a JSON value for type errors."""
    if value is None:
        return "null"
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is int:
        return f"negative integer {value}" if value < 0 else f"integer {value}"
    if type(value) is float:
        if value.is_integer() and abs(value) >= 2**63:
            return f"float {value!r} (integers must fit in 64 bits)"
        return f"float {value!r}"
    if type(value) is str:
        return "a string"
    if type(value) is list:
        return "an array"
    return "an object"


def _quote(text: str) -> str:
    """Double-quoted with JSON escapes, so a user's string cannot break the one-line message."""
    return orjson.dumps(text).decode()


def _json_cause(line: bytes, exc: orjson.JSONDecodeError) -> str:
    """Name the byte that is not UTF-8, or the JSON error and its column in this line."""
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"line is not valid UTF-8 (byte {bad.start + 1})"
    return f"invalid JSON at column {exc.colno}: {exc.msg}"


def _is_blank_text(line: bytes) -> bool:
    """A line that is only Unicode whitespace counts as blank, as in the reference."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return not text.strip(_WHITESPACE)


def _column(buffer: array.array, dtype: type[np.generic]) -> np.ndarray:
    """An exact-size numpy copy of an ``array`` buffer (whose storage is over-allocated)."""
    return np.frombuffer(buffer, dtype=np.dtype(buffer.typecode)).astype(dtype, copy=True)


def _os_reason(exc: OSError) -> str:
    """The OS error text without Python's ``[Errno n]`` prefix and repeated filename."""
    return exc.strerror or str(exc)
