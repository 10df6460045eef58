"""Prompt fidelity against a real server: correction on and off, side by side.

Run from the repository root with the package installed:

    python -m benchmarks.bench_fidelity --host URL --model M --tokenizer-model T \\
        [--manifest F] [--calibrate | --overheads I,T] [--ignore-eos] [--stream] [-- FLAGS…]

It replays a manifest twice with ``batchbench-agent`` (prompt correction on, then
``--no-prompt-correction``; the same seed, a fresh content salt each time so no run is
served from the other's cache), reads the request events, and prints for each run the
share of requests whose ``usage.prompt_tokens`` equals the planned ``prompt_tokens``, the
drift histogram and the mean drift per turn index, plus the output fidelity. Without
``--manifest`` it writes a fixed replay of 16 trajectories and 68 requests with resets and
tool delays (``--trajectories`` and ``--turns`` make a bigger one). Flags after ``--`` go
to both runs (e.g. ``-- --prompt-oracle server``; with ``--no-prompt-correction`` the
oracle is left out of the second run).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

from batchbench.cli.agent import run_console

# Requests per trajectory, cycled: 16 trajectories make 68 requests.
TURNS = (3, 4, 5, 6, 2, 7, 4, 3, 5, 4, 6, 3, 5, 4, 3, 4)


def write_manifest(path: Path, trajectories: int, max_turns: int, seed: int = 20261204) -> int:
    """A reproducible schema-v1 replay with growth, compactions and tool delays; returns
    the number of requests. The defaults give 16 trajectories and 68 requests."""
    rng = random.Random(seed)
    total = 0
    with open(path, "w") as handle:
        for index in range(trajectories):
            turns = min(max_turns, TURNS[index % len(TURNS)])
            prompt = rng.randrange(80, 600)
            requests = []
            for turn in range(turns):
                output = rng.randrange(12, 48)
                request: dict = {"prompt_tokens": prompt, "output_tokens": output}
                if turn and rng.random() < 0.12:
                    prompt = rng.randrange(60, 300)  # a compaction: a shorter fresh prompt
                    request = {"prompt_tokens": prompt, "output_tokens": output}
                    request["reset_before"] = True
                if rng.random() < 0.4:
                    request["delay_after_ms"] = rng.randrange(1, 60)
                requests.append(request)
                prompt += output + rng.randrange(80, 240)
            total += len(requests)
            document = {
                "schema_version": 1,
                "trajectory_id": f"fidelity-{index:03d}",
                "requests": requests,
            }
            handle.write(json.dumps(document, separators=(",", ":")) + "\n")
    return total


def read_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(label: str, events: list[dict]) -> list[str]:
    ok = [e for e in events if e["status"] == "ok"]
    failed = len(events) - len(ok)
    lines = [f"== {label}: {len(ok)} successful requests, {failed} not"]
    if not ok:
        return lines
    drift = Counter(e["prompt_drift"] for e in ok)
    exact = drift.get(0, 0)
    lines.append(f"prompt exact: {exact}/{len(ok)} ({100.0 * exact / len(ok):.1f}%)")
    lines.append(
        "prompt drift histogram: "
        + ", ".join(f"{value:+d}: {count}" for value, count in sorted(drift.items()))
    )
    by_turn: dict[int, list[int]] = defaultdict(list)
    for event in ok:
        by_turn[event["invocation"]].append(event["prompt_drift"])
    lines.append(
        "mean drift by request number: "
        + ", ".join(
            f"{turn}: {sum(values) / len(values):+.2f} (n={len(values)})"
            for turn, values in sorted(by_turn.items())
        )
    )
    output = Counter(e["output_drift"] for e in ok)
    out_exact = output.get(0, 0)
    lines.append(
        f"output exact: {out_exact}/{len(ok)} ({100.0 * out_exact / len(ok):.1f}%); histogram "
        + ", ".join(f"{value:+d}: {count}" for value, count in sorted(output.items()))
    )
    limited = sum(1 for e in ok if e["correction_note"])
    if limited:
        lines.append(f"requests the correction could not bring to target: {limited}")
    return lines


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in raw:
        cut = raw.index("--")
        raw, extra = raw[:cut], raw[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokenizer-model", required=True)
    parser.add_argument("--manifest", type=Path, help="schema-v1 manifest (default: generated)")
    parser.add_argument("--trajectories", type=int, default=16)
    parser.add_argument("--turns", type=int, default=8, help="most requests per trajectory")
    parser.add_argument("--max-active-agents", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--calibrate", action="store_true", help="calibrate before each run")
    parser.add_argument("--overheads", help="initial,turn overhead flags instead of calibrating")
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--only", choices=("on", "off"), help="run one of the two modes")
    args = parser.parse_args(raw)

    with tempfile.TemporaryDirectory(prefix="bench-fidelity-") as tmp:
        work = Path(tmp)
        manifest = args.manifest
        if manifest is None:
            manifest = work / "plans.jsonl"
            count = write_manifest(manifest, args.trajectories, args.turns)
            print(f"manifest: generated, {args.trajectories} trajectories, {count} requests")
        common = [
            "--host", args.host, "--model", args.model,
            "--tokenizer-model", args.tokenizer_model,
            "--agent-plans-jsonl", str(manifest),
            "--max-active-agents", str(args.max_active_agents),
            "--seed", str(args.seed), "--no-progress",
        ]  # fmt: skip
        if args.calibrate:
            common.append("--calibrate")
        if args.overheads:
            initial, turn = args.overheads.split(",")
            common += ["--replay-initial-overhead-tokens", initial]
            common += ["--replay-turn-overhead-tokens", turn]
        if args.ignore_eos:
            common.append("--ignore-eos")
        if args.stream:
            common.append("--stream")
        report: list[str] = []
        modes = [("correction on", []), ("correction off", ["--no-prompt-correction"])]
        if args.only:
            modes = modes[:1] if args.only == "on" else modes[1:]
        for label, flags in modes:
            events = work / f"events-{len(report)}.jsonl"
            mode_extra = list(extra)
            if flags and "--prompt-oracle" in mode_extra:
                at = mode_extra.index("--prompt-oracle")
                del mode_extra[at : at + 2]
            status = run_console(
                [*common, *flags, *mode_extra, "--request-events-jsonl", str(events)],
                "batchbench-agent",
            )
            if status not in (0, 3):
                print(f"batchbench-agent exited with status {status}", file=sys.stderr)
                return status
            report += summarize(label, read_events(events))
        print()
        print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
