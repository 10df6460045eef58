"""Measure a template's replay overheads: the tokens it adds beyond message contents.

The growth model (docs/manifest.md) sees a prompt as contents plus an overhead that starts at
``--replay-initial-overhead-tokens`` and grows by ``--replay-turn-overhead-tokens`` per
appended turn. This renders real growth-mode conversations (a user prompt,
then per turn an assistant reply carrying the ``environment`` tool call and the tool
result), with exact-length synthetic contents, and reads both numbers off the counts. It
checks them over several turns, sizes and agent ids and refuses when they vary, since a
varying overhead cannot be expressed by the two flags.
"""

from __future__ import annotations

from typing import Any

from batchbench.drive.wire import tool_call_id
from batchbench.errors import BatchbenchError
from batchbench.text.promptcount import load_counter
from batchbench.text.replycount import environment_calls
from batchbench.text.synth import Synthesizer
from batchbench.text.tokenizer import LoadedTokenizer

PROBE_TURNS = 4
PROBE_SIZES = ((37, 11, 23), (500, 64, 128), (3, 1, 1))
PROBE_AGENTS = (0, 7, 1234)


def _assistant(text: str, agent: int, invocation: int) -> dict[str, Any]:
    call = tool_call_id(agent, invocation)
    return {
        "role": "assistant",
        "content": text,
        "tool_calls": environment_calls(call),
    }


def _content(synth: Synthesizer, n: int, seed: int) -> tuple[str, int]:
    """A probe content and its tokens. Synthesized text with whitespace at an end is
    stripped and recounted: templates that trim (gemma, llama3, most model templates)
    would drop that whitespace, and the probe must measure framing, not trimming."""
    text = synth.text(n, seed)
    stripped = text.strip()
    if stripped == text:
        return text, n
    return stripped, synth.loaded.count(stripped)


def measure_overheads(loaded: LoadedTokenizer, template: str) -> tuple[int, int]:
    """(initial overhead, turn overhead) in tokens; raises when they are not constant."""
    counter = load_counter(loaded, template)
    synth = Synthesizer.prepare(loaded)
    initials: set[int] = set()
    turns: set[int] = set()
    seed = 0
    for prompt_size, reply_size, environment_size in PROBE_SIZES:
        for agent in PROBE_AGENTS:
            seed += 1
            text, prompt = _content(synth, prompt_size, seed)
            messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
            previous = counter.count(messages).prompt_tokens
            initials.add(previous - prompt)
            for invocation in range(1, PROBE_TURNS + 1):
                text, reply = _content(synth, reply_size, seed * 100 + invocation)
                messages.append(_assistant(text, agent, invocation))
                text, environment = _content(synth, environment_size, seed * 1000 + invocation)
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": tool_call_id(agent, invocation),
                        "content": text,
                    }
                )
                current = counter.count(messages).prompt_tokens
                turns.add(current - previous - reply - environment)
                previous = current
    if len(initials) != 1 or len(turns) != 1:
        raise BatchbenchError(
            f"the {template} template's overheads vary with content on {loaded.spec} "
            f"(initial {sorted(initials)}, turn {sorted(turns)}); no single pair of replay "
            "overhead flags matches it"
        )
    return initials.pop(), turns.pop()
