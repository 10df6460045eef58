"""Size/latency specs and sampled workloads: validation, flag conflicts, seeded streams."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchbench.cli.agent_args import parse_agent_args
from batchbench.config import RunConfig
from batchbench.errors import UsageError
from batchbench.options.declare import field_values
from batchbench.options.shape import resolve_shape
from batchbench.plan.sampling import (
    FamilyFlags,
    FixedSpec,
    LogNormalSpec,
    describe_latency,
    resolve_latency_spec,
    resolve_size_spec,
    round_samples,
    sample_sizes,
    short_float,
)
from batchbench.plan.workload import SampledShape, compile_sampled
from batchbench.rng import mix_seed, splitmix64, standard_normal


def shape_of(*argv: str) -> SampledShape:
    options = field_values(RunConfig, parse_agent_args(list(argv)))["shape_options"]
    return resolve_shape(dict(options))


def test_fixed_and_lognormal_validation():
    assert resolve_size_spec("input", FamilyFlags(fixed=8), 128) == FixedSpec(8)
    with pytest.raises(
        UsageError, match=r"^invalid fixed input value: sample must be greater than zero$"
    ):
        resolve_size_spec("input", FamilyFlags(fixed=0), 128)
    spec = resolve_size_spec("input", FamilyFlags(median=32, sigma=0.5, cap=64), 128)
    assert spec == LogNormalSpec(mu=math.log(32), sigma=0.5, cap=64)
    with pytest.raises(UsageError, match=r"^log-normal median must be greater than zero$"):
        resolve_size_spec("input", FamilyFlags(median=0, sigma=0.5), 128)
    with pytest.raises(UsageError, match=r"^sample log-normal sigma must be greater than zero$"):
        resolve_size_spec("input", FamilyFlags(median=32, sigma=0), 128)


def test_fixed_spec_always_returns_its_value():
    assert sample_sizes(FixedSpec(13), 99, 50, "input").tolist() == [13] * 50


def test_lognormal_is_reproducible_and_capped():
    spec = LogNormalSpec(mu=math.log(100), sigma=0.9, cap=40)
    first = sample_sizes(spec, 1234, 20, "input")
    assert first.tolist() == sample_sizes(spec, 1234, 20, "input").tolist()
    assert first.min() >= 1 and first.max() <= 40
    assert len(first) == 20


def test_lognormal_rounds_half_away_from_zero_and_floors_at_one():
    values = np.array([2.5, 3.5, 0.2, 0.5, 1.49, 1e9])
    assert round_samples(values, None).tolist() == [3, 4, 1, 1, 1, 1000000000]
    assert round_samples(values, 3).tolist() == [3, 3, 1, 1, 1, 3]


def test_non_finite_sample_is_an_error():
    spec = LogNormalSpec(mu=1e300, sigma=1.0)
    with pytest.raises(
        UsageError, match=r"^output log-normal distribution produced a non-finite sample$"
    ):
        sample_sizes(spec, 1, 3, "output")


def test_latency_optional_and_fixed():
    assert resolve_latency_spec(FamilyFlags()) is None
    assert resolve_latency_spec(FamilyFlags(fixed=0)) is None
    assert describe_latency(None) == "0 ms (fixed)"
    assert shape_of("--tool-call-latency-ms", "0").latency is None
    assert shape_of("--tool-latency-ms", "125").latency == FixedSpec(125)
    assert describe_latency(FixedSpec(125)) == "125 ms (fixed)"


def test_lognormal_latency_and_conflict():
    spec = shape_of(
        "--tool-call-latency-lognorm-median-ms", "200", "--tool-call-latency-lognorm-sigma", "0.5"
    ).latency
    assert spec == LogNormalSpec(mu=math.log(200), sigma=0.5)
    assert describe_latency(spec) == "lognormal(median≈200 ms, σ=0.5; μ=5.298)"
    with pytest.raises(
        UsageError,
        match=r"^--tool-call-latency-ms cannot be combined with --tool-call-latency-lognorm-\* flags$",
    ):
        shape_of("--tool-call-latency-ms", "5", "--tool-call-latency-lognorm-max", "9")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ("--input-tokens", "5", "--input-lognorm-sigma", "1"),
            "--input-tokens cannot be combined with --input-lognorm-* flags",
        ),
        (
            ("--initial-prompt-tokens", "5", "--initial-prompt-lognorm-mu", "1"),
            "--input-tokens cannot be combined with --input-lognorm-* flags",
        ),
        (
            ("--model-response-tokens", "5", "--output-lognorm-max", "3"),
            "--output-tokens cannot be combined with --output-lognorm-* flags",
        ),
        (
            ("--environment-response-tokens", "5", "--environment-lognorm-median", "3"),
            "--environment-tokens cannot be combined with --environment-lognorm-* flags",
        ),
        (
            ("--tool-invocations", "5", "--tool-invocations-lognorm-sigma", "3"),
            "--tool-invocations cannot be combined with --tool-invocations-lognorm-* flags",
        ),
        (
            (
                "--input-lognorm-mu",
                "1",
                "--input-lognorm-median",
                "3",
                "--input-lognorm-sigma",
                "1",
            ),
            "provide either --input-lognorm-mu or --input-lognorm-median, not both",
        ),
        (
            ("--output-lognorm-median", "3"),
            "--output-lognorm-sigma is required for log-normal sampling",
        ),
        (
            ("--environment-lognorm-max", "3", "--environment-lognorm-sigma", "1"),
            "--environment-lognorm-median or --environment-lognorm-mu is required for log-normal sampling",
        ),
        (
            ("--input-lognorm-mu", "inf", "--input-lognorm-sigma", "1"),
            "sample log-normal mu must be finite",
        ),
        (
            ("--input-lognorm-mu", "1", "--input-lognorm-sigma", "nan"),
            "sample log-normal sigma must be greater than zero",
        ),
        (
            ("--input-lognorm-mu", "1", "--input-lognorm-sigma", "1", "--input-lognorm-max", "0"),
            "sample log-normal max must be greater than zero",
        ),
        (
            ("--tool-call-latency-lognorm-mu", "1", "--tool-call-latency-lognorm-median", "3"),
            "provide either --tool-call-latency-lognorm-mu or --tool-call-latency-lognorm-median-ms, not both",
        ),
        (
            ("--tool-call-latency-lognorm-mu", "1"),
            "--tool-call-latency-lognorm-sigma is required for log-normal latency sampling",
        ),
        (
            ("--tool-call-latency-lognorm-sigma", "1"),
            "--tool-call-latency-lognorm-median-ms or --tool-call-latency-lognorm-mu is required for log-normal latency sampling",
        ),
    ],
)
def test_family_rules_use_primary_names(argv, message):
    with pytest.raises(UsageError) as caught:
        shape_of(*argv)
    assert str(caught.value) == message


def test_median_becomes_log_mu():
    spec = shape_of("--input-lognorm-median", "500", "--input-lognorm-sigma", "0.25").input
    assert spec == LogNormalSpec(mu=math.log(500), sigma=0.25)
    assert spec.describe() == "lognormal(median≈500, σ=0.25; μ=6.215)"
    capped = shape_of(
        "--output-lognorm-mu", "3", "--output-lognorm-sigma", "1", "--output-lognorm-max", "90"
    )
    assert capped.output.describe() == "lognormal(median≈20, σ=1, max=90; μ=3.000)"


def test_defaults():
    shape = shape_of()
    assert (shape.input, shape.output, shape.environment, shape.tool_invocations) == (
        FixedSpec(128),
        FixedSpec(64),
        FixedSpec(64),
        FixedSpec(4),
    )
    assert shape.latency is None


def test_stream_mixing_matches_reference_formula():
    root, agent, stream = 7, 3, 5
    expected = (root + agent * 0x9E3779B97F4A7C15 + stream * 0xD1B54A32D192ED03) % 2**64
    assert mix_seed(root, agent, stream) == expected
    assert mix_seed(2**64 - 1, 1, 0) == (2**64 - 1 + 0x9E3779B97F4A7C15) % 2**64


def test_splitmix64_known_values():
    # splitmix64 seeded with 0: the published first outputs of the reference generator.
    assert splitmix64(0, 3).tolist() == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
        0x06C45D188009454F,
    ]
    # Counter-based: draw k does not depend on how many were drawn before it.
    assert splitmix64(42, 10)[7] == splitmix64(42, 3, start=7)[0]


def test_standard_normal_is_plausible():
    z = standard_normal(11, 20000)
    assert abs(float(z.mean())) < 0.05 and abs(float(z.std()) - 1.0) < 0.05


def test_sampled_workload_shapes_and_ids():
    shape = SampledShape(FixedSpec(100), FixedSpec(20), FixedSpec(30), FixedSpec(3), FixedSpec(7))
    work = compile_sampled(shape, agents=2, root_seed=1)
    assert list(work.trajectory_ids) == ["sampled-0", "sampled-1"]
    assert work.request_offsets.tolist() == [0, 3, 6]
    assert work.input_content_tokens.tolist() == [100, 150, 200, 100, 150, 200]
    assert work.target_prompt_tokens.tolist() == work.input_content_tokens.tolist()
    assert work.environment_tokens.tolist() == [30] * 6
    assert work.tool_call_latency_ms.tolist() == [7.0] * 6
    assert work.schema_version is None


def test_changing_one_spec_never_changes_another_fields_samples():
    base = SampledShape(
        LogNormalSpec(math.log(500), 0.5),
        LogNormalSpec(math.log(80), 0.7),
        LogNormalSpec(math.log(300), 0.9),
        FixedSpec(5),
        None,
    )
    changed = SampledShape(
        base.input, LogNormalSpec(math.log(10), 0.1), base.environment, base.tool_invocations, None
    )
    a = compile_sampled(base, 4, root_seed=99)
    b = compile_sampled(changed, 4, root_seed=99)
    assert a.environment_tokens.tolist() == b.environment_tokens.tolist()
    assert (
        a.input_content_tokens[a.request_offsets[:-1]].tolist()
        == b.input_content_tokens[b.request_offsets[:-1]].tolist()
    )
    assert a.output_tokens.tolist() != b.output_tokens.tolist()


def test_agents_draw_from_different_streams():
    shape = SampledShape(
        LogNormalSpec(math.log(500), 0.5), FixedSpec(1), FixedSpec(1), FixedSpec(1), None
    )
    work = compile_sampled(shape, 8, root_seed=7)
    firsts = work.input_content_tokens.tolist()
    assert len(set(firsts)) > 1
    assert np.array_equal(
        work.input_content_tokens, compile_sampled(shape, 8, root_seed=7).input_content_tokens
    )


def test_short_float():
    assert [short_float(v) for v in (1.0, 1000.0, 0.5, 2.25)] == ["1", "1000", "0.5", "2.25"]
