"""Keyed cumulative block hashes, the recording's key, and principals derived from it.

Every hash is an HMAC under a per-recording secret key: without the key a short block
("yes", a file name) cannot be recovered by hashing guesses, and two recordings made with
different keys share no hashes. Element k of a chain covers blocks 0..k, so a request
that extends an earlier one (a conversation growing) has the earlier chain as a prefix.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable

from batchbench.errors import InputError
from batchbench.record.blocks import Block

KEY_BYTES = 32  # a generated key's length
MIN_KEY_BYTES = 16  # shorter given keys are refused: they could be guessed
CHAIN_HEX = 32  # 16 bytes of each digest, as lowercase hex
PRINCIPAL_HEX = 16


def chain(key: bytes, blocks: Iterable[Block]) -> list[str]:
    """digest_k = HMAC-SHA256(key, digest_{k-1} || role || NUL || canonical bytes); the
    chain holds the first 16 bytes of each digest in hex."""
    out = []
    previous = b""
    for block in blocks:
        mac = hmac.new(key, previous, hashlib.sha256)
        mac.update(block.role.encode("ascii"))
        mac.update(b"\0")
        mac.update(block.canonical)
        previous = mac.digest()
        out.append(previous.hex()[:CHAIN_HEX])
    return out


def principal(key: bytes, authorization: str | None, named: str | None) -> str:
    """Who sent a request: the value of the --principal-header when it came; else a keyed
    hash of the bearer token (the token itself is never stored); else "anonymous"."""
    if named is not None:
        # aiohttp keeps a header's non-UTF-8 bytes as lone surrogates: a row holds text.
        return named.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if authorization is None:
        return "anonymous"
    scheme, _, token = authorization.partition(" ")
    secret = token.strip() if scheme.lower() == "bearer" and token.strip() else authorization
    raw = secret.encode("utf-8", "surrogateescape")  # the header's bytes, whatever they are
    digest = hmac.new(key, raw, hashlib.sha256).hexdigest()
    return "key-" + digest[:PRINCIPAL_HEX]


def key_path(rows_path: str) -> str:
    return rows_path + ".key"


def recording_key(rows_path: str) -> bytes:
    """The key beside the rows (``<rows>.key``): read when a recording resumes, so its
    hashes continue the same chains; otherwise 32 random bytes written there, readable by
    the owner only (mode 0600, set at creation: the key is never world-readable)."""
    path = key_path(rows_path)
    try:
        with open(path, encoding="ascii") as handle:
            text = handle.read()
    except FileNotFoundError:
        key = secrets.token_bytes(KEY_BYTES)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w", encoding="ascii") as handle:
                handle.write(key.hex() + "\n")
        except OSError as exc:
            raise InputError(f"cannot write the hash key {path}: {exc.strerror or exc}") from None
        return key
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not hexadecimal text"
        raise InputError(f"cannot read the hash key {path}: {reason or exc}") from None
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise InputError(f"{path}: not a hash key (expected hexadecimal)") from None
    if len(key) < MIN_KEY_BYTES:
        raise InputError(f"{path}: a hash key of {len(key)} bytes is too short")
    return key
