"""One declaration per option: a field added in one place (here a subclass of RunConfig
with one more declared field) is in the parser and its --help, the TOML reader, options(),
the resolved-options file and the configuration a command line makes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from batchbench.config import RunConfig
from batchbench.errors import UsageError
from batchbench.options import agent
from batchbench.options.declare import Flag, add_run_options, all_flags, declared, option
from batchbench.options.parser import CommandParser
from batchbench.options.sections import HTTP, PROBES
from batchbench.options.values import uint

HOST = ["--host", "http://127.0.0.1:8000"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WithDummy(RunConfig):
    dummy_level: int = option(
        7, Flag("dummy-level", "a dummy option (default: %(default)s)", HTTP, parse=uint)
    )


def test_the_dummy_option_is_in_the_parser_and_its_help():
    text = agent.build_parser(WithDummy).format_help()
    section = text.split("HTTP behaviour and outputs:", 1)[1].split("\n\n", 1)[0]
    assert "--dummy-level DUMMY_LEVEL" in section
    assert "a dummy option (default: 7)" in " ".join(section.split())
    assert "--dummy-level" not in agent.build_parser(RunConfig).format_help()


def test_the_dummy_option_parses_and_is_checked():
    args = agent.parse_agent_args(WithDummy, ["--dummy-level", "9"])
    assert args is not None and args.dummy_level == 9
    assert agent.parse_agent_args(WithDummy, []).dummy_level == 7
    with pytest.raises(UsageError) as caught:
        agent.parse_agent_args(WithDummy, ["--dummy-level", "-1"])
    assert str(caught.value) == 'argument --dummy-level: "-1" is not a valid non-negative integer'
    with pytest.raises(UsageError) as caught:
        agent.parse_agent_args(WithDummy, ["--dummy-levl", "2"])
    assert str(caught.value) == (
        "unrecognized arguments: --dummy-levl 2 (did you mean --dummy-level?)"
    )


def test_the_configuration_of_a_command_line_holds_it():
    config = WithDummy.from_args(["--dummy-level", "3", "--agents", "2", *HOST])
    assert type(config) is WithDummy
    assert config.dummy_level == 3
    plain = RunConfig.from_args(["--agents", "2", *HOST])
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    assert {n: getattr(config, n) for n in fields} == {n: getattr(plain, n) for n in fields}
    assert WithDummy.from_args(HOST).dummy_level == 7


def test_the_toml_reader_takes_it(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("dummy-level = 11\nagents = 2\n")
    assert WithDummy.from_args(["--config", str(path), *HOST]).dummy_level == 11
    overridden = ["--config", str(path), "--dummy-level", "12", *HOST]
    assert WithDummy.from_args(overridden).dummy_level == 12
    path.write_text('dummy-level = "many"\n')
    with pytest.raises(UsageError) as caught:
        WithDummy.from_args(["--config", str(path), *HOST])
    assert str(caught.value) == f'{path}: dummy-level: "many" is not a valid non-negative integer'


def test_options_and_the_resolved_options_file_write_it(tmp_path):
    config = WithDummy(host="http://127.0.0.1:8000", agents=2, dummy_level=5)
    options = config.options()
    assert options["dummy-level"] == 5
    assert list(options)[-1] == "dummy-level"  # the last field, the last option
    assert {k: v for k, v in options.items() if k != "dummy-level"} == RunConfig(
        host="http://127.0.0.1:8000", agents=2
    ).options()
    text = config.to_toml()
    assert text.splitlines()[-1] == "dummy-level = 5"
    path = tmp_path / "resolved.config.toml"
    path.write_text(text)
    assert WithDummy.from_args(["--config", str(path)]) == config


def test_the_commands_that_take_it():
    for command, expected in (("agent", True), ("capacity", True), ("calibrate", False)):
        parser = CommandParser(prog="x")
        add_run_options(parser, WithDummy, command)
        assert (parser.action_for("--dummy-level") is not None) is expected
    parser = CommandParser(prog="x")
    add_run_options(parser, RunConfig, "calibrate", groups=(PROBES,))
    assert [o for a in parser.declared_actions for o in a.option_strings][2:] == [
        "--sglang",
        "--ignore-eos",
        "--stream",
        "--no-stream",
        "--disable-user-tagging",
        "--request-timeout-secs",
        "--chat-template",
    ]


def test_every_field_of_the_run_configuration_is_declared_once():
    declared_fields = [spec.name for spec, _option in declared(RunConfig)]
    # preset_calibration is no option: a calibration made before the run (--workers, capacity)
    fields = [spec.name for spec in dataclasses.fields(RunConfig)]
    assert declared_fields == [name for name in fields if name != "preset_calibration"]
    strings = [s for flag in all_flags(RunConfig) for s in flag.option_strings]
    assert len(strings) == len(set(strings))
    # as batchbench-agent has always had, but -h, --config, --version; plus --dp-rank-header,
    # --routed-worker-header and --rank-failover; plus --no-stream and --no-calibrate
    assert len(all_flags(RunConfig)) == 92


def test_a_command_line_run_checks_its_options_once(monkeypatch, capsys):
    """The command line checks right after parsing; the run does not repeat the checks
    for that configuration, but does for a configuration built in Python."""
    import batchbench.config as config_module
    from batchbench.cli.agent import main

    calls: list[bool] = []
    real = config_module.check_flag_combinations

    def counting(**kwargs):
        calls.append(True)
        return real(**kwargs)

    monkeypatch.setattr(config_module, "check_flag_combinations", counting)
    argv = ["--agents", "1", "--tool-invocations", "1", "--dry-run", "--seed", "3"]
    assert main([*argv, "--tokenizer-model", "deepseek-v3"]) == 0
    assert len(calls) == 1
    built = RunConfig(agents=1, dry_run=True, tokenizer_model="deepseek-v3")
    calls.clear()
    built.check_once()
    built.check_once()
    assert len(calls) == 2
    capsys.readouterr()


def test_calibrate_passes_tokenizer_download_on():
    """``batchbench calibrate --tokenizer-download`` lets the tokenizer be fetched, as it
    does for the agent (it was shown in --help but dropped)."""
    from batchbench.cli.calibrate import build_parser, probe_config

    base = ["--host", "http://127.0.0.1:9", "--tokenizer-model", "org/model"]
    parser = build_parser("batchbench calibrate")
    assert probe_config(parser.parse_args([*base, "--tokenizer-download"])).tokenizer_download
    assert not probe_config(parser.parse_args(base)).tokenizer_download
