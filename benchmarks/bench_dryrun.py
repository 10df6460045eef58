"""Dry run of a large manifest: wall seconds and peak RSS of the whole command.

Run from the repository root (package installed, or ``PYTHONPATH=.``):
``python benchmarks/bench_dryrun.py [--trajectories N] [--runs R]``. Writes N one-request
trajectories into a temp file and runs ``batchbench agent --dry-run`` on it (every
trajectory admitted at t = 0, its text generated, one ``[DRY-RUN]`` line each, sent to
/dev/null) R times in a child process, then ``batchbench validate`` of the same file as
the yardstick. Peak RSS is the child's own (``wait4``). Budget at 10^6: 60 s, 800 MB.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

BUDGET_SECONDS = 60.0
BUDGET_MB = 800.0


def write_manifest(path: str, trajectories: int) -> None:
    """One request per trajectory, prompts of 64 to 127 tokens."""
    line = (
        '{"schema_version":1,"trajectory_id":"t%07d",'
        '"requests":[{"prompt_tokens":%d,"output_tokens":16}]}\n'
    )
    with open(path, "w") as out:
        out.writelines(line % (i, 64 + i % 64) for i in range(trajectories))


def measure(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of one child process."""
    start = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        child = subprocess.Popen(argv, stdout=sink, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        error = child.stderr.read().decode() if child.stderr else ""
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({child.returncode}): {error}")
    return time.perf_counter() - start, usage.ru_maxrss / 1024.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "manifest.jsonl")
        write_manifest(path, args.trajectories)
        command = [sys.executable, "-m", "batchbench"]
        dry = [*command, "agent", "--agent-plans-jsonl", path, "--dry-run",
               "--tokenizer-model", "deepseek-v3", "--seed", "7"]  # fmt: skip
        runs = [measure(dry) for _ in range(args.runs)]
        validate_s, validate_mb = measure([*command, "validate", path])
    dry_s = statistics.median(s for s, _ in runs)
    dry_mb = max(mb for _, mb in runs)
    rows = [
        ("trajectories (one request each)", f"{args.trajectories:,}"),
        (f"dry run, wall (median of {args.runs})", f"{dry_s:.1f} s"),
        ("dry run, peak RSS", f"{dry_mb:.0f} MB"),
        ("validate, wall", f"{validate_s:.1f} s"),
        ("validate, peak RSS", f"{validate_mb:.0f} MB"),
        ("dry run / validate, wall", f"{dry_s / validate_s:.2f}x"),
    ]
    if args.trajectories == 1_000_000:
        rows.append(("budget", f"{BUDGET_SECONDS:.0f} s, {BUDGET_MB:.0f} MB"))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()
