"""``--server-metrics``: scrape a Prometheus ``/metrics`` page during a run.

The scraper runs beside the benchmark on its event loop: one scrape at once, then one per
interval (missed ticks are skipped, never bunched up). A failed scrape is counted and its
error kept; it never stops the run. Each successful page is parsed (prometheus_client's
parser; see ``promsummary``) into an in-memory time series of the metrics batchbench knows,
and, with a file, every sample is written as one JSON line per scrape:
``{"t": seconds since the run began, "samples": {"name{labels}": value}}``; scrapers of
several endpoints share one file (``sink``), and their lines also carry ``"url"``.
Parsing a vLLM-sized page costs about a millisecond of CPU (``benchmarks/bench_scrape.py``),
so it is done on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from pathlib import Path
from typing import IO, Any

import aiohttp
import orjson
import yarl

from batchbench.drive.transport import ResponseTooLargeError, read_limited
from batchbench.errors import UsageError
from batchbench.results.promsummary import Timeline

ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"  # the classic text format, not OpenMetrics
MIN_TIMEOUT_SECONDS = 5.0
MARK_LEAD_SECONDS = 0.05  # a mark's scrape starts this early (see _scrape_marks)


def check_metrics_url(url: str) -> None:
    """Refuse what cannot be scraped: only http(s) URLs with a host."""
    try:
        parsed = yarl.URL(url)
    except (TypeError, ValueError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise UsageError(
            f"--server-metrics {url!r} is not an http:// or https:// URL "
            "(e.g. http://127.0.0.1:8000/metrics)"
        )


def metrics_url(url: str) -> str:
    """The page to scrape: a URL without a path means the server's ``/metrics``."""
    check_metrics_url(url)
    parsed = yarl.URL(url)
    if parsed.path in ("", "/") and not parsed.query_string:
        return str(parsed.with_path("/metrics"))
    return url


class ServerMetricsScraper:
    """Scrapes one metrics page at an interval into a time series; see the module text.

    ``origin`` is the run's ``time.perf_counter()`` origin, so that sample times are
    seconds since the run began (default: when the scraper was made). Without a
    ``session`` the scraper makes its own and closes it in ``final_scrape``/``close``.
    """

    def __init__(
        self,
        url: str,
        interval: float,
        path: str | None,
        session: aiohttp.ClientSession | None = None,
        origin: float | None = None,
        sink: IO[bytes] | None = None,
    ) -> None:
        self.url = metrics_url(url)
        if not (isinstance(interval, int | float) and math.isfinite(interval) and interval > 0):
            raise UsageError(f"--server-metrics-interval must be above 0 seconds, got {interval}")
        self.interval = float(interval)
        self.path = path
        self.origin = time.perf_counter() if origin is None else origin
        self.timeline = Timeline()
        self.scrapes = 0
        self.failed_scrapes = 0
        self.last_error: str | None = None
        self.cpu_seconds = 0.0  # parsing and writing, on this thread
        self._session = session
        self._own_session = session is None
        self._file: IO[bytes] | None = sink
        self._own_file = sink is None
        self._task: asyncio.Task[None] | None = None
        self._baseline: tuple[float, bytes] | None = None  # (perf_counter time, page)
        # Seconds since the origin to scrape at besides every interval (the measured
        # window's start after a warm-up: the counts' baseline), and their task.
        self.marks: tuple[float, ...] = ()
        self._marks_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        if path is not None and sink is None:
            try:
                self._file = Path(path).open("wb")  # noqa: SIM115 - closed by close()
            except OSError as exc:
                raise UsageError(f"--server-metrics-jsonl {path}: {exc.strerror or exc}") from None

    # --- scraping ------------------------------------------------------------------------

    async def take_baseline(self) -> None:
        """Fetch the page before the run's clock starts, kept until ``start`` knows the
        origin: a baseline fetched once requests flow would already count some of them
        (a gateway counts a request when it forwards it)."""
        self._baseline = await self._fetch()

    async def start(self) -> None:
        """The baseline (taken by ``take_baseline``, else scraped now and awaited), then a
        scrape every interval in a background task until ``stop``."""
        baseline, self._baseline = self._baseline, None
        if baseline is not None:
            self.ingest(baseline[0] - self.origin, baseline[1])
        else:
            await self.scrape_once()
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self.run(scrape_now=False))
        if self.marks:
            self._marks_task = loop.create_task(self._scrape_marks())

    async def _scrape_marks(self) -> None:
        """A scrape at each mark, started a little early so that the page stands for a
        time at or just before the mark (a page's time is the middle of its fetch)."""
        for mark in sorted(self.marks):
            wait = self.origin + mark - MARK_LEAD_SECONDS - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            await self.scrape_once()

    async def stop(self) -> None:
        """End the background scraping, take the final scrape and close (idempotent)."""
        for task in (self._task, self._marks_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._marks_task = None
        if not self._closed:
            await self.final_scrape()

    async def run(self, *, scrape_now: bool = True) -> None:
        """Scrape now (unless told not to) and then every interval until cancelled;
        errors are only counted."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        if not scrape_now:
            await asyncio.sleep(self.interval)
            due += self.interval
        while True:
            await self.scrape_once()
            due += self.interval
            now = loop.time()
            if due < now:  # the scrape overran: skip the ticks it missed
                due += math.ceil((now - due) / self.interval) * self.interval
            await asyncio.sleep(due - now)

    async def final_scrape(self) -> None:
        """One last scrape (the state at the run's end), then close the file and session."""
        try:
            await self.scrape_once()
        finally:
            await self.close()

    async def close(self) -> None:
        """Close the file and the scraper's own session (idempotent); no scrape follows."""
        self._closed = True
        if not self._own_file:  # a shared file: its owner closes it
            self._file = None
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.close()
            except OSError as exc:
                self.last_error = f"writing {self.path}: {exc.strerror or exc}"
        if self._own_session and self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def scrape_once(self) -> bool:
        """One scrape; True when its page was read and parsed. Never raises (but
        cancellation)."""
        async with self._lock:  # one fetch at a time: pages arrive in time order
            fetched = await self._fetch()
            return fetched is not None and self.ingest(fetched[0] - self.origin, fetched[1])

    async def _fetch(self) -> tuple[float, bytes] | None:
        """(``perf_counter`` time the page stood for, the page); None when it failed (counted)."""
        if self._closed:
            return None
        try:
            session = self._session
            if session is None:
                session = self._session = aiohttp.ClientSession()
            timeout = aiohttp.ClientTimeout(total=max(MIN_TIMEOUT_SECONDS, self.interval))
            sent = time.perf_counter()
            async with session.get(
                self.url, headers={"Accept": ACCEPT}, timeout=timeout
            ) as response:
                if response.status != 200:
                    self._fail(f"HTTP {response.status} from {self.url}")
                    return None
                body = await read_limited(response)
            received = time.perf_counter()
        except asyncio.CancelledError:
            raise
        except (
            TimeoutError,
            aiohttp.ClientError,
            OSError,
            ValueError,
            ResponseTooLargeError,
        ) as exc:
            self._fail(f"{self.url}: {_describe(exc)}")
            return None
        return (sent + received) / 2, body

    def ingest(self, t: float, body: bytes) -> bool:
        """Parse one page taken at ``t`` and store it (and write it to the file)."""
        started = time.thread_time()
        try:
            text = body.decode("utf-8", "replace")
            samples = self.timeline.ingest(t, text, keep_all=self._file is not None)
        except Exception as exc:  # the parser's errors are not all ValueError
            self.cpu_seconds += time.thread_time() - started
            self._fail(f"{self.url}: not Prometheus text ({_describe(exc)})")
            return False
        self.scrapes += 1
        if self._file is not None and samples is not None:
            try:
                line: dict[str, Any] = {"t": round(t, 6), "samples": samples}
                if not self._own_file:
                    line["url"] = self.url
                self._file.write(orjson.dumps(line) + b"\n")
                self._file.flush()
            except OSError as exc:  # the run goes on; the file stops here
                self.last_error = f"writing {self.path}: {exc.strerror or exc}"
                file, self._file = self._file, None
                if self._own_file:
                    with contextlib.suppress(OSError):
                        file.close()
        self.cpu_seconds += time.thread_time() - started
        return True

    def _fail(self, message: str) -> None:
        self.failed_scrapes += 1
        self.last_error = message

    # --- the summary ---------------------------------------------------------------------

    def document(self, start: float, end: float) -> dict[str, Any]:
        """The results JSON ``server_metrics`` document of the window ``[start, end]``."""
        summary = self.timeline.summary(start, end)
        bounds = summary["counter_bounds"]
        return {
            "url": self.url,
            "interval_seconds": self.interval,
            "scrapes": self.scrapes,
            "failed_scrapes": self.failed_scrapes,
            "last_error": self.last_error,
            "file": self.path,
            "window": {
                "start_seconds": start,
                "end_seconds": end,
                # The scrapes the counts run between (None: no scrape): the last at or
                # before the window's start, the first at or after its end.
                "counters_from_seconds": bounds[0] if bounds is not None else None,
                "counters_to_seconds": bounds[1] if bounds is not None else None,
            },
            "dialect": summary["dialect"],
            "concepts": summary["concepts"],
            "series": summary["series"],
        }


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
