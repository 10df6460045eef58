"""The workload compiler: growth model, overheads, resets and the build-time errors."""

from __future__ import annotations

import orjson
import pytest

from batchbench.errors import ManifestError, PlanError
from batchbench.plan.manifest import parse_manifest
from batchbench.plan.workload import compile_manifest


def manifest_of(*trajectories, source: str = "plans.jsonl"):
    lines = []
    for ident, requests in trajectories:
        reqs = []
        for request in requests:
            prompt, output, *rest = request
            entry = {"prompt_tokens": prompt, "output_tokens": output}
            for extra in rest:
                entry.update(extra)
            reqs.append(entry)
        lines.append(orjson.dumps({"schema_version": 1, "trajectory_id": ident, "requests": reqs}))
    return parse_manifest(b"\n".join(lines) + b"\n", source)


def test_worked_example():
    manifest = manifest_of(
        ("t", [(100, 20), (150, 10, {"delay_after_ms": 25}), (60, 5, {"reset_before": True})])
    )
    work = compile_manifest(manifest, initial_overhead=5, turn_overhead=10)
    assert work.input_content_tokens.tolist() == [95, 135, 55]
    assert work.target_prompt_tokens.tolist() == [100, 150, 60]
    assert work.environment_tokens.tolist() == [20, 0, 0]
    assert work.tool_call_latency_ms.tolist() == [0.0, 25.0, 0.0]
    assert work.reset_before.tolist() == [False, False, True]
    assert work.output_tokens.tolist() == [20, 10, 5]


def test_overheads_accumulate_and_restart_after_a_reset():
    manifest = manifest_of(
        ("t", [(100, 1), (150, 1), (200, 1), (250, 1), (60, 1, {"reset_before": True}), (90, 1)])
    )
    work = compile_manifest(manifest, initial_overhead=5, turn_overhead=10)
    overhead = (work.target_prompt_tokens - work.input_content_tokens).tolist()
    assert overhead == [5, 15, 25, 35, 5, 15]


@pytest.mark.parametrize(("next_prompt", "environment"), [(150, 30), (140, 20)])
def test_environment_from_adjacent_requests(next_prompt, environment):
    work = compile_manifest(manifest_of(("t", [(100, 20), (next_prompt, 5)])))
    assert work.environment_tokens.tolist() == [environment, 0]


def test_shrinking_prompt_is_a_manifest_error():
    with pytest.raises(ManifestError) as caught:
        manifest_of(("t", [(100, 20), (110, 5)]))
    assert str(caught.value) == (
        "invalid trajectory plan at plans.jsonl:1: request 2 prompt_tokens (110) cannot follow the "
        "preceding prompt and output; set reset_before=true to model compaction or reset: next "
        "content (110) is smaller than current content plus output (120)"
    )


def test_prompt_must_exceed_overhead():
    manifest = manifest_of(("first", [(50, 1)]), ("second", [(100, 20), (130, 5)]))
    with pytest.raises(PlanError) as caught:
        compile_manifest(manifest, initial_overhead=50)
    assert (
        str(caught.value)
        == 'trajectory "first" request 1 prompt (50) must exceed its replay overhead (50)'
    )


def test_turn_overhead_that_eats_the_growth_is_a_build_error():
    manifest = manifest_of(("t", [(100, 20), (130, 5)]))
    assert compile_manifest(manifest, turn_overhead=10).environment_tokens.tolist() == [0, 0]
    with pytest.raises(PlanError) as caught:
        compile_manifest(manifest, turn_overhead=11)
    assert str(caught.value) == (
        'trajectory "t" request 2 cannot satisfy its replay overhead (11 tokens); '
        "lower the overhead or set reset_before=true"
    )


def test_first_error_in_file_order_wins():
    manifest = manifest_of(("a", [(100, 20), (130, 5), (400, 1)]), ("b", [(5, 1)]))
    with pytest.raises(PlanError, match=r'^trajectory "a" request 2 cannot satisfy'):
        compile_manifest(manifest, initial_overhead=4, turn_overhead=11)


def test_time_scale_divides_delays():
    manifest = manifest_of(
        ("t", [(100, 20, {"delay_after_ms": 25}), (150, 10, {"delay_after_ms": 7})])
    )
    work = compile_manifest(manifest, time_scale=2.0)
    assert work.tool_call_latency_ms.tolist() == [12.5, 3.5]


def test_trajectory_grouping():
    manifest = manifest_of(
        ("a", [(10, 1), (20, 1)]), ("b", [(30, 1)]), ("c", [(5, 1), (9, 1), (12, 1)])
    )
    work = compile_manifest(manifest, initial_overhead=1)
    assert list(work.trajectory_ids) == ["a", "b", "c"]
    assert [list(work.turns(t)) for t in range(3)] == [[0, 1], [2], [3, 4, 5]]
    assert work.n_requests == 6 and len(work) == 3
    assert work.schema_version == 1
