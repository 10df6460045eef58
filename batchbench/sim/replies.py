"""The simulated model's replies: how many tokens, and text of exactly that many.

Output length follows the request's token fields (the OpenAI-style names and the SGLang ones).
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
import re
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from batchbench.text.synth import Synthesizer, draw_indices
from batchbench.text.tokenizer import LoadedTokenizer

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


# Streams that decide whether and how long a reply thinks; THINKING salts its text's seed.
_THINKS, _ALL_THOUGHT, _THOUGHT = 0x7111, 0xA11, 0x7406
THINKING = 0x7E1C


def reasoning_tokens(output: OutputPlan, share: float) -> int:
    """How many of the reply's tokens are reasoning (``--reasoning-share``): none for most
    replies; for a thinking one, all of them one time in four (the content is then empty,
    as when a model answers with a tool call only), else between 1 and all but one."""
    if share <= 0.0 or output.tokens <= 0:
        return 0
    if int(draw_indices(output.seed ^ _THINKS, 1, 1_000_000)[0]) >= share * 1_000_000:
        return 0
    if output.tokens == 1 or int(draw_indices(output.seed ^ _ALL_THOUGHT, 1, 4)[0]) == 0:
        return output.tokens
    return 1 + int(draw_indices(output.seed ^ _THOUGHT, 1, output.tokens - 1)[0])


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
            # Only the first chunk starts with a head; the others start with a spaced
            # piece, so the chunks join without changing any count.
            return [
                self._synth.text(size, seed + index, head=index == 0)
                for index, size in enumerate(sizes)
            ]
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


class Replies(Protocol):
    """Reply text of a given token count: whole, or cut into chunks for streaming."""

    def whole(self, tokens: int, seed: int) -> str: ...

    def chunks(self, tokens: int, seed: int, per_chunk: int) -> list[str]: ...


# Characters a model's token may hold besides printable text.
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ufffd]")
# Streams that decide a reply's shape, mixed into its seed.
_LEADING, _TRAILING, _IDS = 0x1EAD, 0x7A11, 0x1D5


class ModelReplyText:
    """Replies as a model's would be: token ids decoded to text, not text of a count.

    A reply of k tokens is k ids drawn from the vocabulary (none special or added, none
    whose text holds a control character or an undecodable byte); its text is each id's
    string as it decodes inside a sequence, joined. ``completion_tokens`` is k, but the
    text need not re-encode to k tokens: neighbouring sub-words merge, as a real model's
    sampled tokens often do. A quarter of the replies start with a whitespace token and a
    quarter end with a newline, as models' replies do; chat templates that trim drop them.
    Everything is seeded by the request, so a request gets the same reply in every run.
    """

    def __init__(self, loaded: LoadedTokenizer) -> None:
        tokenizer = loaded.tokenizer
        excluded = loaded.added_ids | loaded.special_ids
        ids = [i for i in range(loaded.base_vocab_size) if i not in excluded]
        anchor = self._anchor(loaded, ids)
        prefix = tokenizer.decode([anchor], skip_special_tokens=False)
        inside = tokenizer.decode_batch([[anchor, i] for i in ids], skip_special_tokens=False)
        alone = tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)
        words: list[str] = []
        firsts: list[str] = []
        spaces: list[tuple[int, str]] = []
        newlines: list[tuple[int, str]] = []
        for token_id, pair, single in zip(ids, inside, alone, strict=True):
            if not pair.startswith(prefix):
                continue
            text = pair[len(prefix) :]
            if not text or _UNPRINTABLE.search(text):
                continue
            if text.isspace():
                (newlines if "\n" in text else spaces).append((token_id, text))
            elif single and not _UNPRINTABLE.search(single):
                words.append(text)
                firsts.append(single)
        if not words:
            raise ValueError(f"{loaded.spec} has no token that decodes to printable text")
        self._words = np.array(words, dtype=object)
        # A model's first token rarely starts with a space: the first token comes from
        # the ids whose text, first in a sequence, starts with a visible character.
        self._firsts = np.array([f for f in firsts if not f[0].isspace()] or firsts, dtype=object)
        # Each id's string is computed once: a reply costs a few draws and a join.
        self._newlines = [text for _, text in newlines] or ["\n"]
        self._whitespace = ([text for _, text in spaces] or [" "]) + self._newlines

    @staticmethod
    def _anchor(loaded: LoadedTokenizer, ids: list[int]) -> int:
        """A plain alphabetic token to decode others after (so their leading spaces stay)."""
        for token_id in ids:
            text = loaded.tokenizer.decode([token_id], skip_special_tokens=False)
            if text.isalpha() and text.isascii():
                return token_id
        return ids[0]

    def _strings(self, tokens: int, seed: int) -> list[str]:
        """The reply's tokens as strings, in order."""
        if tokens <= 0:
            return []
        picks = draw_indices(seed ^ _IDS, tokens, len(self._words))
        first = int(draw_indices(seed ^ _IDS, 1, len(self._firsts))[0])
        strings = self._words[picks].tolist()
        strings[0] = self._firsts[first]
        if int(draw_indices(seed ^ _LEADING, 1, 4)[0]) == 0:
            whitespace = self._whitespace
            strings[0] = whitespace[int(draw_indices(seed, 1, len(whitespace))[0])]
        if tokens > 1 and int(draw_indices(seed ^ _TRAILING, 1, 4)[0]) == 0:
            strings[-1] = self._newlines[int(draw_indices(seed ^ 1, 1, len(self._newlines))[0])]
        return strings

    def whole(self, tokens: int, seed: int) -> str:
        return "".join(self._strings(tokens, seed))

    def chunks(self, tokens: int, seed: int, per_chunk: int) -> list[str]:
        """The same text as ``whole``, cut after every ``per_chunk`` tokens."""
        strings = self._strings(tokens, seed)
        return ["".join(strings[i : i + per_chunk]) for i in range(0, len(strings), per_chunk)]
