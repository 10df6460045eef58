"""A fake smg gateway on loopback for the placement tests: the real aiohttp stub server
answering as smg 1.13.0 does in front of its workers.

``x-smg-target-worker: i`` picks worker i; every answer names its worker in
``x-smg-routed-worker-id``; an index past the last worker is answered 503
``no_available_workers`` with smg's body and header. ``misroute(tag, messages, index)`` says
which requests go to the next worker instead (as a policy that ignores the header would).
``GET`` answers the model list, for the preflight. ``down`` holds indices whose worker is
gone: a request naming one is answered 500 ``call_upstream_connection_failed``, as smg
answers while its health check still lists the worker; then a request without a target
goes to a live worker chosen from its routing key, as consistent hashing does (with every
worker up, to worker 0).
"""

from __future__ import annotations

from collections.abc import Callable

from stubserver import (
    Recorded,
    Reply,
    Stream,
    StubServer,
    chat_completion,
    delta_chunk,
    sse,
    usage_chunk,
)

NO_WORKERS_BODY = {
    "error": {
        "type": "server_error",
        "code": "no_available_workers",
        "message": "All workers are unavailable (circuit breaker open or unhealthy)",
    }
}

UPSTREAM_FAILED_BODY = {
    "error": {
        "type": "server_error",
        "code": "call_upstream_connection_failed",
        "message": "error sending request for url (http://127.0.0.1:1/v1/chat/completions)",
    }
}


class FakeGateway:
    """Answers with the worker a request was placed on; counts each worker's requests."""

    def __init__(
        self,
        workers: list[str],
        misroute: Callable[[str | None, int, int], bool] = lambda tag, messages, index: False,
        worker_header: str = "x-smg-routed-worker-id",
        model: str = "batchbench-sim",
    ) -> None:
        self.workers = workers
        self.model = model
        self.misroute = misroute
        self.worker_header = worker_header
        self.served: dict[str, int] = dict.fromkeys(workers, 0)
        self.down: set[int] = set()
        self.server = StubServer(self.answer)

    def answer(self, recorded: Recorded) -> Reply | Stream:
        if recorded.method == "GET":  # the preflight's model list
            return Reply(body={"object": "list", "data": [{"id": self.model}]})
        body = recorded.json()
        target = recorded.headers.get("x-smg-target-worker")
        if target is None and not self.down:
            index = 0
        elif target is None:  # hashed over the live workers by its routing key
            live = [i for i in range(len(self.workers)) if i not in self.down]
            key = recorded.headers.get("x-smg-routing-key", "")
            index = live[sum(key.encode()) % len(live)]
        else:
            index = int(target)
        if index in self.down:
            return Reply(
                500,
                UPSTREAM_FAILED_BODY,
                headers={"x-smg-error-code": "call_upstream_connection_failed"},
            )
        if index >= len(self.workers):
            return Reply(503, NO_WORKERS_BODY, headers={"x-smg-error-code": "no_available_workers"})
        if self.misroute(body.get("user"), len(body["messages"]), index):
            index = (index + 1) % len(self.workers)
        worker = self.workers[index]
        self.served[worker] += 1
        headers = {self.worker_header: worker}
        if body.get("stream"):
            parts = [sse(delta_chunk("ok")), sse(usage_chunk(10, 5)), b"data: [DONE]\n\n"]
            return Stream([(0.0, part) for part in parts], headers=headers)
        return Reply(body=chat_completion(), headers=headers)

    def __enter__(self) -> FakeGateway:
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()
