"""Seeded block content (schema v2): a block's text depends on its seed, size and role only.

The seed string alone picks the random stream (the first 8 bytes of its SHA-256, read as a
little-endian integer), so equal seeds give identical bytes in every trajectory, request
and run, whatever ``--seed`` or the content salt: that is what lets trajectories share a
system prompt or a tool definition, and a server's prefix cache hit across sessions.

Plain blocks (``system``, ``user``, ``assistant``, ``tool``) are exact-length text. Tool
blocks are sent inside JSON, and it is the JSON that must have the planned count: for
``tool_definition`` the whole compact ``tools`` entry, for ``tool_call`` the arguments
string ``{"input":"…"}``. Their text size is searched (at most 8 sizes) until the wrapped
count is exact, else the closest is kept; ``exact`` says which.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import orjson

from batchbench.errors import SynthesisError
from batchbench.plan.manifest import BLOCK_ROLES
from batchbench.text.standins import stand_in
from batchbench.text.synth import Synthesizer

ROLE_TOOL_DEFINITION = BLOCK_ROLES.index("tool_definition")
ROLE_SYSTEM = BLOCK_ROLES.index("system")
ROLE_USER = BLOCK_ROLES.index("user")
ROLE_ASSISTANT = BLOCK_ROLES.index("assistant")
ROLE_TOOL = BLOCK_ROLES.index("tool")
ROLE_TOOL_CALL = BLOCK_ROLES.index("tool_call")
JSON_ROLES = frozenset({ROLE_TOOL_DEFINITION, ROLE_TOOL_CALL})

# Distinct text sizes tried for a JSON-wrapped block before the closest is kept.
WRAPPED_TRIES = 8
# Text sizes on which wrapped counts through stand-ins are checked against whole encodes.
STAND_IN_SAMPLE_SIZES = (4, 9, 33, 120, 400)
# Sample texts (their tokens, how many, the first stream) around which a tool call's JSON
# scaffold is measured: around a text it can cost other tokens than around an empty one
# (DeepSeek-V3 encodes `{"input":""}` in one token more than it adds to a text), and a
# first guess off by one costs every call a second encode.
CALL_SAMPLE_TOKENS = 8
CALL_SAMPLES = 5
CALL_SAMPLE_STREAM = 0xCA11_5CAF


@lru_cache(maxsize=65536)
def _hex(seed: str) -> str:
    return hashlib.sha256(seed.encode("utf-8")).hexdigest()


def seed_value(seed: str) -> int:
    """The block's random stream: the first 8 bytes of SHA-256(seed), little-endian."""
    return int.from_bytes(bytes.fromhex(_hex(seed)[:16]), "little")


def function_name(seed: str) -> str:
    """``fn_`` and the first 12 hex digits of SHA-256(seed)."""
    return "fn_" + _hex(seed)[:12]


def call_id(seed: str) -> str:
    """``call_`` and the first 24 hex digits of SHA-256(seed)."""
    return "call_" + _hex(seed)[:24]


def tool_entry(seed: str, description: str) -> dict:
    """One ``tools`` entry, keys in the order they are sent."""
    return {
        "type": "function",
        "function": {
            "name": function_name(seed),
            "description": description,
            "parameters": {"type": "object", "properties": {}},
        },
    }


def call_arguments(text: str) -> str:
    """The arguments string of a ``tool_call`` block: ``{"input":<text>}``, compact."""
    return orjson.dumps({"input": text}).decode()


def tool_call(seed: str, arguments: str) -> dict:
    """One tool call of an assistant message, keys in the order they are sent."""
    return {
        "id": call_id(seed),
        "type": "function",
        "function": {"name": function_name(seed), "arguments": arguments},
    }


@dataclass(frozen=True, slots=True)
class BlockText:
    """One block's content as sent.

    ``text`` is the message content, or the description of a ``tool_definition``, or the
    arguments string of a ``tool_call``; ``tokens`` is its count as the plan measures it
    (the wrapper's for JSON blocks); ``exact`` is False when no size gave the planned count.
    """

    text: str
    tokens: int
    exact: bool = True


class BlockTexts:
    """Makes block content for one tokenizer; thread-safe.

    Shared seeds (used by more than one trajectory) are made once per run and kept; the
    others are kept by their trajectory only, so memory follows what is in flight.

    A tool block's JSON is counted around the stand-in of its text (``batchbench.text
    .standins``) when the synthesizer's texts are fast-method ones and, on sample texts,
    that gives the whole wrapper's count (``stand_ins``, checked once); else it is
    encoded whole.
    """

    def __init__(self, synth: Synthesizer, stand_ins: bool = True) -> None:
        self.synth = synth
        self._tokenizer = synth.loaded.tokenizer
        self._shared: dict[tuple[str, int, int], BlockText] = {}
        self._lock = threading.Lock()
        self._stand_ins: bool | None = None if stand_ins and synth.method == "fast" else False
        self._call_scaffold: int | None = None

    @property
    def stand_ins(self) -> bool:
        """Whether tool blocks are counted through stand-ins (checked on first use)."""
        if self._stand_ins is None:
            self._stand_ins = self._stand_ins_add_up()
        return self._stand_ins

    def make(self, seed: str, tokens: int, role: int, shared: bool = False) -> BlockText:
        """The content of a block of ``tokens`` planned tokens."""
        if not shared:
            return self._make(seed, tokens, role)
        key = (seed, tokens, role)
        cached = self._shared.get(key)
        if cached is None:
            cached = self._make(seed, tokens, role)
            with self._lock:
                cached = self._shared.setdefault(key, cached)
        return cached

    def _make(self, seed: str, tokens: int, role: int) -> BlockText:
        try:
            if role in JSON_ROLES:
                return self._wrapped(seed, tokens, role)
            return BlockText(self.synth.text(tokens, seed_value(seed)), tokens)
        except SynthesisError as exc:
            raise exc.with_context(
                f"failed to generate {BLOCK_ROLES[role]} block with seed {_quoted(seed)} "
                f"({tokens} tokens)"
            ) from None

    def _stand_ins_add_up(self) -> bool:
        for role in (ROLE_TOOL_DEFINITION, ROLE_TOOL_CALL):
            wrap = self._wrapper("stand-in sample", role)
            for size in STAND_IN_SAMPLE_SIZES:
                text = self.synth.text(size, size)
                if self._count(wrap(text)) != self._count_short(wrap, text):
                    return False
        return True

    def _scaffold(self, seed: str, role: int) -> int:
        """The tokens a tool block's JSON adds to its text: the first size tried is the
        planned count minus these. A definition's is counted around an empty text, for
        its seed; a call's is the same for every seed, so it is measured once, as the
        most frequent difference around sample texts (the smallest of equally frequent
        ones, so sizes never depend on the order of anything)."""
        if role == ROLE_TOOL_CALL:
            if self._call_scaffold is None:
                differences: Counter[int] = Counter()
                for index in range(CALL_SAMPLES):
                    text = self.synth.text(CALL_SAMPLE_TOKENS, CALL_SAMPLE_STREAM + index)
                    differences[self._count(call_arguments(text)) - CALL_SAMPLE_TOKENS] += 1
                self._call_scaffold = min(differences, key=lambda d: (-differences[d], d))
            return self._call_scaffold
        return self._count(self._wrapper(seed, role)(""))

    def _count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def _count_short(self, wrap: Callable[[str], str], text: str) -> int:
        """The count of ``wrap(text)`` from the wrapper around the text's stand-in."""
        short, _, left_out = stand_in(text)
        return self._count(wrap(short)) + left_out

    @staticmethod
    def _wrapper(seed: str, role: int) -> Callable[[str], str]:
        """The JSON a tool block's text is sent in: the whole ``tools`` entry of a
        definition, the arguments string of a call."""
        if role == ROLE_TOOL_DEFINITION:
            return lambda text: orjson.dumps(tool_entry(seed, text)).decode()
        return call_arguments

    def _wrapped(self, seed: str, tokens: int, role: int) -> BlockText:
        """Search the text size whose wrapped JSON has ``tokens`` tokens; never fails.

        The text of a tool definition is its description (the entry is measured whole); the
        text of a tool call becomes its arguments string."""
        wrap = self._wrapper(seed, role)
        count = self._count_short if self.stand_ins else lambda wrap, text: self._count(wrap(text))
        stream = seed_value(seed)
        size = max(tokens - self._scaffold(seed, role), 1)
        tried: set[int] = set()
        best: tuple[int, str, int] | None = None  # (|difference|, text, count)
        while size not in tried and len(tried) < WRAPPED_TRIES:
            tried.add(size)
            text = self.synth.text(size, stream)
            counted = count(wrap, text)
            if best is None or abs(counted - tokens) < best[0]:
                best = (abs(counted - tokens), text, counted)
            if counted == tokens:
                break
            size = max(size + tokens - counted, 1)
        assert best is not None
        difference, text, counted = best
        sent = text if role == ROLE_TOOL_DEFINITION else wrap(text)
        return BlockText(sent, counted, difference == 0)


def _quoted(text: str) -> str:
    return orjson.dumps(text).decode()
