"""Checks of a run's options that need more than one value or the outside world: options
that need or exclude another, URLs, output paths and the API key. ``RunConfig.check`` runs
them in the order a command line reports its errors."""

from __future__ import annotations

import os

from batchbench.errors import UsageError

SIM_TEMPLATES = ("chatml", "gemma", "llama3", "qwen3", "tokenizer")  # what the simulator renders


def check_flag_combinations(
    *,
    replay: bool,
    replay_only: tuple[tuple[str, object], ...],
    sim: bool,
    sim_only: tuple[tuple[str, object], ...],
    endpoint: str,
    dry_run: bool,
    prompt_oracle: str,
    prompt_correction: bool,
    chat_template: str | None,
    calibrate: bool,
    admission: str | None = None,
    arrival_rate: float | None = None,
    arrival_process: str | None = None,
    routing_pair: tuple[bool, int | None] | None = None,
) -> None:
    """Options that need another option, or exclude one; ``(flag, value)`` pairs count as
    given when the value is not None. The command line checks them right after parsing
    (with the --dp-rank-perfect-routing pair, which a config holds as one value)."""
    if not replay:
        for flag, value in replay_only:
            if value is not None:
                raise UsageError(f"{flag} requires --agent-plans-jsonl")
    check_arrivals(replay, admission, arrival_rate, arrival_process)
    if routing_pair is not None:
        enabled, ranks = routing_pair
        if enabled and ranks is None:
            raise UsageError("--dp-rank-perfect-routing requires --dp-rank-perfect-routing-num")
        if ranks is not None and not enabled:
            raise UsageError("--dp-rank-perfect-routing-num requires --dp-rank-perfect-routing")
    if not sim:
        for flag, value in sim_only:
            if value is not None:
                raise UsageError(f"{flag} requires --sim")
    if sim and endpoint.startswith(("http://", "https://")):
        raise UsageError(
            "--sim cannot be combined with a full-URL --endpoint; give a path such as "
            "/v1/chat/completions"
        )
    if sim and dry_run:
        raise UsageError("--sim cannot be combined with --dry-run; a dry-run sends nothing")
    if prompt_oracle == "server" and not prompt_correction:
        raise UsageError("--prompt-oracle server cannot be combined with --no-prompt-correction")
    if prompt_oracle == "server" and dry_run:
        raise UsageError("--prompt-oracle server cannot be combined with --dry-run")
    if sim and chat_template is not None:
        if chat_template not in SIM_TEMPLATES:
            raise UsageError(
                "with --sim, --chat-template must be chatml, gemma, llama3, qwen3 or tokenizer "
                "(the simulator's templates)"
            )
        if "--chat-template" in str(dict(sim_only).get("--sim-args") or ""):
            raise UsageError("give --chat-template once: as a flag or inside --sim-args, not both")
    if calibrate and dry_run:
        raise UsageError("--calibrate cannot be combined with --dry-run; a dry-run sends nothing")


def check_arrivals(
    replay: bool, admission: str | None, arrival_rate: float | None, arrival_process: str | None
) -> None:
    """Open loop needs start times: a manifest's, or an arrival rate's. An arrival rate
    implies open loop, so it excludes closed loop; its process needs it."""
    if arrival_process is not None and arrival_rate is None:
        raise UsageError("--arrival-process requires --arrival-rate")
    if arrival_rate is not None and admission == "closed-loop":
        raise UsageError(
            "--arrival-rate cannot be combined with --admission closed-loop; "
            "agents that arrive at a rate are admitted open-loop"
        )
    if admission is not None and not replay and arrival_rate is None:
        if admission == "open-loop":
            raise UsageError("--admission open-loop requires --agent-plans-jsonl or --arrival-rate")
        raise UsageError("--admission requires --agent-plans-jsonl")


def check_url(flag: str, value: str) -> None:
    """An http:// or https:// URL, or a usage error that shows the fix."""
    scheme, separator, rest = value.partition("://")
    if not separator:
        raise UsageError(
            f"{flag} {value} has no scheme: use {flag} http://{value} (or https://{value})"
        )
    if scheme.lower() not in ("http", "https"):
        raise UsageError(f"{flag} {value}: only http:// and https:// servers are supported")
    if not rest.strip("/"):
        raise UsageError(f"{flag} {value} names no host")


def check_output_path(flag: str, path: str) -> None:
    """Before the run: the file can be created or replaced (its directory exists, it is not
    a directory, and it may be written), so no result is lost at the end."""
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a directory; give a file name")
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise UsageError(f"{flag} {path}: the directory {parent} does not exist")
    exists = os.path.exists(path)
    if not os.access(parent, os.W_OK | os.X_OK) or (exists and not os.access(path, os.W_OK)):
        raise UsageError(f"{flag} {path} cannot be written (permission denied)")


def check_api_key(key: str, env: str) -> None:
    """The key must fit an HTTP header: visible ASCII (spaces inside allowed)."""
    for position, char in enumerate(key, 1):
        if not " " <= char <= "~":
            what = "a control character" if ord(char) < 32 or ord(char) == 127 else "non-ASCII"
            raise UsageError(
                f"the API key (--api-key or ${env}) cannot be sent in an HTTP header: "
                f"character {position} is {what}"
            )
    if key != key.strip():
        raise UsageError(
            f"the API key (--api-key or ${env}) starts or ends with whitespace; remove it"
        )
