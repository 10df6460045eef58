"""Chat templates: how a server turns a conversation into the prompt text it tokenizes.

The simulator renders and counts prompts with these; the client uses them to know the
template text around a message content (``batchbench.text.framing``), so it can count the
model's replies as the next prompt will render them.

Built-in templates (per-message, so a growing conversation is counted incrementally):

* ``chatml``: ``<|im_start|>{role}\\n{content}{tool calls}<|im_end|>\\n``; content is not
  trimmed; tool calls render as ``<tool_call>`` JSON without their ids; ``tools`` become
  a system message placed first.
* ``gemma`` (Gemma-3 style): ``<bos>``; a leading system message's trimmed text and
  "\\n\\n" go in front of the first other turn; user and tool messages become
  ``<start_of_turn>user\\n{trim(content)}<end_of_turn>\\n``; assistant messages
  ``<start_of_turn>model\\n{trim(content)}<end_of_turn>\\n`` with tool calls not rendered.
* ``llama3`` (Llama-3 style): ``<|begin_of_text|>``, then per message
  ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{trim(content)}<|eot_id|>``; assistant
  tool calls render as JSON lines that include the call id; tool messages render under
  the role ``ipython`` with a ``tool_call_id: <id>`` line before their trimmed content.
  Templates that render ids are why the client keeps its ids' width fixed.

Jinja templates (``tokenizer``: the ``chat_template.jinja`` beside the tokenizer file, else
the ``chat_template`` of its ``tokenizer_config.json``; or a ``.jinja`` file) render in
transformers' environment, on the conversation vLLM hands them: tool-call ``arguments``
JSON strings parsed into objects (modern templates iterate them as mappings), contents
as strings, or as lists of text parts for templates that loop over a message's content.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from batchbench.errors import BatchbenchError
from batchbench.text.tokenizer import LoadedTokenizer

BUILTIN_TEMPLATES = ("chatml", "gemma", "llama3", "qwen3")
TEMPLATE_CHOICES = (*BUILTIN_TEMPLATES, "tokenizer")


Warn = Callable[[str], None]


class TemplateError(BatchbenchError):
    """A request the template cannot render, or a template that cannot be loaded."""


@runtime_checkable
class ChatTemplate(Protocol):
    """How a server turns a conversation into the prompt text it tokenizes."""

    name: str
    # Strings the server's tokenizer treats as added tokens: they split the text before
    # pre-tokenization, so nothing merges across them.
    markers: frozenset[str]
    # Text every prompt starts with (the BOS marker, when the template prints one);
    # llama.cpp's /apply-template leaves it out and /tokenize's add_special puts it back.
    prefix: str

    def render(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> str:
        """The whole prompt, special-token text included."""
        ...


# ---------------------------------------------------------------------------------------
# Message parts


def content_text(content: Any) -> str:
    """A message's ``content`` as text: a string, null, or a list of OpenAI content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise TemplateError("message content parts must be text")
        return "".join(parts)
    raise TemplateError("message content must be a string, null or a list of text parts")


def _role(message: Any) -> str:
    if not isinstance(message, dict):
        raise TemplateError("each message must be an object")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise TemplateError("each message needs a non-empty string role")
    return role


def _function(call: Any) -> tuple[str, Any]:
    """(name, arguments) of one tool call."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise TemplateError("tool_calls entries must be objects with a function")
    function = call["function"]
    name = function.get("name")
    if not isinstance(name, str):
        raise TemplateError("tool call function name must be a string")
    return name, function.get("arguments", "")


def _calls(message: dict) -> list:
    calls = message.get("tool_calls")
    if not calls:
        return []
    if not isinstance(calls, list):
        raise TemplateError("tool_calls must be a list")
    return calls


def parsed_arguments(arguments: Any) -> Any:
    """A tool call's arguments as an object, as vLLM hands them to templates: a JSON
    string is parsed (an empty one becomes ``{}``); anything else is kept."""
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return {} if arguments is None else arguments


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------------------------------
# Built-in templates


class BuiltinTemplate:
    """A template whose every message renders on its own, starting with a marker token.

    ``segments`` gives one text per rendered message; ``prefix`` + segments +
    ``generation`` is the whole prompt. Each segment starts with a marker (an added
    special token), so a prompt's token count is the sum of its parts' counts.
    """

    name = ""
    prefix = ""
    generation = ""
    markers: frozenset[str] = frozenset()
    trims = False
    # True when ``segments`` is ``tool_segments(tools)`` then ``message_segment(m)`` for
    # each message: a message renders the same whatever surrounds it, so a conversation
    # that grows can be counted by its new messages alone.
    per_message = False

    def segments(self, messages: Sequence[Any], tools: Any = None) -> list[str]:
        raise NotImplementedError

    def tool_segments(self, tools: Any) -> list[str]:
        """The segments the tools render in (``per_message`` templates)."""
        raise NotImplementedError

    def message_segment(self, message: Any) -> str:
        """The one segment a message renders in (``per_message`` templates)."""
        raise NotImplementedError

    def render(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> str:
        text = self.prefix + "".join(self.segments(messages, tools))
        return text + (self.generation if add_generation_prompt else "")

    def _content(self, message: dict) -> str:
        text = content_text(message.get("content"))
        return text.strip() if self.trims else text


def _tools_lines(tools: Any) -> str | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise TemplateError("tools must be a list of objects")
    return "\n".join(_dumps(tool) for tool in tools)


class ChatMLTemplate(BuiltinTemplate):
    name = "chatml"
    start, end = "<|im_start|>", "<|im_end|>"
    generation = "<|im_start|>assistant\n"
    markers = frozenset({start, end})

    def body(self, message: Any) -> str:
        """The text between a message's markers: ``role\\n``, content, rendered tool calls."""
        role = _role(message)
        text = role + "\n" + self._content(message)
        for call in _calls(message):
            name, arguments = _function(call)
            if not isinstance(arguments, str):
                arguments = _dumps(arguments)
            call_json = f'{{"name": {_dumps(name)}, "arguments": {arguments}}}'
            text += f"\n<tool_call>\n{call_json}\n</tool_call>"
        return text

    per_message = True

    def segments(self, messages: Sequence[Any], tools: Any = None) -> list[str]:
        return [*self.tool_segments(tools), *map(self.message_segment, messages)]

    def tool_segments(self, tools: Any) -> list[str]:
        lines = _tools_lines(tools)
        if lines is None:
            return []
        return [f"{self.start}system\n# Tools\n\n<tools>\n{lines}\n</tools>{self.end}\n"]

    def message_segment(self, message: Any) -> str:
        return f"{self.start}{self.body(message)}{self.end}\n"


class GemmaTemplate(BuiltinTemplate):
    name = "gemma"
    prefix = "<bos>"
    generation = "<start_of_turn>model\n"
    markers = frozenset({"<bos>", "<start_of_turn>", "<end_of_turn>"})
    trims = True

    def segments(self, messages: Sequence[Any], tools: Any = None) -> list[str]:
        system: str | None = None  # the text put in front of the first other turn
        lines = _tools_lines(tools)
        if lines is not None:
            system = f"Tools:\n{lines}"
        out: list[str] = []
        for index, message in enumerate(messages):
            role = _role(message)
            if role == "system" and index == 0:
                text = self._content(message)
                system = text if system is None else f"{system}\n\n{text}"
                continue
            turn = "model" if role == "assistant" else "user"
            _calls(message)  # validated, not rendered: Gemma-3 has no tool-call syntax
            head = f"{system}\n\n" if system is not None and not out else ""
            out.append(f"<start_of_turn>{turn}\n{head}{self._content(message)}<end_of_turn>\n")
        if system is not None and not out:
            out.append(f"<start_of_turn>user\n{system}\n\n<end_of_turn>\n")
        return out


class Llama3Template(BuiltinTemplate):
    name = "llama3"
    prefix = "<|begin_of_text|>"
    generation = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    markers = frozenset(
        {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}
    )
    trims = True

    def _segment(self, role: str, text: str) -> str:
        return f"<|start_header_id|>{role}<|end_header_id|>\n\n{text}<|eot_id|>"

    per_message = True

    def segments(self, messages: Sequence[Any], tools: Any = None) -> list[str]:
        return [*self.tool_segments(tools), *map(self.message_segment, messages)]

    def tool_segments(self, tools: Any) -> list[str]:
        lines = _tools_lines(tools)
        if lines is None:
            return []
        return [self._segment("system", f"Environment: ipython\nTools:\n{lines}")]

    def message_segment(self, message: Any) -> str:
        role = _role(message)
        text = self._content(message)
        if role == "tool":
            call_id = message.get("tool_call_id")
            text = f"tool_call_id: {call_id if isinstance(call_id, str) else ''}\n{text}"
            role = "ipython"
        rendered = []
        for call in _calls(message):
            name, arguments = _function(call)
            call_id = call.get("id") if isinstance(call.get("id"), str) else ""
            payload = {"id": call_id, "name": name, "parameters": parsed_arguments(arguments)}
            rendered.append(_dumps(payload))
        if rendered:
            text = "\n".join([text, *rendered]) if text else "\n".join(rendered)
        return self._segment(role, text)


class Qwen3Template(BuiltinTemplate):
    """ChatML as Qwen3 and the models trained on its format render it: tools listed in the
    system turn, an assistant's reasoning in a ``<think>`` block when it comes after the
    last user query, tool calls as ``<tool_call>`` JSON (arguments as objects) after a
    newline that an empty text goes without, and tool results as user turns of
    ``<tool_response>`` blocks (consecutive results share one turn). Contents are trimmed.

    Only ``<|im_start|>`` and ``<|im_end|>`` are markers: the tags are plain text here, so
    with a tokenizer that lacks them as added tokens (SmolLM2's GPT-2 pre-tokenizer) the
    text around a reply merges with it differently after ``</think>\n\n`` than after
    ``assistant\n`` -- the case the simulator must let the client get right.
    """

    name = "qwen3"
    start, end = "<|im_start|>", "<|im_end|>"
    generation = "<|im_start|>assistant\n"
    markers = frozenset({start, end})
    trims = True

    def _system(self, text: str | None, tools: Any) -> str | None:
        lines = _tools_lines(tools)
        if lines is None:
            return None if text is None else f"{self.start}system\n{text}{self.end}\n"
        head = f"{text}\n\n" if text else ""
        return (
            f"{self.start}system\n{head}# Tools\n\nYou may call one or more functions to "
            "assist with the user query.\n\nYou are provided with function signatures "
            f"within <tools></tools> XML tags:\n<tools>\n{lines}\n</tools>\n\nFor each "
            "function call, return a json object with function name and arguments within "
            '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
            f'"arguments": <args-json-object>}}\n</tool_call>{self.end}\n'
        )

    def _assistant(self, message: dict, think: bool, last: bool) -> str:
        text = self._content(message)
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        reasoning = reasoning.strip() if isinstance(reasoning, str) else ""
        body = text
        if think and (reasoning or last):
            body = f"<think>\n{reasoning}\n</think>\n\n{text}"
        for index, call in enumerate(_calls(message)):
            name, arguments = _function(call)
            if index > 0 or text:
                body += "\n"
            payload = _dumps(parsed_arguments(arguments))
            body += f'<tool_call>\n{{"name": {_dumps(name)}, "arguments": {payload}}}\n</tool_call>'
        return f"{self.start}assistant\n{body}{self.end}\n"

    def segments(self, messages: Sequence[Any], tools: Any = None) -> list[str]:
        roles = [_role(message) for message in messages]
        out = []
        first = 0
        system_text = None
        if roles and roles[0] == "system":
            system_text, first = self._content(messages[0]), 1
        system = self._system(system_text, tools)
        if system is not None:
            out.append(system)
        last_query = max((i for i, role in enumerate(roles) if role == "user"), default=-1)
        index = first
        while index < len(messages):
            message, role = messages[index], roles[index]
            if role == "assistant":
                think = index > last_query
                out.append(self._assistant(message, think, index == len(messages) - 1))
            elif role == "tool":
                results = []
                while index < len(messages) and roles[index] == "tool":
                    results.append(
                        f"\n<tool_response>\n{self._content(messages[index])}\n</tool_response>"
                    )
                    index += 1
                out.append(f"{self.start}user{''.join(results)}{self.end}\n")
                continue
            else:
                out.append(f"{self.start}{role}\n{self._content(message)}{self.end}\n")
            index += 1
        return out


BUILTINS: dict[str, BuiltinTemplate] = {
    "chatml": ChatMLTemplate(),
    "gemma": GemmaTemplate(),
    "llama3": Llama3Template(),
    "qwen3": Qwen3Template(),
}


# ---------------------------------------------------------------------------------------
# Jinja templates


def _tojson(
    value: Any,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
    ensure_ascii: bool = False,
) -> str:
    """transformers' tojson: key order and non-ASCII text kept (Jinja's own sorts and
    escapes)."""
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
    )


def _strftime_now(format_string: str) -> str:
    return time.strftime(format_string)


def _raise_template_error(message: str) -> None:
    raise TemplateError(f"chat_template raised: {message}")


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


# Special tokens transformers passes to every template render (its special_tokens_map).
_SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# Content part types whose text vLLM keeps (images and audio are not simulated).
_TEXT_PART_TYPES = ("text", "input_text", "output_text", "refusal", "thinking")


@functools.cache
def _environment() -> Any:
    """transformers' Jinja environment for chat templates: sandboxed, trim_blocks,
    lstrip_blocks, loop controls, its tojson, raise_exception, strftime_now, and the
    ``{% generation %}`` tag (assistant-mask templates use it; it renders its body)."""
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError:
        raise TemplateError(
            "rendering a model's chat template needs jinja2: pip install 'batchbench[templates]'"
        ) from None

    class GenerationTag(jinja2.ext.Extension):
        # jinja2 annotates ``tags`` as an instance attribute, so no ClassVar here (mypy).
        tags: set[str] = {"generation"}  # noqa: RUF012

        def parse(self, parser: Any) -> Any:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_template_error
    env.globals["strftime_now"] = _strftime_now
    return env


def _reads(node: Any, names: set[str], key: str | None = None) -> bool:
    """Whether ``node`` reads one of ``names`` (or its ``key`` item), possibly through
    filters, tests or a slice, as vLLM's content-format detection matches them."""
    import jinja2.nodes as nodes

    while (isinstance(node, nodes.Filter | nodes.Test) and node.node is not None) or (
        isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice)
    ):
        node = node.node
    if key is not None:
        if isinstance(node, nodes.Getitem):
            matched = isinstance(node.arg, nodes.Const) and node.arg.value == key
        elif isinstance(node, nodes.Getattr):
            matched = node.attr == key
        else:
            return False
        return matched and _reads(node.node, names)
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name in names


def detect_content_format(source: str) -> str:
    """``openai`` when the template loops over a message's ``content`` (it then gets
    lists of ``{"type": "text", "text": ...}`` parts), else ``string`` (vLLM's "auto"
    detection; a template that does not parse counts as ``string``)."""
    import jinja2
    import jinja2.nodes as nodes

    try:
        tree = _environment().parse(source)
    except jinja2.TemplateError:
        return "string"
    # Names holding the messages (``{% set history = messages[1:] %}`` and so on).
    conversation = {"messages"}
    assigns = list(tree.find_all(nodes.Assign))
    grown = True
    while grown:
        grown = False
        for assign in assigns:
            target = assign.target
            if (
                isinstance(target, nodes.Name)
                and target.name not in conversation
                and _reads(assign.node, conversation)
            ):
                conversation.add(target.name)
                grown = True
    loops = list(tree.find_all(nodes.For))
    message_names = {
        loop.target.name
        for loop in loops
        if isinstance(loop.target, nodes.Name) and _reads(loop.iter, conversation)
    }
    for loop in loops:
        if _reads(loop.iter, message_names, "content"):
            return "openai"
    return "string"


_TEXT_FIELDS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}


def _text_parts(content: Any) -> list[str]:
    """The texts of a message content: a string, null, or a list of text parts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise TemplateError("message content must be a string, null or a list of text parts")
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        field = _TEXT_FIELDS.get(part.get("type", "text")) if isinstance(part, dict) else None
        text = part.get(field) if field else None
        if not isinstance(text, str):
            raise TemplateError("message content parts must be text")
        texts.append(text)
    return texts


def _parsed_calls(calls: list[Any]) -> list[Any]:
    """Copies of tool calls with their arguments parsed (see :func:`parsed_arguments`)."""
    out = []
    for call in calls:
        if isinstance(call, dict) and isinstance(call.get("function"), dict):
            function = dict(call["function"])
            function["arguments"] = parsed_arguments(function.get("arguments"))
            call = {**call, "function": function}
        out.append(call)
    return out


def for_template(messages: Sequence[Any], content_format: str = "string") -> list[dict[str, Any]]:
    """The conversation vLLM hands a chat template, as copies (the caller's messages are
    left alone): role and content; an assistant's tool calls with their ``arguments``
    parsed into objects (modern templates iterate them as mappings; an empty list is
    dropped) and its reasoning; a tool message's ``tool_call_id``; a message's ``name``.
    Other fields are dropped. A content becomes one string (text parts joined by "\n",
    null as ""), or for ``openai``-format templates a list of text parts (tool results
    stay strings, as vLLM keeps them)."""
    out = []
    for message in messages:
        role = _role(message)
        texts = _text_parts(message.get("content"))
        content: Any
        if content_format == "openai" and role != "tool":
            content = [{"type": "text", "text": text} for text in texts]
        else:
            content = "\n".join(texts)
        converted: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant":
            calls = message.get("tool_calls")
            if calls is not None and not isinstance(calls, list):
                raise TemplateError("tool_calls must be a list")
            if calls:
                converted["tool_calls"] = _parsed_calls(calls)
            reasoning = message.get("reasoning", message.get("reasoning_content"))
            if reasoning is not None:
                converted["reasoning"] = converted["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in message:
            converted["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            converted["name"] = message["name"]
        out.append(converted)
    return out


class JinjaTemplate:
    """A model's own chat template, rendered as vLLM renders it (see :func:`for_template`)
    in transformers' environment, with the tokenizer config's special tokens."""

    def __init__(
        self, source: str, config: dict[str, Any], name: str, loaded: LoadedTokenizer
    ) -> None:
        import jinja2

        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"cannot compile the chat template {name}: {exc}") from None
        self._specials = {
            key: text
            for key in _SPECIAL_TOKEN_KEYS
            if (text := _token_text(config.get(key))) is not None
        }
        self.name = name
        self.source = source  # its text: the tags it may test a reply for are named there
        self.content_format = detect_content_format(source)
        added = loaded.tokenizer.get_added_tokens_decoder()
        self.markers = frozenset(token.content for token in added.values() if token.content)
        self.prefix = self._leading_bos()

    def _leading_bos(self) -> str:
        """The BOS text when the template starts its prompts with it, else ""."""
        bos = self._specials.get("bos_token", "")
        if not bos:
            return ""
        try:
            text = self.render([{"role": "user", "content": "x"}])
        except TemplateError:
            return ""
        return bos if text.startswith(bos) else ""

    def render(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> str:
        if tools is not None and not isinstance(tools, list):
            raise TemplateError("tools must be a list of objects")
        conversation = for_template(messages, self.content_format)
        try:
            return self._template.render(
                messages=conversation,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self._specials,
            )
        except TemplateError:
            raise
        except Exception as exc:
            raise TemplateError(f"chat_template failed to render the request: {exc}") from None


def read_template_files(
    directory: Path, warn: Warn | None = None
) -> tuple[str, dict[str, Any], str]:
    """(template source, tokenizer config, its file) from a model directory: its
    ``chat_template.jinja`` first (the newer convention, and what transformers loads),
    else the ``chat_template`` of its ``tokenizer_config.json`` (named templates:
    "default"). The config, when there is one, also gives the special tokens the template
    may print. ``warn`` hears of a directory holding two different templates (transformers
    5 writes both when it converts a GGUF): a server may be running the other one."""
    config_path = directory / "tokenizer_config.json"
    jinja_path = directory / "chat_template.jinja"
    config: dict[str, Any] = {}
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # ValueError covers bad UTF-8 and bad JSON
            raise TemplateError(f"cannot read {config_path}: {exc}") from None
        if not isinstance(config, dict):
            raise TemplateError(f"cannot read {config_path}: not a JSON object")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if jinja_path.is_file():
        try:
            source = jinja_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TemplateError(f"cannot read {jinja_path}: {exc}") from None
        if warn is not None and isinstance(template, str) and template and template != source:
            warn(
                f"warning: {directory} holds two different chat templates; using "
                f"{jinja_path} (the chat_template in {config_path} differs); if the server "
                f"renders the other one, pass it with --chat-template"
            )
        return source, config, str(jinja_path)
    if not config_path.is_file():
        raise TemplateError(
            f"{directory} holds no chat_template.jinja and no tokenizer_config.json"
        )
    if not isinstance(template, str) or not template:
        raise TemplateError(f"{config_path} has no chat_template")
    return template, config, str(config_path)


def _tokenizer_config(loaded: LoadedTokenizer) -> dict[str, Any]:
    """The tokenizer_config.json beside the tokenizer file, when readable: a template given
    as a bare file prints its special tokens (``bos_token``…) from it, as the server does."""
    source = Path(loaded.source)
    if not source.is_file():  # a hub id or a built-in name: nothing beside it
        return {}
    path = source.parent / "tokenizer_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def load_chat_template(
    spec: str, loaded: LoadedTokenizer, warn: Warn | None = None
) -> ChatTemplate:
    """``chatml``, ``gemma``, ``llama3``, ``tokenizer`` (the template beside the tokenizer
    file), a ``.jinja`` file, or a directory holding a template (see
    :func:`read_template_files`)."""
    if spec in BUILTINS:
        return BUILTINS[spec]
    if spec == "tokenizer":
        source = Path(loaded.source)
        if not source.is_file():
            raise TemplateError(
                "the tokenizer template needs a chat_template.jinja or tokenizer_config.json "
                f"beside a tokenizer file; {loaded.source} is not one"
            )
        return JinjaTemplate(*read_template_files(source.parent, warn), loaded)
    path = Path(spec)
    if path.is_dir():
        return JinjaTemplate(*read_template_files(path, warn), loaded)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TemplateError(f"cannot read {path}: {exc}") from None
        return JinjaTemplate(text, _tokenizer_config(loaded), str(path), loaded)
    raise TemplateError(
        f"unknown chat template {spec!r}; expected one of {', '.join(TEMPLATE_CHOICES)}, "
        "a .jinja file or a directory holding one"
    )
