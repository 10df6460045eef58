"""Trajectory manifests: JSONL parsing, validation and SHA-256 identity (docs/manifest.md).

A manifest is stored columnar: one numpy column per request field, grouped per trajectory
by CSR offsets, and one column per block field, grouped per request by a second CSR.
Memory therefore scales with the number of trajectories (their ids) and distinct block
seeds plus a few bytes per request and per block, instead of one Python object each.

Validation order within a line, so that the first error reported is deterministic:

1. JSON syntax and UTF-8, then no repeated key in any object (``dupkeys``), then "the
   line is an object";
2. ``schema_version`` (present, an integer, supported) — the version decides the schema;
3. trajectory-level fields in document order (unknown fields, types), then missing ones;
4. ``trajectory_id`` not blank, ``start_after_ms`` in v1, ``requests`` not empty;
5. every request's structure, in order: object, unknown fields and types in document
   order, missing fields; in v2 then each of its blocks, in order: object, unknown fields
   and types in document order (a ``role`` must name a known role), missing fields;
6. v1 only: the first request using a schema v2 field;
7. per request, in order: positive prompt, positive output, positive ``max_tokens`` (v2),
   no reset on the first request (v1), blocks present exactly when the first request has
   them (v2), then the blocks: at least one, and per block a non-empty seed and ``live``
   on assistant blocks only; finally growth feasibility against the previous request
   (trajectories without blocks);
8. the ``trajectory_id`` is not a duplicate.

Growth feasibility compares contents: a prompt minus its effective overhead. Parsing
knows no global overheads, so the effective overhead is a v2 request's own
``overhead_tokens`` when set, otherwise 0 for the first request and after a reset, and
the previous request's effective overhead for an appended request. In v1 every
overhead is 0 and contents are the prompts.

A block seed that comes back in the same trajectory with other tokens or role is not an
error: replay keeps the first content of a seed until a reset drops it, so the parser
only records the first request per trajectory where that happens (``seed_redefinitions``)
for the caller to warn about. A reset on request 2 or later starts the comparison over.

A fast path accepts well-formed v1 lines without building per-request state; anything it
does not accept (every v2 line included) is re-checked by the full validator, which alone
produces error messages. Columns that only v2 lines fill are allocated for v1-only files
in one numpy fill at the end.
"""

from __future__ import annotations

import array
import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from batchbench.errors import ManifestError
from batchbench.plan import dupkeys
from batchbench.plan.provenance import Provenance, provenance_of, summarize

SUPPORTED_SCHEMA_VERSIONS = (1, 2)
HASH_CHUNK_BYTES = 64 * 1024

# The block roles of schema v2; a block's role code is its index here.
BLOCK_ROLES = ("tool_definition", "system", "user", "assistant", "tool", "tool_call")
_ROLE_CODES = {role: code for code, role in enumerate(BLOCK_ROLES)}
_ASSISTANT = _ROLE_CODES["assistant"]

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
_REQUEST_FIELDS = (*_V1_REQUEST_FIELDS, *_V2_REQUEST_FIELDS)
_REQUIRED_REQUEST_FIELDS = ("prompt_tokens", "output_tokens")
_BLOCK_FIELDS = ("seed", "tokens", "role", "live")
_REQUIRED_BLOCK_FIELDS = ("seed", "tokens", "role")

# "expected one of ..." lists of unknown-field messages, per schema version.
_EXPECTED_TRAJECTORY_FIELDS = {
    1: ", ".join(_V1_TRAJECTORY_FIELDS),
    2: ", ".join(("schema_version", "trajectory_id", "start_after_ms", "requests", "metadata")),
}
_EXPECTED_REQUEST_FIELDS = {1: ", ".join(_V1_REQUEST_FIELDS), 2: ", ".join(_REQUEST_FIELDS)}
_EXPECTED_ROLES = ", ".join(BLOCK_ROLES)

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

# A parsed block until it is stored: (seed, tokens, role code, live).
_Block = tuple[str, int, int, bool]


@dataclass(eq=False)
class Manifest:
    """A parsed manifest: trajectory ids plus aligned per-request and per-block columns.

    ``request_offsets`` is CSR: the requests of trajectory ``t`` are the rows
    ``request_offsets[t]:request_offsets[t + 1]`` of every request column.
    ``block_offsets`` is CSR too: the blocks of request row ``r`` are the rows
    ``block_offsets[r]:block_offsets[r + 1]`` of every block column.

    The columns after ``reset_before`` carry schema v2 fields. Any of them left out when
    the value is built is filled with its "absent" value at the right length, so a
    v1-only manifest has them all: no start offsets, no overheads, no blocks.
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
    reset_before: np.ndarray  # bool (always false on a trajectory's first request)
    # Schema v2 (None: filled in with the "absent" values below, at the right length, by
    # __post_init__; the ignores on these defaults are for that None).
    # Per trajectory: start_after_ms int64, 0 when absent.
    start_after_ms: np.ndarray = None  # type: ignore[assignment]
    # Per request: overhead_tokens int64 (-1 absent); stream int8 (-1 absent, 0 false,
    # 1 true); max_tokens int64 (0 absent); recorded_start_after_ms int64 (-1 absent).
    overhead_tokens: np.ndarray = None  # type: ignore[assignment]
    stream: np.ndarray = None  # type: ignore[assignment]
    max_tokens: np.ndarray = None  # type: ignore[assignment]
    recorded_start_after_ms: np.ndarray = None  # type: ignore[assignment]
    # Blocks: block_offsets int64 (n_requests + 1, CSR); per block: block_seed int32 (an
    # index into block_seeds, the distinct seeds in first-seen order), block_tokens
    # uint32, block_role uint8 (an index into BLOCK_ROLES) and block_live bool.
    block_offsets: np.ndarray = None  # type: ignore[assignment]
    block_seed: np.ndarray = None  # type: ignore[assignment]
    block_seeds: list[str] = field(default_factory=list)
    block_tokens: np.ndarray = None  # type: ignore[assignment]
    block_role: np.ndarray = None  # type: ignore[assignment]
    block_live: np.ndarray = None  # type: ignore[assignment]
    has_start_offsets: bool = False  # some trajectory sets start_after_ms (not null)
    # (trajectory index, 1-based request number, seed), at most one per trajectory: the
    # first request reusing a seed with other tokens or role since the last reset.
    seed_redefinitions: list[tuple[int, int, str]] = field(default_factory=list)
    # Per trajectory: the line's own schema_version, uint8.
    schema_versions: np.ndarray = None  # type: ignore[assignment]
    # Provenance (``metadata.source`` of imported plans, batchbench.plan.provenance): the
    # distinct (format, file) pairs in first-seen order, and per request source_ids int32
    # (an index into source_names, -1 absent) and source_rows int64 (-1 absent).
    source_names: list[tuple[str, str]] = field(default_factory=list)
    source_ids: np.ndarray = None  # type: ignore[assignment]
    source_rows: np.ndarray = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        trajectories = len(self.trajectory_ids)
        requests = int(self.request_offsets[-1])
        absent: list[tuple[str, int, type[np.generic], int]] = [
            ("start_after_ms", trajectories, np.int64, 0),
            ("overhead_tokens", requests, np.int64, -1),
            ("stream", requests, np.int8, -1),
            ("max_tokens", requests, np.int64, 0),
            ("recorded_start_after_ms", requests, np.int64, -1),
            ("block_offsets", requests + 1, np.int64, 0),
            ("block_seed", 0, np.int32, 0),
            ("block_tokens", 0, np.uint32, 0),
            ("block_role", 0, np.uint8, 0),
            ("block_live", 0, np.bool_, 0),
            ("schema_versions", trajectories, np.uint8, self.schema_version),
            ("source_ids", requests, np.int32, -1),
            ("source_rows", requests, np.int64, -1),
        ]
        for name, size, dtype, value in absent:
            if getattr(self, name) is None:
                # A read-only broadcast of one value: a file without the field costs no
                # memory for it, however many requests it has.
                setattr(self, name, np.broadcast_to(np.array(value, dtype=dtype), (size,)))

    def __len__(self) -> int:
        return len(self.trajectory_ids)

    @property
    def n_requests(self) -> int:
        """Total requests over all trajectories."""
        return int(self.request_offsets[-1])

    @property
    def n_blocks(self) -> int:
        """Total blocks over all requests."""
        return int(self.block_offsets[-1])

    def seed_redefinition_warnings(self) -> list[str]:
        """One ``warning: ...`` line per entry of ``seed_redefinitions``, ids JSON-quoted."""
        return [
            f"warning: trajectory {_quote(self.trajectory_ids[trajectory])} request {n}: "
            f"block seed {_quote(seed)} is redefined with different tokens or role; "
            "reusing its first content"
            for trajectory, n, seed in self.seed_redefinitions
        ]

    def source_summary(self) -> list[dict[str, Any]]:
        """Per (format, file) of the trajectories' provenance: how many trajectories and
        requests come from it (``provenance.summarize``)."""
        return summarize(self.source_names, self.source_ids, self.request_offsets)

    def requests_of(self, trajectory: int) -> slice:
        """Rows of one trajectory's requests in the request columns."""
        count = len(self.trajectory_ids)
        index = trajectory + count if trajectory < 0 else trajectory
        if not 0 <= index < count:
            raise IndexError(f"trajectory index {trajectory} out of range for {count} trajectories")
        return slice(int(self.request_offsets[index]), int(self.request_offsets[index + 1]))

    def blocks_of(self, request_row: int) -> slice:
        """Rows of one request's blocks in the block columns (empty without blocks)."""
        count = self.n_requests
        index = request_row + count if request_row < 0 else request_row
        if not 0 <= index < count:
            raise IndexError(f"request row {request_row} out of range for {count} requests")
        return slice(int(self.block_offsets[index]), int(self.block_offsets[index + 1]))


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


def read_manifest_file(path: str) -> bytes:
    """The raw bytes of a manifest file, with the parser's open and read messages."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - the open and the read fail differently
    except OSError as exc:
        raise ManifestError(
            f"failed to open trajectory plan file {path}: {_os_reason(exc)}"
        ) from exc
    with handle:
        try:
            return handle.read()
        except OSError as exc:
            raise ManifestError(
                f"failed to read trajectory plan file {path}: {_os_reason(exc)}"
            ) from exc


def load_manifest(path: str, sha256: str | None = None) -> Manifest:
    """Read and parse a manifest file; ``sha256`` defaults to the hash of the bytes read."""
    data = read_manifest_file(path)
    if sha256 is None:
        sha256 = hashlib.sha256(data).hexdigest()
    return parse_manifest(data, path, sha256)


def parse_manifest(data: bytes, source: str, sha256: str = "") -> Manifest:
    """Parse manifest bytes; ``source`` names the file in messages, as the user gave it."""
    return _parse(data, source, sha256, fast=True)


def validate_manifest(data: bytes, source: str) -> tuple[Manifest | None, list[str]]:
    """Check every line instead of stopping at the first bad one.

    Returns the manifest (hashed) and no messages when the whole file is valid; otherwise
    ``None`` and one message per bad line (its first error, with the usual context), in
    line order. Valid lines still count for duplicate ids.
    """
    builder = _Builder(fast=True)
    errors: list[str] = []
    for number, line in _lines(data):
        try:
            builder.add_line(line, number)
        except ManifestError as exc:
            errors.append(str(exc.with_context(f"invalid trajectory plan at {source}:{number}")))
    if errors:
        return None, errors
    if not builder.trajectory_ids:
        return None, [f"trajectory plan file {source} contains no trajectory plans"]
    return builder.finish(source, hashlib.sha256(data).hexdigest()), []


def _parse(data: bytes, source: str, sha256: str, *, fast: bool) -> Manifest:
    """The parser; ``fast=False`` disables the fast path so tests can compare both."""
    builder = _Builder(fast=fast)
    for number, line in _lines(data):
        try:
            builder.add_line(line, number)
        except ManifestError as exc:
            raise exc.with_context(f"invalid trajectory plan at {source}:{number}") from None
    if not builder.trajectory_ids:
        raise ManifestError(f"trajectory plan file {source} contains no trajectory plans")
    return builder.finish(source, sha256)


def _lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(1-based physical line number, line) of every line that is not ASCII-blank."""
    for number, line in enumerate(io.BytesIO(data), 1):
        if line.strip():
            yield number, line


class _Builder:
    """Accumulates validated trajectories in compact ``array`` buffers.

    A line is fully validated before anything of it is kept (the fast path's partial
    appends are undone), so after an error the builder can go on with the next line.
    """

    def __init__(self, *, fast: bool) -> None:
        self.fast = fast
        self.trajectory_ids: list[str] = []
        self.seen: set[str] = set()
        self.schema_version = 0
        # One entry per trajectory.
        self.line_numbers = array.array("i")
        self.offsets = array.array("q", [0])
        self.start_after = array.array("q")
        self.versions = array.array("B")
        self.has_start_offsets = False
        # One entry per request.
        self.prompt = array.array("I")
        self.output = array.array("I")
        self.delay = array.array("q")
        self.reset = array.array("B")
        # One entry per request, kept from the first v2 line on (earlier rows padded).
        self.overhead = array.array("q")
        self.stream = array.array("b")
        self.max_tokens = array.array("q")
        self.recorded = array.array("q")
        self.block_counts = array.array("I")
        # One entry per block.
        self.block_seed = array.array("i")
        self.block_tokens = array.array("I")
        self.block_role = array.array("B")
        self.block_live = array.array("B")
        self.seed_ids: dict[str, int] = {}
        self.block_seeds: list[str] = []
        self.seed_redefinitions: list[tuple[int, int, str]] = []
        # One entry per request, kept from the first trajectory with provenance on.
        self.source_ids = array.array("i")
        self.source_rows = array.array("q")
        self.source_index: dict[tuple[str, str], int] = {}

    def add_line(self, line: bytes, number: int) -> None:
        """Validate one non-blank line and append its trajectory; raises the bare cause."""
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            if _is_blank_text(line):
                return  # a line of non-ASCII Unicode whitespace only
            raise ManifestError(_json_cause(line, exc)) from None
        mark = len(self.prompt)
        repeats_checked = False
        try:
            if type(obj) is not dict:
                raise ManifestError(
                    f"a trajectory plan must be a JSON object, found {_describe(obj)}"
                )
            version = self._schema_version(obj)
            ident, requests, start = self._trajectory_fields(obj, version)
            if not ident.strip(_WHITESPACE):
                raise ManifestError("trajectory_id must not be empty")
            if version == 1 and start is not None:
                raise ManifestError("start_after_ms requires schema_version 2")
            if not requests:
                raise ManifestError("requests must contain at least one request")
            rows = None
            keys = self._add_requests_fast(requests) if version == 1 and self.fast else -1
            if keys < 0:
                self._truncate(mark)
                rows = _checked_requests(requests, version)
                keys = sum(map(len, requests))  # objects, once checked
                if version == 2 and "blocks" in rows[0]:  # then every request has blocks
                    keys += sum(len(block) for r in requests for block in r["blocks"])
            # Repeated keys: the distinct keys of every object against the line's colons.
            keys += len(obj)
            metadata = obj.get("metadata")
            if type(metadata) is dict or type(metadata) is list:
                keys += dupkeys.keys_in(metadata)
            if line.count(b":") != keys and dupkeys.may_repeat(line, obj, keys):
                repeats_checked = True
                dupkeys.check(line)
            if ident in self.seen:
                raise ManifestError(f"duplicate trajectory_id {_quote(ident)}")
            if number > _I32_MAX:
                raise ManifestError(f"line number {number} exceeds the supported {_I32_MAX} lines")
        except ManifestError:
            self._truncate(mark)
            if not repeats_checked:
                dupkeys.check(line)  # a repeated key explains a line before its values do
            raise
        if rows is not None:
            self._append_requests(rows, version, mark)
        if type(metadata) is dict:
            provenance = provenance_of(metadata, len(requests))
            if provenance is not None:
                self._add_provenance(provenance, mark)
        self.seen.add(ident)
        self.trajectory_ids.append(ident)
        self.line_numbers.append(number)
        self.offsets.append(len(self.prompt))
        self.start_after.append(0 if start is None else start)
        self.versions.append(version)
        self.has_start_offsets = self.has_start_offsets or start is not None
        self.schema_version = max(self.schema_version, version)

    @staticmethod
    def _schema_version(obj: dict[str, Any]) -> int:
        """Check the version first: it decides which fields the line may have."""
        if "schema_version" not in obj:
            raise ManifestError("missing required field schema_version")
        version = _uint(obj["schema_version"], "schema_version", 2**64 - 1)
        if version not in SUPPORTED_SCHEMA_VERSIONS:
            raise ManifestError(f"unsupported schema_version {version}; expected one of [1, 2]")
        return version

    @staticmethod
    def _trajectory_fields(obj: dict[str, Any], version: int) -> tuple[str, list[Any], int | None]:
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
                    + _EXPECTED_TRAJECTORY_FIELDS[version]
                )
        for key in ("trajectory_id", "requests"):
            if key not in obj:
                raise ManifestError(f"missing required field {key}")
        return obj["trajectory_id"], obj["requests"], obj.get("start_after_ms")

    def _add_requests_fast(self, requests: list[Any]) -> int:
        """Append a plain, valid v1 request list and return the keys of its objects; -1
        (maybe half-appended) when it is not one."""
        add_prompt = self.prompt.append
        add_output = self.output.append
        add_delay = self.delay.append
        add_reset = self.reset.append
        # Locals: a global or builtin lookup per request and field is a few % of a parse.
        dict_, int_, bool_, u32_max, i64_max = dict, int, bool, _U32_MAX, _I64_MAX
        needed = -1  # the smallest prompt the next appended request may have
        optional = 0  # keys beyond prompt_tokens and output_tokens
        for request in requests:
            if type(request) is not dict_:
                return -1
            prompt = request.get("prompt_tokens")
            output = request.get("output_tokens")
            if type(prompt) is not int_ or type(output) is not int_:
                return -1
            if not (0 < prompt <= u32_max and 0 < output <= u32_max):
                return -1
            size = len(request)
            if size == 2:
                reset = False
                delay = 0
            else:
                reset = request.get("reset_before", False)
                delay = request.get("delay_after_ms", 0)
                if type(reset) is not bool_ or type(delay) is not int_ or not 0 <= delay <= i64_max:
                    return -1
                if size != 2 + ("reset_before" in request) + ("delay_after_ms" in request):
                    return -1
                optional += size - 2
            if reset:
                if needed < 0:
                    return -1
            elif prompt < needed:
                return -1
            needed = prompt + output
            add_prompt(prompt)
            add_output(output)
            add_delay(delay)
            add_reset(reset)
        return 2 * len(requests) + optional

    def _append_requests(self, rows: list[dict[str, Any]], version: int, mark: int) -> None:
        """Store the checked requests of one trajectory (and, in v2, their blocks)."""
        for n, fields in enumerate(rows, 1):
            self.prompt.append(fields["prompt_tokens"])
            self.output.append(fields["output_tokens"])
            self.delay.append(fields.get("delay_after_ms", 0))
            self.reset.append(n > 1 and fields.get("reset_before", False))
        if version == 1:
            return
        self._pad_v2(mark)
        seed_ids = self.seed_ids
        seeds = self.block_seeds
        add_seed = self.block_seed.append
        add_tokens = self.block_tokens.append
        add_role = self.block_role.append
        add_live = self.block_live.append
        first_use: dict[int, tuple[int, int]] = {}  # seed -> (tokens, role) since the last reset
        redefined = False
        for n, fields in enumerate(rows, 1):
            self.overhead.append(fields.get("overhead_tokens", -1))
            stream = fields.get("stream")
            self.stream.append(-1 if stream is None else int(stream))
            self.max_tokens.append(fields.get("max_tokens", 0))
            self.recorded.append(fields.get("recorded_start_after_ms", -1))
            blocks: list[_Block] = fields.get("blocks", [])
            self.block_counts.append(len(blocks))
            if n > 1 and fields.get("reset_before", False):
                first_use.clear()  # a reset starts the block cache over
            for seed, tokens, role, live in blocks:
                index = seed_ids.get(seed)
                if index is None:
                    index = seed_ids[seed] = len(seeds)
                    seeds.append(seed)
                add_seed(index)
                add_tokens(tokens)
                add_role(role)
                add_live(live)
                if not redefined and first_use.setdefault(index, (tokens, role)) != (tokens, role):
                    self.seed_redefinitions.append((len(self.trajectory_ids), n, seed))
                    redefined = True

    def _add_provenance(self, provenance: Provenance, mark: int) -> None:
        """Store one trajectory's source rows and files (its requests start at ``mark``)."""
        self._pad_sources(mark)
        name, files, rows = provenance
        index = self.source_index
        if type(files) is str:
            key = (name, files)
            ids = array.array("i", [index.setdefault(key, len(index))]) * len(rows)
        else:
            ids = array.array("i", [index.setdefault((name, file), len(index)) for file in files])
        self.source_ids.extend(ids)
        self.source_rows.extend(rows)

    def _pad_sources(self, rows: int) -> None:
        """Give the requests before ``rows`` without provenance their "absent" values."""
        missing = rows - len(self.source_rows)
        if missing > 0:
            self.source_ids.extend(array.array("i", [-1]) * missing)
            self.source_rows.extend(array.array("q", [-1]) * missing)

    def _pad_v2(self, rows: int) -> None:
        """Give the requests before ``rows`` that no v2 line set their "absent" values."""
        missing = rows - len(self.overhead)
        if missing <= 0:
            return
        for column, value in (
            (self.overhead, -1),
            (self.stream, -1),
            (self.max_tokens, 0),
            (self.recorded, -1),
            (self.block_counts, 0),
        ):
            column.extend(array.array(column.typecode, [value]) * missing)

    def _truncate(self, mark: int) -> None:
        for column in (self.prompt, self.output, self.delay, self.reset):
            del column[mark:]

    def finish(self, source: str, sha256: str) -> Manifest:
        """Convert the buffers to exact-size numpy columns."""
        requests = len(self.prompt)
        optional: dict[str, Any] = {}  # columns left to their defaults when unset
        if self.overhead:  # some v2 line was kept; otherwise Manifest fills the defaults
            self._pad_v2(requests)
            block_offsets = np.zeros(requests + 1, dtype=np.int64)
            np.cumsum(_column(self.block_counts, np.int64), out=block_offsets[1:])
            optional = {
                "overhead_tokens": _column(self.overhead, np.int64),
                "stream": _column(self.stream, np.int8),
                "max_tokens": _column(self.max_tokens, np.int64),
                "recorded_start_after_ms": _column(self.recorded, np.int64),
                "block_offsets": block_offsets,
                "block_seed": _column(self.block_seed, np.int32),
                "block_tokens": _column(self.block_tokens, np.uint32),
                "block_role": _column(self.block_role, np.uint8),
                "block_live": _column(self.block_live, np.uint8).view(np.bool_),
            }
        if self.source_rows:  # some trajectory has provenance; otherwise the defaults
            self._pad_sources(requests)
            optional["source_names"] = list(self.source_index)
            optional["source_ids"] = _column(self.source_ids, np.int32)
            optional["source_rows"] = _column(self.source_rows, np.int64)
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
            start_after_ms=_column(self.start_after, np.int64),
            block_seeds=self.block_seeds,
            has_start_offsets=self.has_start_offsets,
            seed_redefinitions=self.seed_redefinitions,
            schema_versions=_column(self.versions, np.uint8),
            **optional,
        )


def _checked_requests(requests: list[Any], version: int) -> list[dict[str, Any]]:
    """Full validation in the documented order; the only source of request errors.

    Returns each request's present fields, with a v2 ``blocks`` value parsed into tuples.
    """
    rows = [_request_fields(request, n, version) for n, request in enumerate(requests, 1)]
    if version == 1:
        for n, fields in enumerate(rows, 1):
            for name in _V2_REQUEST_FIELDS:
                if name in fields:
                    raise ManifestError(f"request {n} field {name} requires schema_version 2")
    block_plan = version == 2 and "blocks" in rows[0]
    needed = 0  # the smallest content the next appended request may have
    overhead = 0  # the previous request's effective overhead
    for n, fields in enumerate(rows, 1):
        prompt = fields["prompt_tokens"]
        output = fields["output_tokens"]
        reset = fields.get("reset_before", False)
        if prompt == 0:
            raise ManifestError(f"request {n} prompt_tokens must be greater than zero")
        if output == 0:
            raise ManifestError(f"request {n} output_tokens must be greater than zero")
        if version == 1:
            if n == 1 and reset:
                raise ManifestError("the first request cannot set reset_before")
        else:
            if fields.get("max_tokens") == 0:
                raise ManifestError(f"request {n} max_tokens must be greater than zero")
            if ("blocks" in fields) != block_plan:
                verb, does = ("define", "does") if block_plan else ("omit", "does not")
                raise ManifestError(
                    f"request {n} must {verb} blocks because the trajectory's first request {does}"
                )
            if block_plan:
                _check_blocks(fields["blocks"], n)
        if block_plan:
            continue  # the blocks are the prompt: nothing grows between requests
        fresh = n == 1 or reset
        own = fields.get("overhead_tokens")
        overhead = own if own is not None else 0 if fresh else overhead
        content = prompt - overhead
        if not fresh and content < needed:
            raise ManifestError(
                f"request {n} prompt_tokens ({prompt}) cannot follow the preceding prompt "
                "and output; set reset_before=true to model compaction or reset: "
                f"next content ({content}) is smaller than current content plus output "
                f"({needed})"
            )
        needed = content + output
    return rows


def _request_fields(request: Any, n: int, version: int) -> dict[str, Any]:
    """One request's present, type-checked fields (a null optional field counts as absent)."""
    if type(request) is not dict:
        raise ManifestError(f"request {n} must be a JSON object, found {_describe(request)}")
    fields: dict[str, Any] = {}
    for key, value in request.items():
        kind = _REQUEST_FIELD_KINDS.get(key)
        if kind is None:
            raise ManifestError(
                f"request {n} has unknown field {_quote(key)}; expected one of "
                + _EXPECTED_REQUEST_FIELDS[version]
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
    if version == 2 and "blocks" in fields:
        try:
            fields["blocks"] = [_block(block, k) for k, block in enumerate(fields["blocks"], 1)]
        except ManifestError as exc:
            raise exc.with_context(f"request {n} blocks are invalid") from None
    return fields


def _block(block: Any, k: int) -> _Block:
    """One block's structure: object, unknown fields and types in document order, missing."""
    if type(block) is not dict:
        raise ManifestError(f"block {k} must be a JSON object, found {_describe(block)}")
    get = block.get
    seed, tokens, role, live = get("seed"), get("tokens"), get("role"), get("live")
    if (  # the common, valid case in one test; anything else is checked in order below
        type(seed) is str
        and type(tokens) is int
        and 0 <= tokens <= _U32_MAX
        and type(role) is str
        and role in _ROLE_CODES
        and (live is None or type(live) is bool)
        and len(block) == 3 + ("live" in block)
    ):
        return seed, tokens, _ROLE_CODES[role], live is True
    live = False
    for key, value in block.items():
        if key == "seed":
            if type(value) is not str:
                raise ManifestError(
                    f"block {k} field seed must be a string, found {_describe(value)}"
                )
        elif key == "tokens":
            _uint(value, f"block {k} field tokens", _U32_MAX)
        elif key == "role":
            if type(value) is not str:
                raise ManifestError(
                    f"block {k} field role must be a string, found {_describe(value)}"
                )
            if value not in _ROLE_CODES:
                raise ManifestError(
                    f"block {k} role: unknown variant {_quote(value)}, expected one of "
                    + _EXPECTED_ROLES
                )
        elif key == "live":
            if value is not None:
                if type(value) is not bool:
                    raise ManifestError(
                        f"block {k} field live must be a boolean, found {_describe(value)}"
                    )
                live = value
        else:
            raise ManifestError(
                f"block {k} has unknown field {_quote(key)}; expected one of "
                + ", ".join(_BLOCK_FIELDS)
            )
    for key in _REQUIRED_BLOCK_FIELDS:
        if key not in block:
            raise ManifestError(f"block {k} is missing required field {key}")
    return block["seed"], block["tokens"], _ROLE_CODES[block["role"]], live


def _check_blocks(blocks: list[_Block], n: int) -> None:
    """The value rules of one request's (structurally valid) blocks."""
    context = f"request {n} blocks are invalid"
    if not blocks:
        raise ManifestError(f"{context}: blocks must contain at least one block")
    for k, (seed, _tokens, role, live) in enumerate(blocks, 1):
        if not seed:
            raise ManifestError(f"{context}: block {k} seed must not be empty")
        if live and role != _ASSISTANT:
            raise ManifestError(
                f"{context}: block {k} is live but has role {BLOCK_ROLES[role]}; "
                "only assistant blocks can be live"
            )


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


def quoted(text: str) -> str:
    """Double-quoted with JSON escapes, so a user's string cannot break the one-line message."""
    return orjson.dumps(text).decode()


_quote = quoted


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
