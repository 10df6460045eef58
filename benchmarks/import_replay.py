"""Import a trace and replay it on the embedded simulator: is the replay exact, and how
much of the prompt does the simulator's prefix cache serve?

Run from the repository root with the package installed:

    python -m benchmarks.import_replay FORMAT INPUT... [--time-scale X] \\
        [--import-args "--first-seconds 300 ..."] [--agent-args "..."]

It runs ``batchbench import`` into a temporary folder, then ``batchbench agent --sim
--sim-args "--speed 0" --admission open-loop --calibrate`` on the manifest (open loop: each
trajectory starts at its recorded offset; ``--time-scale`` compresses the trace's time),
and prints one line: requests, prompt-exact and output-exact shares, and the prefix cache
hit rate the simulator reported (cached prompt tokens / prompt tokens).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

from batchbench.cli.agent import run_console
from batchbench.cli.import_trace import run as run_import


def replay(
    fmt: str, inputs: list[str], import_args: list[str], agent_args: list[str], scale: float
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="import-replay-") as folder:
        manifest = str(Path(folder) / "manifest.jsonl")
        results = Path(folder) / "results.json"
        if run_import([fmt, *inputs, "-o", manifest, *import_args]) != 0:
            raise SystemExit("the import failed")
        argv = [
            "--sim", "--sim-args", "--speed 0", "--agent-plans-jsonl", manifest,
            "--admission", "open-loop", "--time-scale", str(scale), "--calibrate",
            "--no-progress", "--results-json", str(results), *agent_args,
        ]  # fmt: skip
        status = run_console(argv, "batchbench-agent")
        document = json.loads(results.read_text())
    metrics = document["metrics"]
    fidelity = document["fidelity"]
    sent = metrics.get("total_input_tokens") or 0
    return {
        "status": status,
        "requests": fidelity["prompt"]["requests"],
        "prompt_exact_percent": fidelity["prompt"]["exact_percent"],
        "output_exact_percent": fidelity["output"]["exact_percent"],
        "server_cached_tokens": metrics["server_cached_input_tokens"],
        "input_tokens": sent,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("format")
    parser.add_argument("inputs", nargs="+")
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--import-args", default="", help="flags for batchbench import")
    parser.add_argument("--agent-args", default="", help="more flags for the replay")
    args = parser.parse_args()
    line = replay(
        args.format,
        args.inputs,
        shlex.split(args.import_args),
        shlex.split(args.agent_args),
        args.time_scale,
    )
    hit = line["server_cached_tokens"] / line["input_tokens"] if line["input_tokens"] else 0.0
    print(
        f"{args.format}: {line['requests']} requests; prompt exact "
        f"{line['prompt_exact_percent']:.1f}%, output exact {line['output_exact_percent']:.1f}%; "
        f"prefix cache hit rate {hit:.1%} ({line['server_cached_tokens']:,} of "
        f"{line['input_tokens']:,} prompt tokens); exit status {line['status']}"
    )
    sys.exit(0 if line["status"] == 0 else 1)


if __name__ == "__main__":
    main()
