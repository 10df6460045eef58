"""The simulator's chat-template helpers: ChatML rendering for /tokenize and tests.

Prompt counting lives in ``batchbench.text.promptcount`` (one counter for the simulator
and the client); its names are re-exported here for callers that import them from the
simulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from batchbench.text.chat_templates import BUILTINS, TemplateError, content_text
from batchbench.text.promptcount import (
    ChatMLCounter,
    Counted,
    JinjaCounter,
    SegmentCounter,
    chatml_tokenizer,
    load_counter,
    marked_tokenizer,
)

__all__ = [
    "ChatMLCounter",
    "Counted",
    "JinjaCounter",
    "SegmentCounter",
    "TemplateError",
    "chatml_tokenizer",
    "content_text",
    "load_counter",
    "marked_tokenizer",
    "render_body",
    "render_chatml",
]

_CHATML = BUILTINS["chatml"]


def render_body(message: Any) -> str:
    """ChatML: the text between a message's markers (role, content, tool calls)."""
    return _CHATML.body(message)  # type: ignore[attr-defined]


def render_chatml(
    messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
) -> str:
    """The whole ChatML prompt as one string (for /tokenize and for tests)."""
    return _CHATML.render(messages, add_generation_prompt, tools)
