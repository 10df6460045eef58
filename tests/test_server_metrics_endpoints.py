"""Several --server-metrics endpoints (the smg gateway and each simulator behind it), smg's
metric families, and the command line's refusal of a single-value option given twice."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest
from smggateway import smg_gateway

from batchbench.cli.agent import main as agent_main
from batchbench.errors import UsageError
from batchbench.options.parser import CommandParser, Repeated, SingleValue
from batchbench.report import render_html
from batchbench.results.console import server_rank_lines
from batchbench.results.promendpoints import combined_document
from batchbench.results.sections import rank_rows
from batchbench.results.windowreport import server_metrics_lines

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "trajectory-replay" / "plans.jsonl"


def run_through_gateway(gateway, out: Path, capsys) -> tuple[dict, list[str]]:
    """The example's 3 agents through the gateway with perfect routing over 2 ranks,
    scraping the gateway and each simulator; the results JSON and the console lines."""
    metrics = [gateway.metrics_url, *(url + "/metrics" for url in gateway.worker_urls)]
    argv = [
        "--host", gateway.url, "--agent-plans-jsonl", str(EXAMPLE),
        "--tokenizer-model", "deepseek-v3", "--model", "batchbench-sim", "--no-progress",
        "--no-preflight", "--dp-rank-perfect-routing", "--dp-rank-perfect-routing-num", "2",
        "--server-metrics-interval", "0.2", "--results-json", str(out),
        "--server-metrics-jsonl", str(out.with_suffix(".jsonl")),
        "--seed", "7",
    ]  # fmt: skip
    for url in metrics:
        argv += ["--server-metrics", url]
    assert agent_main(argv) == 0
    console = capsys.readouterr().out.splitlines()
    return json.loads(out.read_text()), console


@pytest.mark.native_pass_only
def test_gateway_and_each_worker_scraped_and_labelled(tmp_path, capsys):
    # modelled time (--speed 4): no request is answered before the baseline scrapes
    with smg_gateway(2, "consistent_hashing", "--speed 4") as gateway:
        results, console = run_through_gateway(gateway, tmp_path / "r.json", capsys)
    document = results["server_metrics"]
    first, second = gateway.worker_urls
    smg_url = gateway.metrics_url
    sim_urls = [url + "/metrics" for url in gateway.worker_urls]
    assert [e["url"] for e in document["endpoints"]] == [smg_url, *sim_urls]
    assert [e["dialect"] for e in document["endpoints"]] == [
        "smg",
        "batchbench-sim",
        "batchbench-sim",
    ]
    assert document["dialect"] == "smg, batchbench-sim, batchbench-sim"
    requests = document["concepts"]["requests"]
    own = [requests[f"{url} 0"] for url in sim_urls]  # each simulator is one rank, "0"
    # the gateway's count per worker is each worker's own count, and all 7 requests are there
    assert [requests[f"{smg_url} {first}"], requests[f"{smg_url} {second}"]] == own
    assert sum(own) == 7.0 and min(own) > 0
    # every request named a target worker that exists: all hits
    assert document["concepts"]["policy_branches"] == {
        f"{smg_url} consistent_hashing target_worker_hit": 7.0
    }
    assert sorted(document["concepts"]["running_requests"]) == sorted(
        [f"{smg_url} {first}", f"{smg_url} {second}", *(f"{url} 0" for url in sim_urls)]
    )
    lines = [line for line in console if line.startswith("Server metrics")]
    assert [line.split(" (")[0] for line in lines] == [
        f"Server metrics of {url}" for url in [smg_url, *sim_urls]
    ]
    assert (
        "requests per worker: "  # in the order of the workers' URLs
        + ", ".join(f"{w} {n:g}" for w, n in sorted(zip((first, second), own, strict=True)))
        + "; "
        "policy branches: consistent_hashing target_worker_hit 7" in lines[0]
    )

    # one file, each line naming its endpoint; every endpoint's scrapes are there
    lines = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    per_url = {url: sum(line["url"] == url for line in lines) for url in [smg_url, *sim_urls]}
    assert per_url == {e["url"]: e["scrapes"] for e in document["endpoints"]}
    assert min(per_url.values()) >= 2  # the baseline and the final scrape at least
    # the report charts each endpoint's own series, named by its URL
    page = render_html([results], title="r")
    start = page.index(">", page.index('<script type="application/json" id="bb-figures">')) + 1
    charts = json.loads(page[start : page.index("</script>", start)])["charts"]
    (figure,) = [c["figure"] for c in charts if c["id"] == "bb-server-metrics"]
    running = {t["name"] for t in figure["data"] if t["yaxis"] == "y2"}
    assert running == {
        f"document 1 {smg_url}: rank {first}", f"document 1 {smg_url}: rank {second}",
        *(f"document 1 {url}: rank 0" for url in sim_urls),
    }  # fmt: skip


def endpoint(url: str, requests: dict[str, float]) -> dict:
    """A scraper's document as ServerMetricsScraper.document makes it (counters only)."""
    return {
        "url": url, "interval_seconds": 1.0, "scrapes": 3, "failed_scrapes": 0,
        "last_error": None, "file": None, "window": {"start_seconds": 0.0, "end_seconds": 2.0},
        "dialect": "vllm", "concepts": {"requests": requests},
        "series": {"t": [0.0, 1.0], "running_requests": {"all": [1.0, 2.0]}},
    }  # fmt: skip


def test_one_endpoint_is_its_own_document_and_several_keep_every_rank():
    a = endpoint("http://a:1/metrics", {"0": 4.0, "1": 5.0})
    assert combined_document([a]) is a
    b = endpoint("http://b:1/metrics", {"all": 6.0})
    combined = combined_document([a, b])
    assert combined["concepts"] == {
        "requests": {
            "http://a:1/metrics 0": 4.0,
            "http://a:1/metrics 1": 5.0,
            "http://b:1/metrics": 6.0,
        }
    }
    assert combined["series"] == {"t": [], "running_requests": {}}
    assert (combined["scrapes"], combined["endpoints"]) == (6, [a, b])
    assert server_metrics_lines(combined) == [
        "Server metrics of http://a:1/metrics (vllm, 3 scrapes every 1s): no known metric found",
        "Server metrics of http://b:1/metrics (vllm, 3 scrapes every 1s): no known metric found",
    ]


def test_server_reported_ranks_of_several_pages_are_named_by_url_and_rank():
    """Without client routing the per-rank table comes from the pages' rank labels; with
    several pages each row is named "<url> <rank>" (a page without ranks by its URL)."""
    a = endpoint("http://a:1/metrics", {"0": 4.0, "1": 5.0})
    b = endpoint("http://b:1/metrics", {"all": 6.0})
    rows, source = rank_rows([], None, combined_document([a, b]))  # no client ranks: no inputs
    assert source == "server"
    assert [(row["label"], row["rank"], row["requests"]) for row in rows] == [
        ("http://a:1/metrics 0", 1 << 30, 4.0),
        ("http://a:1/metrics 1", 1 << 30, 5.0),
        ("http://b:1/metrics", 1 << 30, 6.0),
    ]
    lines = server_rank_lines(rows)
    assert [line.split()[:3] for line in lines[2:5]] == [
        ["http://a:1/metrics", "0", "4"],
        ["http://a:1/metrics", "1", "5"],
        ["http://b:1/metrics", "6", "n/a"],
    ]
    single, _ = rank_rows([], None, a)
    assert [(row["label"], row["rank"]) for row in single] == [("0", 0), ("1", 1)]
    assert [line.split()[0] for line in server_rank_lines(single)[2:4]] == ["0", "1"]


# -- a repeated flag --------------------------------------------------------------------------


def every_parser() -> list[tuple[str, CommandParser]]:
    """The parser of every command (each built by its own module)."""
    from batchbench.cli import (  # lazy: every command's parser, only for this walk
        agent_args,
        calibrate,
        capacity,
        export_plans,
        import_trace,
        merge,
        record,
        report,
        sim,
        validate,
    )

    parsers = [
        ("agent", agent_args.build_parser()),
        ("capacity", capacity.build_capacity_parser()),
        ("sim", sim.build_parser()),
    ]
    for name, module in (
        ("calibrate", calibrate), ("export-plans", export_plans), ("import", import_trace),
        ("merge", merge), ("record", record), ("report", report), ("validate", validate),
    ):  # fmt: skip
        parsers.append((name, module.build_parser(f"batchbench {name}")))
    return parsers


REPEATABLE = {("agent", "--server-metrics"), ("capacity", "--server-metrics")}


def test_every_single_value_option_refuses_a_repeat():
    """Walks every option of every command: each that takes a value either repeats on
    purpose (and keeps every value) or refuses a second one; the values are not checked
    here (the action is called as argparse calls it, after conversion)."""
    walked = 0
    for command, parser in every_parser():
        for action in parser.declared_actions:
            if not action.option_strings or action.nargs == 0:
                continue  # positionals and switches
            name = action.option_strings[0]
            if (command, name) in REPEATABLE:
                assert isinstance(action, Repeated), (command, name)
                continue
            assert isinstance(action, SingleValue), (command, name, type(action).__name__)
            parser.given_options = set()
            namespace = argparse.Namespace()
            action(parser, namespace, "first", name)
            with pytest.raises(UsageError) as caught:
                action(parser, namespace, "second", name)
            assert str(caught.value) == f"{name} given twice: it takes one value, so give it once"
            assert getattr(namespace, action.dest) == "first"
            walked += 1
    assert walked > 100


def test_a_repeat_on_the_command_line_is_refused_and_a_repeatable_option_keeps_all():
    from batchbench.cli import agent_args  # lazy: the agent's parser, as in the walk above

    with pytest.raises(UsageError) as caught:
        agent_args.parse_agent_args(["--host", "http://h:1", "--seed", "1", "--seed", "2"])
    assert str(caught.value) == "--seed given twice: it takes one value, so give it once"
    with pytest.raises(UsageError) as caught:
        agent_args.parse_agent_args(["--config", "a.toml", "--config=b.toml"])
    assert str(caught.value) == "--config given twice: it takes one value, so give it once"
    args = agent_args.parse_agent_args(
        ["--server-metrics", "http://a:1", "--server-metrics", "http://b:2/m"]
    )
    assert args is not None
    assert args.server_metrics == ["http://a:1", "http://b:2/m"]


def test_scrapers_sharing_a_file_name_their_url_on_each_line(tmp_path):
    from batchbench.results.scrape import ServerMetricsScraper  # lazy: this test only

    path = tmp_path / "m.jsonl"
    with path.open("wb") as sink:
        a = ServerMetricsScraper("http://a:1", 1.0, str(path), origin=0.0, sink=sink)
        b = ServerMetricsScraper("http://b:2/m", 1.0, str(path), origin=0.0, sink=sink)
        assert a.ingest(0.5, b'smg_worker_requests_total{worker="http://w:1"} 3\n')
        assert b.ingest(0.75, b"batchbench_sim_running 2\n")
        asyncio.run(a.close())  # a shared file stays open for the others
        assert not sink.closed
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {
            "t": 0.5,
            "samples": {'smg_worker_requests_total{worker="http://w:1"}': 3.0},
            "url": "http://a:1/metrics",
        },
        {"t": 0.75, "samples": {"batchbench_sim_running": 2.0}, "url": "http://b:2/m"},
    ]


def test_one_url_given_twice_is_refused():
    from batchbench.config import RunConfig  # lazy: this test only

    with pytest.raises(UsageError) as caught:
        RunConfig.from_args(
            ["--server-metrics", "http://a:1/metrics", "--server-metrics", "http://a:1/metrics"]
        )
    assert str(caught.value) == (
        "--server-metrics 'http://a:1/metrics' given twice (each URL is scraped once)"
    )
