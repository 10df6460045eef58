"""The simulated model's replies: how many tokens, and text of exactly that many.

Output length follows the request's token fields (COMPAT §5.1 names and the SGLang ones).
The cap is ``max_tokens`` (or ``max_new_tokens`` / ``max_completion_tokens``), else the
server's default raised to the floor when only a floor is given. The floor is
``min_tokens`` (or ``min_new_tokens``) clipped to the cap. With ``ignore_eos``, or a floor
at the cap, the reply is exactly the cap; otherwise the model "stops at EOS" at a length
drawn uniformly from [max(floor, 1), cap]. Every draw and every text is seeded from a
stable digest of the request's user tag, prompt length and cap, so the same request gets
the same reply in every run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from batchbench.synth import Synthesizer, draw_indices

REPLY_SEED_SALT = b"batchbench-sim-reply"


class RequestError(ValueError):
    """A request body the simulator rejects with HTTP 400 (message sent to the client)."""


@dataclass(frozen=True)
class OutputPlan:
    tokens: int
    cap: int
    seed: int

    @property
    def finish_reason(self) -> str:
        return "length" if self.tokens >= self.cap else "stop"


def _token_field(body: dict[str, Any], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if type(value) is not int or value < 0:
            raise RequestError(f"{name} must be a non-negative integer")
        return value
    return None


def plan_output(
    body: dict[str, Any], prompt_tokens: int, default_max_tokens: int, tag: str
) -> OutputPlan:
    """How many tokens the reply has, and the seed of its text."""
    cap = _token_field(body, ("max_tokens", "max_new_tokens", "max_completion_tokens"))
    floor = _token_field(body, ("min_tokens", "min_new_tokens")) or 0
    if cap is None:
        cap = max(default_max_tokens, floor)  # a floor alone raises the default cap
    if cap <= 0:
        raise RequestError("max_tokens must be greater than zero")
    floor = min(floor, cap)
    digest = hashlib.blake2b(
        f"{tag}\x00{prompt_tokens}\x00{cap}".encode("utf-8", "surrogatepass"),
        digest_size=8,
        key=REPLY_SEED_SALT,
    ).digest()
    seed = int.from_bytes(digest, "big")
    if body.get("ignore_eos") is True or floor >= cap:
        return OutputPlan(cap, cap, seed)
    low = max(floor, 1)
    tokens = low + int(draw_indices(seed ^ 0xE05, 1, cap - low + 1)[0])
    return OutputPlan(tokens, cap, seed)


class ReplyText:
    """Exact-length reply text, whole or cut into chunks of whole tokens for streaming."""

    def __init__(self, synthesizer: Synthesizer) -> None:
        self._synth = synthesizer
        self._tokenizer = synthesizer.loaded.tokenizer

    def whole(self, tokens: int, seed: int) -> str:
        return self._synth.text(tokens, seed)

    def chunks(self, tokens: int, seed: int, per_chunk: int) -> list[str]:
        """Pieces of ``per_chunk`` tokens (the last may be shorter) that join to ``tokens``.

        With fast pieces, texts join without changing their token counts, so each chunk
        is generated on its own; otherwise one exact text is cut at token offsets, and a
        piece may then be empty (and the next hold more tokens) where a character spans
        several tokens.
        """
        if tokens <= 0:
            return []
        sizes = [per_chunk] * (tokens // per_chunk)
        if tokens % per_chunk:
            sizes.append(tokens % per_chunk)
        if self._synth.method == "fast":
            return [self._synth.text(size, seed + index) for index, size in enumerate(sizes)]
        text = self._synth.text(tokens, seed)
        offsets = self._tokenizer.encode(text, add_special_tokens=False).offsets
        out, start, position = [], 0, 0
        for size in sizes[:-1]:
            position += size
            end = offsets[position][0]
            out.append(text[start:end])
            start = end
        out.append(text[start:])
        # A character can span several byte-level tokens: a cut inside it moves to its
        # end and can leave an empty piece, which the server paces but does not send.
        return out
