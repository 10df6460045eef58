"""What went wrong, classified: every failed attempt gets a kind, its HTTP status when it
had one, and its message; a tally counts them by kind with one example each."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import NotRequired, TypedDict

from batchbench.secrets import redact


class ErrorKind(StrEnum):
    """The kind of a failed attempt (or of a request that never got one)."""

    HTTP_STATUS = "http_status"  # a non-2xx answer; the status is kept
    TIMEOUT = "timeout"  # the attempt took longer than --request-timeout-secs
    CONNECT = "connect"  # no connection: refused, unreachable, DNS, TLS handshake
    DISCONNECT = "disconnect"  # the connection closed while the answer was on its way
    TRUNCATED_STREAM = "truncated_stream"  # a stream that ended before [DONE] and usage
    MALFORMED_JSON = "malformed_json"  # a 2xx body or stream chunk that is not usable JSON
    MISSING_USAGE = "missing_usage"  # a 2xx answer without usage counts
    CANCELLED = "cancelled"  # cut short by Ctrl+C / SIGTERM (in flight or waiting to retry)
    INVALID_REQUEST = "invalid_request"  # the client could not build the request
    INVALID_REDIRECT = "invalid_redirect"  # a 3xx that cannot be followed (bad Location, loop)
    MALFORMED_USAGE = "malformed_usage"  # usage counts out of range or inconsistent
    RESPONSE_TOO_LARGE = "response_too_large"  # a body or SSE line past --max-response-bytes
    SERVER_ERROR = "server_error"  # a 2xx answer that carries the server's error message
    CLIENT_ERROR = "client_error"  # anything else unexpected inside one exchange


@dataclass(frozen=True, slots=True)
class AttemptError:
    """One failed attempt of a request."""

    attempt: int  # 1-based; 0 when the request was never sent
    kind: ErrorKind
    message: str
    status: int | None = None  # HTTP status for http_status
    # A gateway's code saying no worker behind the request's rank answers (see
    # ``batchbench.drive.failover``); kept for the run's rank bookkeeping, not written.
    down_code: str | None = None

    def __post_init__(self) -> None:
        # Every stored and printed error text passes here: a server may echo the key.
        object.__setattr__(self, "message", redact(self.message))

    def as_dict(self) -> dict[str, object]:
        return {
            "attempt": self.attempt,
            "kind": str(self.kind),
            "status": self.status,
            "message": self.message,
        }


class KindEntry(TypedDict):
    """One kind's entry in ``ErrorTally.as_dict``."""

    count: int
    example: str
    statuses: NotRequired[dict[str, int]]  # HTTP statuses only: attempts by status code


@dataclass
class ErrorTally:
    """Failed attempts by kind: counts, HTTP statuses and the first message of each kind."""

    counts: dict[str, int] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, error: AttemptError) -> None:
        kind = str(error.kind)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if kind not in self.examples:
            self.examples[kind] = error.message
        if error.status is not None:
            self.statuses[error.status] = self.statuses.get(error.status, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, KindEntry]:
        """``{kind: {"count": n, "example": message[, "statuses": {code: n}]}}`` by kind."""
        document: dict[str, KindEntry] = {}
        for kind in sorted(self.counts):
            entry: KindEntry = {"count": self.counts[kind], "example": self.examples[kind]}
            if kind == ErrorKind.HTTP_STATUS:
                entry["statuses"] = {str(s): n for s, n in sorted(self.statuses.items())}
            document[kind] = entry
        return document
