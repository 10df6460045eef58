"""``batchbench record``: parse the options, load the tokenizer and the key, serve the
recording proxy until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from urllib.parse import urlsplit

import uvloop

from batchbench.cli.exits import exit_status, parsed_or_status
from batchbench.cli.listening import listen_until_signal
from batchbench.options.parser import CommandParser
from batchbench.record.chain import MIN_KEY_BYTES, recording_key
from batchbench.record.counts import BlockCounter
from batchbench.record.proxy import ProxyConfig, RecordingProxy
from batchbench.record.sink import RowSink
from batchbench.text.tokenizer import DEFAULT_BUILTIN, load_tokenizer

GRACE_S = 10.0  # how long a stop waits for requests in flight

DESCRIPTION = """\
A reverse proxy for an OpenAI-compatible server that records the shape of your own
agents' traffic, never its content, as request-log rows that `batchbench export-plans`
turns into a replayable schema v2 manifest. Point an agent's base URL at the proxy
(http://HOST:PORT/v1); every request goes to --upstream and its reply comes back as
sent, streamed as it arrives.

Each POST to .../chat/completions or .../completions appends one JSON line to
--rows-jsonl when it ends: ts, principal_id, correlation_id, model, chain, block_roles,
block_tokens, prompt_tokens, completion_tokens (from the upstream's usage), stream,
max_tokens, duration_ms. Other paths (/v1/models, /health, ...) are forwarded without a
row.

Stored: per block (the tools array; each message or content part; each tool call) its
role, its token count with --tokenizer-model and a keyed hash (HMAC-SHA256 chained over
the blocks before it, so a conversation that grows keeps its earlier hashes); the
upstream's token counts; timing; the model name; the value of --principal-header when
given. Not stored: any text (messages, tool definitions, tool arguments), API keys,
other header values. Without --principal-header a request's principal is a keyed hash of
its bearer token ("anonymous" without one). The hash key is --hash-key, or the key in
<rows>.key (created with 32 random bytes, mode 0600, and reused when the recording
resumes): keep it private, as hashes of short texts could be checked against guesses by
whoever holds it.

On streams the proxy asks for usage (stream_options.include_usage) when the client did
not, and then removes that usage-only chunk from what the client sees. Recorded requests
ask the upstream for an uncompressed reply (Accept-Encoding: identity), so their usage can
be read; other paths pass through compressed or not. An unreachable upstream gets the
client a 502 and a row without usage; upstream errors pass through, rows without usage.
A client that hangs up mid-reply ends the upstream request; its row has no usage.

Once listening it prints one line, "batchbench record listening on http://HOST:PORT";
SIGINT or SIGTERM stops it: requests in flight get 10 s to finish, then it prints
"recorded N requests to PATH" (followed by how many rows could not be written, if any:
a full disk). Exit status: 0 when stopped, 1 when it cannot start (tokenizer, rows file,
key, address in use), 2 on misuse."""


def upstream_url(text: str) -> str:
    """--upstream: http(s)://host[:port][/prefix]; the client's path follows the prefix.
    Errors do not repeat the URL: it may hold credentials (user:password@host)."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            "must be an http:// or https:// URL with a host (e.g. http://127.0.0.1:8000)"
        )
    if parts.query or parts.fragment:
        raise argparse.ArgumentTypeError("must not have a query or a fragment")
    if parts.username is not None or parts.password is not None:
        raise argparse.ArgumentTypeError(
            "must not hold credentials: the clients' own Authorization headers are forwarded"
        )
    return text.rstrip("/")


def listen_address(text: str) -> tuple[str, int]:
    """--listen: HOST:PORT ([v6]:PORT); port 0 picks a free one."""
    host, colon, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r} must be HOST:PORT with a port from 0 to 65535 (e.g. 127.0.0.1:8100)"
        )
    return host, int(port)


def hash_key(text: str) -> bytes:
    """--hash-key: hex of at least MIN_KEY_BYTES bytes (shorter keys could be guessed)."""
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be hexadecimal (e.g. 64 hex digits)") from None
    if len(key) < MIN_KEY_BYTES:
        raise argparse.ArgumentTypeError(
            f"must hold at least {MIN_KEY_BYTES} bytes ({2 * MIN_KEY_BYTES} hex digits), "
            f"found {len(key)}"
        )
    return key


def build_parser(prog: str) -> CommandParser:
    parser = CommandParser(
        prog=prog, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add(
        "--upstream",
        required=True,
        type=upstream_url,
        metavar="URL",
        help="the server to forward to, e.g. http://127.0.0.1:8000 (a path given here "
        "comes before the client's)",
    )
    add(
        "--listen",
        type=listen_address,
        default=("127.0.0.1", 8100),
        metavar="HOST:PORT",
        help="where the proxy listens; port 0 picks a free one (default: 127.0.0.1:8100)",
    )
    add(
        "--rows-jsonl",
        required=True,
        metavar="PATH",
        help="rows are appended here, one JSON object a line (the key goes to PATH.key)",
    )
    add(
        "--tokenizer-model",
        default=DEFAULT_BUILTIN,
        metavar="NAME",
        help="tokenizer.json path, a directory holding one or a built-in name that counts "
        "block_tokens (default: %(default)s)",
    )
    add(
        "--hash-key",
        type=hash_key,
        metavar="HEX",
        help="the hash key, at least 16 bytes in hex (default: read from PATH.key, or "
        "32 random bytes written there)",
    )
    add(
        "--principal-header",
        metavar="NAME",
        help="take principal_id from this request header when present (its value is "
        "stored); otherwise a keyed hash of the bearer token",
    )
    return parser


async def serve(proxy: RecordingProxy, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM, then let requests in flight finish (up to GRACE_S)."""
    runner = proxy.runner(GRACE_S)
    await runner.setup()
    try:
        await listen_until_signal(runner, host, port, "record")
    finally:
        await runner.cleanup()
        await proxy.drain(GRACE_S)


def _record(args: argparse.Namespace) -> int:
    tokenizer = load_tokenizer(args.tokenizer_model)
    sink = RowSink(args.rows_jsonl)
    try:
        key = args.hash_key if args.hash_key is not None else recording_key(args.rows_jsonl)
        config = ProxyConfig(args.upstream, key, args.principal_header)
        counter = BlockCounter(tokenizer)
        proxy = RecordingProxy(config, counter, sink)
        host, port = args.listen
        try:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(serve(proxy, host, port))
        finally:
            counter.close()
    finally:
        sink.close()
    print(sink.summary(), flush=True)
    return 0


def run(argv: Sequence[str], prog: str = "batchbench record") -> int:
    args = parsed_or_status(build_parser(prog), argv)
    if isinstance(args, int):
        return args
    return exit_status(lambda: _record(args))
