"""Validation of exported plans and the atomic write of the manifest (COMPAT §7.8).

The validator is the package's own manifest parser (``batchbench validate`` and a run use
the same one) restricted to schema 2, plus one rule the parser leaves to a warning: a
block seed must not be redefined with other (tokens, role) within a trajectory, resets
or not. An export with any invalid line, or with no line, writes nothing.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import orjson

from batchbench.errors import InputError
from batchbench.plan.manifest import validate_manifest

_SOURCE = "export"
_PREFIX = f"invalid trajectory plan at {_SOURCE}:"
MAX_REPORTED_ERRORS = 10


def encode(plan: dict[str, Any]) -> bytes:
    """One plan as a compact JSON line (``,``/``:`` separators, UTF-8 unescaped)."""
    return orjson.dumps(plan) + b"\n"


def validate_lines(lines: Sequence[bytes]) -> list[str]:
    """Every error of the lines, ``line <n>: <message>``, in line order; none when valid."""
    errors: dict[int, str] = {}
    _, parser_errors = validate_manifest(b"".join(lines), _SOURCE) if lines else (None, [])
    for message in parser_errors:
        if message.startswith(_PREFIX):
            where, _, cause = message[len(_PREFIX) :].partition(": ")
            errors[int(where)] = cause
    for number, line in enumerate(lines, 1):
        if number in errors:
            continue
        obj = orjson.loads(line)
        version = obj.get("schema_version")
        if version != 2:
            errors[number] = f"unsupported schema_version {version}; expected 2"
            continue
        redefined = _seed_redefinition(obj["requests"])
        if redefined:
            errors[number] = redefined
    return [f"line {number}: {errors[number]}" for number in sorted(errors)]


def _seed_redefinition(requests: list[dict[str, Any]]) -> str | None:
    first: dict[str, tuple[int, str]] = {}
    for n, request in enumerate(requests, 1):
        for block in request.get("blocks") or ():
            content = (block["tokens"], block["role"])
            seen = first.setdefault(block["seed"], content)
            if seen != content:
                return (
                    f"request {n} redefines seed {orjson.dumps(block['seed']).decode()} "
                    f"(tokens {content[0]}, role {content[1]}; first defined with tokens "
                    f"{seen[0]}, role {seen[1]})"
                )
    return None


def write_manifest(path: str, lines: Sequence[bytes]) -> None:
    """Validate, then write the lines atomically (a temporary file in the same directory,
    renamed over ``path``). Raises InputError and leaves no file when there is nothing to
    write or any line is invalid."""
    errors = validate_lines(lines)
    if errors:
        shown = "\n".join(errors[:MAX_REPORTED_ERRORS])
        raise InputError(f"export produced {len(errors)} invalid manifest line(s):\n{shown}")
    directory = os.path.dirname(os.path.abspath(path))
    try:
        descriptor, temporary = tempfile.mkstemp(
            prefix=".export-", suffix=".jsonl.tmp", dir=directory
        )
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.writelines(lines)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # what open() would give, not mkstemp's 0600
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
