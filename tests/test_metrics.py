"""Percentiles and the cache estimate (docs/metrics.md)."""

from batchbench.results.metrics import cached_prefix_estimate, percentiles


def test_percentiles_round_half_away_from_zero():
    assert percentiles([60, 10, 30, 20, 50, 40]) == (40, 60, 60)
    assert percentiles([]) == (None, None, None)
    assert percentiles([7.5]) == (7.5, 7.5, 7.5)


def test_cache_estimate_uses_only_previous_prompt():
    assert cached_prefix_estimate([100, 180, 250, 400]) == 530
    assert cached_prefix_estimate([500, 450]) == 450
