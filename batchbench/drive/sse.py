"""The SSE scanner of streamed chat completions, compiled when built, else its twin.

``SseScanner()`` takes network reads (``feed(data: bytes, arrived: float)``) and, once the
stream ended, ``flush()`` for an unterminated last line. It keeps what a reply needs:
``chunks`` (JSON payloads), ``content`` and ``reasoning`` (the non-empty texts of
``choices[0].delta.content`` / ``.reasoning_content`` or ``.reasoning``, the field named
by ``reasoning_key``), ``times`` (the arrival of each
chunk that carried text: TTFT and inter-token gaps), ``usage`` (the last non-null one),
``done`` (``data: [DONE]`` seen) and ``parsed`` (chunks that needed a full JSON parse).
An invalid JSON payload raises ``ResponseError(BAD_CHUNK)``.

Lines end at ``\\n`` (a ``\\r`` before it is stripped with the payload's whitespace); only
lines starting ``data:`` count; comments, ``event:``, ``id:`` and empty payloads are skipped.

Why most chunks need no JSON parse, exactly: a chunk that was parsed, has no usage, no
backslash, exactly one ``content`` (or ``reasoning_content``, or ``reasoning``) key with
a string value, and no text in the other field, becomes a template ``prefix "TEXT"
suffix``. A later payload that starts with that prefix and ends with that suffix, with a
middle free of quotes, backslashes and control characters that is valid UTF-8, is that
same valid JSON document with only the string changed, so a parse would give the same
chunk with the middle as its text. Anything else (escapes, usage, tool calls, the finish
chunk) takes the full orjson parse. Servers repeat id/model/created across a stream's
chunks, so nearly every content chunk fits; a template is per stream and learning stops
after a few misses.
"""

from __future__ import annotations

from batchbench import _impl

if _impl.NO_EXTENSIONS:
    from batchbench.drive import _sse_py as _backend
else:
    try:
        # mypy types _backend as the twin (same API, batchbench/_native/_sse.pyi)
        from batchbench._native import _sse as _backend  # type: ignore[no-redef]
    except ImportError:  # not built: the twin has the same API and results
        from batchbench.drive import _sse_py as _backend

SseScanner = _backend.SseScanner
IMPLEMENTATION = "native" if _backend.__name__.endswith("._native._sse") else "python"

__all__ = ["IMPLEMENTATION", "SseScanner"]
