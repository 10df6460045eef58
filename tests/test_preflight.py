"""The check before the run, against real aiohttp servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import aiohttp
import pytest
from aiohttp import web

from batchbench.drive.preflight import PreflightError, models_url, preflight
from batchbench.drive.simlaunch import SimError, SimProcess, sim_command
from batchbench.drive.wire import BodyOptions
from batchbench.errors import UsageError

OPTIONS = BodyOptions(model="m", sglang=False, ignore_eos=False, stream=True)
COMPLETION = {
    "choices": [{"message": {"role": "assistant", "content": "x"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
}


def check(routes, model: str | None, headers: dict[str, str] | None = None):
    """Run ``preflight`` against a server with ``routes``; (result or error, requests seen)."""
    seen: list[str] = []

    async def main():
        app = web.Application()

        @web.middleware
        async def record(request, handler):
            seen.append(f"{request.method} {request.path}")
            return await handler(request)

        app.middlewares.append(record)
        app.add_routes(routes)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as session:
                return await preflight(
                    session,
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    headers or {},
                    model,
                    OPTIONS,
                    "$OPENAI_API_KEY",
                )
        finally:
            await runner.cleanup()

    try:
        return asyncio.run(main()), seen
    except (PreflightError, UsageError) as exc:
        return exc, seen


def models(*names: str):
    async def handler(request):
        return web.json_response({"object": "list", "data": [{"id": n} for n in names]})

    return web.get("/v1/models", handler)


def completion(status: int = 200):
    async def handler(request):
        body = await request.json()
        assert body["max_tokens"] == 1 and not body.get("stream")
        if status == 200:
            return web.json_response(COMPLETION)
        return web.Response(status=status, text="nope")

    return web.post("/v1/chat/completions", handler)


def test_models_url_beside_the_endpoint():
    assert models_url("http://h:1/v1/chat/completions") == "http://h:1/v1/models"
    assert models_url("https://gw/team/v1/chat/completions/") == "https://gw/team/v1/models"
    assert models_url("http://h/custom") == "http://h/v1/models"


def test_the_one_listed_model_is_used_and_said():
    result, seen = check([models("qwen3"), completion()], None)
    assert result.model == "qwen3" and result.models == ("qwen3",)
    assert result.notes == ("note: --model not given; using qwen3, the one model the server lists",)
    assert seen == ["GET /v1/models", "POST /v1/chat/completions"]


def test_a_wrong_path_is_found_even_with_a_model_list():
    error, seen = check([models("qwen3")], "qwen3")  # nothing serves chat completions
    assert isinstance(error, PreflightError)
    assert "does not serve chat completions: request failed (404 Not Found)" in str(error)
    assert seen == ["GET /v1/models", "POST /v1/chat/completions"]


def test_several_models_need_a_choice():
    error, _ = check([models("a", "b")], None)
    assert isinstance(error, UsageError)
    assert str(error) == "give --model: the server lists 2 models (a, b)"


def test_a_model_the_server_does_not_list_is_a_warning():
    result, _ = check([models("a"), completion()], "b")
    assert result.model == "b"
    assert result.notes == (
        "warning: the server does not list model 'b' (it lists: a); requests may fail",
    )


def test_without_a_model_list_one_token_must_succeed():
    result, seen = check([completion()], "m")
    assert result.models is None and result.notes == ()
    assert seen == ["GET /v1/models", "POST /v1/chat/completions"]
    error, _ = check([completion(404)], "m")
    assert isinstance(error, PreflightError)
    assert "does not serve chat completions: request failed (404 Not Found) nope" in str(error)
    warned, _ = check([completion(503)], "m")
    assert warned.notes[0].startswith("warning: a 1-token completion at http://127.0.0.1:")
    error, _ = check([completion()], None)
    assert isinstance(error, UsageError) and "keeps no model list" in str(error)


def test_a_refused_key_is_named():
    async def refuse(request):
        return web.Response(status=401, text="bad key")

    error, _ = check([web.get("/v1/models", refuse)], "m", {"authorization": "Bearer sk-x"})
    assert isinstance(error, PreflightError)
    assert str(error).endswith(
        "refused the request: request failed (401 Unauthorized) bad key; check the API key "
        "($OPENAI_API_KEY)"
    )
    assert "sk-x" not in str(error)


def test_an_unreachable_target_fails_within_seconds():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there

    async def main():
        async with aiohttp.ClientSession() as session:
            await preflight(
                session, f"http://127.0.0.1:{port}/v1/chat/completions", {}, "m", OPTIONS, "k"
            )

    started = time.perf_counter()
    with pytest.raises(
        PreflightError, match=rf"^cannot reach http://127\.0\.0\.1:{port}/v1/models"
    ):
        asyncio.run(main())
    assert time.perf_counter() - started < 5.0


def test_stopping_a_simulator_that_is_still_starting_ends_it():
    sim = SimProcess(sim_command("deepseek-v3", None, None))
    failures: list[BaseException] = []

    def start() -> None:
        try:
            sim.start()
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    deadline = time.monotonic() + 10
    while sim._process is None and time.monotonic() < deadline:
        time.sleep(0.01)
    process = sim._process
    assert process is not None and not sim.url  # started, not yet listening
    sim.stop()
    thread.join(30)
    assert not thread.is_alive()
    assert len(failures) == 1 and isinstance(failures[0], SimError)
    assert process.poll() is not None  # the child is gone
