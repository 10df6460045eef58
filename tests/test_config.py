"""RunConfig: frozen, built once from the command line or a TOML file, key redacted."""

from __future__ import annotations

import dataclasses

import pytest

from batchbench.cli.agent_args import config_from_argv
from batchbench.cli.argtypes import suggestion
from batchbench.cli.sim import build_parser as sim_parser
from batchbench.config import ApiKey, RunConfig
from batchbench.errors import UsageError


def usage_error(argv: list[str]) -> str:
    with pytest.raises(UsageError) as caught:
        config_from_argv(argv)
    return str(caught.value)


def test_from_args_is_frozen_and_resolved():
    config = RunConfig.from_args(
        ["--agents", "3", "--input-tokens", "50", "--max-active-agents", "2", "--stream"]
    )
    assert (config.agents, config.max_active_agents, config.stream) == (3, 2, True)
    assert config.shape_options == (("input-tokens", 50),)
    assert config.shape.input.describe() == "50 (fixed)"
    assert config.endpoint_url == "https://api.openai.com/v1/chat/completions"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.agents = 4  # type: ignore[misc]
    assert dataclasses.replace(config, agents=4).agents == 4


def test_api_key_never_shown(monkeypatch):
    monkeypatch.setenv("BB_TEST_KEY", "sk-from-env")
    config = RunConfig.from_args(["--api-key-env", "BB_TEST_KEY", "--agents", "1"])
    assert config.api_key == ApiKey("sk-from-env")
    assert config.api_key.reveal() == "sk-from-env"
    for text in (repr(config), str(config), str(config.api_key), config.to_toml()):
        assert "sk-from-env" not in text
    assert "<redacted>" in repr(config)
    flag = RunConfig.from_args(["--api-key", "sk-flag", "--agents", "1"])
    assert flag.api_key.reveal() == "sk-flag"
    assert RunConfig.from_args(["--api-key", "", "--agents", "1"]).api_key is None


def test_toml_file_with_flags_overriding(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        'model = "m1"\nagents = 5\nmax-active-agents = 2\nstream = true\n'
        "input-lognorm-median = 100.0\ninput-lognorm-sigma = 0.5\n"
        'no-prompt-correction = true\ntime-scale = 2\nagent-plans-jsonl = "p.jsonl"\n'
    )
    with pytest.raises(UsageError, match="--agents cannot be combined"):
        config_from_argv(["--config", str(path)])
    path.write_text(path.read_text().replace('time-scale = 2\nagent-plans-jsonl = "p.jsonl"\n', ""))
    config = config_from_argv(["--config", str(path), "--model", "m2", "--agents", "7"])
    assert (config.model, config.agents, config.max_active_agents) == ("m2", 7, 2)
    assert config.stream is True and config.prompt_correction is False
    assert config.shape_options == (("input-lognorm-median", 100.0), ("input-lognorm-sigma", 0.5))


def test_toml_errors_name_file_and_option(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("max-active-agent = 3\n")
    assert usage_error(["--config", str(path)]) == (
        f'{path}: unknown option "max-active-agent" (did you mean --max-active-agents?)'
    )
    path.write_text("agents = -2\n")
    assert usage_error(["--config", str(path)]) == (
        f'{path}: agents: "-2" is not a valid non-negative integer'
    )
    path.write_text('stream = "yes"\n')
    assert usage_error(["--config", str(path)]) == f"{path}: stream: expected true or false"
    path.write_text('prompt-oracle = "maybe"\n')
    assert usage_error(["--config", str(path)]).startswith(
        f"{path}: prompt-oracle: invalid choice 'maybe'"
    )
    path.write_text("agents = [1]\n")
    assert usage_error(["--config", str(path)]) == f"{path}: agents: expected a string or a number"
    path.write_text("agents = \n")
    assert usage_error(["--config", str(path)]).startswith(f"--config {path}: invalid TOML:")
    assert usage_error(["--config", str(tmp_path / "missing.toml")]) == (
        f"--config {tmp_path / 'missing.toml'}: No such file or directory"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--agents", "4", "--output-tokens", "9", "--tool-call-latency-ms", "3", "--seed", "11",
         "--content-salt", 'q"uote\\', "--dp-rank-perfect-routing",
         "--dp-rank-perfect-routing-num", "2", "--stream", "--results-json", "out/r.json"],
        ["--agent-plans-jsonl", "x.jsonl", "--admission", "open-loop", "--time-scale", "2.5",
         "--replay-initial-overhead-tokens", "3", "--no-prompt-correction", "--sim",
         "--sim-args", "--speed 0", "--chat-template", "gemma"],
    ],
)  # fmt: skip
def test_written_options_read_back(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.jsonl").write_text("")
    config = RunConfig.from_args(argv)
    path = tmp_path / "r.config.toml"
    path.write_text(config.to_toml())
    assert config_from_argv(["--config", str(path)]) == config


def test_misspelled_flags_get_a_suggestion():
    assert usage_error(["--max-active-agent", "3"]) == (
        "unrecognized arguments: --max-active-agent 3 (did you mean --max-active-agents?)"
    )
    assert usage_error(["--strem"]) == "unrecognized arguments: --strem (did you mean --stream?)"
    assert usage_error(["--zzzz"]) == "unrecognized arguments: --zzzz"
    parser = sim_parser()
    assert suggestion(parser, "unrecognized arguments: --model-nam x") == (
        "unrecognized arguments: --model-nam x (did you mean --model-name?)"
    )


def test_sim_model_means_what_agent_model_means():
    parser = sim_parser()
    assert parser.parse_args(["--model", "served"]).model_name == "served"
    assert parser.parse_args(["--model-name", "older"]).model_name == "older"
    assert parser.parse_args([]).model_name == "batchbench-sim"


def test_check_covers_configs_built_in_python():
    with pytest.raises(UsageError, match="agents must be greater than zero"):
        RunConfig(agents=0).check()
    with pytest.raises(UsageError, match="--admission requires --agent-plans-jsonl"):
        RunConfig(admission="open-loop").check()
    with pytest.raises(UsageError, match="--sim cannot be combined with --dry-run"):
        RunConfig(sim=True, dry_run=True).check()
    with pytest.raises(UsageError, match=r"invalid endpoint URL: http://127\.0\.0\.1:99999/v1/"):
        RunConfig(host="http://127.0.0.1:99999").check()
    with pytest.raises(UsageError, match="input"):
        RunConfig(shape_options=(("input-lognorm-mu", 1.0),)).check()
    RunConfig(sim=True, endpoint="/v1/chat/completions").check()
