"""Live calibration: measure the server's framing overheads with probes built like real turns.

A probe is a growth conversation exactly as the driver builds it: a user message, then
per turn the assistant's reply carrying the synthetic ``environment`` tool call and the
tool result answering it, with the run's body options (token fields, ``ignore_eos``,
streaming) and ``max_tokens`` 1. Every content is exact-length synthetic text, so the
server's ``usage.prompt_tokens`` gives

    initial overhead = prompt(request 1) - user tokens
    turn overhead    = prompt(request 2) - prompt(request 1) - reply tokens - tool tokens

Three probes of different sizes must agree; a fourth conversation of one user message and
four turns checks the model: its every prompt is predicted and compared with the served
count.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

from batchbench.drive.transport import ResponseTooLargeError, limited_reads, read_limited
from batchbench.drive.wire import (
    MISSING_USAGE,
    NO_STREAM_USAGE,
    BodyOptions,
    Conversation,
    Reply,
    ResponseError,
    StreamAssembler,
    assistant_with_tool_call,
    body_tail,
    http_error_text,
    is_retryable_status,
    parse_response,
    parse_retry_after,
    tool_call_id,
    tool_message,
)
from batchbench.errors import BatchbenchError
from batchbench.text.replycount import ReplyAccounting
from batchbench.text.synth import Synthesizer

# (user, reply, tool) tokens of the three solving probes.
PROBE_SIZES = ((37, 11, 23), (64, 24, 48), (120, 8, 160))
# The check conversation: a user message, then (reply, tool) tokens per turn.
CHECK_USER = 50
CHECK_TURNS = ((13, 40), (7, 9), (30, 70), (5, 21))
PROBE_SEED = 0xCA11_B8A7_E000_0000
PROBE_TAG = "batchbench-calibrate"
ATTEMPTS = 4
BACKOFF_SECONDS = 0.25


class CalibrationError(BatchbenchError):
    """The server could not be calibrated (unreachable, errors, or no usage: ``no_usage``)."""

    def __init__(self, message: str, no_usage: bool = False) -> None:
        super().__init__(message)
        self.no_usage = no_usage


@dataclass(frozen=True)
class Calibration:
    """The measured overheads and the check that they predict the server."""

    initial: int
    turn: int
    initial_seen: tuple[int, ...]
    turn_seen: tuple[int, ...]
    check_planned: tuple[int, ...] = field(default_factory=tuple)
    check_served: tuple[int, ...] = field(default_factory=tuple)
    seconds: float = 0.0
    requests: int = 0  # probe requests sent, retries included (the banner counts them)

    @property
    def consistent(self) -> bool:
        return len(set(self.initial_seen)) == 1 and len(set(self.turn_seen)) == 1

    @property
    def check_ok(self) -> bool:
        return self.check_planned == self.check_served

    def lines(self, url: str) -> list[str]:
        """What ``batchbench calibrate`` prints."""
        lines = [
            f"Calibrated against {url}: initial overhead {self.initial} tokens, "
            f"turn overhead {self.turn} tokens ({self.seconds:.2f}s)"
        ]
        if not self.consistent:
            lines.append(
                "warning: the probes disagree (initial "
                f"{list(self.initial_seen)}, turn {list(self.turn_seen)}); using the most "
                "frequent values, and prompt correction will absorb the rest"
            )
        verdict = "OK" if self.check_ok else "MISMATCH"
        lines.append(
            f"Check (1 user message + {len(CHECK_TURNS)} turns): planned "
            f"{list(self.check_planned)}, served {list(self.check_served)} -> {verdict}"
        )
        lines.append(
            f"flags: --replay-initial-overhead-tokens {self.initial} "
            f"--replay-turn-overhead-tokens {self.turn}"
        )
        return lines

    def as_dict(self) -> dict:
        return {
            "initial_overhead_tokens": self.initial,
            "turn_overhead_tokens": self.turn,
            "initial_observations": list(self.initial_seen),
            "turn_observations": list(self.turn_seen),
            "check_planned_prompt_tokens": list(self.check_planned),
            "check_served_prompt_tokens": list(self.check_served),
            "check_ok": self.check_ok,
            "seconds": self.seconds,
        }


class _Prober:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        headers: dict[str, str],
        options: BodyOptions,
        synth: Synthesizer,
        replies: ReplyAccounting,
        user_tagging: bool,
    ) -> None:
        self.session = session
        self.url = url
        self.headers = headers
        self.options = options
        self.synth = synth
        self.replies = replies
        self.tag = PROBE_TAG if user_tagging else None
        self.seed = PROBE_SEED
        self.sent = 0  # requests sent, retries included

    def text(self, tokens: int) -> str:
        self.seed += 1
        return self.synth.text(tokens, self.seed)

    async def served(self, conversation: Conversation) -> int:
        """``usage.prompt_tokens`` of one probe request. Transport errors, retryable
        statuses and unusable bodies are retried with backoff (``Retry-After`` honoured);
        a server that keeps answering without usage cannot be calibrated."""
        body = conversation.body(body_tail(self.options, 1, self.tag))
        error = ""
        for attempt in range(ATTEMPTS):
            wait = None
            try:
                return (await self._post(body)).prompt_tokens
            except ResponseError as exc:
                if attempt == ATTEMPTS - 1 and str(exc) in (MISSING_USAGE, NO_STREAM_USAGE):
                    raise CalibrationError(
                        "calibration needs usage.prompt_tokens in every response, and "
                        f"{self.url} sent none ({exc})",
                        no_usage=True,
                    ) from None
                error = str(exc)
            except _Status as exc:
                if not exc.retryable:
                    raise CalibrationError(f"calibration probe failed: {exc}") from None
                error, wait = str(exc), exc.retry_after
            except (aiohttp.ClientError, OSError, TimeoutError, ResponseTooLargeError) as exc:
                error = str(exc) or type(exc).__name__
            if attempt < ATTEMPTS - 1:
                await asyncio.sleep(min(max(wait or 0.0, BACKOFF_SECONDS * 2**attempt), 30.0))
        raise CalibrationError(f"calibration probe failed: {error}")

    async def _post(self, body: bytes) -> Reply:
        self.sent += 1
        async with self.session.post(self.url, data=body, headers=self.headers) as response:
            status = response.status
            if not 200 <= status < 300:
                raise _Status(
                    status, await read_limited(response), response.headers.get("Retry-After")
                )
            if not self.options.stream:
                return parse_response(await read_limited(response))
            assembler = StreamAssembler()
            assembler.heard_type(response.headers.get("Content-Type"))
            async for data in limited_reads(response):
                assembler.feed(data, time.perf_counter())
            return assembler.finish(time.perf_counter())

    def append_turn(self, conversation: Conversation, invocation: int, reply: int, tool: int):
        """Append one turn as the driver does; returns (rendered reply tokens, tool tokens)."""
        reply_text = self.text(reply)
        call = tool_call_id(0, invocation)
        conversation.append(
            assistant_with_tool_call({"role": "assistant", "content": reply_text}, call),
            tool_message(call, self.text(tool)),
        )
        return self.replies.count(reply_text), tool


class _Status(Exception):
    def __init__(self, status: int, body: bytes, retry_after: str | None = None) -> None:
        super().__init__(http_error_text(status, body))
        self.retryable = is_retryable_status(status)
        self.retry_after = parse_retry_after(retry_after) if status in (429, 503) else None


def _most_common(values: list[int]) -> int:
    return Counter(values).most_common(1)[0][0]


async def calibrate(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    options: BodyOptions,
    synth: Synthesizer,
    replies: ReplyAccounting,
    user_tagging: bool = True,
) -> Calibration:
    """Solve the initial and per-turn overhead from probes; raises CalibrationError."""
    started = time.perf_counter()
    prober = _Prober(session, url, headers, options, synth, replies, user_tagging)
    initials: list[int] = []
    turns: list[int] = []
    for user, reply, tool in PROBE_SIZES:
        conversation = Conversation(options.model)
        conversation.reset(prober.text(user))
        first = await prober.served(conversation)
        initials.append(first - user)
        rendered, tool_tokens = prober.append_turn(conversation, 1, reply, tool)
        second = await prober.served(conversation)
        turns.append(second - first - rendered - tool_tokens)
    initial, turn = _most_common(initials), _most_common(turns)

    conversation = Conversation(options.model)
    conversation.reset(prober.text(CHECK_USER))
    planned = [CHECK_USER + initial]
    served = [await prober.served(conversation)]
    for invocation, (reply, tool) in enumerate(CHECK_TURNS, start=1):
        rendered, tool_tokens = prober.append_turn(conversation, invocation, reply, tool)
        planned.append(planned[-1] + rendered + tool_tokens + turn)
        served.append(await prober.served(conversation))
    return Calibration(
        initial,
        turn,
        tuple(initials),
        tuple(turns),
        tuple(planned),
        tuple(served),
        time.perf_counter() - started,
        prober.sent,
    )
