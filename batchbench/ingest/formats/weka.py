"""WEKA's Claude Code trajectories (callanjfox/kv-cache-tester ``traces/trace_NNNN.json``).

One JSON file is one trajectory: ``block_size`` and ``hash_id_scope`` for its hash ids, the
token sizes of its tool definitions and system prompt, and ``requests[]``. A request has
``t`` (seconds since the trajectory began), ``type`` (``s`` streamed, ``n`` not), ``in``,
``out``, ``hash_ids`` (the prompt's full blocks; the tokens past them are new content),
``api_time`` (seconds the API call took), ``think_time`` (the idle gap before it) and
``model``. An entry of ``type`` ``subagent`` is a sub-agent (a Task tool call): it carries
its own ``requests[]``, tool and system sizes, ``duration_ms``, and may nest further
sub-agents the same way. Its ``t`` is when it *returned*: ``t − duration_ms`` falls on
the end of the parent request that spawned it (within a second, for all six sub-agents
of the public sample; three spawned together in trace_0277 share that start), its
requests' ``t`` count from that start, and the parent's next ``think_time`` covers the
wait. So a sub-agent's requests are placed at ``t − duration_ms/1000 + request t``.

Every request becomes a Record, in document order; ``row`` counts requests from 1 in that
order, sub-agents' requests where the sub-agent sits (sub-agent entries take no number).
The main agent's requests form the session named after the file (its name without
``.json`` and a compression suffix); each sub-agent's form the session ``<file>/sub<k>``
(k counts sub-agents from 1 in document order), and ``origin`` is the request's path in
the document (``requests[16].requests[3]``: the sub-agent entry is the spawn point).
Schema v2 has no spawn or join, so a sub-agent replays as its own open-loop trajectory at
its recorded start while the parent's recorded idle gap stands for the wait.
Hash ids are one id space per file, shared by the main agent and its sub-agents (the
sub-agents of trace_0291 share their own prefix with each other and none with the
parent), so ``hash_id_scope: local`` becomes ``hash_scope="file"``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import PurePath
from typing import Any, Literal

from batchbench.errors import InputError
from batchbench.ingest.formats.fields import Fields, parse_object
from batchbench.ingest.inputs import open_binary
from batchbench.ingest.record import FormatOptions, Record

NAME = "weka"
SUMMARY = "WEKA Claude Code trajectories: one JSON file each, sub-agents as their own sessions"

_SCOPES: dict[str, Literal["global", "file"]] = {"local": "file", "global": "global"}
_COMPRESSION = (".gz", ".zst", ".zstd")


def trajectory_key(path: str) -> str:
    """The file's name without its compression suffix and ``.json``: the main session."""
    name = PurePath(path).name
    for suffix in _COMPRESSION:
        name = name.removesuffix(suffix)
    return name.removesuffix(".json")


def prefix_roles(prompt: int, tool_tokens: int, system_tokens: int) -> tuple[tuple[str, int], ...]:
    """Tool definitions then system prompt, clipped to the prompt: a prompt shorter than
    both (a changed tool set) still labels its first tokens as the longer prompts sharing
    its blocks do, so one block never gets two roles."""
    tools = min(prompt, tool_tokens)
    system = min(prompt - tools, system_tokens)
    return tuple(
        (role, size) for role, size in (("tool_definition", tools), ("system", system)) if size
    )


class _Reader:
    """One file's walk: the running row and sub-agent numbers, and what every record shares."""

    def __init__(self, path: str, block_size: int, scope: Literal["global", "file"]) -> None:
        self.path = path
        self.block_size = block_size
        self.scope = scope
        self.row = 0
        self.subagents = 0

    def agent(self, fields: Fields, session: str, base_s: float, origin: str) -> Iterator[Record]:
        """The requests of one agent (the file, or a sub-agent entry) and its sub-agents."""
        tool_tokens = fields.count("tool_tokens")
        system_tokens = fields.count("system_tokens")
        for index, entry in enumerate(fields.objects("requests")):
            where = f"{origin}requests[{index}]"
            request = Fields(entry, f"{self.path}: {where}")
            kind = request.text("type")
            if kind == "subagent":
                self.subagents += 1
                yield from self.agent(
                    request,
                    f"{trajectory_key(self.path)}/sub{self.subagents}",
                    base_s + request.seconds("t") - request.count("duration_ms") / 1000,
                    f"{where}.",
                )
            elif kind in ("s", "n"):
                yield self.request(
                    request, kind, session, base_s, where, tool_tokens, system_tokens
                )
            else:
                raise InputError(
                    f'{request.where}: field "type" must be "s", "n" or "subagent", got {kind!r}'
                )

    def request(
        self,
        request: Fields,
        kind: str,
        session: str,
        base_s: float,
        origin: str,
        tool_tokens: int,
        system_tokens: int,
    ) -> Record:
        prompt = request.count("in")
        hash_ids = request.ids("hash_ids")
        if len(hash_ids) > -(-prompt // self.block_size):
            raise InputError(
                f'{request.where}: field "hash_ids" has {len(hash_ids)} blocks of '
                f"{self.block_size} tokens, more than the {prompt}-token prompt holds"
            )
        self.row += 1
        return Record(
            source=self.path,
            row=self.row,
            time_s=base_s + request.seconds("t"),
            input_tokens=prompt,
            output_tokens=request.count("out"),
            latency_s=request.optional_duration("api_time"),
            idle_before_s=request.optional_duration("think_time"),
            session=session,
            hash_ids=hash_ids,
            block_size=self.block_size,
            hash_scope=self.scope,
            prefix_roles=prefix_roles(prompt, tool_tokens, system_tokens),
            stream=kind == "s",
            model=request.optional_text("model"),
            origin=origin,
        )


def _document(path: str) -> dict[str, Any]:
    stream = open_binary(path)
    try:
        data = stream.read()
    except (OSError, EOFError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    finally:
        stream.close()
    return parse_object(data, path)


def read(path: str, options: FormatOptions) -> Iterator[Record]:
    """The file's requests, sub-agents' included, in document order."""
    fields = Fields(_document(path), path)
    block_size = options.block_size or fields.count("block_size")
    if block_size <= 0:
        raise fields.error("block_size", "a positive integer", block_size)
    scope = fields.text("hash_id_scope")
    if scope not in _SCOPES:
        raise InputError(
            f'{path}: field "hash_id_scope" must be "local" or "global", got {scope!r}'
        )
    reader = _Reader(path, block_size, _SCOPES[scope])
    yield from reader.agent(fields, trajectory_key(path), 0.0, "")
