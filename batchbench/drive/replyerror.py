"""What makes a 2xx reply unusable, shared by ``wire`` (whole bodies) and the SSE scanner
(streamed chunks, both implementations): the error it raises and the text of a server's own
error. Apart from ``wire`` because ``wire`` imports the scanner."""

from __future__ import annotations

import orjson

from batchbench.results.failures import ErrorKind
from batchbench.secrets import redact

BAD_CHUNK = "invalid JSON in streamed response chunk"
ERROR_BODY_LIMIT = 500


class ResponseError(Exception):
    """A 2xx response that cannot be used (retried like a 5xx); ``kind`` classifies it."""

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.MALFORMED_JSON) -> None:
        super().__init__(message)
        self.kind = kind


def server_error_text(payload: bytes | str | dict | list | None) -> str:
    """The message a server put in an error (``{"error":{"message":…}}``, ``{"error":
    "…"}``, ``{"message":…}`` or plain text), cut at 500 characters."""
    document = payload
    if isinstance(payload, bytes | str):
        try:
            document = orjson.loads(payload)
        except orjson.JSONDecodeError:
            document = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
    if isinstance(document, dict):
        inner = document.get("error", document)
        if isinstance(inner, dict):
            message = inner.get("message")
            document = message if isinstance(message, str) else inner
        else:
            document = inner
    if not isinstance(document, str):
        document = orjson.dumps(document).decode()
    text = redact(document).strip() or "(no message)"
    return text[:ERROR_BODY_LIMIT] + "..." if len(text) > ERROR_BODY_LIMIT else text
