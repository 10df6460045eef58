"""Behaviour-equality check: the same scenarios before and after a refactor, compared.

A refactor that must not change behaviour (same messages, outputs, file formats, exit
statuses) is checked by running a fixed list of scenarios with the code under test and
comparing every output file and the console, masked of whatever varies between two runs
of the same code (wall clock, durations, latencies, rates, CPU, pids, ports, temporary
paths). Deterministic values (token counts, request and agent counts, fidelity, seeds,
digests) are never masked, so a change in them shows up as a difference.

Run from the repository root, with the package under test importable (installed, or the
checkout first on ``PYTHONPATH`` after ``python setup.py build_ext --inplace``)::

    python benchmarks/behaviour_check.py --out BEFORE          # on the old code
    python benchmarks/behaviour_check.py --out AFTER           # on the new code
    python benchmarks/behaviour_check.py --compare BEFORE AFTER

``--out`` writes ``masked/<scenario>/<file>`` (what is compared: console stdout, stderr
and exit status of every step, every file the scenario wrote) and ``raw/<scenario>/``
(the unmasked files, to look at). ``--compare`` prints a unified diff per differing file
and exits 1 when anything differs. ``--only NAME`` runs some scenarios. A run takes about
a minute; two runs of the same code compare equal (that is the masks' test).

Also masked, because they follow timing rather than the code: line order of events files
in live runs (sorted), the client verdict (ok / client-bound follows the machine's load),
SLO attainment shares (of measured latencies), server gauges sampled at scrape instants,
content salts drawn at random, and runs of spaces (column widths follow masked values).
Times compare as ``<T>``; counts next to them stay.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import difflib
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "trajectory-replay"
STEP_TIMEOUT_S = 240

# --- scenarios ------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """Commands run in order in one fresh directory; every file they leave is compared."""

    name: str
    steps: tuple[tuple[str, ...], ...]
    sort_lines: tuple[str, ...] = field(default=())  # files whose line order is timing's
    directories: tuple[str, ...] = ()  # made before the first step
    server: tuple[str, ...] = ()  # `batchbench sim` options: started first, its URL is {host}


def _agent(*args: str) -> tuple[str, ...]:
    return ("batchbench-agent", *args)


def _bb(*args: str) -> tuple[str, ...]:
    return ("batchbench", *args)


def _shard_step(index: int) -> tuple[str, ...]:
    """One shard of the README example against the scenario's shared simulator."""
    return _agent(
        "--agent-plans-jsonl",
        "examples/trajectory-replay/plans.jsonl",
        "--max-active-agents",
        "2",
        "--host",
        "{host}",
        "--tokenizer-model",
        "deepseek-v3",
        "--seed",
        "7",
        "--shard",
        f"{index}/2",
        "--results-json",
        f"shard-{index}/results.json",
        "--agent-events-jsonl",
        f"shard-{index}/agent-events.jsonl",
        "--request-events-jsonl",
        f"shard-{index}/request-events.jsonl",
    )


_ALL_OUTPUTS = (
    "--results-json",
    "results.json",
    "--results-csv",
    "results.csv",
    "--agent-events-jsonl",
    "agent-events.jsonl",
    "--request-events-jsonl",
    "request-events.jsonl",
)
_LIVE_EVENTS = ("agent-events.jsonl", "request-events.jsonl")
_CAPACITY_SIM = (
    "--decode-step-ms 0 --decode-step-ms-per-seq 40 --decode-step-ms-per-ktoken 0 "
    "--prefill-tokens-per-s 1e9"
)

SCENARIOS: tuple[Scenario, ...] = (
    # README: the main command (as .ci/run runs it), the dry-run example, schema 2.
    Scenario(
        "readme-main",
        (
            _agent(
                "--agent-plans-jsonl",
                "examples/trajectory-replay/plans.jsonl",
                "--max-active-agents",
                "2",
                "--sim",
                "--calibrate",
                "--seed",
                "7",
                "--agent-events-jsonl",
                "events.jsonl",
            ),
        ),
        sort_lines=("events.jsonl",),
    ),
    Scenario(
        "readme-dry-run",
        (
            _agent(
                "--agent-plans-jsonl",
                "examples/trajectory-replay/plans.jsonl",
                "--max-active-agents",
                "2",
                "--replay-initial-overhead-tokens",
                "10",
                "--replay-turn-overhead-tokens",
                "4",
                "--tokenizer-model",
                "deepseek-v3",
                "--dry-run",
                "--seed",
                "7",
                *_ALL_OUTPUTS,
            ),
        ),
    ),
    Scenario(
        "readme-schema2",
        (
            _bb(
                "validate",
                "examples/trajectory-replay/plans.jsonl",
                "examples/trajectory-replay/plans-v2.jsonl",
            ),
            _bb("validate", "--json", "examples/trajectory-replay/plans-v2.jsonl"),
            _agent(
                "--agent-plans-jsonl",
                "examples/trajectory-replay/plans-v2.jsonl",
                "--sim",
                "--admission",
                "open-loop",
                "--seed",
                "7",
            ),
        ),
    ),
    Scenario(
        "sampled-live",
        (
            _agent(
                "--agents",
                "6",
                "--max-active-agents",
                "3",
                "--tool-invocations",
                "3",
                "--input-tokens",
                "300",
                "--output-tokens",
                "12",
                "--environment-tokens",
                "40",
                "--sim",
                "--sim-dp-ranks",
                "2",
                "--dp-rank-perfect-routing",
                "--dp-rank-perfect-routing-num",
                "2",
                "--stream",
                "--slo",
                "ttft_p95=5s,goodput=50%",
                "--seed",
                "11",
                *_ALL_OUTPUTS,
            ),
        ),
        sort_lines=_LIVE_EVENTS,
    ),
    Scenario(
        "v2-open-loop",
        (
            _agent(
                "--agent-plans-jsonl",
                "examples/trajectory-replay/plans-v2.jsonl",
                "--sim",
                "--admission",
                "open-loop",
                "--time-scale",
                "4",
                "--stream",
                "--seed",
                "7",
                *_ALL_OUTPUTS,
            ),
        ),
        sort_lines=_LIVE_EVENTS,
    ),
    Scenario(
        "workers-2",
        (
            _agent(
                "--agents",
                "8",
                "--max-active-agents",
                "4",
                "--tool-invocations",
                "2",
                "--output-tokens",
                "10",
                "--sim",
                "--workers",
                "2",
                "--seed",
                "5",
                *_ALL_OUTPUTS,
            ),
        ),
        sort_lines=_LIVE_EVENTS,
    ),
    Scenario(
        "shards-merge",
        (
            _shard_step(0),
            _shard_step(1),
            _bb("merge", "shard-0/results.json", "shard-1/results.json", "-o", "merged"),
        ),
        sort_lines=(
            "merged/agent-events.jsonl",
            "merged/request-events.jsonl",
            "shard-0/agent-events.jsonl",
            "shard-0/request-events.jsonl",
            "shard-1/agent-events.jsonl",
            "shard-1/request-events.jsonl",
        ),
        directories=("shard-0", "shard-1"),
        server=("--dp-ranks", "2"),
    ),
    Scenario(
        "capacity",
        (
            _bb(
                "capacity",
                "--sim",
                "--sim-args",
                _CAPACITY_SIM,
                "--stream",
                "--output-tokens",
                "8",
                "--agents",
                "8",
                "--tool-invocations",
                "2",
                "--slo",
                "itl_p50=60ms",
                "--warmup",
                "0",
                "--window-trajectories",
                "8",
                "--max-agents",
                "2",
                "--seed",
                "3",
                "--output-dir",
                "capacity-out",
                "--report-html",
                "capacity-out/report.html",
            ),
        ),
    ),
    Scenario(
        "report",
        (
            _agent(
                "--agents",
                "6",
                "--max-active-agents",
                "3",
                "--output-tokens",
                "8",
                "--tool-invocations",
                "3",
                "--tool-call-latency-ms",
                "300",
                "--sim",
                "--sim-dp-ranks",
                "2",
                "--dp-rank-perfect-routing",
                "--dp-rank-perfect-routing-num",
                "2",
                "--stream",
                "--slo",
                "ttft_p95=2s,goodput=90%",
                "--server-metrics",
                "sim",
                "--seed",
                "9",
                "--results-json",
                "run.json",
                "--report-html",
                "run.html",
            ),
            _bb("report", "run.json", "-o", "report.html"),
        ),
    ),
)

# --- running --------------------------------------------------------------------------


def _command(argv: tuple[str, ...]) -> list[str]:
    """The console script beside this interpreter, else the same entry point through -c."""
    script = shutil.which(argv[0], path=str(Path(sys.executable).parent))
    if script:
        return [script, *argv[1:]]
    entry = {
        "batchbench": "from batchbench.cli.main import main as entry",
        "batchbench-agent": "from batchbench.cli.agent import console_main as entry",
    }[argv[0]]
    code = f"import sys; {entry}; sys.argv[0] = {argv[0]!r}; sys.exit(entry())"
    return [sys.executable, "-c", code, *argv[1:]]


def _run_scenario(scenario: Scenario, raw_root: Path, masked_root: Path) -> None:
    work = raw_root / scenario.name
    shutil.rmtree(work, ignore_errors=True)
    (work / "examples").mkdir(parents=True)
    shutil.copytree(EXAMPLES, work / "examples" / EXAMPLES.name)
    for directory in scenario.directories:
        (work / directory).mkdir(parents=True)
    env = {**os.environ, "TZ": "UTC", "COLUMNS": "100", "PYTHONHASHSEED": "0"}
    consoles: list[str] = []
    with _server(scenario.server, work, env) as host:
        for index, argv in enumerate(scenario.steps):
            argv = tuple(arg.replace("{host}", host) for arg in argv)
            consoles.append(_run_step(argv, index, work, env))
            print(
                f"  {scenario.name} step {index}: {consoles[-1].splitlines()[1]}", file=sys.stderr
            )
    _write_masked(scenario, work, masked_root / scenario.name, consoles)


@contextlib.contextmanager
def _server(options: tuple[str, ...], work: Path, env: dict[str, str]) -> Iterator[str]:
    """A `batchbench sim` on a free port for the scenario's steps (shards need one server)."""
    if not options:
        yield ""
        return
    command = _command(("batchbench", "sim", "--port", "0", *options))
    with open(work / "server.log", "w") as log:
        server = subprocess.Popen(
            command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=log, text=True
        )
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
            match = re.search(r"listening on (http://\S+)", line)
            if not match:
                raise RuntimeError(f"batchbench sim did not start: {line!r}")
            yield match.group(1)
        finally:
            server.terminate()
            server.wait(timeout=30)
            if server.stdout is not None:
                server.stdout.close()


def _run_step(argv: tuple[str, ...], index: int, work: Path, env: dict[str, str]) -> str:
    """Run one command; its console as one text (command, exit status, stdout, stderr)."""
    if True:
        try:
            done = subprocess.run(
                _command(argv),
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=STEP_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
            status, stdout, stderr = str(done.returncode), done.stdout, done.stderr
        except subprocess.TimeoutExpired as timeout:
            status = f"timeout after {STEP_TIMEOUT_S} s"
            stdout = _text(timeout.stdout)
            stderr = _text(timeout.stderr)
        (work / f"step-{index}.stdout").write_text(stdout)
        (work / f"step-{index}.stderr").write_text(stderr)
    return f"$ {' '.join(argv)}\nexit status: {status}\n--- stdout\n{stdout}--- stderr\n{stderr}"


def _write_masked(scenario: Scenario, work: Path, target: Path, consoles: list[str]) -> None:
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    (target / "console.txt").write_text(mask_text("\n".join(consoles), work))
    for path in sorted(work.rglob("*")):
        relative = path.relative_to(work).as_posix()
        if (
            not path.is_file()
            or relative.startswith("examples/")
            or relative.startswith("step-")
            or relative == "server.log"
        ):
            continue
        masked = mask_file(path, work)
        if relative in scenario.sort_lines:
            masked = "".join(sorted(masked.splitlines(keepends=True)))
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_text(masked)


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


# --- masking --------------------------------------------------------------------------
#
# What varies between two runs of the same code is masked to a placeholder; everything
# else is kept. Runs of two or more spaces are squeezed to two (column widths follow the
# masked values). JSON is masked by key, so a count next to a latency stays compared.

MASK = "<T>"
_TIME_KEY = re.compile(
    r"(_ms|_seconds|_secs_measured|_per_second|_per_minute|_per_1000_requests)$"
    r"|_at$|_lag$|^(timestamp|wall_origin|host|endpoint|content_salt|mean_active_agents)$"
    r"|^(lag_\w+|total_duration|window_start|window_end|attainment\w*|within|client_verdict)$"
)
_STATS_KEEP = {"count"}  # in a latency statistics object, only the count is deterministic
# time series, sample values of a distribution, server gauges sampled at scrape instants
_SUBTREES = {"timeseries", "values", "series", "scrapes"}
_SERVER_GAUGES = {"kv_cache_usage", "running_requests", "waiting_requests"}
_TEXT_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(https?://(?:127\.0\.0\.1|localhost|\[::1\])):\d+"), r"\1:<PORT>"),
    (re.compile(r"(?i)(content.salt.{1,60}?)\b[0-9a-f]{16}\b"), r"\1<SALT>"),
    (re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?"), MASK),
    (re.compile(r"\bpid \d+"), "pid <PID>"),
    # SLO attainment: the share of latencies within a limit
    (re.compile(r"(attainment) \d+(?:\.\d+)?% \[[\d.]+, [\d.]+\]"), r"\1 <N>% [<N>, <N>]"),
    (re.compile(r"\b(\w+_at_ms)=\d+"), r"\1=" + MASK),
    (re.compile(r"/tmp/[\w.-]+"), "<TMP>"),
    # durations and latencies with a unit, not a limit written after ≤ / ≥ / =
    (re.compile(r"(?<![≤≥=]\s)(?<![\w.=])-?\d+(?:\.\d+)?(\s?)(ms|s|µs)(?![\w/])"), MASK + r"\1\2"),
    (re.compile(r"\b\d+(?:\.\d+)?(\s)(tok/s|req/s|good req/s|per minute)"), MASK + r"\1\2"),
    (re.compile(r"\b\d+(?:\.\d+)?%( of (?:one|a) core)"), MASK + r"%\1"),
    (re.compile(r"\b(p\d+(?:\.\d+)?|max|min|mean)=\d+(?:\.\d+)?(ms)?"), r"\1=" + MASK + r"\2"),
)
# On lines about the server: its gauges, sampled at scrape instants.
_SERVER_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b(mean|max|peak) \d+(?:\.\d+)?(%?)(?= over| on|,|\)|;)"), r"\1 <N>\2"),
    (re.compile(r"\b\d+ scrapes\b"), "<N> scrapes"),
)
# Console tables whose columns after the first (or the first two) are times or rates.
_LATENCY_ROW = re.compile(
    r"^(\s+(?:TTFT|ITL|TPOT|Request latency|Agent end-to-end|E2E)\s+\d+)\s+\d.*$"
)
# the client verdict (ok / client-bound) follows the machine's load, in the console and HTML
_CLIENT_VERDICT = re.compile(r"^(Client: ).*$|(<li>Client )\([^<]*(?=</li>)")
_CAPACITY_ROW = re.compile(r"^\s*\d+\s{2,}\S")
# window, req/s, out tok/s, TTFT p50/p99, ITL p99, E2E p95; client (ok / client-bound)
_CAPACITY_TIMED_COLUMNS = (1, 2, 3, 4, 5, 6, 7, 10)


def mask_text(text: str, work: Path) -> str:
    """Mask a console text or a string value: paths, ports, salts, times, rates."""
    text = text.replace(str(work), "<WORK>")
    lines = []
    in_capacity_table = False
    for line in text.split("\n"):
        if line.startswith("agents ") and "verdict" in line:
            in_capacity_table = True
        elif in_capacity_table and _CAPACITY_ROW.match(line):
            cells = re.split(r"\s{2,}", line.strip())
            line = "  ".join(
                MASK if index in _CAPACITY_TIMED_COLUMNS else cell
                for index, cell in enumerate(cells)
            )
        else:
            in_capacity_table = False
        line = _LATENCY_ROW.sub(r"\1 " + MASK, line)
        line = _CLIENT_VERDICT.sub(lambda found: (found.group(1) or found.group(2)) + MASK, line)
        rules = _TEXT_RULES + (_SERVER_RULES if "server" in line.lower() else ())
        for pattern, replacement in rules:
            line = pattern.sub(replacement, line)
        lines.append(re.sub(r" {2,}", "  ", line))
    return "\n".join(lines)


def mask_json(value: Any, work: Path, key: str = "") -> Any:
    """Mask a parsed JSON document by key (times, rates, hosts), strings as text."""
    if key in _SUBTREES:
        return MASK
    if isinstance(value, dict | list) and (_TIME_KEY.search(key) or key in _SERVER_GAUGES):
        return _mask_numbers(value)
    if key == "client" and isinstance(value, dict):  # ok / client-bound: the machine's load
        return {
            k: MASK if k in ("verdict", "reason") else mask_json(v, work, k)
            for k, v in value.items()
        }
    if key == "records" and isinstance(value, list):  # shard data: rows with times in them
        return [_mask_floats(row) for row in value]
    if key == "charts" and isinstance(value, list):
        return [_mask_chart(chart, work) for chart in value]
    if isinstance(value, dict):
        if key.endswith("_ms") and "count" in value:
            return {k: (v if k in _STATS_KEEP else MASK) for k, v in value.items()}
        return {k: mask_json(v, work, k) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_json(item, work, key) for item in value]
    if _TIME_KEY.search(key) and value is not None and not isinstance(value, bool):
        return MASK
    if isinstance(value, str):
        return mask_text(value, work)
    return value


def _mask_numbers(value: Any) -> Any:
    """Every number below a key that names times or sampled gauges."""
    if isinstance(value, dict):
        return {k: _mask_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_numbers(item) for item in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return MASK
    return value


def _mask_floats(value: Any) -> Any:
    """Fractional numbers (times) in a positional row; integers and flags stay."""
    if isinstance(value, list):
        return [_mask_floats(item) for item in value]
    return MASK if isinstance(value, float) else value


_TIMED_AXIS = re.compile(r"(?i)second|millisecond|\bms\b|/s\b|per s|latency|time")


_TIME_SERIES_CHART = re.compile(r"throughput|concurrency|server-metrics|over-time")
# traces of latencies or rates on an axis without a title (per-rank TTFT, capacity curve)
_TIMED_TRACE = re.compile(r"^(?!SLO).*(?:(?<![a-z])p\d+|/s\b|^capacity:)")


def _mask_chart(chart: Any, work: Path) -> Any:
    """A report chart: the data along an axis of times or rates is masked.

    Time series (throughput, concurrency, server metrics) are masked whole; other charts
    by their axis titles (a CDF keeps its fractions, a histogram its counts), and traces
    named after a percentile (per-rank TTFT) lose their values.
    """
    chart = mask_json(chart, work, "chart")
    if not isinstance(chart, dict):
        return chart
    figure = chart.get("figure", {})
    layout = figure.get("layout", {})
    if "annotations" in layout:  # "N points at 0 ms are not drawn": a timing accident
        notes = [note for note in layout.pop("annotations") if "not drawn" not in str(note)]
        if notes:
            layout["annotations"] = notes
    whole = bool(_TIME_SERIES_CHART.search(str(chart.get("id", ""))))
    for axis in ("x", "y"):
        timed = whole
        for name, axis_layout in layout.items():
            if not (name.startswith(f"{axis}axis") and isinstance(axis_layout, dict)):
                continue
            title = axis_layout.get("title", {})
            text = title.get("text", "") if isinstance(title, dict) else str(title)
            timed = timed or bool(_TIMED_AXIS.search(text))
        for name, axis_layout in layout.items():
            if timed and name.startswith(f"{axis}axis") and "range" in axis_layout:
                axis_layout["range"] = MASK
        for trace in figure.get("data", []):
            named = axis == "y" and _TIMED_TRACE.search(str(trace.get("name", "")))
            if axis in trace and (timed or named):
                trace[axis] = MASK
                if f"error_{axis}" in trace:
                    trace[f"error_{axis}"] = MASK
                if axis == "x":  # what is drawn of a CDF (0 ms points are not) follows x
                    trace["y"] = MASK
    return chart


_CELL = re.compile(r'(<td data-field="(\w+)"[^>]*>)([^<]*)(</td>)')


_TABLE = re.compile(r'<table id="([\w-]+)".*?</table>', re.DOTALL)
# report tables whose cells hold times under names that do not say so
_TABLE_TIMED_FIELDS = {
    "bb-slo": {"value"},
    "bb-server-concepts": {"value", "mean", "min", "p50", "p90", "p99", "max"},
}


def _mask_table(match: re.Match[str]) -> str:
    timed = _TABLE_TIMED_FIELDS.get(match.group(1), set())

    def cell(found: re.Match[str]) -> str:
        opening, name, value, closing = found.groups()
        masked = name in timed or _TIME_KEY.search(name)
        return opening + (MASK if masked else value) + closing

    return _CELL.sub(cell, match.group(0))


def _mask_csv(text: str, work: Path) -> str:
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return ""
    header = rows[0]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for row in rows[1:]:
        writer.writerow(
            MASK if _TIME_KEY.search(name) and cell else mask_text(cell, work)
            for name, cell in zip(header, row, strict=False)
        )
    return out.getvalue()


def _mask_npz(path: Path, work: Path) -> str:
    """Shard data: every array's name, type and shape; sorted integer columns; the meta."""
    import numpy as np  # only shard scenarios write numpy archives

    lines = []
    with np.load(path) as archive:
        for name in archive.files:
            array = archive[name]
            timed = name.startswith("series.") or name == "lag_ms" or name.endswith("_ms")
            varies = name.startswith("series.") or name in ("lag_ms", "meta")
            shape = MASK if varies else array.shape
            lines.append(f"{name} {array.dtype} {shape}")
            if name == "meta":
                meta = json.loads(array.tobytes().decode())
                lines.append(json.dumps(mask_json(meta, work), indent=1, sort_keys=True))
            elif array.dtype.kind in "iub" and not timed and name != "samples.gap_first":
                lines.append(f"  sorted: {sorted(array.tolist())}")
    return "\n".join(lines) + "\n"


_SCRIPT = re.compile(r"(<script[^>]*>)(.*?)(</script>)", re.DOTALL)


def _mask_html(text: str, work: Path) -> str:
    """The report: its figures JSON masked, other scripts by digest, the page as text."""

    def script(match: re.Match[str]) -> str:
        opening, body, closing = match.groups()
        if 'type="application/json"' in opening:
            figures = mask_json(json.loads(body), work)
            shown = json.dumps(figures, indent=1, sort_keys=True, ensure_ascii=False)
            return f"{opening}\n{shown}\n{closing}"
        digest = hashlib.sha256(body.encode()).hexdigest()
        return f"{opening}<{len(body)} characters, sha256 {digest}>{closing}"

    return mask_text(_TABLE.sub(_mask_table, _SCRIPT.sub(script, text)), work)


def mask_file(path: Path, work: Path) -> str:
    """One output file, masked according to its kind."""
    if path.suffix == ".npz":
        return _mask_npz(path, work)
    text = path.read_text(errors="replace")
    if path.suffix == ".json":
        return json.dumps(mask_json(json.loads(text), work), indent=1) + "\n"
    if path.suffix == ".jsonl":
        return "".join(
            json.dumps(mask_json(json.loads(line), work)) + "\n"
            for line in text.splitlines()
            if line.strip()
        )
    if path.suffix == ".csv":
        return _mask_csv(text, work)
    if path.suffix == ".html":
        return _mask_html(text, work)
    return mask_text(text, work)


# --- comparing ------------------------------------------------------------------------


def _files(root: Path) -> dict[str, Path]:
    masked = root / "masked"
    return {p.relative_to(masked).as_posix(): p for p in masked.rglob("*") if p.is_file()}


def compare(before: Path, after: Path) -> int:
    """Print a unified diff per differing file; 1 when anything differs."""
    left, right = _files(before), _files(after)
    if not left or not right:
        print("error: nothing to compare (no masked/ directory)", file=sys.stderr)
        return 2
    differing = 0
    for name in sorted(left.keys() | right.keys()):
        a = left[name].read_text().splitlines(keepends=True) if name in left else []
        b = right[name].read_text().splitlines(keepends=True) if name in right else []
        if a == b:
            continue
        differing += 1
        label_a = f"{before}/{name}" if name in left else "/dev/null"
        label_b = f"{after}/{name}" if name in right else "/dev/null"
        sys.stdout.writelines(difflib.unified_diff(a, b, label_a, label_b))
        sys.stdout.write("\n")
    total = len(left.keys() | right.keys())
    if differing:
        print(f"{differing} of {total} files differ")
        return 1
    print(f"equal: {total} files")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", type=Path, metavar="DIR", help="run the scenarios into DIR")
    mode.add_argument("--compare", nargs=2, type=Path, metavar="DIR", help="compare two runs")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these scenarios")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    names = {s.name for s in SCENARIOS}
    unknown = sorted(set(args.only or ()) - names)
    if unknown:
        parser.error(f"unknown scenario {unknown[0]} (known: {', '.join(sorted(names))})")
    out = args.out.resolve()
    for scenario in SCENARIOS:
        if args.only and scenario.name not in args.only:
            continue
        print(f"scenario {scenario.name}", file=sys.stderr)
        _run_scenario(scenario, out / "raw", out / "masked")
    print(f"wrote {out / 'masked'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
