"""Before the run, with perfect routing: does every rank index reach a worker?

smg reads ``X-SMG-Target-Worker: i`` as its i-th worker in registration order and answers
an index past its last worker with 503 ``no_available_workers``; a run with more ranks than
workers would fail every agent of the missing ranks, with no hint why. One 1-token probe
per rank index, carrying that rank's headers as the run's requests will, finds this before
anything starts; the worker each probe's reply names (``x-smg-routed-worker-id``) gives the
banner its rank -> worker layout.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
import orjson

from batchbench.drive.preflight import (
    PREFLIGHT_TIMEOUT_SECONDS,
    SKIP_HINT,
    PreflightError,
    one_token_body,
)
from batchbench.drive.replyerror import ERROR_BODY_LIMIT
from batchbench.drive.transport import ResponseTooLargeError, read_limited
from batchbench.drive.wire import BodyOptions, http_error_text, request_headers
from batchbench.secrets import redact

# smg's header naming why it refused a request, and the code for "no worker at that index".
ERROR_CODE_HEADER = "x-smg-error-code"
NO_WORKERS = "no_available_workers"
# Answers that mean "not now" rather than "no such rank" (as the preflight treats them).
BUSY_STATUSES = frozenset({408, 409, 429})


@dataclass(frozen=True)
class RankLayout:
    """Per rank index, the worker its probe reached (None: the reply named none), and
    warnings for indices that were busy rather than refused."""

    workers: tuple[str | None, ...]
    notes: tuple[str, ...] = ()

    @property
    def probes(self) -> int:
        return len(self.workers)


@dataclass(frozen=True)
class _Answer:
    status: int
    worker: str | None
    code: str | None
    raw: bytes


async def probe_ranks(
    session: aiohttp.ClientSession,
    endpoint_url: str,
    api_key: str | None,
    ranks: int,
    rank_header: str,
    worker_header: str,
    model: str,
    options: BodyOptions,
) -> RankLayout:
    """One probe per rank index, all at once; raises PreflightError naming the lowest
    index that was refused or could not be sent, and the gateway's answer."""
    body = one_token_body(model, options)
    answers = await asyncio.gather(
        *(
            _probe(
                session,
                endpoint_url,
                request_headers(api_key, None, i, rank_header),
                body,
                worker_header,
            )
            for i in range(ranks)
        ),
        return_exceptions=True,
    )
    workers: list[str | None] = []
    notes: list[str] = []
    for index, answer in enumerate(answers):
        if isinstance(answer, BaseException):
            if not isinstance(answer, Exception):
                raise answer
            reason = str(answer) or type(answer).__name__
            raise PreflightError(
                f"rank {index}: the probe got no answer from {endpoint_url}: {reason} ({SKIP_HINT})"
            )
        if answer.status in BUSY_STATUSES and answer.code != NO_WORKERS:
            # busy or rate-limited now, not refused: the run's retries handle it
            notes.append(
                f"warning: the rank {index} probe was answered "
                f"{http_error_text(answer.status, answer.raw)}; the run goes on"
            )
        elif not 200 <= answer.status < 300:
            raise PreflightError(refusal_text(index, ranks, answer.status, answer.code, answer.raw))
        workers.append(answer.worker)
    return RankLayout(tuple(workers), tuple(notes))


async def _probe(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    body: bytes,
    worker_header: str,
) -> _Answer:
    timeout = aiohttp.ClientTimeout(total=max(PREFLIGHT_TIMEOUT_SECONDS, 60.0))
    async with session.post(url, data=body, headers=headers, timeout=timeout) as response:
        try:
            raw = await read_limited(response)
        except ResponseTooLargeError:
            raw = b""  # it answered; the status tells whether the index was taken
        return _Answer(
            response.status,
            response.headers.get(worker_header),
            response.headers.get(ERROR_CODE_HEADER),
            raw,
        )


def _one_line(text: str) -> str:
    """A server's words as one line, cut at the error-body limit, any secret redacted."""
    text = " ".join(redact(text).split())
    return text[:ERROR_BODY_LIMIT] + "..." if len(text) > ERROR_BODY_LIMIT else text


def refusal_text(index: int, ranks: int, status: int, code: str | None, raw: bytes) -> str:
    """``rank i: the gateway answered <status> <code> (<message>)``, and when the index is
    past the workers the gateway has, the flag and the count that explain it."""
    message = None
    try:
        error = orjson.loads(raw).get("error")
        if isinstance(error, dict):
            code = code or (str(error["code"]) if error.get("code") else None)
            message = str(error["message"]) if error.get("message") else None
    except (orjson.JSONDecodeError, AttributeError):
        pass
    if code is None:
        return f"rank {index}: the gateway answered {http_error_text(status, raw)} ({SKIP_HINT})"
    answer = f"{status} {_one_line(code)}" + (f" ({_one_line(message)})" if message else "")
    if code == NO_WORKERS and index == 0:
        return f"rank 0: the gateway answered {answer}: it has no worker to send to"
    if code == NO_WORKERS:
        return (
            f"rank {index}: the gateway answered {answer}: --dp-rank-perfect-routing-num "
            f"{ranks} is more than its {index} "
            f"{'worker' if index == 1 else 'workers'}"
        )
    return f"rank {index}: the gateway answered {answer} ({SKIP_HINT})"
