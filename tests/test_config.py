"""RunConfig: frozen, built once from the command line or a TOML file, key redacted."""

from __future__ import annotations

import dataclasses
import re

import pytest

from batchbench.cli.agent_args import config_from_argv
from batchbench.cli.sim import build_parser as sim_parser
from batchbench.config import ApiKey, RunConfig
from batchbench.errors import UsageError
from batchbench.options.parser import suggestion


def usage_error(argv: list[str]) -> str:
    with pytest.raises(UsageError) as caught:
        config_from_argv(argv)
    return str(caught.value)


def test_from_args_is_frozen_and_resolved():
    config = RunConfig.from_args(
        [
            "--agents",
            "3",
            "--input-tokens",
            "50",
            "--max-active-agents",
            "2",
            "--stream",
            "--host",
            "http://127.0.0.1:8000",
        ]
    )
    assert (config.agents, config.max_active_agents, config.stream) == (3, 2, True)
    assert config.shape_options == (("input-tokens", 50),)
    assert config.shape.input.describe() == "50 (fixed)"
    assert config.endpoint_url == "http://127.0.0.1:8000/v1/chat/completions"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.agents = 4  # type: ignore[misc]
    assert dataclasses.replace(config, agents=4).agents == 4


def test_api_key_never_shown(monkeypatch):
    monkeypatch.setenv("BB_TEST_KEY", "sk-from-env")
    host = ["--host", "http://127.0.0.1:8000"]
    config = RunConfig.from_args(["--api-key-env", "BB_TEST_KEY", "--agents", "1", *host])
    assert config.api_key == ApiKey("sk-from-env")
    assert config.api_key.reveal() == "sk-from-env"
    for text in (repr(config), str(config), str(config.api_key), config.to_toml()):
        assert "sk-from-env" not in text
    assert "<redacted>" in repr(config)
    flag = RunConfig.from_args(["--api-key", "sk-flag", "--agents", "1", *host])
    assert flag.api_key.reveal() == "sk-flag"
    assert RunConfig.from_args(["--api-key", "", "--agents", "1", *host]).api_key is None


def test_toml_file_with_flags_overriding(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        'model = "m1"\nagents = 5\nmax-active-agents = 2\nstream = true\n'
        "input-lognorm-median = 100.0\ninput-lognorm-sigma = 0.5\n"
        'no-prompt-correction = true\ntime-scale = 2\nagent-plans-jsonl = "p.jsonl"\n'
        'host = "http://127.0.0.1:8000"\n'
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
    path.write_text('dp-rank-header = "sglang"\n')
    assert usage_error(["--config", str(path)]).startswith(
        f"{path}: dp-rank-header: invalid choice 'sglang'"
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
         "--dp-rank-perfect-routing-num", "2", "--stream", "--results-json", "r.json",
         "--host", "http://127.0.0.1:8000", "--model", "m"],
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
    # Output paths come back as comments: a run from the file does not overwrite results.
    assert config_from_argv(["--config", str(path)]) == dataclasses.replace(
        config, results_json=None
    )


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
    with pytest.raises(
        UsageError, match=r"^--admission open-loop requires --agent-plans-jsonl or --arrival-rate$"
    ):
        RunConfig(admission="open-loop").check()
    with pytest.raises(UsageError, match="--sim cannot be combined with --dry-run"):
        RunConfig(sim=True, dry_run=True).check()
    with pytest.raises(UsageError, match=r"invalid endpoint URL: http://127\.0\.0\.1:99999/v1/"):
        RunConfig(host="http://127.0.0.1:99999").check()
    with pytest.raises(UsageError, match="input"):
        RunConfig(shape_options=(("input-lognorm-mu", 1.0),)).check()
    RunConfig(sim=True, endpoint="/v1/chat/completions").check()


def test_written_options_escape_and_comment(tmp_path):
    config = RunConfig(
        agents=2, seed=(1 << 64) - 1, user_prefix="a\x7fb", dry_run=True, tokenizer_model="t",
        results_csv="x.csv",
    )  # fmt: skip
    text = config.to_toml(salt_used="s4lt")
    assert 'seed = "18446744073709551615"' in text
    assert 'user-prefix = "a\\u007fb"' in text
    assert '# content-salt = "s4lt"' in text and '# results-csv = "x.csv"' in text
    path = tmp_path / "r.toml"
    path.write_text(text)
    again = config_from_argv(["--config", str(path)])
    assert (again.seed, again.user_prefix, again.content_salt) == ((1 << 64) - 1, "a\x7fb", None)


def test_options_file_edge_cases(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_bytes(b'model = "\xff"\n')
    assert usage_error(["--config", str(path)]).startswith(f"--config {path}: invalid TOML:")
    path.write_text('config = "other.toml"\n')
    assert usage_error(["--config", str(path)]) == (
        f'{path}: "config" cannot be set in an options file'
    )
    assert config_from_argv(["--config", str(path), "--help"]) is None  # help still works


def test_python_configs_are_checked_like_command_lines():
    for config, message in [
        (RunConfig(agents=-1), "--agents must be an integer of at least 0, not -1"),
        (RunConfig(max_active_agents=0), "--max-active-agents must be an integer of at least 1"),
        (RunConfig(seed=1 << 70), "--seed must be an integer in 0..2^64-1"),
        (RunConfig(grace_seconds=-1.0), "--grace-seconds must be a non-negative number"),
        (RunConfig(shape_options=(("input-tokenz", 5),)), "unknown shape option 'input-tokenz'"),
        (RunConfig(shape_options=(("input-tokens", "5"),)), "must be a number"),
        (RunConfig(sim=True, endpoint="http://x/v1/chat/completions"), "full-URL --endpoint"),
        (RunConfig(sim=True, chat_template="my.jinja"), "the simulator's templates"),
    ]:
        with pytest.raises(UsageError, match=re.escape(message)):
            config.check()
    keyed = RunConfig(api_key="sk-plain")
    assert keyed.api_key == ApiKey("sk-plain") and "sk-plain" not in repr(keyed)


def test_library_reads_the_key_variable(monkeypatch):
    monkeypatch.setenv("BB_LIB_KEY", "sk-env")
    assert RunConfig(api_key_env="BB_LIB_KEY").resolved_api_key() == "sk-env"
    monkeypatch.setenv("BB_LIB_KEY", "bad\nkey")
    with pytest.raises(UsageError, match="character 4 is a control character"):
        RunConfig(api_key_env="BB_LIB_KEY", host="http://127.0.0.1:1").check()


def test_a_misspelled_command_gets_a_suggestion(capsys):
    from batchbench.cli.main import run as batchbench

    assert batchbench(["calibrat"]) == 2
    assert capsys.readouterr().err == (
        "Error: unknown command 'calibrat' (did you mean calibrate?); expected run, agent, sim, "
        "calibrate, validate, capacity, report, merge, import, export-plans, record or "
        "tokenizers\n"
    )
