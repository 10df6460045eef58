"""Serving until a signal, for the commands that are servers (``sim``, ``record``)."""

from __future__ import annotations

import asyncio
import os
import signal

from aiohttp import web

from batchbench.errors import BatchbenchError


async def listen_until_signal(runner: web.AppRunner, host: str, port: int, name: str) -> None:
    """Listen on host:port with a set-up ``runner``, print
    ``batchbench <name> listening on http://HOST:PORT`` (the bound port: 0 picks one) and
    return at SIGINT or SIGTERM. The handlers are in place before the line is printed:
    whoever reads it may stop the server at once."""
    site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise BatchbenchError(f"cannot listen on {host}:{port}: {reason}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    bound = runner.addresses[0]
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    print(f"batchbench {name} listening on http://{shown}:{bound[1]}", flush=True)
    await stop.wait()
