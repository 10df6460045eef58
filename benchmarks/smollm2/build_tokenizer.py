"""A tokenizer.json for a llama.cpp GGUF whose vocabulary is GPT-2-style byte-level BPE
with the ``smollm`` pre-tokenizer (SmolLM2): digits one by one, then GPT-2's regex.

llama.cpp tokenizes with the vocabulary and merges stored in the GGUF; this writes the
same tokenizer for ``tokenizers``, so the client counts what the server counts. Check it
against the server's ``/tokenize`` before trusting it (see README.md here).

    pip install gguf
    python build_tokenizer.py SmolLM2-135M-Instruct.Q4_1.gguf OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CONTROL = 3  # llama.cpp token type of special tokens (<|im_start|>, <|im_end|>, ...)


def build(gguf_path: str, out_dir: str) -> Path:
    from gguf import GGUFReader

    reader = GGUFReader(gguf_path)

    def values(key: str) -> list:
        field = reader.fields[key]
        return [field.parts[index] for index in field.data]

    def text(key: str) -> str:
        field = reader.fields[key]
        return bytes(field.parts[field.data[0]]).decode()

    if text("tokenizer.ggml.model") != "gpt2" or text("tokenizer.ggml.pre") != "smollm":
        raise SystemExit(f"{gguf_path}: not a gpt2/smollm vocabulary; this script knows only that")
    tokens = [bytes(part).decode("utf-8") for part in values("tokenizer.ggml.tokens")]
    kinds = [int(part[0]) for part in values("tokenizer.ggml.token_type")]
    merges = [bytes(part).decode("utf-8") for part in values("tokenizer.ggml.merges")]
    added = [
        {
            "id": index,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for index, (token, kind) in enumerate(zip(tokens, kinds, strict=True))
        if kind == CONTROL
    ]
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": True,
                    "use_regex": True,
                },
            ],
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {token: index for index, token in enumerate(tokens)},
            "merges": merges,
        },
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tokenizer.json"
    path.write_text(json.dumps(document))
    return path


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    print(build(sys.argv[1], sys.argv[2]))
