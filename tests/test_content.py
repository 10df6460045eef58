"""Per-stream text determinism: order-independent, exact, distinct per agent and field."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from batchbench.errors import SynthesisError
from batchbench.plan.sampling import FixedSpec
from batchbench.plan.workload import SampledShape, Workload, compile_sampled
from batchbench.stages.execute import generation_workers
from batchbench.text.content import ContentFactory
from batchbench.text.synth import Synthesizer


@pytest.fixture(scope="module")
def synth(deepseek):
    return Synthesizer.prepare(deepseek)


def sampled(agents: int, input_tokens: int, environment: int = 64) -> Workload:
    shape = SampledShape(
        FixedSpec(input_tokens), FixedSpec(8), FixedSpec(environment), FixedSpec(3), None
    )
    return compile_sampled(shape, agents, root_seed=7)


def test_text_is_independent_of_generation_order(synth, deepseek):
    factory = ContentFactory(synth, sampled(6, 64), root_seed=7)
    jobs = [(agent, turn) for agent in range(6) for turn in range(2)]
    forward = {job: factory.environment(*job) for job in jobs}
    with ThreadPoolExecutor(max_workers=8) as pool:
        backward = dict(
            zip(
                reversed(jobs),
                pool.map(lambda job: factory.environment(*job), reversed(jobs)),
                strict=True,
            )
        )
    assert forward == backward
    assert len(set(forward.values())) == len(jobs)
    assert {deepseek.count(text) for text in forward.values()} == {64}


@pytest.mark.parametrize(("cpus", "workers"), [(None, 1), (2, 2), (32, 32), (96, 32)])
def test_generation_pool_is_bounded_at_32_workers(monkeypatch, cpus, workers):
    monkeypatch.setattr("os.cpu_count", lambda: cpus)
    assert generation_workers() == workers


def test_two_agents_get_different_initial_prompts(synth, deepseek):
    work = sampled(2, 32)
    assert work.schema_version is None
    factory = ContentFactory(synth, work, root_seed=7)
    first, second = factory.initial_prompt(0), factory.initial_prompt(1)
    assert first != second
    assert deepseek.count(first) == deepseek.count(second) == 32


def test_reset_prompt_matches_direct_generation(synth, deepseek):
    work = sampled(1, 24)
    work.input_content_tokens[:] = 24
    factory = ContentFactory(synth, work, root_seed=7)
    prefetched = factory.reset_prompt(0, 1)
    again = ContentFactory(synth, work, root_seed=7).reset_prompt(0, 1)
    assert prefetched == again and deepseek.count(prefetched) == 24
    assert prefetched != factory.reset_prompt(0, 2)


def test_root_seed_changes_text(synth):
    work = sampled(1, 40)
    assert ContentFactory(synth, work, 1).initial_prompt(0) != ContentFactory(
        synth, work, 2
    ).initial_prompt(0)


def test_failure_names_trajectory_request_and_field(synth):
    work = sampled(1, 40)

    class Impossible:
        def text(self, n, seed):
            raise SynthesisError(
                f"failed to generate synthetic text with exactly {n} tokens after 256 attempts (last count: 0)"
            )

    factory = ContentFactory(Impossible(), work, root_seed=7)  # type: ignore[arg-type]
    with pytest.raises(SynthesisError) as caught:
        factory.environment(0, 1)
    assert str(caught.value) == (
        'failed to generate environment content for trajectory "sampled-0" invocation 2: '
        "request 2 field environment_tokens (64): failed to generate synthetic text with exactly "
        "64 tokens after 256 attempts (last count: 0)"
    )
    assert np.all(work.environment_tokens == 64)
