"""Placement against real components: the simulator's own per-rank counters, and the real
smg gateway (``pip install smg``) in front of two simulators. The smg tests skip, saying
why, when its binary is not installed."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from batchbench.cli.agent import main
from batchbench.drive.preflight import PreflightError
from batchbench.drive.simlaunch import SimProcess, sim_command

SMG = shutil.which("smg")
needs_smg = pytest.mark.skipif(
    SMG is None, reason="smg is not installed (pip install smg==1.13.0 provides its binary)"
)
SIM_ARGS = "--speed 0"
COMMON = [
    "--agents", "8", "--max-active-agents", "8", "--tool-invocations", "2",
    "--input-tokens", "64", "--output-tokens", "8", "--seed", "5", "--user-prefix", "a",
    "--tokenizer-model", "deepseek-v3", "--no-progress", "--model", "batchbench-sim",
    "--dp-rank-perfect-routing", "--dp-rank-perfect-routing-num", "2",
]  # fmt: skip


def sim_requests(url: str) -> dict[str, int]:
    """rank label -> chat completions the simulator served (its own /metrics)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    found = re.findall(r'^batchbench_sim_requests_total\{rank="(\d+)"\} (\S+)$', text, re.M)
    return {rank: int(float(value)) for rank, value in found}


def run(tmp_path: Path, capsys, *args: str) -> tuple[int, dict, list[dict], list[str]]:
    """In-process run: (status, results JSON, request events, console lines)."""
    results, events = tmp_path / "run.json", tmp_path / "events.jsonl"
    status = main(
        [*COMMON, *args, "--results-json", str(results), "--request-events-jsonl", str(events)]
    )
    out = capsys.readouterr().out.splitlines()
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    return status, json.loads(results.read_text()), rows, out


def test_probes_carry_rank_zeros_headers_and_are_counted(tmp_path, capsys):
    """A two-rank simulator counts per rank: rank 0 served its agents' requests plus the
    preflight's completion, the calibration's probes and its layout probe; rank 1 its own
    and its layout probe. The banner says as much."""
    with SimProcess(sim_command("deepseek-v3", 2, SIM_ARGS)) as sim:
        status, document, events, out = run(tmp_path, capsys, "--host", sim.url, "--calibrate")
        served = sim_requests(sim.url)
    assert status == 0
    client = Counter(str(event["dp_rank"]) for event in events)
    assert client == {"0": 8, "1": 8}
    calibration = 11  # three two-request probes and a five-request check, none retried
    assert [line for line in out if line.startswith("Probes before the run")] == [
        f"Probes before the run: {1 + calibration + 2} (preflight 1 and calibration "
        f"{calibration} with rank 0's headers; rank layout 2, one per rank)"
    ]
    assert served == {"0": 8 + 1 + calibration + 1, "1": 8 + 1}
    assert [r["requests"] for r in document["ranks"]] == [8, 8]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Gateway:
    """``smg launch`` in front of ``workers`` with ``policy``; stopped by its own PID."""

    def __init__(self, workers: list[str], policy: str) -> None:
        self.workers = workers
        self.port, metrics = free_port(), free_port()
        assert SMG is not None
        self.process = subprocess.Popen(
            [SMG, "launch", "--host", "127.0.0.1", "--port", str(self.port),
             "--worker-urls", *workers, "--policy", policy,
             "--prometheus-port", str(metrics)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until the gateway lists every worker as healthy and forwards their model list
        (the simulator does not count it as a chat completion); a worker still registering
        would make its rank index refused."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.url + "/workers", timeout=2) as response:
                    listed = json.loads(response.read())["workers"]
                healthy = {w["url"] for w in listed if w.get("is_healthy")}
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as response:
                    if response.status == 200 and healthy >= set(self.workers):
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise AssertionError(f"smg did not come up at {self.url}")
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def two_sims():
    with (
        SimProcess(sim_command("deepseek-v3", None, SIM_ARGS)) as first,
        SimProcess(sim_command("deepseek-v3", None, SIM_ARGS)) as second,
    ):
        yield [first.url, second.url]


def served_since(two_sims: list[str], before: dict[str, int]) -> dict[str, int]:
    """Chat completions each simulator served since ``before`` (they serve every test)."""
    return {url: sim_requests(url)["0"] - before[url] for url in two_sims}


def behind_smg(two_sims, policy: str, tmp_path, capsys, *args: str):
    before = served_since(two_sims, dict.fromkeys(two_sims, 0))
    gateway = Gateway(two_sims, policy)
    try:
        gateway.wait_ready()
        # the simulators' request counts are the subject: no calibration probes
        outcome = run(tmp_path, capsys, "--host", gateway.url, "--no-calibrate", *args)
    finally:
        gateway.stop()
    return (*outcome, served_since(two_sims, before))


@needs_smg
@pytest.mark.native_pass_only
def test_consistent_hashing_places_every_request_on_its_rank(two_sims, tmp_path, capsys):
    status, document, events, out, own = behind_smg(
        two_sims, "consistent_hashing", tmp_path, capsys
    )
    assert status == 0
    ranks = document["ranks"]
    assert [r["misplaced"] for r in ranks] == [0, 0]
    assert [r["switches"] for r in ranks] == [0, 0]
    usual = [r["usual_worker"] for r in ranks]
    assert sorted(usual) == sorted(two_sims)
    # Each simulator served its rank's requests, the rank-layout probe of its index, and
    # (rank 0's worker) the preflight's completion.
    assert own == {
        usual[0]: ranks[0]["workers"][usual[0]] + 1 + 1,
        usual[1]: ranks[1]["workers"][usual[1]] + 1,
    }
    assert [r["workers"] for r in ranks] == [{usual[0]: 8}, {usual[1]: 8}]
    assert {(e["dp_rank"], e["worker"]) for e in events} == {(0, usual[0]), (1, usual[1])}
    layout = f"Rank layout (preflight probes): 0 -> {usual[0]}, 1 -> {usual[1]}"
    assert layout in out
    assert not any(line.startswith("Warning: ") for line in out)


@needs_smg
@pytest.mark.native_pass_only
def test_a_rank_past_smgs_workers_is_refused(two_sims, tmp_path, capsys):
    before = served_since(two_sims, dict.fromkeys(two_sims, 0))
    gateway = Gateway(two_sims, "consistent_hashing")
    try:
        gateway.wait_ready()
        args = [*COMMON, "--host", gateway.url]
        args[args.index("--dp-rank-perfect-routing-num") + 1] = "3"
        with pytest.raises(PreflightError) as caught:
            main(args)
    finally:
        gateway.stop()
    assert str(caught.value) == (
        "rank 2: the gateway answered 503 no_available_workers (All workers are unavailable "
        "(circuit breaker open or unhealthy)): --dp-rank-perfect-routing-num 3 is more than "
        "its 2 workers"
    )
    # Nothing of the run went out: the preflight's completion and the two probes that
    # found a worker are all the simulators served.
    assert sum(served_since(two_sims, before).values()) == 3


@needs_smg
@pytest.mark.native_pass_only
def test_cache_aware_misplacement_is_detected_and_warned(two_sims, tmp_path, capsys):
    status, document, events, out, own = behind_smg(two_sims, "cache_aware", tmp_path, capsys)
    assert status == 0
    ranks = document["ranks"]
    placed = Counter(e["worker"] for e in events)
    # The client's placement figures are the simulators' own counts, probes taken out.
    assert sum(own.values()) == sum(placed.values()) + 1 + 2
    warnings = [line for line in out if line.startswith("Warning: ")]
    assert len(warnings) == 1
    assert warnings[0].endswith(
        "the gateway ignored x-smg-target-worker: its policy may not honour it (smg's "
        "default cache_aware does not); use --policy consistent_hashing"
    )
    shared = ranks[0]["usual_worker"] == ranks[1]["usual_worker"]
    assert sum(r["misplaced"] for r in ranks) > 0 or shared
