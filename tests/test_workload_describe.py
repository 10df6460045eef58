"""The workload description (batchbench.ingest.describe): exact figures of hand-built
plans (percentiles, shares, the perfect prefix cache computed by hand), its text, and its
HTML page opened in a real headless Chromium."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_export_plans import Export, row
from test_report_html import chromium_driver, open_when_ready, parse

from batchbench.errors import BatchbenchError
from batchbench.ingest.describe import describe, format_description
from batchbench.ingest.distribution import (
    Histogram,
    Percentiles,
    linear_histogram,
    log_histogram,
    nice_width,
    percentiles,
)
from batchbench.report import PLOTLY_MISSING
from batchbench.report.workload import render_workload_html, write_workload_html


def block(seed: str, tokens: int, role: str = "user", live: bool | None = None) -> dict:
    out = {"seed": seed, "tokens": tokens, "role": role}
    if live is not None:
        out["live"] = live
    return out


SYS = block("sys", 100, "system")


def conversations() -> list[dict]:
    """Two trajectories sharing a system block; "a" grows with a live block a turn, "b"
    starts a fresh conversation (reset) whose live block has no reply to take. "b" comes
    first in the file but "a" starts first."""
    a = {
        "schema_version": 2,
        "trajectory_id": "a",
        "start_after_ms": 0,
        "requests": [
            {"prompt_tokens": 130, "output_tokens": 20, "delay_after_ms": 1000,
             "recorded_start_after_ms": 0, "overhead_tokens": 10,
             "blocks": [SYS, block("a-u1", 20)]},
            {"prompt_tokens": 190, "output_tokens": 30, "delay_after_ms": 500,
             "recorded_start_after_ms": 2500,
             "blocks": [SYS, block("a-u1", 20), block("a-r1", 20, "assistant", True),
                        block("a-u2", 40)]},
            {"prompt_tokens": 230, "output_tokens": 5, "recorded_start_after_ms": 4000,
             "blocks": [SYS, block("a-u1", 20), block("a-r1", 20, "assistant"),
                        block("a-u2", 40), block("a-r2", 30, "assistant", True),
                        block("a-u3", 10)]},
        ],
    }  # fmt: skip
    b = {
        "schema_version": 2,
        "trajectory_id": "b",
        "start_after_ms": 1000,
        "requests": [
            {"prompt_tokens": 150, "output_tokens": 50, "delay_after_ms": 0,
             "recorded_start_after_ms": 1000, "blocks": [SYS, block("b-u1", 50)]},
            {"prompt_tokens": 140, "output_tokens": 10, "reset_before": True,
             "recorded_start_after_ms": 3000,
             "blocks": [SYS, block("b-r0", 25, "assistant", True), block("b-u2", 10)]},
        ],
    }  # fmt: skip
    return [b, a]


# By hand, in arrival order a0 (0 ms), b0 (1000), a1 (2500), b1 (3000), a2 (4000):
#   a0 hits nothing of 120; b0 hits sys: 100 of 150; a1 hits sys, a-u1 and the reply to
#   a0 (its live block): 140 of 180; b1 (a reset: its live block is its own seed, never
#   seen) hits sys: 100 of 135; a2 hits sys, a-u1, a-r1 (still a0's reply), a-u2 and the
#   reply to a1: 210 of 220. Total 550 of 805.
HITS = (0, 100, 140, 100, 210)
COUNTED = (120, 150, 180, 135, 220)


def growth() -> list[dict]:
    """A manifest without blocks: "g" grows, resets, grows again; "h" is one request."""
    g = {
        "schema_version": 2,
        "trajectory_id": "g",
        "start_after_ms": 200,
        "requests": [
            {"prompt_tokens": 100, "output_tokens": 20, "delay_after_ms": 300},
            {"prompt_tokens": 150, "output_tokens": 10, "delay_after_ms": None},
            {"prompt_tokens": 80, "output_tokens": 5, "reset_before": True,
             "delay_after_ms": 2500},
            {"prompt_tokens": 90, "output_tokens": 7},
        ],
    }  # fmt: skip
    h = {"schema_version": 2, "trajectory_id": "h", "requests": [
        {"prompt_tokens": 40, "output_tokens": 4}]}  # fmt: skip
    return [g, h]


# -- distributions --------------------------------------------------------------------------


def test_percentiles_are_nearest_rank():
    assert percentiles(list(range(1, 201))) == Percentiles(200, 100, 180, 198, 200)
    assert percentiles([10, 20, 30, 40, 50, 60, 70, 80, 90, 100]) == Percentiles(
        10, 50, 90, 100, 100
    )
    assert percentiles([7]) == Percentiles(1, 7, 7, 7, 7)
    assert percentiles([]) == Percentiles(0, None, None, None, None)


def test_histograms_bin_every_value_once():
    assert nice_width(0.3) == 1 and nice_width(3.3) == 5 and nice_width(120) == 200
    assert linear_histogram([3, 4, 4, 9]) == Histogram((3, 4, 5, 6, 7, 8, 9, 10), (1, 2, 0, 0, 0, 0, 1))  # fmt: skip
    values = sorted([0, 1, 250, 299, 300, 5999])
    histogram = linear_histogram(values, bins=10)
    assert histogram.edges[:3] == (0, 1000, 2000) and histogram.edges[-1] == 6000
    assert histogram.counts == (5, 0, 0, 0, 0, 1)
    assert log_histogram([1, 10, 99, 100]) == Histogram(
        (1.0, 1.58489, 2.51189, 3.98107, 6.30957, 10.0, 15.8489, 25.1189, 39.8107, 63.0957,
         100.0, 158.489),
        (1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1),
    )  # fmt: skip
    assert linear_histogram([]) == log_histogram([]) == Histogram((), ())


# -- the figures ----------------------------------------------------------------------------


def test_conversations_with_shared_and_live_blocks():
    desc = describe(conversations())
    assert (desc.trajectories, desc.multi_request_trajectories, desc.requests) == (2, 2, 5)
    assert (desc.block_requests, desc.prompt_tokens, desc.output_tokens) == (5, 840, 115)
    # 805 block tokens: sys 5 x 100 is shared; a-r1 in a1, a-r2 and b-r0 are marked live
    # (a-r1 in a2 repeats a reply but is not marked).
    assert (desc.block_tokens, desc.shared_block_tokens, desc.live_block_tokens) == (805, 500, 75)
    assert desc.shared_share == 500 / 805 and desc.live_share == 75 / 805
    assert (desc.cache_hit_tokens, desc.cache_counted_tokens) == (sum(HITS), sum(COUNTED))
    assert desc.cache_hit_rate == 550 / 805
    assert (desc.first_arrival_ms, desc.last_arrival_ms) == (0, 4000)
    assert desc.prompt == Percentiles(5, 150, 230, 230, 230)  # 130 140 150 190 230
    assert desc.output == Percentiles(5, 20, 50, 50, 50)  # 5 10 20 30 50
    assert desc.turns == Percentiles(2, 2, 3, 3, 3)
    assert desc.delay_ms == Percentiles(3, 500, 1000, 1000, 1000)  # 0 500 1000
    assert desc.zero_delays == 1
    assert desc.delay_histogram.counts[0] == 1 and sum(desc.delay_histogram.counts) == 2
    assert desc.turns_histogram == Histogram((2, 3, 4), (1, 1))
    # One request a second; the cumulative rate follows the arrival order, not the file's
    # (in file order b0 would come first and a0 would hit sys).
    assert desc.timeline.bin_ms == 1000
    assert desc.timeline.requests == (1, 1, 1, 1, 1)
    running = [sum(HITS[: i + 1]) / sum(COUNTED[: i + 1]) for i in range(5)]
    assert desc.timeline.cache_hit_rate == tuple(running)
    assert running[0] == 0.0


def test_growth_manifest_hits_the_predecessors_prompt_and_reply():
    desc = describe(growth())
    # g1 extends g0: min(100 + 20, 150) = 120; g2 resets: 0; g3 extends g2: min(85, 90).
    assert (desc.cache_hit_tokens, desc.cache_counted_tokens) == (205, 460)
    assert (desc.block_requests, desc.block_tokens) == (0, 0)
    assert desc.shared_share is None and desc.live_share is None
    # h at 0; g at 200, 500, 500 (a null delay is 0), 3000 (cumulative delays).
    assert (desc.first_arrival_ms, desc.last_arrival_ms) == (0, 3000)
    assert desc.timeline.requests == (4, 0, 0, 1)
    assert desc.timeline.cache_hit_rate == (120 / 370, 120 / 370, 120 / 370, 205 / 460)
    assert desc.delay_ms == Percentiles(3, 300, 2500, 2500, 2500)
    assert desc.multi_request_trajectories == 1


def test_recorded_times_are_read_relative_to_the_first_request_and_never_go_back():
    plan = {"schema_version": 2, "trajectory_id": "r", "start_after_ms": 100, "requests": [
        {"prompt_tokens": 10, "output_tokens": 1, "recorded_start_after_ms": 5000},
        {"prompt_tokens": 20, "output_tokens": 1, "recorded_start_after_ms": 4000},
        {"prompt_tokens": 30, "output_tokens": 1, "delay_after_ms": 700},
        {"prompt_tokens": 40, "output_tokens": 1, "recorded_start_after_ms": 9000},
    ]}  # fmt: skip
    desc = describe([plan])
    # 100; 100 + 4000 - 5000 raised to 100; 100 + 0 (no recorded time: the delay after the
    # previous request, absent = 0); 100 + 9000 - 5000 = 4100.
    assert desc.timeline.requests == (3, 0, 0, 0, 1)
    assert (desc.first_arrival_ms, desc.last_arrival_ms) == (100, 4100)


def test_a_live_block_is_cached_only_once_its_request_has_run():
    """Two requests arriving at the same time in file order: the second one's live block
    answers the first, which has run; a live block answering nothing (first request)
    is its seed and hits only when that seed was served before."""
    plan = {"schema_version": 2, "trajectory_id": "x", "requests": [
        {"prompt_tokens": 10, "output_tokens": 5,
         "blocks": [block("u", 10), block("r", 5, "assistant", True)]},
        {"prompt_tokens": 30, "output_tokens": 5,
         "blocks": [block("u", 10), block("r", 5, "assistant", True),
                    block("q", 5, "assistant", True), block("v", 10)]},
    ]}  # fmt: skip
    # Request 1 reuses the kept content of seed r (the fallback of request 0: its seed),
    # and q, its first new live block, is request 0's reply: u, r and q hit.
    desc = describe([plan])
    assert (desc.cache_hit_tokens, desc.cache_counted_tokens) == (20, 45)


def test_a_reset_drops_the_replies_a_trajectory_kept():
    plan = {"schema_version": 2, "trajectory_id": "y", "requests": [
        {"prompt_tokens": 10, "output_tokens": 5, "blocks": [block("u", 10)]},
        {"prompt_tokens": 25, "output_tokens": 5,
         "blocks": [block("u", 10), block("R", 5, "assistant", True), block("v", 10)]},
        {"prompt_tokens": 25, "output_tokens": 5, "reset_before": True,
         "blocks": [block("u", 10), block("R", 5, "assistant"), block("w", 10)]},
    ]}  # fmt: skip
    # y1 hits u and its live R (y0's reply): 15 of 25. After the reset R is generated from
    # its seed again, which no prompt held: y2 hits u only, 10 of 25.
    desc = describe([plan])
    assert (desc.cache_hit_tokens, desc.cache_counted_tokens) == (25, 60)


def test_an_empty_workload_is_all_missing():
    desc = describe([])
    assert desc.requests == 0 and desc.cache_hit_rate is None
    text = format_description(desc)
    assert text.splitlines()[1] == "arrivals: from n/a to n/a after the start"
    assert text.splitlines()[-1] == "  delay_after_ms           0  n/a  n/a  n/a  n/a"


def test_the_text_is_one_screen_of_aligned_figures():
    text = format_description(describe(conversations()))
    assert text == (
        "workload: 5 requests in 2 trajectories (2 with more than one request)\n"
        "arrivals: from 0.0 s to 4.0 s after the start\n"
        "tokens: 840 prompt, 115 output\n"
        "blocks: 805 tokens in 5 requests; 62.1% shared by 2+ trajectories, 9.3% live\n"
        "perfect prefix cache, in arrival order: 68.3% of prompt tokens hit (550 of 805)\n"
        "                       count  p50    p90    p99    max\n"
        "  prompt tokens            5  150    230    230    230\n"
        "  output tokens            5   20     50     50     50\n"
        "  requests/trajectory      2    2      3      3      3\n"
        "  delay_after_ms           3  500  1,000  1,000  1,000"
    )
    lines = format_description(describe(growth())).splitlines()
    assert lines[3] == "blocks: none (each prompt grows by its predecessor's prompt and reply)"
    assert lines[4] == (
        "perfect prefix cache, in arrival order: 44.6% of prompt tokens hit (205 of 460)"
    )


def test_the_description_is_json():
    data = json.loads(json.dumps(describe(conversations()).to_dict()))
    assert data["cache_hit_rate"] == 550 / 805 and data["shared_share"] == 500 / 805
    assert data["prompt"] == {"count": 5, "p50": 150, "p90": 230, "p99": 230, "max": 230}
    assert data["timeline"]["requests"] == [1, 1, 1, 1, 1]
    assert data["turns_histogram"] == {"edges": [2, 3, 4], "counts": [1, 1]}


# -- the commands that write manifests ------------------------------------------------------


def conversation_rows() -> list[dict]:
    """A request and its continuation, whose reply becomes a live block."""
    roles = ["tool_definition", "system", "user", "assistant", "user"]
    return [
        row(0, "a", ["t", "s", "u"], roles=roles[:3], tokens=[10, 10, 5], prompt=30),
        row(5, "b", ["t", "s", "u", "r", "v"], roles=roles, tokens=[10, 10, 5, 3, 2], prompt=35),
    ]


def test_export_plans_prints_the_description_and_draws_it(tmp_path, capsys):
    page = tmp_path / "workload.html"
    result = Export(tmp_path, conversation_rows(), "--describe-html", str(page), capsys=capsys)
    assert (result.status, result.out) == (0, "")
    # b hits t, s, u (25 tokens) and its live block, a's reply (3): 28 of 25 + 30.
    assert result.err.splitlines()[1:] == [
        "workload: 2 requests in 1 trajectory (1 with more than one request)",
        "arrivals: from 0.0 s to 5.0 s after the start",
        "tokens: 65 prompt, 6 output",
        "blocks: 55 tokens in 2 requests; 0.0% shared by 2+ trajectories, 5.5% live",
        "perfect prefix cache, in arrival order: 50.9% of prompt tokens hit (28 of 55)",
        "                       count    p50    p90    p99    max",
        "  prompt tokens            2     30     35     35     35",
        "  output tokens            2      3      3      3      3",
        "  requests/trajectory      1      2      2      2      2",
        "  delay_after_ms           1  5,000  5,000  5,000  5,000",
        f"wrote the workload description to {page}",
    ]
    parser, figures = parse(page.read_text())
    assert "<title>batchbench workload: plans.jsonl</title>" in page.read_text()
    by_field = {next(k for k in r if k != "figure"): r for r in parser.tables["bb-workload"]}
    assert by_field["cache_hit_rate"]["cache_hit_rate"] == "50.9%"
    assert list(figures) == CHARTS


def test_export_plans_without_plotly_stops_before_writing(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in conversation_rows()))
    out = tmp_path / "plans.jsonl"
    code = (
        "import sys; sys.modules['plotly'] = None\n"
        "from batchbench.cli.export_plans import run\n"
        f"sys.exit(run(['--rows-jsonl', {str(rows)!r}, '--start', '2026-01-01T00:00:00Z',"
        f" '--end', '2026-01-01T01:00:00Z', '--output', {str(out)!r},"
        f" '--describe-html', {str(tmp_path / 'w.html')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", f"error: {PLOTLY_MISSING}\n")
    assert not out.exists()


# -- the page -------------------------------------------------------------------------------

CHARTS = [
    "bb-workload-isl",
    "bb-workload-osl",
    "bb-workload-turns",
    "bb-workload-delay",
    "bb-workload-arrivals",
    "bb-workload-cache",
]


def test_the_page_has_the_texts_figures_and_every_chart():
    desc = describe(conversations())
    page = render_workload_html(desc, "conversations <b>")
    parser, figures = parse(page)
    assert "<title>conversations &lt;b&gt;</title>" in page
    assert "<h1>conversations &lt;b&gt;</h1>" in page
    assert parser.charts == CHARTS and list(figures) == CHARTS
    figures_table = {next(k for k in row if k != "figure"): row for row in parser.tables["bb-workload"]}  # fmt: skip
    assert figures_table["cache_hit_rate"]["cache_hit_rate"] == "68.3%"
    assert figures_table["shared_share"]["shared_share"] == "62.1%"
    assert figures_table["live_share"]["live_share"] == "9.3%"
    assert figures_table["prompt_tokens"]["prompt_tokens"] == "840"
    assert figures_table["last_arrival"]["last_arrival"] == "4.0 s"
    assert parser.tables["bb-workload-percentiles"][3] == {
        "per": "delay_after_ms", "count": "3", "p50": "500", "p90": "1,000", "p99": "1,000",
        "max": "1,000",
    }  # fmt: skip
    assert figures["bb-workload-turns"]["data"][0]["y"] == [1, 1]
    assert figures["bb-workload-arrivals"]["data"][0]["y"] == [1.0] * 5
    cache = figures["bb-workload-cache"]["data"][0]
    assert cache["x"] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert cache["y"] == list(desc.timeline.cache_hit_rate)
    # The delays' log axis is ticked at 1, 2 and 5 times powers of ten, as plain numbers.
    delay = figures["bb-workload-delay"]["layout"]["xaxis"]
    assert delay["type"] == "log" and delay["tickmode"] == "array"
    assert all(str(t)[0] in "125" for t in delay["ticktext"]), delay["ticktext"]
    assert delay["ticktext"] == [f"{v:,g}" for v in delay["tickvals"]]


def test_a_page_without_delays_says_so():
    plan = {"schema_version": 2, "trajectory_id": "one", "requests": [
        {"prompt_tokens": 5, "output_tokens": 1}]}  # fmt: skip
    page = render_workload_html(describe([plan]), "one")
    parser, figures = parse(page)
    assert parser.charts == list(figures) == [c for c in CHARTS if c != "bb-workload-delay"]
    assert "No delays: no request is followed by another in its trajectory." in page


def test_missing_plotly_is_one_clear_line(tmp_path):
    code = (
        "import sys; sys.modules['plotly'] = None\n"
        "from batchbench.errors import BatchbenchError\n"
        "from batchbench.ingest.describe import describe\n"
        "from batchbench.report.workload import write_workload_html\n"
        "try:\n"
        f"    write_workload_html(describe([]), {str(tmp_path / 'w.html')!r}, 'w')\n"
        "except BatchbenchError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, PLOTLY_MISSING + "\n", "")
    assert not (tmp_path / "w.html").exists()


def test_an_unwritable_path_is_one_line(tmp_path):
    with pytest.raises(BatchbenchError) as caught:
        write_workload_html(describe([]), tmp_path / "no" / "w.html", "w")
    assert (
        str(caught.value) == f"cannot write {tmp_path / 'no' / 'w.html'}: No such file or directory"
    )


@pytest.mark.native_pass_only
def test_the_page_opens_in_headless_chromium_and_draws_every_chart(tmp_path):
    out = tmp_path / "workload.html"
    write_workload_html(describe(conversations()), out, "conversations")
    driver = chromium_driver(tmp_path)
    try:
        open_when_ready(driver, out)
        state = driver.execute_script(
            """
            var charts = Array.from(document.querySelectorAll('.bb-chart'));
            var cell = function (field) {
              var td = document.querySelector('#bb-workload td[data-field="' + field + '"]');
              return td && td.textContent;
            };
            return {
              ready: window.__bbReady, errors: window.__bbErrors,
              ids: charts.map(function (c) { return c.id; }),
              drawn: charts.filter(function (c) {
                return c.classList.contains('js-plotly-plot') && c.querySelector('.main-svg');
              }).length,
              traces: charts.map(function (c) {
                return c.querySelectorAll('.scatterlayer .trace, .barlayer .trace').length;
              }),
              hit: cell('cache_hit_rate'), shared: cell('shared_share'),
              requests: cell('requests'),
            };
            """
        )
        logs = driver.get_log("browser")
    finally:
        driver.quit()
    assert state["errors"] == [] and state["ready"] is True
    assert [entry for entry in logs if entry["level"] == "SEVERE"] == []
    assert state["ids"] == CHARTS and state["drawn"] == len(CHARTS)
    assert all(count > 0 for count in state["traces"]), state["traces"]
    assert (state["hit"], state["shared"], state["requests"]) == ("68.3%", "62.1%", "5")
