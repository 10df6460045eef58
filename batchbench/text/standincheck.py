"""The one-time check that stand-ins (``batchbench.text.standins``) add up for a tokenizer
and chat template: sample requests of every block role, made of fast-method texts, counted
through stand-ins and whole."""

from __future__ import annotations

from batchbench.text.blocks import call_arguments, tool_call, tool_entry
from batchbench.text.standins import RenderingCounter, StandIns, counted
from batchbench.text.synth import Synthesizer


def stand_ins_add_up(counter: RenderingCounter, synth: Synthesizer) -> bool:
    """True when the synthesizer's texts are fast-method ones and, on requests of every
    block role and a few sizes, counting through stand-ins gives exactly the whole
    prompt's encode (checked once per run, like ``SegmentCounter.segments_add_up``)."""
    if synth.method != "fast":
        return False
    for messages, tools in _samples(synth):

        def build(stand_ins: StandIns | None, messages=messages, tools=tools):
            return _shortened(messages, tools, stand_ins)

        try:
            if counted(counter, build, True) != len(counter.encode_ids(messages, True, tools)):
                return False
        except Exception:  # a template that cannot render the sample: count in full
            return False
    return True


def _samples(synth: Synthesizer) -> list[tuple[list[dict], list[dict]]]:
    """Requests of every block role (a tool, system, user, an assistant text with a tool
    call, its result) at a few sizes, made of fast-method texts."""
    requests = []
    for index, tokens in enumerate((4, 9, 33, 120)):
        stream = 0x5A4D_0000 + index * 16
        seed = f"stand-in sample {index}"
        call = tool_call(seed, call_arguments(synth.text(tokens, stream + 1)))
        messages: list[dict] = [
            {"role": "system", "content": synth.text(tokens + 3, stream + 2)},
            {"role": "user", "content": synth.text(tokens + 1, stream + 3)},
            {
                "role": "assistant",
                "content": synth.text(tokens + 2, stream + 4),
                "tool_calls": [call],
            },
            {"role": "tool", "tool_call_id": call["id"], "content": synth.text(tokens, stream)},
            {"role": "user", "content": synth.text(tokens + 5, stream + 5)},
        ]
        tools = [tool_entry(seed, synth.text(tokens + 7, stream + 6))]
        requests.append((messages, tools))
    return requests


def _shortened(
    messages: list[dict], tools: list[dict], stand_ins: StandIns | None
) -> tuple[list[dict], list[dict]]:
    """A sample request with its texts shortened (as it is, for None)."""
    if stand_ins is None:
        return messages, tools
    shorten = stand_ins.shorten
    out = []
    for message in messages:
        copy = {**message, "content": shorten(message["content"])}
        if "tool_calls" in message:
            copy["tool_calls"] = [
                _with_arguments(call, shorten(call["function"]["arguments"]))
                for call in message["tool_calls"]
            ]
        out.append(copy)
    entries = []
    for tool in tools:
        function = tool["function"]
        entries.append(
            {**tool, "function": {**function, "description": shorten(function["description"])}}
        )
    return out, entries


def _with_arguments(call: dict, arguments: str) -> dict:
    """A copy of a tool call with other arguments."""
    return {**call, "function": {**call["function"], "arguments": arguments}}
