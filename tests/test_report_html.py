"""The HTML report (issue 13): rendered from real simulator runs, checked for content (every
chart present, table cells equal to the JSON's values as formatted, figures carrying the
JSON's data, hostile strings escaped), and opened in a real headless Chromium."""

from __future__ import annotations

import fcntl
import html
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import pytest

from batchbench.cli.agent import main as agent_main
from batchbench.cli.capacity import run as capacity_main
from batchbench.cli.report import run as report_main
from batchbench.drive.simlaunch import SimProcess, sim_command
from batchbench.errors import BatchbenchError
from batchbench.report import (
    PLOTLY_MISSING,
    load_documents,
    render_html,
    require_plotly,
    write_report,
)
from batchbench.report.charts import VERDICT_COLORS, bin_factor, log_ticks
from batchbench.results.formatting import MISSING, number, percent, ratio_percent

# The report is pure Python: its end-to-end tests run once (see the marker in conftest).
pytestmark = pytest.mark.native_pass_only

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "trajectory-replay" / "plans.jsonl"
SLO = "ttft_p99=2s,itl_p99=100ms,e2e_p95=30s"
HOSTILE = '<img src=x onerror="window.__bbPwned=1">&amp;"'
RUN_CHARTS = {
    "bb-cdf-ttft",
    "bb-cdf-itl",
    "bb-cdf-e2e",
    "bb-throughput",
    "bb-concurrency",
    "bb-ranks",
    "bb-fidelity",
    "bb-server-metrics",
}
CAPACITY_CHARTS = {"bb-capacity-curve", "bb-capacity-tput-latency", "bb-capacity-cdf"}


# -- real runs ------------------------------------------------------------------------------


def run_agent(sim_url: str, out: Path, *extra: str) -> dict:
    """batchbench-agent against a running simulator, scraping its /metrics; returns the
    results JSON document."""
    status = agent_main(
        [
            "--host", sim_url, "--agent-plans-jsonl", str(EXAMPLE),
            "--tokenizer-model", "deepseek-v3", "--model", "batchbench-sim", "--stream",
            "--no-progress", "--no-preflight", "--slo", SLO,
            "--server-metrics", sim_url + "/metrics", "--server-metrics-interval", "0.2",
            "--results-json", str(out), *extra,
        ]
    )  # fmt: skip
    assert status == 0
    return json.loads(out.read_text())


def made_once(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """A copy, in this worker's own temp dir, of a directory ``make`` fills once per session.

    Under pytest-xdist each worker that runs a test of this module would otherwise set up
    the module's fixtures again (a simulator run, a capacity search: 10-25 s each); the
    first worker to ask makes the directory in the session's shared temp dir (holding a
    lock), the others wait for it and copy it. Each worker gets its own copy, as before,
    since some tests write files beside the documents."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    made = shared / f"made-once-{name}"
    with open(shared / f"made-once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (made / ".complete").exists():
                shutil.rmtree(made, ignore_errors=True)
                made.mkdir()
                make(made)
                (made / ".complete").touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    copy = tmp_path_factory.mktemp(name)
    shutil.copytree(made, copy, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".complete"))
    return copy


def make_runs(root: Path) -> None:
    routing = ["--dp-rank-perfect-routing", "--dp-rank-perfect-routing-num", "2"]
    with SimProcess(sim_command("deepseek-v3", 2, "--speed 4")) as sim:
        run_agent(sim.url, root / "a.json", *routing)
        run_agent(sim.url, root / "b.json", "--max-active-agents", "1")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Two real runs against one simulator with 2 DP ranks: all 3 agents at once with client
    routing ("a"), and one agent at a time ("b")."""
    root = made_once(tmp_path_factory, "runs", make_runs)
    return {"a": root / "a.json", "b": root / "b.json"}


@pytest.fixture(scope="module")
def capacity(tmp_path_factory) -> Path:
    """A real capacity search against the simulator (2 to 4 active agents; two running
    sequences per rank, so a third agent queues behind them, for up to a whole 32-token
    reply: 160 ms at --speed 2, far past the 60 ms TTFT limit, while two agents see about
    7 ms, leaving room for a loaded machine); returns its capacity.json."""
    return made_once(tmp_path_factory, "capacity", make_capacity) / "search" / "capacity.json"


def make_capacity(root: Path) -> None:
    out = root / "search"
    status = capacity_main(
        [
            "--sim", "--sim-args", "--speed 2 --max-batch 2", "--tokenizer-model", "deepseek-v3",
            "--agents", "400", "--tool-invocations", "4", "--input-tokens", "256",
            "--output-tokens", "32", "--environment-tokens", "32", "--stream", "--seed", "3",
            "--slo", "ttft_p90=60ms,itl_p90=100ms", "--min-agents", "2", "--max-agents", "4",
            "--resolution", "1", "--warmup", "0.5", "--window", "4", "--max-extensions", "0", "--probe", "0",
            "--output-dir", str(out), "--no-progress",
        ]
    )  # fmt: skip
    assert status in (0, 1)  # 1: not concluded; the report draws what was measured either way


# -- reading the page ---------------------------------------------------------------------


class PageParser(HTMLParser):
    """Chart div ids, and each table's rows as {data-field: cell text}."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.charts: list[str] = []
        self.tables: dict[str, list[dict[str, str]]] = {}
        self.text: list[str] = []
        self._table: str | None = None
        self._field: str | None = None
        self._cell: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "div" and "bb-chart" in (attrs.get("class") or "").split():
            self.charts.append(attrs["id"])
        elif tag == "table":
            self._table = attrs.get("id")
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append({})
        elif tag == "td" and self._table is not None:
            self._field, self._cell = attrs.get("data-field"), []

    def handle_endtag(self, tag):
        if tag == "td" and self._field is not None:
            self.tables[self._table][-1][self._field] = "".join(self._cell)
            self._field = None
        elif tag == "table":
            self.tables[self._table] = [row for row in self.tables[self._table] if row]
            self._table = None

    def handle_data(self, data):
        if self._field is not None:
            self._cell.append(data)
        self.text.append(data)


def parse(page: str) -> tuple[PageParser, dict[str, dict]]:
    """The parsed page and its figures by chart id."""
    parser = PageParser()
    parser.feed(page)
    start = page.index('<script type="application/json" id="bb-figures">')
    start = page.index(">", start) + 1
    specs = json.loads(page[start : page.index("</script>", start)])
    return parser, {chart["id"]: chart["figure"] for chart in specs["charts"]}


def report(tmp_path: Path, *files: Path, name: str = "report.html") -> tuple[str, Path]:
    out = tmp_path / name
    assert report_main([*map(str, files), "-o", str(out)]) == 0
    return out.read_text(), out


def six(values: list) -> list:
    return [float(f"{v:.6g}") for v in values]


# -- content ------------------------------------------------------------------------------


def test_formatting_is_the_documented_one():
    values = (7, 12345, 2.100739, 201.671, 1010.0166, 30000.0, 4290225.5, 0.0123, 0.0, None)
    assert [number(v) for v in values] == [
        "7", "12,345", "2.10", "201.7", "1,010.0", "30,000", "4,290,226", "0.0123", "0.00", MISSING,
    ]  # fmt: skip
    assert number(float("nan")) == MISSING and number(True) == "yes"
    assert percent(36.54384830855419) == "36.5%" and ratio_percent(0.91666) == "91.7%"
    assert percent(None) == MISSING


def test_report_of_a_real_run_has_every_chart_and_the_json_values(runs, tmp_path, capsys):
    document = json.loads(runs["a"].read_text())
    page, out = report(tmp_path, runs["a"])
    assert (
        capsys.readouterr().out
        == f"Wrote HTML report to {out} ({out.stat().st_size / 1e6:.1f} MB)\n"
    )
    assert out.stat().st_size < 10 * 1024 * 1024
    assert "<script src" not in page and page.count("* plotly.js v") == 1  # inlined once
    parser, figures = parse(page)
    assert set(parser.charts) == RUN_CHARTS == set(figures)

    window = document["window"]
    latency = window["latency"]
    (row,) = parser.tables["bb-headline"]
    assert row == {
        "file": "a.json",
        "requests": number(window["requests"]),
        "failed_requests": "0",
        "duration_seconds": number(window["duration_seconds"]),
        "requests_per_second": number(window["requests_per_second"]),
        "output_tokens_per_second": number(window["output_tokens_per_second"]),
        "ttft_p50_ms": number(latency["ttft_ms"]["percentiles"]["p50"]),
        "ttft_p99_ms": number(latency["ttft_ms"]["percentiles"]["p99"]),
        "itl_p50_ms": number(latency["itl_ms"]["percentiles"]["p50"]),
        "itl_p99_ms": number(latency["itl_ms"]["percentiles"]["p99"]),
        "e2e_p50_ms": number(latency["e2e_ms"]["percentiles"]["p50"]),
        "e2e_p99_ms": number(latency["e2e_ms"]["percentiles"]["p99"]),
        "good_requests_per_second": number(window["goodput"]["good_requests_per_second"]),
        "goodput_ratio": ratio_percent(window["goodput"]["goodput_ratio"]),
        "good_trajectories_per_minute": number(window["goodput"]["good_trajectories_per_minute"]),
        "cache_hit_percent": percent(window["cache_hit_percent"]),
        "client_verdict": window["client"]["verdict"],
        "slo_verdict": window["slo_verdict"],
    }
    assert row["requests"] == "7" and row["goodput_ratio"] == "100.0%"
    assert [(r["objective"], r["limit"], r["verdict"]) for r in parser.tables["bb-slo"]] == [
        ("ttft_p99", "≤ 2,000.0 ms", window["slo"][0]["verdict"]),
        ("itl_p99", "≤ 100.0 ms", window["slo"][1]["verdict"]),
        ("e2e_p95", "≤ 30,000 ms", window["slo"][2]["verdict"]),
    ]
    # Output speed (tokens/s) in the latency section: per agent and per request, p50 and p10.
    speed = window["output_speed"]
    assert speed["agents"]["count"] == 3
    assert parser.tables["bb-output-speed"] == [
        {
            "file": "a.json",
            "agents": "3",
            "agents_p50": number(speed["agents"]["percentiles"]["p50"]),
            "agents_p10": number(speed["agents"]["percentiles"]["p10"]),
            "requests": number(speed["requests"]["count"]),
            "requests_p50": number(speed["requests"]["percentiles"]["p50"]),
            "requests_p10": number(speed["requests"]["percentiles"]["p10"]),
        }
    ]
    assert page.index('id="bb-cdf-e2e"') < page.index('id="bb-output-speed"')
    assert page.index('id="bb-output-speed"') < page.index('id="over-time"')
    itl = window["slo"][1]
    low, high = itl["value_low_ms"], itl["value_high_ms"]
    # A side too few samples bound is left open: "(≥ low)", "(≤ high)".
    bounds = (
        f"{number(low)} – {number(high)}"
        if low is not None and high is not None
        else f"≥ {number(low)}"
        if low is not None
        else f"≤ {number(high)}"
    )
    assert parser.tables["bb-slo"][1]["value"] == f"{number(itl['value_ms'])} ({bounds})"
    assert parser.tables["bb-slo"][1]["within"] == f"{itl['within']:,} / {itl['samples']:,}"
    for side in ("client", "server"):  # the one-sentence verdicts, under the header
        verdict = window[side]
        assert verdict["reason"]
        sentence = f"{side.capitalize()} ({verdict['verdict']}): {verdict['reason']}"
        assert f"<li>{html.escape(sentence)}</li>" in page
    (header,) = parser.tables["bb-documents"]
    assert header == {
        "file": "a.json",
        "kind": "run",
        "timestamp": document["timestamp"],
        "batchbench_version": document["batchbench_version"],
        "verdict": "ok",
        "slo_verdict": window["slo_verdict"],
    }

    # The figures carry the document's data.
    for metric in ("ttft", "itl", "e2e"):
        distribution = document["distributions"][f"{metric}_ms"]
        trace = figures[f"bb-cdf-{metric}"]["data"][0]
        assert trace["name"] == "a.json"
        positive = [  # a log axis has no 0 (sub-millisecond gaps are rounded to 0 ms)
            (x, y)
            for x, y in zip(distribution["values"], distribution["fractions"], strict=True)
            if x > 0
        ]
        assert trace["x"] == six([x for x, _ in positive])
        assert trace["y"] == six([y for _, y in positive])
        zeros = len(distribution["values"]) - len(positive)
        notes = [a["text"] for a in figures[f"bb-cdf-{metric}"]["layout"].get("annotations", [])]
        assert notes == ([f"{zeros} points at 0 ms are not drawn (log scale)"] if zeros else [])
        assert figures[f"bb-cdf-{metric}"]["layout"]["xaxis"]["type"] == "log"
    limit = figures["bb-cdf-ttft"]["data"][1]
    assert (limit["x"], limit["y"], limit["name"]) == (
        [2000.0, 2000.0],
        [0, 1],
        "SLO ttft_p99 ≤ 2,000.0 ms",
    )
    timeseries = document["timeseries"]
    throughput = figures["bb-throughput"]["data"]
    assert [t["y"] for t in throughput] == [
        six(timeseries["requests_per_second"]),
        six(timeseries["output_tokens_per_second"]),
    ]
    assert all(t["x"] == six(timeseries["t"]) for t in throughput)
    concurrency = figures["bb-concurrency"]["data"]
    assert [(t["name"], t["y"]) for t in concurrency] == [
        ("active agents", six(timeseries["active_agents"])),
        ("requests in flight", six(timeseries["in_flight"])),
    ]
    assert document["ranks_source"] == "client"
    bars = figures["bb-ranks"]["data"]
    assert [b["x"] for b in bars] == [["rank 0", "rank 1"]] * 5
    assert [b["y"] for b in bars] == [
        [r[key] for r in document["ranks"]]
        for key in ("requests", "input_tokens", "ttft_p50_ms", "ttft_p99_ms", "cached_tokens")
    ]
    assert sum(bars[0]["y"]) == 7
    assert "a.json: per-rank figures from client routing" in page
    prompt, output = figures["bb-fidelity"]["data"]
    histogram = document["fidelity"]["prompt"]["histogram"]
    assert prompt["x"] == sorted(int(k) for k in histogram)
    assert prompt["y"] == [histogram[str(k)] for k in prompt["x"]]
    assert sum(prompt["y"]) == 7 and sum(output["y"]) == 7
    fidelity_rows = parser.tables["bb-fidelity-table"]
    assert fidelity_rows[0]["exact_percent"] == percent(
        document["fidelity"]["prompt"]["exact_percent"]
    )
    server = document["server_metrics"]
    kv = [t for t in figures["bb-server-metrics"]["data"] if t["yaxis"] == "y"]
    assert [t["name"] for t in kv] == sorted(
        f"rank {r}" for r in server["series"]["kv_cache_usage"]
    )
    assert kv[0]["y"] == six(server["series"]["kv_cache_usage"]["0"])
    concepts = parser.tables["bb-server-concepts"]
    assert {(r["concept"], r["rank"]) for r in concepts} == {
        (concept, rank) for concept, by_rank in server["concepts"].items() for rank in by_rank
    }

    # Configuration and manifest identity.
    (manifest,) = parser.tables["bb-manifest"]
    assert manifest == {
        "file": "a.json",
        "path": document["manifest"]["path"],
        "sha256": document["manifest"]["sha256"],
        "schema_version": "1",
    }
    configuration = {r["option"]: r["value"] for r in parser.tables["bb-configuration"]}
    assert configuration["model"] == "batchbench-sim"
    assert configuration["stream"] == "true"
    assert configuration["max_active_agents"] == MISSING


def test_two_runs_overlay_their_cdfs_with_one_row_each(runs, tmp_path):
    page, _ = report(tmp_path, runs["a"], runs["b"])
    parser, figures = parse(page)
    for metric in ("ttft", "itl", "e2e"):
        names = [t["name"] for t in figures[f"bb-cdf-{metric}"]["data"] if "SLO" not in t["name"]]
        assert names[:2] == ["a.json", "b.json"]
    assert [r["file"] for r in parser.tables["bb-headline"]] == ["a.json", "b.json"]
    b = json.loads(runs["b"].read_text())
    assert parser.tables["bb-headline"][1]["requests_per_second"] == number(
        b["window"]["requests_per_second"]
    )
    # a routed to ranks (client figures); b did not, so its ranks come from the scraped
    # server metrics.
    assert (b["ranks_source"], [r["rank"] for r in b["ranks"]]) == ("server", [0, 1])
    bars = figures["bb-ranks"]["data"]
    assert [t["legendgroup"] for t in bars] == ["a.json"] * 5 + ["b.json"] * 5
    assert [t["y"] for t in bars[5:]] == [
        [r[key] for r in b["ranks"]]
        for key in ("requests", "input_tokens", "ttft_p50_ms", "ttft_p99_ms", "cached_tokens")
    ]
    assert (
        "a.json: per-rank figures from client routing (the rank each request was sent to)." in page
    )
    assert "b.json: per-rank figures from the server&#x27;s metrics (per-rank labels)." in page
    assert [r["file"] for r in parser.tables["bb-manifest"]] == ["a.json", "b.json"]
    assert {"bb-configuration", "bb-configuration-2"} <= set(parser.tables)


def test_capacity_report_draws_the_curve_and_marks_the_answer(capacity, tmp_path):
    document = json.loads(capacity.read_text())
    page, _ = report(tmp_path, capacity)
    parser, figures = parse(page)
    assert set(parser.charts) == CAPACITY_CHARTS  # a capacity document alone: no run sections
    steps = document["steps"]
    by_agents = {s["agents"]: s for s in steps}
    agents = sorted(by_agents)
    # Doubling 2 -> 4, then bisection to 3 (resolution 1) when 2 holds and 4 breaks, as the
    # simulator's queue makes them; the checks below follow whatever the search measured.
    assert agents[0] == 2 and len(agents) >= 2
    curve = figures["bb-capacity-curve"]
    traces = {t["name"]: t for t in curve["data"]}
    for objective in ("ttft_p90", "itl_p90"):
        trace = traces[objective]
        outcomes = [
            next(o for o in by_agents[a]["window"]["slo"] if o["objective"] == objective)
            for a in agents
        ]
        assert trace["x"] == agents
        assert trace["y"] == [o["value_ms"] for o in outcomes]
        assert trace["error_y"]["array"] == [
            None if o["value_high_ms"] is None else max(o["value_high_ms"] - o["value_ms"], 0.0)
            for o in outcomes
        ]
        assert trace["marker"]["color"] == [VERDICT_COLORS[by_agents[a]["verdict"]] for a in agents]
        limit = traces[f"SLO {objective} ≤ {number(outcomes[0]['limit_ms'])} ms"]
        span = [agents[0], agents[-1]]
        assert (limit["x"], limit["y"]) == (span, [outcomes[0]["limit_ms"]] * 2)
        assert limit["line"]["color"] == trace["line"]["color"]
    assert traces["SLO ttft_p90 ≤ 60.00 ms"]["y"] == [60.0, 60.0]
    assert curve["layout"]["yaxis"]["type"] == "log"
    assert traces["requests/s"]["y"] == [
        by_agents[a]["window"]["requests_per_second"] for a in agents
    ]
    assert traces["goodput ratio"]["y"] == [
        by_agents[a]["window"]["goodput"]["goodput_ratio"] for a in agents
    ]
    assert {f"step {v}" for v in VERDICT_COLORS} <= set(traces)
    answer = document["answer"]
    label = "capacity" if answer["concluded"] else "held so far (not concluded)"
    marked = [(s["x0"], a["text"]) for s, a in zip(curve["layout"]["shapes"],
                                                   curve["layout"]["annotations"][-2:], strict=True)]  # fmt: skip
    expected = [(v, f"{text}: {v}") for v, text in ((answer["agents"], label),
                (answer["breaking_agents"], "breaks")) if v is not None]  # fmt: skip
    assert marked == expected
    if answer["agents"] is not None:
        stars = [t for t in curve["data"] if t["name"] == f"{label}: {answer['agents']} agents"]
        assert [(t["x"], t["y"]) for t in stars] == [
            ([answer["agents"]], [traces[o]["y"][agents.index(answer["agents"])]])
            for o in ("ttft_p90", "itl_p90")
        ]
    cdf = figures["bb-capacity-cdf"]
    assert [t["name"] for t in cdf["data"] if "SLO" not in t["name"]] == [
        f"{a} agents" for a in agents
    ]
    step = json.loads((capacity.parent / by_agents[agents[1]]["results_json"]).read_text())
    positive = [v for v in step["distributions"]["ttft_ms"]["values"] if v > 0]
    assert cdf["data"][1]["x"] == six(positive)
    assert cdf["data"][-1]["name"] == "SLO ttft_p90 ≤ 60.00 ms"  # the limit marker's trace
    rows = parser.tables["bb-capacity-steps"]
    assert [(r["agents"], r["phase"], r["verdict"], r["results_json"]) for r in rows] == [
        (str(s["agents"]), s["phase"], s["verdict"], s["results_json"]) for s in steps
    ]
    for row, step in zip(rows, steps, strict=True):
        latency = step["window"]["latency"]
        assert row["requests_per_second"] == number(step["window"]["requests_per_second"])
        assert row["ttft_p99_ms"] == number(latency["ttft_ms"]["percentiles"]["p99"])
        assert row["e2e_p95_ms"] == number(latency["e2e_ms"]["percentiles"]["p95"])
        assert row["cache_hit_percent"] == percent(step["window"]["cache_hit_percent"])
    # The answer is said once, under the page's title (not again in the capacity section).
    assert page.count('class="bb-answer"') == 1
    assert f'<li class="bb-answer">{html.escape(answer["text"])}</li>' in page
    assert parser.tables["bb-documents"][0]["verdict"] == (
        "concluded" if answer["concluded"] else "open"
    )


def test_log_axes_tick_at_one_two_five_times_powers_of_ten():
    ticks = log_ticks([8.0, 24.0])
    assert (ticks["tickvals"], ticks["ticktext"]) == ([5.0, 10.0, 20.0, 50.0], ["5", "10", "20", "50"])  # fmt: skip
    assert ticks["range"] == [math.log10(5.0), math.log10(50.0)] and ticks["type"] == "log"
    # beyond four decades, the powers of ten alone
    wide = log_ticks([0.01, 30000.0, None, 0.0])
    assert wide["ticktext"] == ["0.01", "0.1", "1", "10", "100", "1,000", "10,000", "100,000"]
    # one value on a tick: the ticks either side of it too
    assert log_ticks([20.0])["tickvals"] == [10.0, 20.0, 50.0]
    assert log_ticks([0.0, -1.0, None]) == {}  # nothing to draw on a log axis


def test_throughput_bins_follow_the_runs_length_and_requests(runs, tmp_path):
    """A 300 s run of 600 requests recorded in 0.5 s bins that swing 0-4 req/s: drawn in
    10 s bins (20 requests each; at least 1/60 of the run, at most a tenth), and the title
    says so. A short run keeps its recorded bins."""
    assert bin_factor(0.5, 300.0, 600.0) == 20  # 20 requests' worth: 10 s
    assert bin_factor(0.5, 300.0, 60000.0) == 10  # busy: 1/60 of the run, 5 s
    assert bin_factor(0.5, 300.0, 10.0) == 60  # sparse: a tenth of the run, 30 s
    assert bin_factor(0.5, 0.86, 7.0) == 1
    document = json.loads(runs["a"].read_text())
    document["timeseries"] = {
        "interval_seconds": 0.5,
        "t": [0.5 * (i + 1) for i in range(600)],
        "active_agents": [3.0] * 600,
        "in_flight": [1.0] * 600,
        "requests_per_second": [0.0, 4.0] * 300,
        "output_tokens_per_second": [0.0, 100.0] * 300,
    }
    path = tmp_path / "long.json"
    path.write_text(json.dumps(document))
    page, _ = report(tmp_path, path)
    _, figures = parse(page)
    throughput = figures["bb-throughput"]
    assert throughput["layout"]["title"]["text"] == "Throughput over time (10 s bins)"
    requests, tokens = throughput["data"]
    assert requests["x"] == [10.0 * (i + 1) for i in range(30)] == tokens["x"]
    assert (requests["y"], tokens["y"]) == ([2.0] * 30, [50.0] * 30)
    page, _ = report(tmp_path, runs["a"], runs["b"], name="short.html")
    _, figures = parse(page)
    assert figures["bb-throughput"]["layout"]["title"]["text"] == (
        "Throughput over time (0.5 s bins)"
    )


def test_cdf_y_axes_say_what_they_count(runs, tmp_path):
    _, figures = parse(report(tmp_path, runs["a"])[0])
    titles = {m: figures[f"bb-cdf-{m}"]["layout"]["yaxis"]["title"]["text"] for m in ("ttft", "itl", "e2e")}  # fmt: skip
    assert titles == {
        "ttft": "fraction of requests",
        "itl": "fraction of inter-token gaps",  # an ITL sample is a gap between chunks
        "e2e": "fraction of requests",
    }
    assert figures["bb-cdf-itl"]["data"][0]["hovertemplate"] == (
        "%{x:.4~g} ms: %{y:.1%} of inter-token gaps"
    )


def test_workload_summary_and_server_table_units(runs, capacity, tmp_path):
    document = json.loads(runs["a"].read_text())
    page, _ = report(tmp_path, runs["a"], capacity)
    parser, _ = parse(page)
    window = document["window"]
    tokens = window["request_tokens"]
    (row,) = parser.tables["bb-workload"]
    assert row == {
        "file": "a.json",
        "trajectories": "3",
        "requests": "7",
        "input_mean": number(window["input_tokens"] / window["successful_requests"]),
        "input_p50": f"{tokens['input']['p50']:,}",
        "input_p90": f"{tokens['input']['p90']:,}",
        "output_mean": number(window["output_tokens"] / window["successful_requests"]),
        "output_p50": f"{tokens['output']['p50']:,}",
        "output_p90": f"{tokens['output']['p90']:,}",
    }
    assert tokens["output"] == {"mean": 96.0, "p50": 96, "p90": 128, "max": 128}
    assert (row["output_mean"], row["output_p50"], row["output_p90"]) == ("96.00", "96", "128")
    # a capacity search: one row per step, each from its step's results
    steps = json.loads(capacity.read_text())["steps"]
    rows = parser.tables["bb-capacity-workload"]
    assert [r["file"] for r in rows] == [s["results_json"] for s in steps]
    assert [r["requests"] for r in rows] == [f"{s['window']['requests']:,}" for s in steps]
    assert {r["trajectories"] for r in rows} == {"400"}
    # The server table: shares in percent, times in ms, counts without decimals.
    concepts = document["server_metrics"]["concepts"]
    cells = {(r["concept"], r["rank"]): r for r in parser.tables["bb-server-concepts"]}
    kv = cells[("kv_cache_usage", "0")]
    assert kv["mean"] == ratio_percent(concepts["kv_cache_usage"]["0"]["mean"])
    assert kv["mean"].endswith("%") and kv["value"] == MISSING
    ttft = cells[("ttft_seconds", "0")]
    assert ttft["p50"] == f"{number(concepts['ttft_seconds']['0']['p50'] * 1000)} ms"
    assert cells[("requests", "0")]["value"] == "4"  # 4.0 in the document
    assert cells[("prompt_tokens", "1")]["value"] == f"{concepts['prompt_tokens']['1']:,.0f}"
    assert "." not in cells[("prompt_tokens", "1")]["value"]
    assert cells[("running_requests", "0")]["max"] == "2"
    assert cells[("prefix_cache_hit_percent", "0")]["value"] == percent(
        concepts["prefix_cache_hit_percent"]["0"]
    )
    # The prefix cache's token counters (issue 28) are counts, like the other counters.
    for concept in ("prefix_cache_hit_tokens", "prefix_cache_queried_tokens"):
        value = concepts[concept]["0"]
        assert cells[(concept, "0")]["value"] == f"{value:,.0f}" and value == int(value) > 0
    hits, queried = (
        concepts[c]["0"] for c in ("prefix_cache_hit_tokens", "prefix_cache_queried_tokens")
    )
    assert concepts["prefix_cache_hit_percent"]["0"] == round(100.0 * hits / queried, 6)


def test_throughput_against_latency_has_one_point_per_step(capacity, tmp_path):
    document = json.loads(capacity.read_text())
    steps = sorted(document["steps"], key=lambda s: s["agents"])
    _, figures = parse(report(tmp_path, capacity)[0])
    against = figures["bb-capacity-tput-latency"]
    traces = {t["name"]: t for t in against["data"]}
    for objective in ("ttft_p90", "itl_p90"):
        trace = traces[objective]
        assert trace["x"] == [s["window"]["requests_per_second"] for s in steps]
        assert trace["y"] == [
            next(o["value_ms"] for o in s["window"]["slo"] if o["objective"] == objective)
            for s in steps
        ]
        assert trace["text"] == [f"{s['agents']} agents" for s in steps]
        assert trace["marker"]["color"] == [VERDICT_COLORS[s["verdict"]] for s in steps]
    assert traces["SLO ttft_p90 ≤ 60.00 ms"]["y"] == [60.0, 60.0]
    assert against["layout"]["xaxis"]["title"]["text"] == "requests per second"
    assert against["layout"]["yaxis"]["type"] == "log"


def test_capacity_without_a_step_file_still_draws_its_curve(capacity, tmp_path):
    document = json.loads(capacity.read_text())
    steps = sorted(document["steps"], key=lambda s: s["agents"])
    names = [s["results_json"] for s in steps]
    directory = tmp_path / "moved"
    directory.mkdir()
    shutil.copy(capacity, directory / "capacity.json")
    shutil.copy(capacity.parent / names[0], directory)  # the first step's file only,
    (directory / names[1]).write_text("{not json")  # the second's is broken, others missing
    page, _ = report(tmp_path, directory / "capacity.json")
    parser, figures = parse(page)
    assert set(parser.charts) == CAPACITY_CHARTS
    assert [t["name"] for t in figures["bb-capacity-cdf"]["data"] if "SLO" not in t["name"]] == [
        f"{steps[0]['agents']} agents"
    ]
    assert len(parser.tables["bb-capacity-steps"]) == len(steps)
    assert figures["bb-capacity-curve"]["data"][0]["x"] == [s["agents"] for s in steps]
    text = "".join(parser.text)
    assert f"{directory / names[1]} is not JSON" in text
    for name in names[2:]:
        assert f"cannot read {directory / name}: No such file or directory" in text


def test_strings_from_documents_are_escaped(runs, tmp_path):
    document = json.loads(runs["a"].read_text())
    document["manifest"]["path"] = HOSTILE
    document["configuration"]["model"] = HOSTILE
    document["window"]["client"]["reason"] = HOSTILE
    hostile_file = tmp_path / "<b>evil&amp;.json"
    hostile_file.write_text(json.dumps(document))
    page, _ = report(tmp_path, hostile_file)
    assert "<img" not in page and "<b>evil&" not in page
    assert page.count(html.escape(HOSTILE)) >= 3
    parser, figures = parse(page)
    assert parser.tables["bb-manifest"][0]["path"] == HOSTILE  # shown as text
    assert parser.tables["bb-configuration"][0] == {"option": "model", "value": HOSTILE}
    assert figures["bb-cdf-ttft"]["data"][0]["name"] == "&lt;b&gt;evil&amp;amp;.json"


def test_library_api_renders_documents_built_in_memory(runs, tmp_path):
    document = json.loads(runs["a"].read_text())
    write_report([document], str(tmp_path / "r.html"), title="nightly <run>")
    page = (tmp_path / "r.html").read_text()
    assert "<title>nightly &lt;run&gt;</title>" in page and "<h1>nightly &lt;run&gt;</h1>" in page
    parser, _ = parse(page)
    assert parser.tables["bb-headline"][0]["file"] == "document 1"
    assert set(parser.charts) == RUN_CHARTS
    assert render_html(load_documents([runs["a"]])) == render_html(load_documents([runs["a"]]))


def test_an_older_document_falls_back_to_the_whole_run_summary(runs, tmp_path):
    document = json.loads(runs["a"].read_text())
    for key in ("kind", "window", "distributions", "timeseries", "server_metrics"):
        document.pop(key)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(document))
    page, _ = report(tmp_path, path)
    parser, _ = parse(page)
    metrics = document["metrics"]
    row = parser.tables["bb-headline"][0]
    assert row["requests_per_second"] == number(metrics["requests_per_second"])
    assert row["ttft_p99_ms"] == number(metrics["ttft_p99_ms"])
    assert row["e2e_p50_ms"] == number(metrics["latency_p50_ms"])
    assert row["cache_hit_percent"] == percent(
        metrics["server_cached_input_tokens"] / metrics["total_input_tokens"] * 100
    )
    assert row["goodput_ratio"] == MISSING
    assert set(parser.charts) == {"bb-ranks", "bb-fidelity"}
    text = "".join(parser.text)
    assert "old.json: no measured window in the document" in text
    assert "Time to first token: no distribution in the documents" in text
    assert "No server metrics in the documents" in text


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read {path}: No such file or directory"),
        (b"\xff not json", "{path} is not JSON: "),
        (b"[1, 2]", "{path} is not a batchbench results or capacity document (a JSON list"),
        (b'{"hello": 1}', '{path} is not a batchbench results or capacity document (no "kind";'),
        (b'{"kind": "sweep"}', '{path} is not a batchbench results or capacity document ("kind": "sweep";'),
        (b'{"kind": "capacity"}', '{path}: capacity document without a "steps" list'),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_naming_the_file(tmp_path, capsys, content, message):
    path = tmp_path / "in.json"
    if content is not None:
        path.write_bytes(content)
    assert report_main([str(path), "-o", str(tmp_path / "r.html")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("Error: " + message.format(path=path))
    assert captured.err.count("\n") == 1
    assert not (tmp_path / "r.html").exists()


def test_usage(capsys):
    assert report_main(["x.json"]) == 2
    assert capsys.readouterr().err == ("Error: the following arguments are required: -o/--output\n")
    assert report_main(["--help"]) == 0
    help_text = capsys.readouterr().out
    assert "self-contained HTML" in help_text and "capacity.json" in help_text


def test_missing_plotly_is_one_clear_line(runs, tmp_path):
    code = (
        "import sys; sys.modules['plotly'] = None\n"
        "from batchbench.cli.report import run\n"
        f"sys.exit(run([{str(runs['a'])!r}, '-o', {str(tmp_path / 'r.html')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"Error: {PLOTLY_MISSING}\n"
    assert PLOTLY_MISSING == "the HTML report needs plotly: pip install 'batchbench[report]'"


def test_require_plotly_checks_without_importing_plotly(monkeypatch):
    code = (
        "import sys\n"
        "from batchbench.report import require_plotly\n"
        "print(require_plotly(), 'plotly' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "None False\n", "")
    monkeypatch.setitem(sys.modules, "plotly", None)  # what an uninstalled plotly looks like
    with pytest.raises(BatchbenchError) as caught:
        require_plotly()
    assert str(caught.value) == PLOTLY_MISSING


# -- malformed documents ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"kind": "run", "window": {"slo": 5}}, "window.slo must be a list, not a number (5)"),
        ({"kind": "capacity", "steps": [], "slo": 5},
         "slo must be a list of strings, not a number (5)"),
        ({"kind": "run", "window": 5}, "window must be an object, not a number (5)"),
        ({"kind": "run", "window": {"slo": [{"limit_ms": "2s"}]}},
         'window.slo[0].limit_ms must be a number, not a string ("2s")'),
        ({"kind": "run", "ranks": [{"rank": "0"}]},
         'ranks[0].rank must be a number, not a string ("0")'),
        ({"kind": "run", "ranks_source": ["client"]}, "ranks_source must be a string, not a list"),
        ({"kind": "run", "interrupted": "no"},
         'interrupted must be true or false, not a string ("no")'),
        ({"kind": "run", "timeseries": {"t": [0.5, True]}},
         "timeseries.t[1] must be a number, not true"),
        ({"kind": "run", "distributions": {"ttft_ms": {"values": {"0": 1}}}},
         "distributions.ttft_ms.values must be a list of numbers, not an object"),
        ({"kind": "run", "server_metrics": {"concepts": {"requests": {"a\nb": "x" * 50}}}},
         'server_metrics.concepts.requests["a\\nb"] must be a number or an object, not a '
         'string ("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...)'),
        ({"kind": "capacity", "steps": [{"agents": 2, "window": {"latency": {"ttft_ms": {
            "percentiles": {"p99": "1"}}}}}]},
         'steps[0].window.latency.ttft_ms.percentiles.p99 must be a number, not a string ("1")'),
        ({"kind": "capacity", "steps": [7]}, "steps[0] must be an object, not a number (7)"),
        ({"kind": "capacity", "steps": [{"agents": 2, "results_json": 5}]},
         "steps[0].results_json must be a string, not a number (5)"),
        ({"kind": "capacity", "steps": [], "answer": {"concluded": 1}},
         "answer.concluded must be true or false, not a number (1)"),
        ({"kind": "run", "configuration": {"x": json.loads("[" * 300 + "]" * 300)}},
         "cannot be shown: a value is nested too deeply"),
    ],
)  # fmt: skip
def test_a_malformed_document_is_one_line_naming_the_field(tmp_path, capsys, content, message):
    path = tmp_path / "f.json"
    path.write_text(json.dumps(content))
    assert report_main([str(path), "-o", str(tmp_path / "f.html")]) == 1
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", f"Error: {path}: {message}\n")
    assert not (tmp_path / "f.html").exists()


# A value of each JSON kind, and how an error names it.
WRONG = {
    "int": (5, "a number (5)"),
    "str": ("x", 'a string ("x")'),
    "list": ([1, "x"], "a list"),
    "dict": ({"a": 1}, "an object"),
    "null": (None, "null"),
}


def outcome(path: Path, document: dict) -> tuple[str | None, str | None]:
    """(page, None) when ``document``, written to ``path``, renders, or (None, message) when
    it is refused: with a BatchbenchError (never another exception) of one line that starts
    with the file's name."""
    path.write_text(json.dumps(document))
    try:
        page = render_html(load_documents([path]))
    except BatchbenchError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(str(path)), message
        return None, message
    finally:
        path.unlink()
    assert page.endswith("</body></html>\n")
    return page, None


@pytest.mark.slow
def test_fuzz_every_top_level_section_of_the_wrong_type(runs, capacity):
    """Each top-level section (and a few absent ones) replaced with a value of each kind."""
    loader = ("_report_source", "_report_steps", "_report_notes")  # never taken from a file
    bases = (
        (json.loads(runs["a"].read_text()), ("manifest", "window", "ranks", *loader)),
        (json.loads(capacity.read_text()), ("slo", "answer", "metrics", "window", *loader)),
    )
    counts = {"rendered": 0, "refused": 0}
    path = capacity.parent / "fuzz.json"  # beside the step files a capacity document names
    for base, extra in bases:
        for key in dict.fromkeys([*base, *extra]):
            for variant, (value, found) in WRONG.items():
                page, message = outcome(path, {**base, key: value})
                counts["rendered" if page is not None else "refused"] += 1
                if key in loader or (variant == "null" and key not in ("kind", "steps")):
                    assert page is not None, (key, variant, message)
                elif message is not None and key not in ("kind", "steps"):
                    assert message.startswith(f"{path}: {key}"), message
                    assert message.endswith(f", not {found}") or (
                        variant == "list" and message.startswith(f"{path}: {key}[0]")
                    ), message
    assert counts["rendered"] > 50 and counts["refused"] > 50, counts


def paths(value, prefix: tuple = ()):
    """Every path into a document: each object key, and each list's first element (and the
    first entry of a map keyed by numbers, as ranks and drift histograms are)."""
    if prefix:
        yield prefix
    if isinstance(value, dict):
        keys = list(value)
        if keys and all(k.lstrip("-").isdigit() for k in keys):
            keys = keys[:1]
        for key in keys:
            yield from paths(value[key], (*prefix, key))
    elif isinstance(value, list) and value:
        yield from paths(value[0], (*prefix, 0))


def replaced(value, path: tuple, new):
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: replaced(value[head], rest, new)}
    return [replaced(value[0], rest, new), *value[1:]]


@pytest.mark.slow
def test_fuzz_every_nested_field_of_the_wrong_type(runs, capacity):
    """Every field below the top level replaced with a value of each kind, in a document that
    holds only its section (so each page is quick to build). A capacity document's steps are
    fuzzed in its first step, without its step file (the top-level fuzz reads step files)."""
    path = capacity.parent / "fuzz.json"
    counts = {"rendered": 0, "refused": 0}
    capacity_document = json.loads(capacity.read_text())
    step = {k: v for k, v in capacity_document["steps"][0].items() if k != "results_json"}
    bases = (json.loads(runs["a"].read_text()), {**capacity_document, "steps": [step]})
    for base in bases:
        kind = base["kind"]
        for where in paths(base):
            if len(where) < 2:
                continue
            top = where[0]
            name = top + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in where[1:])
            # A step's window has the run window's schema, fuzzed in full above; here a number
            # and null in each of its fields exercise the capacity curve (a slow chart).
            step_window = where[:3] == ("steps", 0, "window")
            for variant in ("int", "null") if step_window else WRONG:
                value = WRONG[variant][0]
                document = {"kind": kind, top: replaced(base[top], where[1:], value)}
                if kind == "capacity" and top != "steps":  # the answer is drawn on the steps
                    document["steps"] = capacity_document["steps"] if top == "answer" else []
                page, message = outcome(path, document)
                counts["rendered" if page is not None else "refused"] += 1
                if variant == "null":
                    assert page is not None, (name, message)
                elif message is not None:
                    assert message.startswith(f"{path}: {name}"), (name, message)
    assert counts["rendered"] > 1000 and counts["refused"] > 500, counts


def test_a_malformed_step_file_is_a_note_and_the_curve_is_drawn(capacity, tmp_path):
    document = json.loads(capacity.read_text())
    names = sorted(s["results_json"] for s in document["steps"])
    for name in names:
        shutil.copy(capacity.parent / name, tmp_path)
    broken = json.loads((tmp_path / names[0]).read_text())
    broken["window"]["slo"] = 5
    (tmp_path / names[0]).write_text(json.dumps(broken))
    (tmp_path / "capacity.json").write_text(json.dumps(document))
    page, _ = report(tmp_path, tmp_path / "capacity.json")
    parser, figures = parse(page)
    assert set(parser.charts) == CAPACITY_CHARTS
    note = (
        "step results not loaded, its latency distribution is not drawn: "
        f"{tmp_path / names[0]}: window.slo must be a list, not a number (5)"
    )
    assert note in "".join(parser.text)
    assert len([t for t in figures["bb-capacity-cdf"]["data"] if "SLO" not in t["name"]]) == (
        len(names) - 1
    )


def test_a_step_file_outside_the_capacity_directory_is_not_read(capacity, tmp_path):
    document = json.loads(capacity.read_text())
    step = min(document["steps"], key=lambda s: s["agents"])
    directory = tmp_path / "search"
    (directory / "sub").mkdir(parents=True)
    for target in (directory, directory / "sub", tmp_path):  # valid step files everywhere
        shutil.copy(capacity.parent / step["results_json"], target / "step.json")
    outside = [
        str(tmp_path / "step.json"),  # absolute
        "../step.json",
        "sub/step.json",
        "sub\\step.json",
        "..",
        "",
    ]
    document["steps"] = [
        {**step, "agents": agents, "results_json": name}
        for agents, name in enumerate(["step.json", *outside], start=2)
    ]
    (directory / "capacity.json").write_text(json.dumps(document))
    page, _ = report(tmp_path, directory / "capacity.json")
    parser, figures = parse(page)
    cdf = [t["name"] for t in figures["bb-capacity-cdf"]["data"] if "SLO" not in t["name"]]
    assert cdf == ["2 agents"]  # only the step file in the document's own directory
    notes = [n for n in parser.text if n.startswith("step results not loaded")]
    assert notes == [
        "step results not loaded, its latency distribution is not drawn: results_json "
        f"{json.dumps(name)} is not a file name in the capacity document's directory"
        for name in outside
    ]
    assert [r["results_json"] for r in parser.tables["bb-capacity-steps"]] == [
        "step.json",
        *outside,
    ]


def test_documents_built_in_memory_are_checked_like_files(runs):
    document = json.loads(runs["a"].read_text())
    document["window"]["slo"] = tuple(document["window"]["slo"])  # as JSON would write it
    document["window"]["requests_per_second"] = float("nan")  # JSON null
    parser, _ = parse(render_html([document]))
    assert parser.tables["bb-headline"][0]["requests_per_second"] == MISSING
    assert len(parser.tables["bb-slo"]) == 3
    for bad, message in (
        ({**document, "window": "x"}, 'document 1: window must be an object, not a string ("x")'),
        ({**document, "_report_notes": [1]},
         "document 1: _report_notes[0] must be a string, not a number (1)"),
        ({**document, "manifest": {"path": Path("p")}},
         "document 1: cannot be shown: Type is not JSON serializable: PosixPath"),
        ([1], "document 1 is not a batchbench results or capacity document (a list, not an "
              "object)"),
    ):  # fmt: skip
        with pytest.raises(BatchbenchError) as caught:
            render_html([bad])
        assert str(caught.value) == message


# -- a real browser -----------------------------------------------------------------------


def chromium_driver(tmp_path: Path):
    """Headless Chromium through the system chromedriver (never selenium-manager), or a
    skip where they are not installed."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)")  # fmt: skip
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for argument in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--window-size=1400,1000", f"--user-data-dir={tmp_path / 'profile'}",
    ):  # fmt: skip
        options.add_argument(argument)
    options.binary_location = shutil.which("chromium") or ""
    options.set_capability("goog:loggingOptions", {"browser": "ALL"})
    service = Service(executable_path=shutil.which("chromedriver"))
    return webdriver.Chrome(service=service, options=options)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """One headless Chromium for the module's browser tests (starting one takes a second)."""
    driver = chromium_driver(tmp_path_factory.mktemp("chromium"))
    try:
        yield driver
    finally:
        driver.quit()


def open_when_ready(driver, page: Path) -> None:
    """Load the page and wait, 30 s at most, until its script says it drew or failed."""
    driver.get(page.as_uri())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if driver.execute_script("return window.__bbReady === true || window.__bbErrors.length > 0"):  # fmt: skip
            break
        time.sleep(0.05)


@pytest.fixture(scope="module")
def opened_report(runs, capacity, browser, tmp_path_factory):
    """The report of run a (with a hostile manifest path), run b and the capacity search,
    opened in the module's browser once: (its text, its path, the browser's log of it)."""
    tmp_path = tmp_path_factory.mktemp("opened")
    document = json.loads(runs["a"].read_text())
    document["manifest"]["path"] = HOSTILE
    hostile = tmp_path / "hostile.json"
    hostile.write_text(json.dumps(document))
    page, out = report(tmp_path, hostile, runs["b"], capacity)
    browser.get_log("browser")  # drop what an earlier page logged
    open_when_ready(browser, out)
    return page, out, browser.get_log("browser")


def test_report_opens_in_headless_chromium_and_draws_every_chart(opened_report, browser, tmp_path):
    page, _, logs = opened_report
    parser, _ = parse(page)
    assert set(parser.charts) == RUN_CHARTS | CAPACITY_CHARTS
    driver = browser
    state = driver.execute_script(
        """
        var charts = Array.from(document.querySelectorAll('.bb-chart'));
        return {
          ready: window.__bbReady, errors: window.__bbErrors, pwned: window.__bbPwned,
          charts: charts.length,
          drawn: charts.filter(function (c) {
            return c.classList.contains('js-plotly-plot') && c.querySelector('.main-svg');
          }).length,
          plotted: document.querySelectorAll('.js-plotly-plot').length,
          traces: charts.map(function (c) {
            return c.querySelectorAll('.scatterlayer .trace, .barlayer .trace').length;
          }),
          speedRows: Array.from(
            document.querySelectorAll('#bb-output-speed tbody tr')
          ).map(function (r) { return r.cells[0].textContent; }),
          speedVisible: (function () {
            var t = document.getElementById('bb-output-speed');
            return t !== null && t.getBoundingClientRect().height > 0;
          })(),
        };
        """
    )
    screenshot = tmp_path / "report.png"
    assert driver.save_screenshot(str(screenshot))
    assert state["errors"] == [] and state["ready"] is True
    assert [entry for entry in logs if entry["level"] == "SEVERE"] == []
    assert state["charts"] == len(RUN_CHARTS | CAPACITY_CHARTS) == state["plotted"]
    assert state["drawn"] == state["charts"]
    assert all(count > 0 for count in state["traces"]), state["traces"]
    assert state["pwned"] is None  # the hostile manifest path stayed text
    assert state["speedRows"] == ["hostile.json", "b.json"] and state["speedVisible"]
    assert screenshot.stat().st_size > 10_000


def one_two_five(label: str) -> bool:
    """Whether a tick label is 1, 2 or 5 times a power of ten, written as a plain number."""
    value = float(label.replace(",", ""))
    exponent = math.floor(math.log10(value) + 1e-9)
    mantissa = round(value / 10.0**exponent, 9)
    return mantissa in (1.0, 2.0, 5.0) and "e" not in label.lower()


def test_the_drawn_report_reads_well_at_1400_px(opened_report, capacity, browser):
    """What a reader sees, from the rendered DOM: log axes ticked at 1, 2 and 5 times powers
    of ten, the CDFs' y axes named by what they count, the capacity answer once, the steps
    table without a sideways scroll, the throughput-latency chart with one labelled point
    per step, and the throughput bins' width in its title."""
    _, _, logs = opened_report
    document = json.loads(capacity.read_text())
    steps = sorted(document["steps"], key=lambda s: s["agents"])
    state = browser.execute_script(
        """
        function texts(root, selector) {
          return Array.from(root.querySelectorAll(selector)).map(function (t) {
            return t.textContent;
          });
        }
        var axes = [];
        document.querySelectorAll('.js-plotly-plot').forEach(function (gd) {
          Object.keys(gd._fullLayout).forEach(function (key) {
            var ax = gd._fullLayout[key];
            if (!/^[xy]axis\\d*$/.test(key) || ax.type !== 'log') return;
            axes.push({chart: gd.id, axis: key, ticks: texts(gd, '.' + ax._id + 'tick text')});
          });
        });
        function ytitle(id) { return texts(document.getElementById(id), '.g-ytitle')[0]; }
        function title(id) { return texts(document.getElementById(id), '.gtitle')[0]; }
        var table = document.getElementById('bb-capacity-steps');
        var against = document.getElementById('bb-capacity-tput-latency');
        var first = against.querySelector('.scatterlayer .trace');
        return {
          width: window.innerWidth,
          axes: axes,
          ytitles: ['bb-cdf-ttft', 'bb-cdf-itl', 'bb-cdf-e2e', 'bb-capacity-cdf'].map(ytitle),
          answers: texts(document, '.bb-answer'),
          table: [table.scrollWidth, table.clientWidth],
          page: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
          points: first.querySelectorAll('.points path').length,
          labels: texts(first, '.textpoint text'),
          against: title('bb-capacity-tput-latency'),
          throughput: title('bb-throughput'),
        };
        """
    )
    assert state["width"] >= 1380  # a 1400 px window, less its scroll bar
    # The CDFs' x axes, the capacity curve's latency axis and the throughput-latency
    # chart's y axis are log axes; each shows its ticks as 1, 2 or 5 times a power of ten.
    assert sorted((a["chart"], a["axis"]) for a in state["axes"]) == [
        ("bb-capacity-cdf", "xaxis"),
        ("bb-capacity-curve", "yaxis"),
        ("bb-capacity-tput-latency", "yaxis"),
        ("bb-cdf-e2e", "xaxis"),
        ("bb-cdf-itl", "xaxis"),
        ("bb-cdf-ttft", "xaxis"),
    ]
    for axis in state["axes"]:
        assert len(axis["ticks"]) >= 2, axis
        assert all(one_two_five(t) for t in axis["ticks"]), axis
    assert state["ytitles"] == [
        "fraction of requests",
        "fraction of inter-token gaps",
        "fraction of requests",
        "fraction of requests",
    ]
    # said once, under the title (several documents: named by the file)
    assert state["answers"] == [f"capacity.json: {document['answer']['text']}"]
    scroll, client = state["table"]
    assert scroll <= client, state["table"]  # no sideways scroll of the steps table
    assert state["page"][0] <= state["page"][1], state["page"]  # nor of the page
    assert state["points"] == len(steps)
    assert state["labels"] == [f"{s['agents']} agents" for s in steps]
    assert state["against"] == "Throughput against latency, one point per step"
    assert state["throughput"] == "Throughput over time (0.5 s bins)"  # short runs: as recorded
    assert [entry for entry in logs if entry["level"] == "SEVERE"] == []


def test_a_dry_run_reports_what_it_has(tmp_path):
    results = tmp_path / "dry.json"
    status = agent_main(
        [
            "--agent-plans-jsonl", str(EXAMPLE), "--dry-run", "--tokenizer-model", "deepseek-v3",
            "--results-json", str(results),
        ]
    )  # fmt: skip
    assert status == 0
    page, _ = report(tmp_path, results)
    parser, figures = parse(page)
    assert parser.charts == [] and figures == {}
    assert parser.tables["bb-headline"][0]["requests"] == "0"
    assert "dry.json: a dry run: no requests were sent, so there are no live figures" not in page
    assert "a dry run: no requests were sent, so there are no live figures" in page
    assert parser.tables["bb-manifest"][0]["path"] == str(EXAMPLE)
