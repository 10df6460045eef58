"""A request body as its blocks: the units whose keyed hashes form the recorded chain.

A block is one piece of content with a role: the whole ``tools`` array, a message's text
(or each of its content parts), one tool call. Its canonical bytes are what the chain
hashes, so the same content gives the same block whichever way a client spells it (a
string or a one-part list, keys in any order); its text is what the tokenizer counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

# Message roles as export-plans names them; a role not listed here counts as user input.
_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}


@dataclass(frozen=True, slots=True)
class Block:
    role: str
    canonical: bytes  # hashed into the chain
    text: str  # counted with the tokenizer


def _json_block(role: str, value: Any) -> Block:
    """A block of structured content: its sorted compact JSON is both hashed and counted."""
    canonical = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    return Block(role, canonical, canonical.decode("utf-8"))


def _text_block(role: str, text: str) -> Block:
    return Block(role, text.encode("utf-8"), text)


def _content_blocks(role: str, content: Any) -> list[Block]:
    """A message's content: a string is one block, a list one block per part (a text
    part by its text, any other part by its JSON), anything else one JSON block."""
    if content is None:
        return [_text_block(role, "")]
    if isinstance(content, str):
        return [_text_block(role, content)]
    if isinstance(content, list):
        blocks = []
        for part in content:
            if (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                blocks.append(_text_block(role, part["text"]))
            else:
                blocks.append(_json_block(role, part))
        return blocks
    return [_json_block(role, content)]


def _tool_call_block(call: Any) -> Block:
    """One tool call as {"name", "arguments"}: its id is the client's bookkeeping, not
    content the model reads, and differs between otherwise identical retries."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return _json_block("tool_call", call)
    return _json_block(
        "tool_call", {"name": function.get("name"), "arguments": function.get("arguments")}
    )


def _assistant_blocks(message: dict[str, Any]) -> list[Block]:
    """The reply's content when it has any, then each tool call (the legacy
    ``function_call`` counts as one)."""
    content = message.get("content")
    blocks = [] if content in (None, "", []) else _content_blocks("assistant", content)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        blocks.extend(_tool_call_block(call) for call in calls)
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        blocks.append(_tool_call_block({"function": legacy}))
    return blocks


def chat_blocks(body: dict[str, Any]) -> list[Block]:
    """The blocks of a /chat/completions body: the tools array first (a template renders
    it ahead of the messages), then every message in order."""
    blocks = []
    tools = body.get("tools")
    if tools:
        blocks.append(_json_block("tool_definition", tools))
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            blocks.append(_json_block("user", message))
            continue
        raw_role = message.get("role")
        role = _ROLES.get(raw_role, "user") if isinstance(raw_role, str) else "user"
        if role == "assistant":
            blocks.extend(_assistant_blocks(message))
        else:
            blocks.extend(_content_blocks(role, message.get("content")))
    return blocks


def completion_blocks(body: dict[str, Any]) -> list[Block]:
    """The one user block of a /completions body: its prompt (a list prompt as JSON)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [_text_block("user", prompt)]
    if prompt is None:
        return []
    return [_json_block("user", prompt)]
