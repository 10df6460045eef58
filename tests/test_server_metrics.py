"""``--server-metrics``: Prometheus pages of vLLM, SGLang, llama.cpp and the simulator read
into concepts and summarized over a window (batchbench.results.promsummary), scraped over
HTTP (batchbench.results.scrape), and a real ``batchbench sim`` with two DP ranks scraped
while it serves requests.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from batchbench.drive.simlaunch import SimProcess, sim_command
from batchbench.errors import UsageError
from batchbench.results.promsummary import (
    Timeline,
    counter_increase,
    gauge_stats,
    histogram_quantile,
)
from batchbench.results.scrape import ServerMetricsScraper, check_metrics_url, metrics_url

NONE3 = {"p50": None, "p90": None, "p99": None}


def summarize(pages: list[tuple[float, str]], start: float, end: float) -> dict:
    timeline = Timeline()
    for t, text in pages:
        timeline.ingest(t, text)
    return timeline.summary(start, end)


def stats(mean, p50, p99, top, bottom) -> dict:
    return {"mean": mean, "p50": p50, "p99": p99, "max": top, "min": bottom}


# --- vLLM ------------------------------------------------------------------------------


def vllm_page(v: dict) -> str:
    """A vLLM v1 page for engines 0 and 1 (layout as prometheus_client writes it), with
    families batchbench does not read around the ones it does."""
    lines = [
        "# HELP python_gc_objects_collected_total Objects collected during gc",
        "# TYPE python_gc_objects_collected_total counter",
        'python_gc_objects_collected_total{generation="0"} 1234.0',
    ]
    for name, kind in (
        ("num_requests_running", "gauge"),
        ("num_requests_waiting", "gauge"),
        ("kv_cache_usage_perc", "gauge"),
        ("prefix_cache_queries_total", "counter"),
        ("prefix_cache_hits_total", "counter"),
        ("prompt_tokens_total", "counter"),
        ("generation_tokens_total", "counter"),
    ):
        lines += [f"# HELP vllm:{name} {name}.", f"# TYPE vllm:{name} {kind}"]
        for engine in (0, 1):
            lines.append(f'vllm:{name}{{engine="{engine}",model_name="m"}} {v[name][engine]}')
        if kind == "counter":
            base = name.removesuffix("_total")
            lines += [f"# HELP vllm:{base}_created x", f"# TYPE vllm:{base}_created gauge"]
            lines.append(f'vllm:{base}_created{{engine="0",model_name="m"}} 1.7e+09')
    lines += ["# HELP vllm:request_success_total done", "# TYPE vllm:request_success_total counter"]
    for (engine, reason), value in v["request_success_total"].items():
        lines.append(
            f'vllm:request_success_total{{engine="{engine}",finished_reason="{reason}",'
            f'model_name="m"}} {value}'
        )
    for family, buckets in (
        ("time_to_first_token_seconds", v["ttft"]),
        ("e2e_request_latency_seconds", v["e2e"]),
    ):
        name = f"vllm:{family}"
        lines += [f"# HELP {name} h", f"# TYPE {name} histogram"]
        for engine in (0, 1):
            for le, count in zip(("0.25", "0.5", "1.0", "+Inf"), buckets[engine], strict=True):
                lines.append(f'{name}_bucket{{engine="{engine}",le="{le}",model_name="m"}} {count}')
            lines.append(f'{name}_count{{engine="{engine}",model_name="m"}} {buckets[engine][-1]}')
            lines.append(f'{name}_sum{{engine="{engine}",model_name="m"}} 1.5')
    lines += ["# HELP process_cpu_seconds_total cpu", "# TYPE process_cpu_seconds_total counter"]
    lines.append("process_cpu_seconds_total 12.5")
    return "\n".join(lines) + "\n"


VLLM_START = {
    "num_requests_running": (2.0, 0.0),
    "num_requests_waiting": (1.0, 0.0),
    "kv_cache_usage_perc": (0.25, 0.5),
    "prefix_cache_queries_total": (100.0, 50.0),
    "prefix_cache_hits_total": (40.0, 0.0),
    "prompt_tokens_total": (100.0, 50.0),
    "generation_tokens_total": (10.0, 5.0),
    "request_success_total": {(0, "stop"): 3.0, (1, "stop"): 1.0},
    "ttft": ((0, 0, 0, 0), (0, 0, 0, 0)),
    "e2e": ((0, 0, 0, 0), (0, 0, 0, 0)),
}
VLLM_END = {
    "num_requests_running": (4.0, 1.0),
    "num_requests_waiting": (3.0, 0.0),
    "kv_cache_usage_perc": (0.75, 0.5),
    "prefix_cache_queries_total": (300.0, 150.0),
    "prefix_cache_hits_total": (140.0, 25.0),
    "prompt_tokens_total": (300.0, 150.0),
    "generation_tokens_total": (30.0, 5.0),
    # engine 0's "length" series appears after the first scrape: it counts from zero
    "request_success_total": {(0, "stop"): 5.0, (0, "length"): 1.0, (1, "stop"): 2.0},
    "ttft": ((2, 6, 10, 10), (0, 0, 0, 0)),
    "e2e": ((9, 9, 9, 9), (9, 9, 9, 9)),
}


def test_vllm_page_concepts_per_engine():
    summary = summarize([(0.0, vllm_page(VLLM_START)), (10.0, vllm_page(VLLM_END))], 0.0, 10.0)
    assert summary["dialect"] == "vllm"
    assert summary["concepts"] == {
        "kv_cache_usage": {
            "0": stats(0.5, 0.75, 0.75, 0.75, 0.25),
            "1": stats(0.5, 0.5, 0.5, 0.5, 0.5),
        },
        "running_requests": {
            "0": stats(3.0, 4.0, 4.0, 4.0, 2.0),
            "1": stats(0.5, 1.0, 1.0, 1.0, 0.0),
        },
        "waiting_requests": {
            "0": stats(2.0, 3.0, 3.0, 3.0, 1.0),
            "1": stats(0.0, 0.0, 0.0, 0.0, 0.0),
        },
        "prefix_cache_hit_percent": {"0": 50.0, "1": 25.0},
        "prefix_cache_hit_tokens": {"0": 100.0, "1": 25.0},
        "prefix_cache_queried_tokens": {"0": 200.0, "1": 100.0},
        "requests": {"0": 3.0, "1": 1.0},
        "prompt_tokens": {"0": 200.0, "1": 100.0},
        "generation_tokens": {"0": 20.0, "1": 0.0},
        # engine 0: 2, 4, 4 and 0 new observations in the buckets <= 0.25, 0.5, 1, +Inf
        "ttft_seconds": {"0": {"p50": 0.4375, "p90": 0.875, "p99": 0.9875}, "1": NONE3},
        "policy_branches": {},
    }
    assert summary["series"] == {
        "t": [0.0, 10.0],
        "kv_cache_usage": {"0": [0.25, 0.75], "1": [0.5, 0.5]},
        "running_requests": {"0": [2.0, 4.0], "1": [0.0, 1.0]},
        "waiting_requests": {"0": [1.0, 3.0], "1": [0.0, 0.0]},
    }


def test_older_vllm_names_and_hit_rate_gauge():
    """vLLM v0: gpu_cache_usage_perc, a hit-rate gauge, no prefix counters, no engine."""

    def page(usage: float, hit_rate: float, prompt: int) -> str:
        return (
            "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage.\n"
            "# TYPE vllm:gpu_cache_usage_perc gauge\n"
            f'vllm:gpu_cache_usage_perc{{model_name="m"}} {usage}\n'
            "# HELP vllm:gpu_prefix_cache_hit_rate GPU prefix cache block hit rate.\n"
            "# TYPE vllm:gpu_prefix_cache_hit_rate gauge\n"
            f'vllm:gpu_prefix_cache_hit_rate{{model_name="m"}} {hit_rate}\n'
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
            "# TYPE vllm:prompt_tokens_total counter\n"
            f'vllm:prompt_tokens_total{{model_name="m"}} {prompt}\n'
        )

    pages = [(0.0, page(0.125, 0.25, 7)), (1.0, page(0.25, 0.5, 9)), (2.0, page(0.375, 0.75, 17))]
    concepts = summarize(pages, 0.0, 2.0)["concepts"]
    assert concepts["kv_cache_usage"] == {"all": stats(0.25, 0.25, 0.375, 0.375, 0.125)}
    assert concepts["prefix_cache_hit_percent"] == {"all": 50.0}
    assert concepts["prompt_tokens"] == {"all": 10.0}
    assert concepts["requests"] == concepts["ttft_seconds"] == concepts["running_requests"] == {}


# --- SGLang and llama.cpp ----------------------------------------------------------------


def sglang_page(running, queue, usage, prompt, cached, requests, generation, ttft) -> str:
    labels = 'model_name="meta-llama/Llama-3.1-8B-Instruct",tp_rank="0"'
    lines = []
    for name, kind, value in (
        ("sglang:num_running_reqs", "gauge", running),
        ("sglang:num_queue_reqs", "gauge", queue),
        ("sglang:token_usage", "gauge", usage),
        ("sglang:cache_hit_rate", "gauge", 0.9),  # counters win over the gauge
        ("sglang:prompt_tokens_total", "counter", prompt),
        ("sglang:cached_tokens_total", "counter", cached),
        ("sglang:num_requests_total", "counter", requests),
        ("sglang:generation_tokens_total", "counter", generation),
    ):
        lines += [f"# HELP {name} x", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {value}"]
    name = "sglang:time_to_first_token_seconds"
    lines += [
        f"# HELP {name} Histogram of time to first token in seconds.",
        f"# TYPE {name} histogram",
    ]
    lines.append(f"{name}_sum{{{labels}}} 0.6")
    for le, count in zip(("0.1", "0.2", "0.4", "+Inf"), ttft, strict=True):
        lines.append(f'{name}_bucket{{le="{le}",{labels}}} {count}')
    lines.append(f"{name}_count{{{labels}}} {ttft[-1]}")
    return "\n".join(lines) + "\n"


def test_sglang_page_without_rank_labels_is_all():
    pages = [
        (5.0, sglang_page(3, 0, 0.28, "8.128902e+06", 200, 10, 100, (0, 0, 0, 0))),
        (6.0, sglang_page(5, 2, 0.3, "8.129402e+06", 450, 14, 180, (1, 3, 4, 4))),
    ]
    summary = summarize(pages, 5.0, 6.0)
    assert summary["dialect"] == "sglang"
    assert summary["concepts"] == {
        "kv_cache_usage": {"all": stats(0.29, 0.3, 0.3, 0.3, 0.28)},
        "running_requests": {"all": stats(4.0, 5.0, 5.0, 5.0, 3.0)},
        "waiting_requests": {"all": stats(1.0, 2.0, 2.0, 2.0, 0.0)},
        "prefix_cache_hit_percent": {"all": 50.0},  # 250 cached of 500 prompt tokens
        "prefix_cache_hit_tokens": {"all": 250.0},
        "prefix_cache_queried_tokens": {"all": 500.0},
        "requests": {"all": 4.0},
        "prompt_tokens": {"all": 500.0},
        "generation_tokens": {"all": 80.0},
        "ttft_seconds": {"all": {"p50": 0.15, "p90": 0.32, "p99": 0.392}},
        "policy_branches": {},
    }


def test_llamacpp_page():
    def page(processing, deferred, ratio, prompt, predicted) -> str:
        lines = []
        for name, kind, value in (
            ("llamacpp:prompt_tokens_total", "counter", prompt),
            ("llamacpp:prompt_seconds_total", "counter", 3.5),
            ("llamacpp:tokens_predicted_total", "counter", predicted),
            ("llamacpp:prompt_tokens_seconds", "gauge", 1000.0),
            ("llamacpp:kv_cache_usage_ratio", "gauge", ratio),
            ("llamacpp:requests_processing", "gauge", processing),
            ("llamacpp:requests_deferred", "gauge", deferred),
        ):
            lines += [f"# HELP {name} x", f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(lines) + "\n"

    pages = [(0.0, page(1, 0, 0.5, 10, 3)), (2.0, page(2, 1, 0.25, 60, 43))]
    summary = summarize(pages, 0.0, 2.0)
    assert summary["dialect"] == "llamacpp"
    assert summary["concepts"] == {
        "kv_cache_usage": {"all": stats(0.375, 0.5, 0.5, 0.5, 0.25)},
        "running_requests": {"all": stats(1.5, 2.0, 2.0, 2.0, 1.0)},
        "waiting_requests": {"all": stats(0.5, 1.0, 1.0, 1.0, 0.0)},
        "prefix_cache_hit_percent": {},
        "prefix_cache_hit_tokens": {},
        "prefix_cache_queried_tokens": {},
        "requests": {},
        "prompt_tokens": {"all": 50.0},
        "generation_tokens": {"all": 40.0},
        "ttft_seconds": {},
        "policy_branches": {},
    }


def test_llamacpp_prefix_hits_from_its_cached_counter():
    """llama.cpp's prompt counter leaves reused tokens out; they have a counter of their
    own (as a real llama-server with --metrics exposes): hits / (processed + reused)."""

    def page(processed: float, cached: float) -> str:
        return (
            "# HELP llamacpp:prompt_tokens_total x\n# TYPE llamacpp:prompt_tokens_total counter\n"
            f"llamacpp:prompt_tokens_total {processed}\n"
            "# HELP llamacpp:prompt_tokens_cached_total x\n"
            "# TYPE llamacpp:prompt_tokens_cached_total counter\n"
            f"llamacpp:prompt_tokens_cached_total {cached}\n"
        )

    summary = summarize([(0.0, page(100, 20)), (3.0, page(700, 420))], 0.0, 3.0)
    # 600 tokens processed and 400 reused in the window: 400 / 1000
    assert summary["concepts"]["prefix_cache_hit_percent"] == {"all": 40.0}
    assert summary["concepts"]["prompt_tokens"] == {"all": 600.0}
    # the tokens behind that share: looked up = processed + reused
    assert summary["concepts"]["prefix_cache_hit_tokens"] == {"all": 400.0}
    assert summary["concepts"]["prefix_cache_queried_tokens"] == {"all": 1000.0}


def test_simulator_families_alone_use_the_rank_label():
    """The simulator's own batchbench_sim_* names (as before its vLLM families)."""

    def page(requests: tuple, prompt: tuple, cached: tuple, queue: tuple) -> str:
        lines = []
        for family, kind, values in (
            ("requests_total", "counter", requests),
            ("prompt_tokens_total", "counter", prompt),
            ("completion_tokens_total", "counter", (5, 5)),
            ("cached_tokens_total", "counter", cached),
            ("queue_depth", "gauge", queue),
            ("running", "gauge", (1, 1)),
            ("kv_running_tokens", "gauge", (100, 100)),
        ):
            name = f"batchbench_sim_{family}"
            lines += [f"# HELP {name} x", f"# TYPE {name} {kind}"]
            lines += [f'{name}{{rank="{r}"}} {values[r]}' for r in (0, 1)]
        lines.append('batchbench_sim_info{version="0.1"} 1')
        return "\n".join(lines) + "\n"

    pages = [
        (0.0, page((0, 0), (0, 0), (0, 0), (0, 0))),
        (1.0, page((144, 112), (1000, 800), (400, 600), (2, 0))),
    ]
    summary = summarize(pages, 0.0, 1.0)
    assert summary["dialect"] == "batchbench-sim"
    concepts = summary["concepts"]
    assert concepts["requests"] == {"0": 144.0, "1": 112.0}
    assert concepts["prefix_cache_hit_percent"] == {"0": 40.0, "1": 75.0}
    assert concepts["waiting_requests"] == {
        "0": stats(1.0, 2.0, 2.0, 2.0, 0.0),
        "1": stats(0.0, 0.0, 0.0, 0.0, 0.0),
    }
    assert concepts["kv_cache_usage"] == {} and concepts["ttft_seconds"] == {}


# --- the arithmetic ----------------------------------------------------------------------


def test_counter_increase_corrects_restarts():
    assert counter_increase([]) == 0.0
    assert counter_increase([7.0]) == 0.0
    assert counter_increase([10.0, 15.0, 3.0, 8.0]) == 13.0  # 5, restart: 3, then 5
    assert counter_increase([10.0, 0.0, 0.0, 4.0]) == 4.0


def test_counter_restart_and_window_bounds_in_a_timeline():
    def page(value: float, running: float) -> str:
        return (
            "# TYPE vllm:prompt_tokens_total counter\n"
            f'vllm:prompt_tokens_total{{engine="0"}} {value}\n'
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0"}} {running}\n'
        )

    # The server restarts between t=2 and t=3 (30 -> 4).
    pages = [(float(t), page(v, t)) for t, v in enumerate((0, 10, 30, 4, 14))]
    whole = summarize(pages, 0.0, 4.0)["concepts"]
    assert whole["prompt_tokens"] == {"0": 44.0}  # 10 + 20 + 4 + 10
    # Counters: the scrapes enclosing the window (1 and 3); gauges: the scrapes inside it.
    part = summarize(pages, 1.5, 2.5)["concepts"]
    assert part["prompt_tokens"] == {"0": 24.0}  # 20 + 4
    assert part["running_requests"] == {"0": stats(2.0, 2.0, 2.0, 2.0, 2.0)}
    # A window between two scrapes: the gauge scrape nearest its middle.
    part = summarize(pages, 3.2, 3.4)["concepts"]
    assert part["prompt_tokens"] == {"0": 10.0}
    assert part["running_requests"] == {"0": stats(3.0, 3.0, 3.0, 3.0, 3.0)}
    # Before the first scrape and after the last: the first and last scrapes.
    assert summarize(pages, -5.0, 9.0)["concepts"]["prompt_tokens"] == {"0": 44.0}


def test_histogram_quantile_interpolates_inside_the_bucket():
    buckets = [(0.25, 2.0), (0.5, 6.0), (1.0, 10.0), (2.0, 12.0), (math.inf, 12.0)]
    assert histogram_quantile(0.25, buckets) == 0.3125  # rank 3: a quarter into (0.25, 0.5]
    assert histogram_quantile(0.5, buckets) == 0.5  # rank 6: the top of (0.25, 0.5]
    assert histogram_quantile(0.75, buckets) == 0.875  # rank 9: 3 of 4 into (0.5, 1]
    assert histogram_quantile(1.0, buckets) == 2.0
    assert histogram_quantile(0.125, buckets) == 0.1875  # rank 1.5 in [0, 0.25]
    # In the +Inf bucket the largest finite bound is the answer.
    assert histogram_quantile(0.9, [(1.0, 5.0), (math.inf, 10.0)]) == 1.0
    # Bucket increases that come out unordered are made monotonic first.
    assert histogram_quantile(0.5, [(1.0, 4.0), (2.0, 3.0), (math.inf, 8.0)]) == 1.0
    assert histogram_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None  # no observations
    assert histogram_quantile(0.5, [(1.0, 3.0)]) is None  # no +Inf bucket
    assert histogram_quantile(0.5, []) is None


def test_gauge_distribution():
    assert gauge_stats([0.5, 1.0, 0.0, 0.25]) == stats(0.4375, 0.5, 1.0, 1.0, 0.0)
    values = [float(v) for v in range(1, 101)]
    assert gauge_stats(values) == stats(50.5, 51.0, 99.0, 100.0, 1.0)
    assert gauge_stats([]) == stats(None, None, None, None, None)


def test_series_are_downsampled_to_1000_points():
    timeline = Timeline()
    for t in range(2500):
        timeline.ingest(
            float(t), f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting {t}\n"
        )
    summary = timeline.summary(0.0, 2499.0)
    times = summary["series"]["t"]
    assert len(times) == 1000 and times[0] == 0.0 and times[-1] == 2499.0
    assert summary["series"]["waiting_requests"]["all"] == times
    assert summary["concepts"]["waiting_requests"]["all"]["mean"] == 1249.5  # every scrape
    empty = Timeline().summary(0.0, 1.0)
    assert empty["dialect"] == "unknown"
    assert empty["series"] == {
        "t": [],
        "kv_cache_usage": {},
        "running_requests": {},
        "waiting_requests": {},
    }


def test_a_page_the_parser_rejects_adds_nothing():
    timeline = Timeline()
    with pytest.raises(ValueError):
        timeline.ingest(0.0, 'vllm:num_requests_running{engine="0"} many\n')
    assert len(timeline.times) == 0 and timeline.series == {}


# --- the scraper over HTTP ---------------------------------------------------------------


def test_metrics_urls():
    for bad in ("ftp://host/metrics", "localhost:8000", "", "http://", "/metrics"):
        with pytest.raises(UsageError) as caught:
            check_metrics_url(bad)
        assert str(caught.value) == (
            f"--server-metrics {bad!r} is not an http:// or https:// URL "
            "(e.g. http://127.0.0.1:8000/metrics)"
        )
    check_metrics_url("https://gpu-node:8000/metrics")
    assert metrics_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://h:1/custom/path") == "http://h:1/custom/path"
    with pytest.raises(UsageError, match=r"^--server-metrics-interval must be above 0"):
        ServerMetricsScraper("http://h:1/metrics", 0.0, None)
    with pytest.raises(UsageError, match=r"^--server-metrics-jsonl /nonexistent/dir/m.jsonl: "):
        ServerMetricsScraper("http://h:1/metrics", 1.0, "/nonexistent/dir/m.jsonl")


def test_scraper_counts_failures_and_writes_jsonl(tmp_path: Path):
    """A real aiohttp server answers a page, a 500, a restarted server's page and text the
    parser rejects; the scraper never raises and keeps what it could read."""
    first = vllm_page(VLLM_START)
    restarted = vllm_page(VLLM_START).replace(
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0',
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 30.0',
    )
    answers = [
        web.Response(text=first, content_type="text/plain"),
        web.Response(status=500, text="boom"),
        web.Response(text=restarted, content_type="text/plain"),
        web.Response(text='vllm:num_requests_running{engine="0"} lots\n'),
    ]
    path = tmp_path / "metrics.jsonl"

    async def scenario():
        async def handler(request: web.Request) -> web.Response:
            return answers.pop(0)

        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            scraper = ServerMetricsScraper(f"http://127.0.0.1:{port}", 1.0, str(path))
            outcomes = [await scraper.scrape_once() for _ in range(4)]
            await scraper.close()
            unreachable = ServerMetricsScraper(f"http://127.0.0.1:{port}/metrics", 1.0, None)
        finally:
            await runner.cleanup()
        assert await unreachable.scrape_once() is False
        await unreachable.close()
        return scraper, outcomes, unreachable

    scraper, outcomes, unreachable = asyncio.run(scenario())
    assert outcomes == [True, False, True, False]
    assert (scraper.scrapes, scraper.failed_scrapes) == (2, 2)
    assert scraper.last_error.startswith(f"{scraper.url}: not Prometheus text (ValueError")
    assert (unreachable.scrapes, unreachable.failed_scrapes) == (0, 1)
    assert unreachable.last_error.startswith(f"{unreachable.url}: ClientConnectorError")
    document = scraper.document(0.0, 60.0)
    assert document["concepts"]["prompt_tokens"] == {"0": 30.0, "1": 0.0}  # restart: 0 -> 30
    assert document["concepts"]["requests"] == {"0": 0.0, "1": 0.0}
    assert {k: document[k] for k in ("url", "scrapes", "failed_scrapes", "file", "window")} == {
        "url": scraper.url,
        "scrapes": 2,
        "failed_scrapes": 2,
        "file": str(path),
        "window": {
            "start_seconds": 0.0,
            "end_seconds": 60.0,
            # the counts run between the two scrapes read (the first and the last)
            "counters_from_seconds": scraper.timeline.times[0],
            "counters_to_seconds": scraper.timeline.times[1],
        },
    }
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [sorted(line) for line in lines] == [["samples", "t"], ["samples", "t"]]
    assert lines[0]["t"] < lines[1]["t"]
    key = 'vllm:prompt_tokens_total{engine="0",model_name="m"}'
    assert [line["samples"][key] for line in lines] == [100.0, 30.0]
    # Every sample of the families read, _count and _sum included; nothing else.
    assert "process_cpu_seconds" in {f.name for f in text_string_to_metric_families(first)}
    assert len(lines[0]["samples"]) == 2 * 7 + 2 + 2 * 6  # gauges and counters, success, ttft
    assert (
        'vllm:time_to_first_token_seconds_count{engine="1",model_name="m"}' in lines[0]["samples"]
    )
    assert not any(k.startswith(("process_", "python_", "vllm:e2e")) for k in lines[0]["samples"])


# --- a real simulator --------------------------------------------------------------------


def test_scraping_a_real_simulator_with_two_ranks(tmp_path: Path):
    """``batchbench sim --dp-ranks 2`` serves requests routed by header while the scraper
    runs at 50 ms; the window's per-rank figures equal what the client sent and was told."""
    sent = {"0": 7, "1": 4}
    path = tmp_path / "scrape.jsonl"
    text = "The quick brown fox jumps over the lazy dog. " * 20  # long enough to hit cache

    async def scenario(url: str):
        origin = time.perf_counter()
        scraper = ServerMetricsScraper(url, 0.05, str(path), origin=origin)
        await scraper.start()
        usages: dict[str, list[dict]] = {"0": [], "1": []}
        async with aiohttp.ClientSession() as session:

            async def one(rank: str, index: int) -> None:
                body = {
                    "model": "m",
                    "messages": [{"role": "user", "content": text}],
                    "max_tokens": 30,
                    "ignore_eos": True,  # 30 decode steps: scrapes see them running
                    "stream": index % 2 == 1,
                    "stream_options": {"include_usage": True},
                }
                headers = {"x-data-parallel-rank": rank}
                async with session.post(
                    url + "/v1/chat/completions", json=body, headers=headers
                ) as response:
                    assert response.status == 200
                    if body["stream"]:
                        events = (await response.read()).split(b"\n\n")
                        usage = orjson.loads(events[-3].removeprefix(b"data: "))["usage"]
                    else:
                        usage = (await response.json())["usage"]
                    usages[rank].append(usage)

            await one("0", 0)  # its prompt is cached for the rest
            await one("1", 0)
            jobs = [one(rank, i) for rank, count in sent.items() for i in range(1, count)]
            await asyncio.gather(*jobs)
        end = time.perf_counter() - origin
        await scraper.stop()
        return scraper, usages, end

    with SimProcess(sim_command("deepseek-v3", 2, "--speed 1")) as sim:
        scraper, usages, end = asyncio.run(scenario(sim.url))
    document = scraper.document(0.0, end)
    assert document["failed_scrapes"] == 0 and document["last_error"] is None
    assert document["dialect"] == "batchbench-sim"
    concepts = document["concepts"]
    assert concepts["requests"] == {rank: float(count) for rank, count in sent.items()}

    def total(rank: str, field: str) -> float:
        return float(sum(u[field] for u in usages[rank]))

    assert concepts["prompt_tokens"] == {r: total(r, "prompt_tokens") for r in sent}
    assert concepts["generation_tokens"] == {r: total(r, "completion_tokens") for r in sent}
    cached = {r: sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages[r]) for r in sent}
    assert all(cached[r] > 0 for r in sent)
    assert concepts["prefix_cache_hit_percent"] == {
        r: round(100.0 * cached[r] / total(r, "prompt_tokens"), 6) for r in sent
    }
    for rank in sent:
        ttft = concepts["ttft_seconds"][rank]
        assert 0.0 < ttft["p50"] <= ttft["p90"] <= ttft["p99"] < 5.0
        assert set(concepts["kv_cache_usage"][rank]) == {"mean", "p50", "p99", "max", "min"}
        assert 0.0 <= concepts["kv_cache_usage"][rank]["max"] <= 1.0
    assert concepts["running_requests"]["0"]["max"] >= 1.0  # six at once on rank 0
    assert concepts["waiting_requests"]["0"]["min"] == 0.0
    # The file: one line per scrape; the last has every request's first token observed.
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert len(lines) == document["scrapes"] >= 3
    assert len(document["series"]["t"]) == sum(1 for line in lines if line["t"] <= end)
    last = lines[-1]["samples"]
    for rank, count in sent.items():
        labels = f'engine="{rank}",model_name="batchbench-sim"'
        assert last[f"vllm:time_to_first_token_seconds_count{{{labels}}}"] == count
        assert last[f'batchbench_sim_requests_total{{rank="{rank}"}}'] == count
        assert last[f"vllm:request_success_total{{{labels}}}"] == count
