"""Cost of counting a long agent history in the simulator: cached per-message counts vs a
one-pass encode of the whole rendered prompt.

Run: ``python -m benchmarks.bench_sim_count [--turns T] [--tool-tokens N] [--repeat R]``.
A growth conversation (tool-call turns, DeepSeek-V3, exact-length synthetic contents)
is posted turn by turn; each turn's request is parsed from JSON and counted with the
ChatML counter, which encodes only the two new messages. The table gives, for the last
turn, the median time of that parse + count and of one encode of the whole rendered
prompt, measured side by side in one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import orjson

from batchbench.text.promptcount import ChatMLCounter
from batchbench.text.synth import Synthesizer
from batchbench.text.tokenizer import load_tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--tool-tokens", type=int, default=2000)
    parser.add_argument("--reply-tokens", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)

    loaded = load_tokenizer("deepseek-v3")
    synth = Synthesizer.prepare(loaded)
    counter = ChatMLCounter(loaded)
    call = {
        "id": "call_batchbench_0_1",
        "type": "function",
        "function": {"name": "environment", "arguments": '{"request":"continue"}'},
    }
    messages = [{"role": "user", "content": synth.text(args.tool_tokens, 1)}]
    incremental: list[float] = []
    for turn in range(args.turns):
        reply = synth.text(args.reply_tokens, 1000 + turn)
        messages.append({"role": "assistant", "content": reply, "tool_calls": [call]})
        messages.append({"role": "tool", "content": synth.text(args.tool_tokens, 2000 + turn)})
        raw = orjson.dumps({"messages": messages})
        started = time.perf_counter()
        prompt = counter.count(orjson.loads(raw)["messages"]).prompt_tokens
        incremental.append(time.perf_counter() - started)

    last = incremental[-1]  # the only timing that encodes the last two new messages
    full = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        assert len(counter.encode_ids(messages)) == prompt
        full.append(time.perf_counter() - started)
    cached = []
    for _ in range(args.repeat):  # everything cached: parse + hash + sum only
        started = time.perf_counter()
        counter.count(orjson.loads(raw)["messages"])
        cached.append(time.perf_counter() - started)

    print(f"last turn: {prompt:,} prompt tokens, {len(messages)} messages, {len(raw) / 1e6:.2f} MB")
    print(f"{'method':<44} {'ms':>9}")
    print(f"{'parse + count, 2 new messages encoded':<44} {last * 1000:>9.1f}")
    print(f"{'parse + count, all messages cached':<44} {statistics.median(cached) * 1000:>9.1f}")
    print(f"{'one-pass encode of the rendered prompt':<44} {statistics.median(full) * 1000:>9.1f}")
    print(f"speed-up at the last turn: {statistics.median(full) / last:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
