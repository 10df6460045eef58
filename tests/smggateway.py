"""The real SGLang Model Gateway (``smg``, the pinned wheel of the test extra) in front of
``batchbench sim`` workers, for tests that must see what a real gateway does with the
routing headers and what its /metrics page says.

``smg_gateway(n, policy)`` is a context manager: it starts n simulators, then smg on free
ports with their URLs in that order, waits until the gateway answers, and stops everything
(smg first) on the way out. Tests call ``require_smg()`` first: without the binary they are
skipped with a message saying how to get it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from batchbench.drive.simlaunch import SimProcess, sim_command

START_SECONDS = 20.0


def require_smg() -> str:
    """The smg binary's path; skips the calling test when it is not installed."""
    path = shutil.which("smg")
    if path is None:
        pytest.skip("smg is not installed (pip install '.[test]' installs the pinned wheel)")
    return path


@dataclass(frozen=True)
class Gateway:
    url: str  # the OpenAI-compatible front
    metrics_url: str  # its Prometheus page (smg serves it on a port of its own)
    worker_urls: tuple[str, ...]  # in the order given to --worker-urls
    sims: tuple[SimProcess, ...]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def smg_gateway(workers: int, policy: str, sim_args: str = "--speed 0") -> Iterator[Gateway]:
    """smg with ``policy`` in front of ``workers`` fresh simulators (see the module text)."""
    binary = require_smg()
    with contextlib.ExitStack() as stack:
        sims = [
            stack.enter_context(SimProcess(sim_command("deepseek-v3", None, sim_args)))
            for _ in range(workers)
        ]
        urls = tuple(sim.url for sim in sims)
        port, metrics_port = free_port(), free_port()
        command = [binary, "launch", "--host", "127.0.0.1", "--port", str(port)]
        command += ["--worker-urls", *urls, "--policy", policy]
        command += ["--prometheus-port", str(metrics_port)]
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        stack.callback(_stop, process)
        gateway = Gateway(
            f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics", urls,
            tuple(sims),
        )  # fmt: skip
        _wait_ready(process, gateway)
        yield gateway


def _wait_ready(process: subprocess.Popen, gateway: Gateway) -> None:
    """Until the gateway lists every worker and its metrics page answers."""
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"smg exited with status {process.returncode} while starting")
        try:
            with urllib.request.urlopen(gateway.url + "/workers", timeout=2) as response:
                listed = json.loads(response.read())["workers"]
            with urllib.request.urlopen(gateway.metrics_url, timeout=2):
                pass
            healthy = {worker["url"] for worker in listed if worker.get("is_healthy")}
            if healthy >= set(gateway.worker_urls):  # every rank index names a worker
                return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    pytest.fail(f"smg did not become ready within {START_SECONDS:g} s")


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
