"""Percentiles and the cache estimate (docs/metrics.md)."""

from batchbench.results.metrics import percentiles
from batchbench.results.recording import Recorder


def test_percentiles_round_half_away_from_zero():
    assert percentiles([60, 10, 30, 20, 50, 40]) == (40, 60, 60)
    assert percentiles([]) == (None, None, None)
    assert percentiles([7.5]) == (7.5, 7.5, 7.5)


def cache_estimate(prompts: list[int]) -> int:
    """The estimate the recorder keeps for one trajectory's successful requests."""
    recorder = Recorder()
    figures = recorder.agent_started(0, 0)
    for prompt in prompts:
        recorder.request_succeeded(figures, None, prompt, 1, None, 0.1)
        recorder.request_done(figures, prompt, 1)
    return recorder.totals.estimated_cached_input_tokens


def test_cache_estimate_uses_only_previous_prompt():
    """The examples of docs/metrics.md, through the recorder a run uses."""
    assert cache_estimate([100, 180, 250, 400]) == 530
    assert cache_estimate([500, 450]) == 450
