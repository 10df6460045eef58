"""Every public trace sample imports whole: each row is one request (or a counted drop),
the token totals equal the input's, and the manifest passes ``batchbench validate``.
Skipped where the samples are absent (they are never committed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from realtraces import traces_folder

from batchbench.cli.validate import check_file
from batchbench.ingest.importer import MIN_PROMPT_TOKENS, ImportOptions, import_trace

SAMPLES = {
    "mooncake": ("mooncake", ["conversation_trace.jsonl", "synthetic_trace.jsonl"]),
    "weka": ("weka", ["trace_*.json"]),
    "tracelab": ("tracelab", ["round_trace.jsonl"]),
    "azure": ("azure-2023", ["AzureLLMInferenceTrace_code.csv", "AzureLLMInferenceTrace_conv.csv"]),
    "ragpulse": ("ragpulse", ["0_trace.jsonl"]),
}


def _inputs(fmt: str) -> list[list[str]]:
    folder_name, patterns = SAMPLES[fmt]
    folder = traces_folder(folder_name)
    if fmt == "weka":  # one trajectory a file: import them together
        return [sorted(str(p) for p in folder.glob(patterns[0]))]
    return [[str(folder / name)] for name in patterns]


@pytest.mark.slow
@pytest.mark.native_pass_only  # the importer and validate are pure Python: no compiled module
@pytest.mark.parametrize("fmt", sorted(SAMPLES))
def test_a_public_trace_imports_whole(fmt: str, tmp_path: Path) -> None:
    for n, inputs in enumerate(_inputs(fmt)):
        output = tmp_path / f"{fmt}-{n}.jsonl"
        stats, plans = import_trace(
            ImportOptions(format=fmt, inputs=tuple(inputs), output=str(output))
        )
        assert stats.rows == stats.requests + sum(stats.dropped.values())
        assert set(stats.dropped) <= {"no output tokens", "no input tokens"}
        # Prompts under --min-prompt-tokens are raised, and counted apart.
        assert (stats.prompt_tokens - stats.raised_tokens, stats.output_tokens) == (
            stats.kept_prompt_tokens,
            stats.kept_output_tokens,
        )
        lines = output.read_bytes().splitlines()
        assert len(lines) == stats.written == len(plans)
        written = [json.loads(line) for line in lines]
        rows = sum(len(plan["metadata"]["source"]["rows"]) for plan in written)
        assert rows == stats.requests
        prompt = sum(r["prompt_tokens"] for plan in written for r in plan["requests"])
        blocks = sum(b["tokens"] for plan in written for r in plan["requests"] for b in r["blocks"])
        assert prompt == blocks == stats.prompt_tokens  # every prompt is its blocks, exactly
        smallest = min(r["prompt_tokens"] for plan in written for r in plan["requests"])
        assert smallest >= MIN_PROMPT_TOKENS
        report = check_file(str(output))
        assert report["valid"] and not report["warnings"], report["errors"] or report["warnings"]
