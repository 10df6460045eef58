"""Issue 28's small fixes, end to end against the embedded simulator (``--sim``): the cache
bound of shared blocks, the streaming note, the drawn seed, the model note, --host with an
API path, the throughput of failed requests, and the server-metrics baseline after a
warm-up. The agent runs in-process."""

from __future__ import annotations

import csv
import json
import re
import tomllib
from pathlib import Path

import pytest

from batchbench.cli.agent import main
from batchbench.config import RunConfig
from batchbench.errors import UsageError
from batchbench.report.page import _interval
from batchbench.results.console import server_rank_lines

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trajectory-replay" / "plans-v2.jsonl"
TOOLS = {"seed": "tools/editor-shell-v1", "tokens": 600, "role": "tool_definition"}
SYSTEM = {"seed": "prompt/coding-agent-v1", "tokens": 420, "role": "system"}


def run(capsys, tmp_path: Path, plans: Path, *args: str, status: int = 0) -> dict:
    summary, table = tmp_path / "summary.json", tmp_path / "results.csv"
    argv = [
        "--agent-plans-jsonl", str(plans), "--no-progress",
        "--results-json", str(summary), "--results-csv", str(table), *args,
    ]  # fmt: skip
    got = main(argv)
    captured = capsys.readouterr()
    assert got == status, captured.out[-2000:] + captured.err[-2000:]
    with open(table, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {
        "out": captured.out.splitlines(),
        "err": captured.err,
        "summary": json.loads(summary.read_text()),
        "csv": rows[0],
        "options": tomllib.loads((tmp_path / "summary.config.toml").read_text()),
    }


def line(out: list[str], prefix: str) -> str:
    found = [text for text in out if text.startswith(prefix)]
    assert len(found) == 1, (prefix, found)
    return found[0]


def shared_manifest(path: Path, sessions: int) -> Path:
    """Sessions of one request sharing a tool definition and a system prompt, each due
    0.3 s after the one before (so each finds the shared blocks in the cache), with a
    manifest overhead of 0: the template's framing is all unplanned."""
    with open(path, "w") as handle:
        for i in range(sessions):
            task = {"seed": f"s{i}/task", "tokens": 150, "role": "user"}
            request = {
                "prompt_tokens": 1170, "output_tokens": 10, "overhead_tokens": 0,
                "blocks": [TOOLS, SYSTEM, task],
            }  # fmt: skip
            trajectory = {
                "schema_version": 2, "trajectory_id": f"s{i}", "start_after_ms": i * 300,
                "requests": [request],
            }  # fmt: skip
            handle.write(json.dumps(trajectory) + "\n")
    return path


def test_shared_blocks_raise_no_false_cache_alarm(capsys, tmp_path):
    plans = shared_manifest(tmp_path / "shared.jsonl", 6)
    result = run(
        capsys, tmp_path, plans, "--sim", "--sim-args", "--speed 8", "--admission", "open-loop"
    )
    out = result["out"]
    # Sessions 2-6 each find the tools block, the system prompt and the framing around
    # them cached: 1040 tokens in whole 16-token blocks (1020 of blocks, 20 of framing).
    assert line(out, "Server-reported cached input tokens") == (
        "Server-reported cached input tokens (usage.prompt_tokens_details): 5200 "
        "(74.1% of input tokens)"
    )
    # The bound: 5 x 1020 shared block tokens and 6 x 39 tokens of framing as served.
    assert not any(text.startswith("Warning: the server reported") for text in out)
    assert result["summary"]["fidelity"]["explainable_cached_input_tokens"] == 5334
    # The compatibility estimate keeps its per-trajectory meaning; a line says so.
    assert line(out, "Estimated cached input tokens") == (
        "Estimated cached input tokens (perfect server-side caching): 0"
    )
    assert line(out, "Cached input tokens with the blocks") == (
        "Cached input tokens with the blocks trajectories share (perfect prefix caching, "
        "at most): 5334; the estimate above counts each trajectory's own earlier prompts only"
    )


def test_a_manifest_stream_a_drawn_seed_and_no_model_note(capsys, tmp_path):
    result = run(capsys, tmp_path, EXAMPLE, "--sim", "--sim-args", "--speed 8")
    out = result["out"]
    # session-a's second request streams (the manifest's "stream": true), without --stream.
    assert line(out, "Time to first token (ms, streamed requests): ").startswith(
        "Time to first token (ms, streamed requests): p50="
    )
    assert not any(text.startswith("Time to first token, inter-token") for text in out)
    # The seed was drawn: the results JSON records it, as the options file does; the CSV
    # column keeps its compatibility meaning (--seed as given: empty).
    drawn = result["options"]["seed"]
    assert result["summary"]["configuration"]["seed"] == int(drawn)
    assert result["csv"]["seed"] == ""
    # --sim: the model is the simulator's, with no note about it.
    assert "--model not given" not in result["err"]
    assert result["summary"]["configuration"]["model"] == "batchbench-sim"


def test_no_stream_note_when_no_request_streams(capsys, tmp_path):
    plans = shared_manifest(tmp_path / "one.jsonl", 1)
    out = run(capsys, tmp_path, plans, "--sim", "--seed", "7", "--no-stream")["out"]
    assert line(out, "Time to first token, inter-token latency, TPOT: ") == (
        "Time to first token, inter-token latency, TPOT: not measured "
        "(--no-stream: replies were not streamed)"
    )
    assert result_seed(tmp_path) == 7


def result_seed(tmp_path: Path) -> int:
    return json.loads((tmp_path / "summary.json").read_text())["configuration"]["seed"]


def test_host_with_an_api_path_is_one_error():
    for host, base in (
        ("http://127.0.0.1:18012/v1/chat", "http://127.0.0.1:18012"),
        ("http://gw:8000/prefix/v1/chat/completions/", "http://gw:8000/prefix"),
    ):
        path = host.split(base, 1)[1].rstrip("/")
        with pytest.raises(UsageError) as caught:
            main(["--agent-plans-jsonl", str(EXAMPLE), "--host", host, "--no-progress"])
        assert str(caught.value) == (
            f"--host {host} carries the API path {path}: give the server's base URL "
            f"(e.g. --host {base}); requests go to --host plus --endpoint "
            "(/v1/chat/completions)"
        )
    # A trailing /v1 (the OpenAI SDK's base_url) stays accepted.
    config = RunConfig(host="http://127.0.0.1:18012/v1", agent_plans_jsonl=str(EXAMPLE))
    config.check()
    assert config.endpoint_url == "http://127.0.0.1:18012/v1/chat/completions"
    # With an --endpoint that is no /v1/... path, the host's path is the gateway's own.
    config = RunConfig(
        host="http://gw:8000/v1/deployments/m", endpoint="chat/completions",
        agent_plans_jsonl=str(EXAMPLE),
    )  # fmt: skip
    config.check()
    assert config.endpoint_url == "http://gw:8000/v1/deployments/m/chat/completions"


def test_all_failed_run_says_no_request_succeeded(capsys, tmp_path):
    result = run(
        capsys, tmp_path, EXAMPLE, "--sim", "--sim-args", "--speed 8 --max-model-len 200",
        "--seed", "1", status=3,
    )  # fmt: skip
    out = result["out"]
    metrics = result["summary"]["metrics"]
    assert metrics["failed_requests"] == 2 and metrics["successful_requests"] == 0
    assert metrics["requests_per_second"] > 0  # its compatibility definition: all sent
    total = line(out, "Total duration: ")
    assert total.endswith(
        f"requests {metrics['requests_per_second']:.2f} req/s "
        "(failed included; 0.00 req/s succeeded)"
    )
    # The window is the whole run: its counts are the lines above, not repeated.
    assert re.fullmatch(
        r"Measured window: the whole run \(0\.00s to \d+\.\d\ds, no warm-up\): its requests, "
        r"rates, cached tokens and p50/p90/p99 are the lines above",
        line(out, "Measured window: "),
    )
    # No successful request: no length line, no peak rate.
    assert not [x for x in out if x.startswith(("Input tokens per", "Peak output"))]


def test_server_rank_counts_start_at_the_warm_up_end(capsys, tmp_path):
    plans = shared_manifest(tmp_path / "ranks.jsonl", 8)
    result = run(
        capsys, tmp_path, plans, "--sim", "--sim-args", "--speed 8 --dp-ranks 2",
        "--admission", "open-loop", "--warmup", "1", "--server-metrics", "sim",
        "--server-metrics-interval", "30", "--seed", "3",
    )  # fmt: skip
    window = result["summary"]["server_metrics"]["window"]
    assert window["start_seconds"] == 1.0
    # The counts' baseline is a scrape taken where the warm-up ends (not the one at 0 s).
    assert 0.9 < window["counters_from_seconds"] <= 1.0
    header = line(result["out"], "Per-rank load (2 ranks, from the server's metrics")
    low, high = window["counters_from_seconds"], window["counters_to_seconds"]
    assert header == (
        "Per-rank load (2 ranks, from the server's metrics counted between scrapes at "
        f"{low:.2f}s and {high:.2f}s; completions counted at scrape times):"
    )
    # The sessions due at 1.2, 1.5, 1.8 and 2.1 s are the window's requests (not all 8).
    rows = result["summary"]["ranks"]
    assert sum(row["requests"] for row in rows) == 4


def test_server_rank_lines_name_the_scrapes_counted_between():
    rows = [{"rank": 0, "label": "0", "requests": 3.0}, {"rank": 1, "label": "1", "requests": 1.0}]
    header = "Per-rank load (2 ranks, from the server's metrics "
    tail = "; completions counted at scrape times):"
    # No window known: the old wording.
    assert server_rank_lines(rows)[0] == f"{header}over the measured window{tail}"
    # A baseline taken where the warm-up ends (a little early): the scrapes alone.
    at_start = {"start_seconds": 2.0, "counters_from_seconds": 1.96, "counters_to_seconds": 9.5}
    assert server_rank_lines(rows, at_start)[0] == (
        f"{header}counted between scrapes at 1.96s and 9.50s{tail}"
    )
    # A baseline well before the window's start: said so.
    early = {**at_start, "counters_from_seconds": 0.0}
    assert server_rank_lines(rows, early)[0] == (
        f"{header}counted between scrapes at 0.00s and 9.50s (the measured window starts at "
        f"2.00s){tail}"
    )


def test_the_report_prints_an_open_interval_as_a_bound():
    assert _interval(700.0, 614.6, None) == "700.0 (≥ 614.6)"
    assert _interval(700.0, None, 800.0) == "700.0 (≤ 800.0)"
    assert _interval(700.0, 614.6, 800.0) == "700.0 (614.6 – 800.0)"
    assert _interval(700.0, None, None) == "700.0"


def test_console_prints_each_figure_once(capsys, tmp_path):
    """The trajectory example at seed 7 on the simulator, streamed, its window the whole run:
    one cache line per source (the client's estimate, the usage-reported tokens, the
    server's metrics), each p50/p90/p99 once, the request lengths and the peak output rate
    once."""
    result = run(
        capsys, tmp_path, EXAMPLE.with_name("plans.jsonl"), "--max-active-agents", "2",
        "--sim", "--calibrate", "--seed", "7", "--server-metrics", "sim", "--stream",
    )  # fmt: skip
    out = result["out"]
    cache = [x for x in out if re.search(r"cached? (input|hits)", x)]
    assert len(cache) == 3
    assert cache[0] == "Estimated cached input tokens (perfect server-side caching): 1664"
    assert cache[1] == (
        "Server-reported cached input tokens (usage.prompt_tokens_details): 1664 "
        "(36.6% of input tokens)"
    )
    assert cache[2].startswith("Server metrics (batchbench-sim, ")
    assert cache[2].endswith("; prefix cache hits 1664 of 4544 prompt tokens (36.6%)")
    assert line(out, "Input tokens per request") == (
        "Input tokens per request: mean 649.14, p50 512, p90 896, max 1280 (7 successful requests)"
    )
    assert line(out, "Output tokens per request") == (
        "Output tokens per request: mean 96.00, p50 96, p90 128, max 128"
    )
    window = result["summary"]["window"]
    assert window["request_tokens"]["input"] == {"mean": 4544 / 7, "p50": 512, "p90": 896,
                                                 "max": 1280}  # fmt: skip
    peak = window["peak_output"]
    assert line(out, "Peak output tokens/s: ") == (
        f"Peak output tokens/s: {peak['tokens_per_second']:.0f} (the 1-second bin from "
        f"{peak['bin_start_seconds']:.2f}s; tokens counted as their chunks arrived)"
    )
    assert 96 <= peak["tokens_per_second"] <= 672 and peak["counted_at"] == "chunks"
    # Percentiles: p50/p90/p99 in the compatibility lines only, the rest in the table.
    latency = [x for x in out if not x.startswith("Client health")]  # its own p50 (lag)
    assert [x.split(":")[0] for x in latency if " p50=" in x or x.endswith(" p50")] == [
        "Request latency (ms)",
        "Agent end-to-end latency (ms, completed agents)",
        "Time to first token (ms, streamed requests)",
        "Inter-token latency (ms, streamed requests)",
        "Time per output token (ms, streamed requests)",
    ]
    table = out[out.index("Latency over the whole run (p50, p90, p99 in the lines above):") :]
    assert table[1].split() == ["(ms)", "count", "mean", "min", "max", "std", "p95", "p99.9"]
    assert [x.split()[0] for x in table[2:7]] == ["TTFT", "ITL", "TPOT", "Request", "Agent"]
    # What makes leaving them out right: the whole run's p50/p90/p99 are the window's.
    metrics, latency_stats = result["summary"]["metrics"], window["latency"]
    for key, name in (
        ("e2e_ms", "latency"),
        ("agent_e2e_ms", "agent_end_to_end_latency"),
        ("ttft_ms", "ttft"),
        ("itl_ms", "inter_token_latency"),
        ("tpot_ms", "tpot"),
    ):
        for p in ("p50", "p90", "p99"):
            assert latency_stats[key]["percentiles"][p] == metrics[f"{name}_{p}_ms"]  # fmt: skip
    assert [x for x in out if x.startswith("Measured window")] == [
        f"Measured window: the whole run (0.00s to {window['end_seconds']:.2f}s, no warm-up): "
        "its requests, rates, cached tokens and p50/p90/p99 are the lines above"
    ]
