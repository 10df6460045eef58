"""Before the first agent starts: is the target there, does it take the key, which model does
it serve, and does the chat endpoint answer? Two small requests (the model list, then a
completion of one token) turn a wrong host, port, path, model or key into one clear error
within seconds instead of a run of failures."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from batchbench.drive.transport import ResponseTooLargeError, read_limited
from batchbench.drive.wire import (
    BodyOptions,
    Conversation,
    body_tail,
    http_error_text,
    is_retryable_status,
)
from batchbench.errors import BatchbenchError, UsageError

PREFLIGHT_TIMEOUT_SECONDS = 10.0
SKIP_HINT = "--no-preflight skips this check"
MODEL_CHOSEN_NOTE = "note: --model not given; using"  # not printed for --sim: its one model


class PreflightError(BatchbenchError):
    """The target cannot serve the run."""


@dataclass(frozen=True)
class Preflight:
    """What the check learned: the model to send, and notes for the user."""

    model: str
    models: tuple[str, ...] | None  # what the server lists; None when it keeps no list
    notes: tuple[str, ...] = field(default=())


def models_url(endpoint_url: str) -> str:
    """The model list beside the chat endpoint: ``…/v1/chat/completions`` → ``…/v1/models``."""
    parts = urlsplit(endpoint_url)
    path = parts.path.rstrip("/")
    for suffix in ("/chat/completions", "/completions"):
        if path.endswith(suffix):
            return urlunsplit(
                (parts.scheme, parts.netloc, path[: -len(suffix)] + "/models", "", "")
            )
    return urlunsplit((parts.scheme, parts.netloc, "/v1/models", "", ""))


async def preflight(
    session: aiohttp.ClientSession,
    endpoint_url: str,
    headers: dict[str, str],
    model: str | None,
    options: BodyOptions,
    key_source: str,
) -> Preflight:
    """Check the target; raises PreflightError (unreachable, refused, wrong path) or
    UsageError (no --model and no single model to use)."""
    url = models_url(endpoint_url)
    models = await _list_models(session, url, headers, key_source)
    notes: list[str] = []
    if model is None:
        if models is None:
            raise UsageError(
                f"give --model: the server keeps no model list at {url} to choose one from"
            )
        if len(models) != 1:
            listed = ", ".join(models) if models else "none"
            raise UsageError(f"give --model: the server lists {len(models)} models ({listed})")
        model = models[0]
        notes.append(f"{MODEL_CHOSEN_NOTE} {model}, the one model the server lists")
    elif models is not None and model not in models:
        notes.append(
            f"warning: the server does not list model {model!r} (it lists: "
            f"{', '.join(models) or 'none'}); requests may fail"
        )
    await _one_token(session, endpoint_url, headers, model, options, key_source, notes)
    return Preflight(model, tuple(models) if models is not None else None, tuple(notes))


async def _list_models(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], key_source: str
) -> list[str] | None:
    timeout = aiohttp.ClientTimeout(total=PREFLIGHT_TIMEOUT_SECONDS)
    try:
        async with session.get(url, headers=headers, timeout=timeout) as response:
            status, raw = response.status, await read_limited(response)
    except TimeoutError:
        raise PreflightError(
            f"no answer from {url} within {PREFLIGHT_TIMEOUT_SECONDS:g}s; is the server "
            f"up? ({SKIP_HINT})"
        ) from None
    except (aiohttp.ClientError, OSError) as exc:
        reason = str(exc) or type(exc).__name__
        raise PreflightError(
            f"cannot reach {url}: {reason}; check --host and that the server is running "
            f"({SKIP_HINT})"
        ) from None
    except ResponseTooLargeError:
        return None  # no usable list: as a server that lists none
    _refused(status, raw, url, key_source)
    if status != 200:
        return None
    try:
        document = orjson.loads(raw)
        return [str(entry["id"]) for entry in document["data"]]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


async def _one_token(
    session: aiohttp.ClientSession,
    endpoint_url: str,
    headers: dict[str, str],
    model: str,
    options: BodyOptions,
    key_source: str,
    notes: list[str],
) -> None:
    """One completion of one token must succeed (a 5xx, 408, 409 or 429 is only a warning:
    the server may be busy or warming up, and the run retries those)."""
    body = one_token_body(model, options)
    timeout = aiohttp.ClientTimeout(total=max(PREFLIGHT_TIMEOUT_SECONDS, 60.0))
    try:
        async with session.post(endpoint_url, data=body, headers=headers, timeout=timeout) as r:
            status, raw = r.status, await read_limited(r)
    except TimeoutError:
        raise PreflightError(
            f"a 1-token completion at {endpoint_url} got no answer in time ({SKIP_HINT})"
        ) from None
    except (aiohttp.ClientError, OSError) as exc:
        reason = str(exc) or type(exc).__name__
        raise PreflightError(f"cannot reach {endpoint_url}: {reason} ({SKIP_HINT})") from None
    except ResponseTooLargeError as exc:  # it answers; the run's requests will tell more
        notes.append(
            f"warning: a 1-token completion at {endpoint_url} failed: {exc}; the run goes on"
        )
        return
    _refused(status, raw, endpoint_url, key_source)
    if 200 <= status < 300:
        return
    if is_retryable_status(status):  # busy or rate-limited now: the run's retries handle it
        notes.append(
            f"warning: a 1-token completion at {endpoint_url} failed: "
            f"{http_error_text(status, raw)}; the run goes on"
        )
        return
    raise PreflightError(
        f"{endpoint_url} does not serve chat completions: {http_error_text(status, raw)}; "
        f"check --host, --endpoint and --model ({SKIP_HINT})"
    )


def one_token_body(model: str, options: BodyOptions) -> bytes:
    """A "Hello" asking for one token, not streamed, with the run's token fields."""
    conversation = Conversation(model)
    conversation.reset("Hello")
    single = BodyOptions(
        model=model, sglang=options.sglang, ignore_eos=options.ignore_eos, stream=False
    )
    return conversation.body(body_tail(single, 1, None))


def _refused(status: int, raw: bytes, url: str, key_source: str) -> None:
    if status in (401, 403):
        raise PreflightError(
            f"{url} refused the request: {http_error_text(status, raw)}; check the API key "
            f"({key_source})"
        )
