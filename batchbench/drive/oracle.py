"""``--prompt-oracle server``: ask the server how many tokens a conversation will cost.

Some servers count a whole conversation through their own chat template without running
it: vLLM's ``POST /tokenize`` with ``messages`` (answering ``{"count": …}``), and
llama.cpp's ``POST /apply-template`` followed by ``POST /tokenize`` of the rendered prompt
with ``add_special``. The driver sizes each request's new content against that count
before sending it, so even framing the client cannot predict costs nothing. The protocol
is detected once, with a one-message probe, before the run starts.
"""

from __future__ import annotations

import time
from typing import Literal, TypeGuard
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from batchbench.drive.transport import ResponseTooLargeError, read_limited
from batchbench.errors import BatchbenchError

Protocol = Literal["vllm", "llamacpp"]
PROBE_BODY = b'{"messages":[{"role":"user","content":"hello"}],"add_generation_prompt":true}'
# Server counts per request at most: the first, then resized ones.
ORACLE_ROUNDS = 3


class OracleError(BatchbenchError):
    """The server cannot count conversations, or a count request failed."""


def server_root(endpoint_url: str) -> str:
    """``scheme://host:port`` of the chat endpoint: where both protocols live."""
    parts = urlsplit(endpoint_url)
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


class PromptOracle:
    """Counts conversations on the server; ``count`` takes a ``tokenize_body`` (see
    ``batchbench.drive.wire.Conversation``) and returns the prompt tokens it would cost."""

    def __init__(self, session: aiohttp.ClientSession, root: str, headers: dict[str, str]) -> None:
        self._session = session
        self._root = root.rstrip("/")
        self._headers = headers
        self.protocol: Protocol | None = None
        self.queries = 0
        self.seconds = 0.0

    async def _post(self, path: str, body: bytes) -> tuple[int, object]:
        async with self._session.post(self._root + path, data=body, headers=self._headers) as r:
            raw = await read_limited(r)
            try:
                return r.status, orjson.loads(raw)
            except orjson.JSONDecodeError:
                return r.status, None

    async def detect(self) -> Protocol:
        """Find which protocol the server speaks; ``OracleError`` naming both when none."""
        try:
            status, document = await self._post("/tokenize", PROBE_BODY)
            if status == 200 and isinstance(document, dict) and _is_count(document.get("count")):
                self.protocol = "vllm"
                return self.protocol
            status, document = await self._post("/apply-template", PROBE_BODY)
            if (
                status == 200
                and isinstance(document, dict)
                and isinstance(document.get("prompt"), str)
            ):
                self.protocol = "llamacpp"
                return self.protocol
        except (aiohttp.ClientError, OSError, TimeoutError, ResponseTooLargeError) as exc:
            detail = str(exc) or type(exc).__name__
            raise OracleError(
                f"--prompt-oracle server: cannot reach {self._root}: {detail}"
            ) from None
        raise OracleError(
            f"--prompt-oracle server: {self._root} counts no conversations (neither vLLM's "
            "POST /tokenize with messages nor llama.cpp's POST /apply-template answered); "
            "run without --prompt-oracle"
        )

    async def count(self, tokenize_body: bytes) -> int:
        """The server's prompt-token count of the conversation in ``tokenize_body``."""
        started = time.perf_counter()
        try:
            if self.protocol == "llamacpp":
                status, document = await self._post("/apply-template", tokenize_body)
                prompt = document.get("prompt") if isinstance(document, dict) else None
                if status != 200 or not isinstance(prompt, str):
                    raise OracleError(f"/apply-template answered {status}")
                body = orjson.dumps({"content": prompt, "add_special": True, "parse_special": True})
                status, document = await self._post("/tokenize", body)
                tokens = document.get("tokens") if isinstance(document, dict) else None
                if status != 200 or not isinstance(tokens, list):
                    raise OracleError(f"/tokenize answered {status}")
                return len(tokens)
            status, document = await self._post("/tokenize", tokenize_body)
            count = document.get("count") if isinstance(document, dict) else None
            if status != 200 or not _is_count(count):
                raise OracleError(f"/tokenize answered {status}")
            return count
        except (aiohttp.ClientError, OSError, TimeoutError, ResponseTooLargeError) as exc:
            raise OracleError(f"count request failed: {str(exc) or type(exc).__name__}") from None
        finally:
            self.queries += 1
            self.seconds += time.perf_counter() - started


def _is_count(value: object) -> TypeGuard[int]:
    return type(value) is int and value >= 0
