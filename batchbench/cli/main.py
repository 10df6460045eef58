"""``batchbench``: one command for the package's tools (``run``, ``validate``, ...)."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Sequence

from batchbench.cli.agent import exit_process, hold_late_signals, run_console
from batchbench.cli.agent_args import version_text
from batchbench.text.tokenizer import describe_builtins

USAGE = """usage: batchbench <command> [options]

commands:
  run          the benchmark: replay trajectories or sampled agents against a server
  agent        the same as run (and as the batchbench-agent script), kept for existing scripts
  sim          run the OpenAI-compatible serving simulator (DP ranks, prefix caches, faults)
  calibrate    measure a server's chat-template overheads with probe requests
  validate     check trajectory manifests, report every invalid line, summarize valid files
  capacity     find how many active agents a deployment holds under --slo (doubling, then
               bisection; one results JSON per step, resumable)
  report       write a self-contained HTML report (charts) from results or capacity JSON
  import       turn a public trace (Mooncake, WEKA, TraceLab, Azure, ...) into a manifest
  export-plans rebuild sessions from request-log rows (JSONL) into a schema v2 manifest
  record       a proxy that records your agents' requests as content-free rows for
               export-plans (hashes and token counts, never text)
  merge        merge the results of a run split with --shard I/N into one run's outputs
  tokenizers   list the built-in tokenizer names usable with --tokenizer-model

options:
  --version    print the version and which implementation (native or pure Python) is active
  -h, --help   show this help

Run `batchbench run --help` for the benchmark's options.
"""


def run(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], list(argv[1:])
    if command == "--version":
        print(version_text())
        return 0
    if command in ("run", "agent"):  # one benchmark, two names
        hold_late_signals()
        return run_console(rest, f"batchbench {command}")
    if command == "sim":
        from batchbench.cli.sim import run as run_sim  # lazy: one command's modules

        return run_sim(rest)
    if command == "calibrate":
        from batchbench.cli.calibrate import run as run_calibrate  # lazy: one command's modules

        return run_calibrate(rest)
    if command == "validate":
        from batchbench.cli.validate import run as run_validate  # lazy: one command's modules

        return run_validate(rest)
    if command == "capacity":
        from batchbench.cli.capacity import run as run_capacity  # lazy: one command's modules

        return run_capacity(rest)
    if command == "report":
        from batchbench.cli.report import run as run_report  # lazy: one command's modules

        return run_report(rest)
    if command == "merge":
        from batchbench.cli.merge import run as run_merge  # lazy: one command's modules

        return run_merge(rest)
    if command == "export-plans":
        from batchbench.cli.export_plans import run as run_export  # lazy: one command's modules

        return run_export(rest)
    if command == "record":
        from batchbench.cli.record import run as run_record  # lazy: one command's modules

        return run_record(rest)
    if command == "import":
        from batchbench.cli.import_trace import run as run_import  # lazy: one command's modules

        return run_import(rest)
    if command == "tokenizers":
        if rest:
            return tokenizers_usage(rest)
        for name, path in describe_builtins():
            print(f"{name}\t{path}")
        return 0
    close = difflib.get_close_matches(command, COMMANDS, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    print(
        f"Error: unknown command {command!r}{hint}; expected "
        f"{', '.join(COMMANDS[:-1])} or {COMMANDS[-1]}",
        file=sys.stderr,
    )
    return 2


TOKENIZERS_USAGE = """usage: batchbench tokenizers

List the built-in tokenizer names usable with --tokenizer-model (they ship with the package
and load offline), one a line: the name, a tab, and the tokenizer.json it loads (or "not
installed").

options:
  -h, --help   show this help
"""


def tokenizers_usage(rest: Sequence[str]) -> int:
    """``batchbench tokenizers --help``: its help; any other argument: a usage error."""
    if rest[0] in ("-h", "--help") and len(rest) == 1:
        sys.stdout.write(TOKENIZERS_USAGE)
        return 0
    print(f"Error: batchbench tokenizers takes no arguments, not {rest[0]!r}", file=sys.stderr)
    return 2


COMMANDS = (
    "run",
    "agent",
    "sim",
    "calibrate",
    "validate",
    "capacity",
    "report",
    "merge",
    "import",
    "export-plans",
    "record",
    "tokenizers",
)


def main() -> None:
    try:
        status = run(sys.argv[1:])
    except KeyboardInterrupt:  # a late Ctrl+C while an agent run's last error line prints
        status = 130
    exit_process(status)
