"""A block request counted and sent by the messages it adds (``batchbench.drive
.messagecount``, ``batchbench.drive.blockmessages``): with a template that renders each
message on its own, a request keeps the counts and the JSON of the messages it shares
with its trajectory's last one, and builds only the rest. Every count must equal the
whole prompt's encode and every body the whole object's JSON, while the messages built
are exactly the new ones: the last shared one again when a tool call hangs on it, all of
them when the tools change or after a reset."""

from __future__ import annotations

import orjson
import pytest
from test_promptcount import bytelevel
from test_standins import blk
from tokenizers import AddedToken

from batchbench.drive import blockmessages, messagecount
from batchbench.drive.blockmessages import Kept, Rows, build
from batchbench.drive.blocks import (
    BlockFraming,
    TrajectoryBlocks,
    assemble,
    build_messages,
    prepare_blocks,
)
from batchbench.plan.manifest import parse_manifest
from batchbench.plan.workload import compile_manifest
from batchbench.text.blocks import ROLE_USER, BlockTexts, call_id
from batchbench.text.chat_templates import BUILTINS, ChatMLTemplate, load_chat_template
from batchbench.text.promptcount import template_counter
from batchbench.text.synth import Synthesizer

REPLY = "Sure thing: running the tests now.\n\n```\npytest -q\n```"


def requests() -> list[tuple[bool, list[dict]]]:
    """(reset before, blocks) of seven requests: growth with a live reply, a call and its
    result; a request that ends in a live reply (no block can absorb); a call hung on that
    reply the next request; a tool defined late with two calls and a repeated block; then
    a reset and a result no call asked for."""
    r0 = [
        blk("tools/shell", 60, "tool_definition"),
        blk("prompt/system", 40, "system"),
        blk("t/task", 25, "user"),
        blk("t/tiny", 2, "user"),
    ]
    r1 = [
        *r0,
        blk("t/reply-1", 20, "assistant", live=True),
        blk("t/call-1", 30, "tool_call"),
        blk("t/result-1", 50, "tool"),
    ]
    r2 = [*r1, blk("t/reply-2", 20, "assistant", live=True)]
    r3 = [
        *r2,
        blk("t/call-2", 14, "tool_call"),
        blk("t/result-2", 120, "tool"),
        blk("t/note", 9, "assistant"),
    ]
    r4 = [
        *r3,
        blk("tools/editor", 40, "tool_definition"),
        blk("t/reply-3", 20, "assistant", live=True),
        blk("t/call-3", 12, "tool_call"),
        blk("t/call-4", 16, "tool_call"),
        blk("t/result-3", 30, "tool"),
        blk("t/result-4", 33, "tool"),
        blk("t/task", 25, "user"),
    ]
    r5 = [r0[0], r0[1], blk("t/task-2", 30, "user")]
    r6 = [*r5, blk("t/reply-4", 20, "assistant", live=True), blk("t/result-5", 20, "tool")]
    return [(False, r) for r in (r0, r1, r2, r3, r4)] + [(True, r5), (False, r6)]


def workload(per_block: int = 30):
    """The requests, each with an overhead of ``per_block`` tokens a block: more than the
    template's framing, so every absorbing block grows."""
    out = []
    for reset, blocks in requests():
        overhead = per_block * len(blocks)
        request = {"prompt_tokens": sum(b["tokens"] for b in blocks) + overhead,
                   "output_tokens": 8, "overhead_tokens": overhead, "blocks": blocks}  # fmt: skip
        if reset:
            request["reset_before"] = True
        out.append(request)
    line = {"schema_version": 2, "trajectory_id": "t", "requests": out}
    return compile_manifest(parse_manifest(orjson.dumps(line) + b"\n", "plans.jsonl"))


def replay(counter, synth: Synthesizer, monkeypatch, stand_ins: bool = True, per_block: int = 30):
    """Each request prepared (counted by its new messages) and assembled: per request, the
    incremental counts with the whole prompt's encodes at that moment, the messages
    rendered to count it, and the messages built to send it."""
    work = workload(per_block)
    texts = BlockTexts(synth)
    state = TrajectoryBlocks(work.blocks, framing=BlockFraming(counter, stand_ins))
    assert state.framing is not None and state.framing.per_message
    counts: list[tuple[int, int]] = []
    rendered: list[int] = []
    sent: list[int] = []
    notes: list[str | None] = []
    corrections: list[int] = []
    current = [0]
    count = state.counts.count

    def checked(*args):
        got = count(*args)
        messages, tools = build_messages(state, current[0])
        counts.append((got, len(counter.encode_ids(messages, True, tools or None))))
        return got

    def spied_segment(message, segment=counter.message_segment):
        rendered[-1] += 1
        return segment(message)

    def spied_build(*args, **kwargs):
        built = build(*args, **kwargs)
        sent[-1] += len(built.messages)
        return built

    monkeypatch.setattr(state.counts, "count", checked)
    monkeypatch.setattr(counter, "message_segment", spied_segment)
    monkeypatch.setattr(blockmessages, "build", spied_build)
    for request in work.turns(0):
        current[0] = request
        if work.reset_before[request]:
            state.reset()
        rendered.append(0)
        target = int(work.target_prompt_tokens[request])
        overhead = int(work.overhead_tokens[request])
        sizing = prepare_blocks(state, request, texts, target, overhead, state.framing)
        notes.append(sizing.note)
        corrections.append(sizing.correction)
        sent.append(0)
        head, messages = assemble(state, request, "m")
        whole, tools = build_messages(state, request)
        body: dict = {"model": "m", "messages": whole}
        if tools:
            body["tools"] = tools
        assert head == orjson.dumps(body)[:-1] and messages == len(whole)
        state.keep_reply({"role": "assistant", "content": REPLY}, 0)
    # Every absorbing block grew; the request that ends in a live reply has none.
    assert [note is None for note in notes] == [True, True, False, True, True, True, True]
    assert all(correction > 0 for correction in corrections[:2] + corrections[3:])
    return counts, rendered, sent


@pytest.mark.parametrize("name", ["chatml", "llama3"])
def test_requests_count_and_send_their_new_messages_only(deepseek, monkeypatch, name):
    synth = Synthesizer.prepare(deepseek)
    counter = template_counter(deepseek, load_chat_template(name, deepseek))
    counts, rendered, sent = replay(counter, synth, monkeypatch)
    assert [got for got, _ in counts] == [whole for _, whole in counts]
    # Counting: every message first; then the resized absorbing block's message and the
    # new ones; the live reply a call hangs on again; all 12 when a tool comes; a reset.
    assert rendered == [3, 3, 2, 3, 12, 2, 3]
    # Sending: the previous request's messages are final (absorbing block resized).
    assert sent == [3, 2, 1, 3, 12, 2, 2]


def test_whole_texts_are_counted_alike_without_stand_ins(deepseek, monkeypatch):
    synth = Synthesizer.prepare(deepseek)
    counter = template_counter(deepseek, load_chat_template("chatml", deepseek))
    counts, rendered, _ = replay(counter, synth, monkeypatch, stand_ins=False)
    assert [got for got, _ in counts] == [whole for _, whole in counts]
    assert rendered == [3, 3, 2, 3, 12, 2, 3]


@pytest.mark.parametrize("short", ["qwen3", "glm4"])
def test_other_tokenizers_count_exactly(packaged, monkeypatch, short):
    loaded = packaged(short)
    synth = Synthesizer.prepare(loaded)
    counter = template_counter(loaded, load_chat_template("chatml", loaded))
    counts, _, _ = replay(counter, synth, monkeypatch)
    assert [got for got, _ in counts] == [whole for _, whole in counts]


class EchoingChatML(ChatMLTemplate):
    """ChatML that prints every tool result twice."""

    name = "echoing-chatml"

    def message_segment(self, message):
        segment = super().message_segment(message)
        return segment + segment if message.get("role") == "tool" else segment


def test_texts_the_template_repeats_are_counted_whole(deepseek, monkeypatch):
    """A tool result's stand-in is printed twice: the new messages are rendered again with
    the results whole, and the counts stay exact."""
    synth = Synthesizer.prepare(deepseek)
    counter = template_counter(deepseek, EchoingChatML())
    renders: list[int] = []
    trusted = messagecount.trusted

    def spied(render):
        renders.append(0)

        def counting(stand_ins):
            renders[-1] += 1
            return render(stand_ins)

        return trusted(counting)

    monkeypatch.setattr(messagecount, "trusted", spied)
    counts, rendered, _ = replay(counter, synth, monkeypatch, per_block=90)
    assert [got for got, _ in counts] == [whole for _, whole in counts]
    assert renders == [1, 2, 2, 2, 2, 1, 2]  # again where a tool result is new
    assert rendered == [3, 6, 4, 6, 24, 2, 6]


def test_templates_that_render_messages_together_count_whole_requests(deepseek):
    for name in ("gemma", "qwen3"):
        counter = template_counter(deepseek, load_chat_template(name, deepseek))
        assert not counter.per_message() and not BlockFraming(counter, True).per_message
    loaded = bytelevel()
    loaded.tokenizer.add_special_tokens(
        [AddedToken("<|im_start|>", special=True, lstrip=True, normalized=False)]
    )
    counter = template_counter(loaded, BUILTINS["chatml"])
    assert not counter.per_message()  # its segment counts do not add up


def test_kept_messages_stop_at_the_first_block_that_differs(deepseek):
    work = workload()
    plan = work.blocks
    texts = BlockTexts(Synthesizer.prepare(deepseek))
    state = TrajectoryBlocks(plan)
    for request in range(4):
        prepare_blocks(state, request, texts, 0, 0, None)
        state.keep_reply({"role": "assistant", "content": REPLY}, 0)
    kept = Kept()
    rows1, rows2, rows3 = (Rows.of(plan, request) for request in (1, 2, 3))
    filled1, filled3 = state.filled(1), state.filled(3)
    assert kept.shared(rows1, filled1) == 0  # nothing kept yet
    built = build(plan.seeds, rows1, filled1)
    kept.keep(rows1, filled1, 0, built)
    assert kept.ends == [2, 3, 4, 6, 7] and kept.takes_calls == [False] * 3 + [True, False]
    assert kept.pending == [(), (), (), (call_id("t/call-1"),), ()]  # result-1 answers it
    assert kept.shared(rows1, filled1) == 5  # the same request again
    assert kept.shared(rows2, state.filled(2)) == 5  # request 2 adds a live reply
    changed = list(filled1)
    changed[3] = texts.make("t/tiny", 3, ROLE_USER)
    assert kept.shared(rows1, changed) == 2  # the tiny task differs: system and task kept
    kept.keep(rows2, state.filled(2), 5, build(plan.seeds, rows2, state.filled(2), 7))
    assert kept.ends == [2, 3, 4, 6, 7, 8]
    # Request 3 hangs a call on request 2's last message (the live reply): rebuilt.
    assert kept.shared(rows3, filled3) == 5
    assert kept.resume(5) == (7, ())
    tools_changed = Rows.of(plan, 4)
    assert kept.shared(tools_changed, state.filled(4)) == 0
