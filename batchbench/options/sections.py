"""The ``--help`` sections of the run options and the commands that take them: the
vocabulary the declarations on ``RunConfig``'s fields use."""

from __future__ import annotations

from batchbench.options.declare import RUN_COMMANDS, Group

AGENT_ONLY = ("agent",)  # options a capacity search sets itself, per step, or cannot use
WITH_CALIBRATE = (*RUN_COMMANDS, "calibrate")  # the target, and what a probe request sends

# --help sections, in the order batchbench-agent shows them (``order``: the options that
# predate the declaration keep their place in a section). "(not in the Rust
# batchbench-agent)": options the Rust tool this package replaces does not have (see the
# README's "One command line"); the other sections hold its options, and ours beside them.
TARGET = Group("target and model")
FIDELITY = Group("prompt fidelity (not in the Rust batchbench-agent)")
SHAPE = Group("sampled workload shape (without --agent-plans-jsonl)")
REPLAY = Group("agents, replay and admission", order=("agents",))
ROUTING = Group("routing and identity")
HTTP = Group(
    "HTTP behaviour and outputs",
    order=(
        "request-timeout-secs",
        "max-response-bytes",
        "max-retries",
        "retry-delay-ms",
        "max-retry-wait",
        "max-failure-rate",
        "sglang",
        "ignore-eos",
        "verbose",
        "dry-run",
        "seed",
    ),
)
LIVE = Group(
    "live runs (not in the Rust batchbench-agent)",
    order=(
        "stream",
        "no-stream",
        "request-events-jsonl",
        "results-json",
        "grace-seconds",
        "no-preflight",
        "no-progress",
    ),
)
WINDOW = Group("objectives, measured window and report")
SCALE = Group("scale-out (not in the Rust batchbench-agent)")
SIM = Group("embedded simulator (not in the Rust batchbench-agent)")
OPTION_GROUPS = (TARGET, FIDELITY, SHAPE, REPLAY, ROUTING, HTTP, LIVE, WINDOW, SCALE, SIM)
# batchbench calibrate's sections
PROBES = Group(
    "probes (as in batchbench-agent)",
    order=(
        "sglang",
        "ignore-eos",
        "stream",
        "no-stream",
        "disable-user-tagging",
        "request-timeout-secs",
        "chat-template",
    ),
)
CALIBRATE_SIM = Group("embedded simulator")
