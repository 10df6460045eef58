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
the ``chat_template`` of its ``tokenizer_config.json``; or a ``.jinja`` file) render as
transformers does, after the tool-call ``arguments`` JSON strings are parsed into objects,
as vLLM and SGLang do before rendering (modern templates iterate them as mappings).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchbench.errors import BatchbenchError
from batchbench.text.tokenizer import LoadedTokenizer

BUILTIN_TEMPLATES = ("chatml", "gemma", "llama3")
TEMPLATE_CHOICES = (*BUILTIN_TEMPLATES, "tokenizer")


class TemplateError(BatchbenchError):
    """A request the template cannot render, or a template that cannot be loaded."""


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

    def segments(self, messages: Sequence[Any], tools: Any = None) -> list[str]:
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

    def segments(self, messages: Sequence[Any], tools: Any = None) -> list[str]:
        lines = _tools_lines(tools)
        out = []
        if lines is not None:
            out.append(f"{self.start}system\n# Tools\n\n<tools>\n{lines}\n</tools>{self.end}\n")
        out.extend(f"{self.start}{self.body(m)}{self.end}\n" for m in messages)
        return out


class GemmaTemplate(BuiltinTemplate):
    name = "gemma"
    prefix = "<bos>"
    generation = "<start_of_turn>model\n"
    markers = frozenset({"<bos>", "<start_of_turn>", "<end_of_turn>"})
    trims = True

    def segments(self, messages: Sequence[Any], tools: Any = None) -> list[str]:
        system = ""
        lines = _tools_lines(tools)
        if lines is not None:
            system = f"Tools:\n{lines}"
        out = []
        for index, message in enumerate(messages):
            role = _role(message)
            if role == "system" and index == 0:
                text = self._content(message)
                system = f"{system}\n\n{text}" if system else text
                continue
            turn = "model" if role == "assistant" else "user"
            _calls(message)  # validated, not rendered: Gemma-3 has no tool-call syntax
            head = f"{system}\n\n" if system and not out else ""
            out.append(f"<start_of_turn>{turn}\n{head}{self._content(message)}<end_of_turn>\n")
        if system and not out:
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

    def segments(self, messages: Sequence[Any], tools: Any = None) -> list[str]:
        out = []
        lines = _tools_lines(tools)
        if lines is not None:
            out.append(self._segment("system", f"Environment: ipython\nTools:\n{lines}"))
        for message in messages:
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
            out.append(self._segment(role, text))
        return out


BUILTINS: dict[str, BuiltinTemplate] = {
    "chatml": ChatMLTemplate(),
    "gemma": GemmaTemplate(),
    "llama3": Llama3Template(),
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


def _token_text(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


def for_template(messages: Sequence[Any]) -> list[Any]:
    """Copies of the messages with every assistant tool call's arguments parsed into an
    object (vLLM's and SGLang's preprocessing); the caller's messages are left alone."""
    out = []
    for message in messages:
        if isinstance(message, dict) and isinstance(message.get("tool_calls"), list):
            message = dict(message)
            calls = []
            for call in message["tool_calls"]:
                if isinstance(call, dict) and isinstance(call.get("function"), dict):
                    function = dict(call["function"])
                    function["arguments"] = parsed_arguments(function.get("arguments"))
                    call = {**call, "function": function}
                calls.append(call)
            message["tool_calls"] = calls
        out.append(message)
    return out


class JinjaTemplate:
    """A model's own chat template, rendered the way transformers and vLLM render it."""

    def __init__(
        self, source: str, config: dict[str, Any], name: str, loaded: LoadedTokenizer
    ) -> None:
        try:
            import jinja2
            import jinja2.sandbox
        except ImportError:
            raise TemplateError(
                "rendering a model's chat template needs jinja2: "
                "pip install 'batchbench[templates]'"
            ) from None
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_template_error
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"cannot compile the chat template {name}: {exc}") from None
        self._specials = {
            key: _token_text(config.get(key)) for key in ("bos_token", "eos_token", "pad_token")
        }
        self.name = name
        added = loaded.tokenizer.get_added_tokens_decoder()
        self.markers = frozenset(token.content for token in added.values() if token.content)

    def render(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> str:
        if tools is not None and not isinstance(tools, list):
            raise TemplateError("tools must be a list of objects")
        try:
            return self._template.render(
                messages=for_template(messages),
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                **self._specials,
            )
        except TemplateError:
            raise
        except Exception as exc:
            raise TemplateError(f"chat_template failed to render the request: {exc}") from None


def read_template_files(directory: Path) -> tuple[str, dict[str, Any], str]:
    """(template source, tokenizer config, its file) from a model directory: its
    ``chat_template.jinja`` first (the newer convention), else the ``chat_template`` of
    its ``tokenizer_config.json`` (named templates: "default"). The config, when there is
    one, also gives the special tokens the template may print."""
    config_path = directory / "tokenizer_config.json"
    jinja_path = directory / "chat_template.jinja"
    config: dict[str, Any] = {}
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TemplateError(f"cannot read {config_path}: {exc}") from None
        if not isinstance(config, dict):
            raise TemplateError(f"cannot read {config_path}: not a JSON object")
    if jinja_path.is_file():
        try:
            return jinja_path.read_text(encoding="utf-8"), config, str(jinja_path)
        except OSError as exc:
            raise TemplateError(f"cannot read {jinja_path}: {exc}") from None
    if not config_path.is_file():
        raise TemplateError(
            f"{directory} holds no chat_template.jinja and no tokenizer_config.json"
        )
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str) or not template:
        raise TemplateError(f"{config_path} has no chat_template")
    return template, config, str(config_path)


def load_chat_template(spec: str, loaded: LoadedTokenizer) -> BuiltinTemplate | JinjaTemplate:
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
        return JinjaTemplate(*read_template_files(source.parent), loaded)
    path = Path(spec)
    if path.is_dir():
        return JinjaTemplate(*read_template_files(path), loaded)
    if path.is_file():
        try:
            return JinjaTemplate(path.read_text(encoding="utf-8"), {}, str(path), loaded)
        except OSError as exc:
            raise TemplateError(f"cannot read {path}: {exc}") from None
    raise TemplateError(
        f"unknown chat template {spec!r}; expected one of {', '.join(TEMPLATE_CHOICES)}, "
        "a .jinja file or a directory holding one"
    )
