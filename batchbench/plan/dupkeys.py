"""Duplicate keys in a manifest line, which orjson (like most parsers) resolves silently.

A line that names a key twice (``"prompt_tokens":100,"prompt_tokens":5000``) is refused
at every level, because the value that wins is a parser's accident, not the author's
intent. Checking every line with a second, pair-preserving parse would double the
loader's cost, so the check is a count first:

- every key of every object is followed by exactly one ``:`` outside strings, and a ``:``
  inside a string is a byte of that string; so the line's ``:`` bytes are at least the
  number of keys written, and exactly that plus the colons of its strings;
- orjson's objects hold the *distinct* keys, which the validator counts as it walks them.

When the colon count equals the distinct keys (plus, for a line with colons in its
strings, the colons of the parsed strings, when the line has no escapes that could hide
one), no key repeats. Anything else, and every line that fails validation, is parsed
again by ``json`` with a hook that marks objects whose keys repeat, to name the first
one. The walk goes outermost object first, then in document order.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from batchbench.errors import ManifestError

# (parent path, key or index): how the walk reached a value.
_Path = tuple[str | int, ...]


def keys_in(value: Any) -> int:
    """Keys of every object in a parsed JSON value (the distinct keys orjson kept)."""
    if type(value) is dict:  # the common case, a flat object, without a generator
        for inner in value.values():
            if type(inner) is dict or type(inner) is list:
                break
        else:
            return len(value)
    count = 0
    pending = [value]
    while pending:
        item = pending.pop()
        if type(item) is dict:
            count += len(item)
            pending.extend(v for v in item.values() if type(v) in (dict, list))
        elif type(item) is list:
            pending.extend(v for v in item if type(v) in (dict, list))
    return count


def string_colons(value: Any) -> int:
    """``:`` characters in every key and string of a parsed JSON value."""
    count = 0
    pending = [value]
    while pending:
        item = pending.pop()
        if type(item) is dict:
            for key, inner in item.items():
                count += key.count(":")
                if type(inner) is str:
                    count += inner.count(":")
                elif type(inner) in (dict, list):
                    pending.append(inner)
        elif type(item) is list:
            for inner in item:
                if type(inner) is str:
                    count += inner.count(":")
                elif type(inner) in (dict, list):
                    pending.append(inner)
        elif type(item) is str:
            count += item.count(":")
    return count


def may_repeat(line: bytes, parsed: Any, keys: int) -> bool:
    """False when the counts prove no key of ``line`` repeats; ``keys``: the distinct keys
    of every object in ``parsed`` (orjson's value of ``line``)."""
    colons = line.count(b":")
    if colons == keys:
        return False
    # Colons inside strings; an escape (\u003a) could stand for one and hide a repeat.
    if b"\\" in line:
        return True
    # The id and the metadata hold them in most files ("session:42"): counting those
    # strings first spares walking every request. Each count only adds string colons,
    # so an equality still proves that no key repeats.
    if type(parsed) is dict:
        ident = parsed.get("trajectory_id")
        known = ident.count(":") if type(ident) is str else 0
        known += string_colons(parsed.get("metadata"))
        if colons == keys + known:
            return False
    return colons != keys + string_colons(parsed)


def check(line: bytes) -> None:
    """Raise the ``ManifestError`` naming the first repeated key of a line, if any."""
    message = first_repeat(line)
    if message is not None:
        raise ManifestError(message)


class _Object(dict):
    """A parsed object that remembers its first repeated key."""

    repeated: str | None = None


def _hook(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                obj.repeated = key
                break
            seen.add(key)
    return obj


def first_repeat(line: bytes) -> str | None:
    """The message for the first repeated key of a line (None when no key repeats or the
    line is not JSON): outermost object first, then in document order."""
    try:
        root = json.loads(line.decode("utf-8"), object_pairs_hook=_hook)
    except RecursionError:  # orjson takes 1024 levels, json fewer
        return "JSON nested too deeply to check for duplicate keys"
    except ValueError:  # not JSON (or not UTF-8): the validator's message says why
        return None
    pending: list[tuple[Any, _Path]] = [(root, ())]
    while pending:
        value, path = pending.pop()
        if type(value) is _Object:
            if value.repeated is not None:
                return _message(path, value.repeated)
            children = [(inner, (*path, key)) for key, inner in value.items()]
        elif type(value) is list:
            children = [(inner, (*path, index)) for index, inner in enumerate(value)]
        else:
            continue
        pending.extend(reversed(children))
    return None


def _message(path: _Path, key: str) -> str:
    """Name the object as the validator's messages do: the trajectory, request ``n``, its
    block ``k``, or any other object by its path."""
    quoted = orjson.dumps(key).decode()
    if path == ():
        return f"duplicate field {quoted}"
    if len(path) == 2 and path[0] == "requests" and type(path[1]) is int:
        return f"request {path[1] + 1} has duplicate field {quoted}"
    if (
        len(path) == 4
        and path[0] == "requests"
        and type(path[1]) is int
        and path[2] == "blocks"
        and type(path[3]) is int
    ):
        return (
            f"request {path[1] + 1} blocks are invalid: "
            f"block {path[3] + 1} has duplicate field {quoted}"
        )
    if len(path) >= 2 and path[0] == "requests" and type(path[1]) is int:
        where = f"request {path[1] + 1} field {_dotted(path[2:])}"
    else:
        where = _dotted(path)
    return f"duplicate key {quoted} in {where}"


def _dotted(path: _Path) -> str:
    """``metadata.tags[0]``; a key that is not a plain name is quoted: ``a["b c"]``."""
    text = ""
    for step in path:
        if isinstance(step, int):
            text += f"[{step}]"
        elif step.isidentifier():
            text += f".{step}" if text else step
        else:
            text += f"[{orjson.dumps(step).decode()}]"
    return text
