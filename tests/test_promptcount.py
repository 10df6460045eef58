"""The one prompt counter (``batchbench.text.promptcount``): the client counts block
requests with the class the simulator counts every request with; its cache is bounded and
keyed by content hash, so no prompt text stays in memory."""

from __future__ import annotations

import gc
import shutil
import subprocess
import sys
import textwrap
import tracemalloc

import pytest
from test_sim_units import metaspace_first, qwen3_config_path
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from batchbench.sim.server import SimConfig, SimServer
from batchbench.sim.serving import ServingModel
from batchbench.stages.prepare import template_counter as client_template_counter
from batchbench.text.chat_templates import BUILTIN_TEMPLATES, BUILTINS, load_chat_template
from batchbench.text.promptcount import SegmentCounter, load_counter, template_counter
from batchbench.text.tokenizer import LoadedTokenizer

# Template counting (client and simulator) is pure Python: no compiled module or twin
# (the pure-twin pass would run the same code again; see the marker in conftest).
pytestmark = pytest.mark.native_pass_only

CALL = {
    "id": "call_batchbench_00000001_000001",
    "type": "function",
    "function": {"name": "environment", "arguments": '{"request":"continue"}'},
}
TOOLS = [{"type": "function", "function": {"name": "environment", "parameters": {}}}]


def conversation(result: str, turns: int = 1) -> list[dict]:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Go."}]
    for turn in range(turns):
        messages += [
            {"role": "assistant", "content": f"Step {turn}.", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": CALL["id"], "content": f"{result} ({turn})"},
        ]
    return messages


def bytelevel() -> LoadedTokenizer:
    """Byte-level BPE with the 256-symbol alphabet and no merges: instant to copy."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return LoadedTokenizer.wrap(tok, "bytelevel", "<built in test: bytelevel>")


def wordlevel() -> LoadedTokenizer:
    """Whitespace-split words, each one token (all unknown but a few): long words make
    megabytes of text a few thousand tokens, encoded in milliseconds."""
    vocab = {"[UNK]": 0, "user": 1, "assistant": 2, "tool": 3, "system": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return LoadedTokenizer.wrap(tok, "wordlevel", "<built in test: wordlevel>")


class MarkedChatML:
    """ChatML rendered whole by a template that is not a built-in (as a model's Jinja
    template is): the counter cuts its prompts before each marker."""

    name = "marked-chatml"
    markers = BUILTINS["chatml"].markers
    prefix = ""

    def render(self, messages, add_generation_prompt=True, tools=None):
        return BUILTINS["chatml"].render(messages, add_generation_prompt, tools)


@pytest.mark.parametrize("name", BUILTIN_TEMPLATES)
def test_client_and_simulator_count_with_the_same_class(deepseek, name):
    template = load_chat_template(name, deepseek)
    client = client_template_counter(deepseek, template)
    simulator = load_counter(deepseek, name)
    assert client_template_counter is template_counter
    assert type(client) is type(simulator)
    assert isinstance(client, SegmentCounter)
    messages = conversation("tool output")
    whole = len(simulator.encode_ids(messages, True, TOOLS))
    assert client(messages, TOOLS) == simulator.count(messages, tools=TOOLS).prompt_tokens == whole


def test_the_simulator_server_counts_with_that_class():
    loaded = bytelevel()
    server = SimServer(SimConfig(chat_template="gemma", serving=ServingModel(speed=0)), loaded)
    client = template_counter(loaded, load_chat_template("gemma", loaded))
    assert type(server.counter) is type(client) is SegmentCounter


def test_the_client_imports_nothing_from_the_simulator():
    script = textwrap.dedent(
        """
        import sys
        from tokenizers import Tokenizer, models, pre_tokenizers
        import batchbench.api
        from batchbench.drive.blocks import BlockFraming
        from batchbench.text.chat_templates import load_chat_template
        from batchbench.text.tokenizer import LoadedTokenizer
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        tok = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        loaded = LoadedTokenizer.wrap(tok, "b", "b")
        counter = batchbench.stages.prepare.template_counter(loaded, load_chat_template("llama3", loaded))
        assert BlockFraming(counter).counter([{"role": "user", "content": "hi"}], []) > 0
        print(sorted(m for m in sys.modules if m.startswith("batchbench.sim")))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_client_cache_is_bounded_and_keeps_no_text():
    """A 5 MB tool result is counted; the cache holds (hash, length) keys and counts only,
    never more than its bound, and nothing of the text stays once the request is gone."""
    loaded = wordlevel()
    counter = template_counter(loaded, load_chat_template("chatml", loaded), cache_entries=4)
    word = "riverstone" * 100  # 1000 characters: 5 MB of text in a few thousand tokens
    large = " ".join(f"{word}{i}" for i in range(5_000))[:5_000_000]
    assert len(large) == 5_000_000

    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        messages = conversation(large)
        expected = len(counter.encode_ids(messages, True, TOOLS))
        assert counter(messages, TOOLS) == expected
        assert counter(messages, TOOLS) == expected  # now from the cache
        assert len(counter.cache) <= counter.cache.limit == 4
        for turn in range(2, 6):  # more distinct segments than the cache holds
            grown = conversation("short result", turn)
            assert counter(grown, TOOLS) == len(counter.encode_ids(grown, True, TOOLS))
            assert len(counter.cache) <= 4
        keys, values = counter.cache.keys(), counter.cache.values()
        assert all(type(k) is tuple and [type(x) for x in k] == [int, int] for k in keys)
        assert all(type(v) is tuple and [type(x) for x in v] == [int, bool] for v in values)
        del messages
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 1_000_000  # the 5 MB text (and the segments holding it) are gone


def test_rendered_templates_are_cut_before_each_marker(packaged_tokenizer_dir, tmp_path):
    """A model's own template (rendered whole) on the client: cut at its added tokens,
    counted exactly, with tools and tool calls."""
    directory = tmp_path / "qwen3"
    directory.mkdir()
    shutil.copy(packaged_tokenizer_dir / "qwen3" / "tokenizer.json", directory)
    shutil.copy(qwen3_config_path(), directory)
    path = directory / "tokenizer.json"
    loaded = LoadedTokenizer.wrap(Tokenizer.from_file(str(path)), "qwen3", str(path))
    counter = template_counter(loaded, load_chat_template("tokenizer", loaded))
    assert type(counter) is SegmentCounter and counter.segments_add_up()
    messages = conversation("tool output <think>x</think>", turns=3)
    segments = counter.segments(messages, True, TOOLS)
    assert "".join(segments) == counter.render(messages, True, TOOLS)
    assert all(any(s.startswith(m) for m in counter.template.markers) for s in segments)
    assert counter(messages, TOOLS) == len(counter.encode_ids(messages, True, TOOLS))
    stored = counter.cache.stored
    messages += conversation("more output", turns=4)[-2:]
    assert counter(messages, TOOLS) == len(counter.encode_ids(messages, True, TOOLS))
    assert counter.cache.stored - stored <= 6  # only the new turn's segments encoded


def test_segments_starting_at_a_marker_add_up_where_pieces_did_not():
    """A Metaspace tokenizer that marks only a text's first word: a text between markers
    counted alone gains a token, one counted after its marker does not; the counter cuts
    before markers, so its sums are exact (the earlier client counter fell back to whole
    prompts here)."""
    loaded = metaspace_first()
    counter = template_counter(loaded, MarkedChatML())
    assert counter.segments_add_up()
    messages = [
        {"role": "user", "content": "river lake"},
        {"role": "assistant", "content": "stone", "tool_calls": [CALL]},
        {"role": "tool", "content": "cloud river"},
    ]
    assert counter(messages, []) == len(counter.encode_ids(messages, True, None))
    assert counter.cache.stored > 0


def test_a_marker_that_strips_text_before_it_counts_whole_prompts():
    """An added token that swallows the whitespace before it (lstrip) makes segment sums
    too long: found on the sample conversation, and whole prompts are encoded."""
    loaded = bytelevel()
    loaded.tokenizer.add_special_tokens(
        [AddedToken("<|im_start|>", special=True, lstrip=True, normalized=False)]
    )
    counter = template_counter(loaded, MarkedChatML())
    assert not counter.segments_add_up()
    messages = conversation("tool output", turns=2)
    assert counter(messages, TOOLS) == len(counter.encode_ids(messages, True, TOOLS))
    assert counter.cache.stored == 0


def test_short_new_segments_are_encoded_one_per_call_long_ones_in_one_batch(deepseek):
    """A few short segments skip the tokenizer's thread pool (one text per call); a long
    batch goes to it whole. The counts are the whole prompt's either way."""
    counter = template_counter(deepseek, load_chat_template("chatml", deepseek))
    batches: list[int] = []
    encode = counter._encode_batch

    def spy(texts, add_special_tokens):
        batches.append(len(texts))
        return encode(texts, add_special_tokens=add_special_tokens)

    counter._encode_batch = spy
    short = conversation("tool output")
    assert counter(short, TOOLS) == len(counter.encode_ids(short, True, TOOLS))
    assert batches == [1, 1, 1, 1, 1]  # tools, system, user, assistant, tool: 5 segments
    batches.clear()
    long = conversation("word " * 5_000)
    assert counter(long, TOOLS) == len(counter.encode_ids(long, True, TOOLS))
    assert batches == [1]  # the long tool result alone is new
    batches.clear()
    both = conversation("word " * 5_000, turns=2)
    assert counter(both, TOOLS) == len(counter.encode_ids(both, True, TOOLS))
    assert batches == [2]  # turn 1: its assistant message and long result, one batch
