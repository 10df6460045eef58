"""Opening trace files: plain, gzip or zstd, chosen by content rather than name, streamed."""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from typing import IO

from batchbench.errors import InputError

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def open_binary(path: str) -> IO[bytes]:
    """The file's decompressed bytes as a stream. A zstd file needs the ``zstandard``
    package (the ``import`` extra); InputError names the file when it cannot be read."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 (returned to the caller)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    head = raw.peek(4)[:4] if isinstance(raw, io.BufferedReader) else b""
    if head.startswith(_GZIP_MAGIC):
        return gzip.open(raw, "rb")  # type: ignore[return-value]
    if head.startswith(_ZSTD_MAGIC):
        try:
            import zstandard  # lazy: an optional extra
        except ImportError:
            raw.close()
            raise InputError(
                f"{path} is zstd-compressed; install the import extra to read it: "
                "pip install 'batchbench[import]'"
            ) from None
        reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return io.BufferedReader(reader)
    return raw


def lines(path: str) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line without its end) for every line, streamed; a damaged
    compressed file is an InputError naming it."""
    stream = open_binary(path)
    try:
        for number, line in enumerate(stream, 1):
            yield number, line.rstrip(b"\r\n")
    except (OSError, EOFError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    except Exception as exc:  # a damaged zstd frame (zstandard.ZstdError)
        if type(exc).__module__.split(".")[0] != "zstandard":
            raise
        raise InputError(f"cannot read {path}: {exc}") from None
    finally:
        stream.close()


def text_lines(path: str) -> Iterator[tuple[int, str]]:
    """As ``lines``, decoded as UTF-8 (a BOM at the start is dropped); a line that is not
    UTF-8 is an InputError naming the file and line."""
    for number, raw in lines(path):
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            yield number, raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{path}:{number}: not UTF-8 text") from None
