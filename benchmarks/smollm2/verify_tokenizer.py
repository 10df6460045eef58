"""Compares a tokenizer.json with a llama.cpp server's ``/tokenize`` on random texts made
of the pieces replies and templates are made of (newlines before letters and digits,
digits, tags, markers, non-ASCII); prints the mismatches and exits 1 on any.

    python verify_tokenizer.py http://127.0.0.1:18091 tok/tokenizer.json [N]
"""

from __future__ import annotations

import json
import random
import sys
import urllib.request

from tokenizers import Tokenizer

PIECES = (
    "Hello", " world", "\n\n", "\n", "123", "4", " 56", "...", "(x)", "<tool_call>",
    "<think>", "é", "日本", "  ", "\t", "def f(x):", "'s", "don't", "<|im_start|>",
    "<|im_end|>", "user\n", "😀", "CamelCase", "snake_case", "#!", "\r\n",
)  # fmt: skip


def server_ids(url: str, text: str) -> list[int]:
    body = json.dumps({"content": text, "add_special": False, "parse_special": True}).encode()
    request = urllib.request.Request(
        url.rstrip("/") + "/tokenize", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["tokens"]


def main(url: str, path: str, count: int = 1400) -> int:
    tokenizer = Tokenizer.from_file(path)
    rng = random.Random(20261205)
    bad = 0
    for _ in range(count):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 30)))
        expected = server_ids(url, text)
        if tokenizer.encode(text, add_special_tokens=False).ids != expected:
            bad += 1
            print(f"mismatch: {text!r}")
    print(f"{count - bad}/{count} texts tokenized as the server does")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:])))
