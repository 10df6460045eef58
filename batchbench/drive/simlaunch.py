"""``batchbench-agent --sim``: the embedded simulator in a child process on loopback.

The child binds port 0 and prints its URL; the parent reads it, waits for ``/health``,
runs the benchmark against it and stops it afterwards, on errors and on Ctrl+C too. The
child runs in its own session, so a terminal's Ctrl+C reaches only the benchmark, which
then finishes its outputs before it stops the simulator. A parent that dies without
stopping it (``kill -9``) still takes it along: the child gets ``--parent-pid`` and ends
at the parent's death (Linux) and when its standard input, a pipe only the parent holds,
reaches end of file (``batchbench.lifeline``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from batchbench.errors import BatchbenchError, UsageError

LISTENING = "batchbench sim listening on "
START_TIMEOUT_SECONDS = 120.0
STOP_TIMEOUT_SECONDS = 10.0


class SimError(BatchbenchError):
    """The simulator could not be started."""


def sim_command(tokenizer: str, dp_ranks: int | None, extra: str | None) -> list[str]:
    """The child's command line; ``extra`` is split like a shell would split it."""
    command = [sys.executable, "-m", "batchbench", "sim", "--host", "127.0.0.1", "--port", "0"]
    command += ["--tokenizer-model", tokenizer]
    if dp_ranks is not None:
        command += ["--dp-ranks", str(dp_ranks)]
    if extra:
        try:
            command += shlex.split(extra)
        except ValueError as exc:
            raise UsageError(f"--sim-args: {exc}") from None
    return command


class SimProcess:
    """A running simulator; use as a context manager."""

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.url = ""
        self._process: subprocess.Popen | None = None
        self._stopped = threading.Event()  # set by stop(): a start still running gives up

    def __enter__(self) -> SimProcess:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> str:
        """Start the child and wait until it is healthy. ``stop()`` from another thread (a
        cancelled run) ends the wait and the child."""
        if self._stopped.is_set():
            raise SimError("the simulator was stopped before it started")
        process = subprocess.Popen(
            [*self.command, "--parent-pid", str(os.getpid())],
            stdin=subprocess.PIPE,  # never written: its end of file tells the child we ended
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self._process = process
        try:
            if self._stopped.is_set():
                raise SimError("the simulator was stopped while it started")
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line.startswith(LISTENING):
                _terminate(process)  # a child still running is terminated first
                raise SimError(
                    f"the simulator did not start (exit status {process.returncode}); "
                    f"command: {shlex.join(self.command)}"
                )
            self.url = line[len(LISTENING) :].strip()
            threading.Thread(target=_drain, args=(process.stdout,), daemon=True).start()
            self._wait_healthy(process, time.monotonic() + timeout)
        except BaseException:  # SimError, KeyboardInterrupt: never leave the child running
            self._process = None
            _terminate(process)
            raise
        return self.url

    def _wait_healthy(self, process: subprocess.Popen, deadline: float) -> None:
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2.0) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if self._stopped.is_set():
                raise SimError("the simulator was stopped while it started")
            if process.poll() is not None:
                raise SimError(f"the simulator exited with status {process.returncode}")
            if time.monotonic() > deadline:
                raise SimError(f"the simulator at {self.url} did not become healthy")
            time.sleep(0.05)

    def stop(self) -> None:
        self._stopped.set()
        process, self._process = self._process, None
        if process is not None:
            _terminate(process)


def _terminate(process: subprocess.Popen) -> None:
    """Terminate, wait, and kill when it will not go."""
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(STOP_TIMEOUT_SECONDS)


def _drain(stream) -> None:
    with contextlib.suppress(OSError, ValueError):
        for _line in stream:
            pass
