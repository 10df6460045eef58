"""One CLI shape (issue 28): ``batchbench run``, the ``--concurrency`` alias, each command's
``--help`` listing only its options, ``-o`` a file and ``--output-dir`` a folder,
``batchbench tokenizers --help``, what "compatible" means, and ``--sim-args`` mistakes in
one line."""

from __future__ import annotations

import argparse
import shlex
import sys
import tomllib
from pathlib import Path

import pytest

from batchbench.cli.agent_args import parse_agent_args
from batchbench.cli.main import run as batchbench
from batchbench.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
PLANS = str(ROOT / "examples" / "trajectory-replay" / "plans.jsonl")
DRY_RUN = [
    "--agent-plans-jsonl", PLANS, "--max-active-agents", "2", "--tokenizer-model", "deepseek-v3",
    "--dry-run", "--seed", "7",
]  # fmt: skip


def output_of(capsys, argv: list[str]) -> tuple[int, str, str]:
    status = batchbench(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def help_options(capsys, argv: list[str]) -> list[str]:
    """Every option string ``--help`` lists in its option sections."""
    status, out, _err = output_of(capsys, [*argv, "--help"])
    assert status == 0
    listed = []
    for line in out.splitlines():
        if line.startswith("  -"):
            for part in line.split("  ")[1].split(", "):
                listed.append(part.split(" ")[0])
    return listed


# -- A. batchbench run -------------------------------------------------------------------
def test_run_is_the_benchmark_and_agent_stays(capsys, monkeypatch):
    status, out, err = output_of(capsys, ["run", *DRY_RUN, "--content-salt", "1"])
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "=== Agent Loop Benchmark Configuration ==="
    assert sum(line.startswith("[DRY-RUN] ") for line in lines) == 7
    assert "Agents: 3 completed / 3 total" in lines
    status, out, _err = output_of(capsys, ["run", "--help"])
    assert status == 0 and out.startswith("usage: batchbench run [-h] ")
    # both names run the same console entry, each under its own name
    import batchbench.cli.main as cli_main

    calls = []
    monkeypatch.setattr(cli_main, "run_console", lambda argv, prog: calls.append((argv, prog)) or 0)
    monkeypatch.setattr(cli_main, "hold_late_signals", lambda: None)
    assert batchbench(["run", "--seed", "1"]) == batchbench(["agent", "--seed", "1"]) == 0
    assert calls == [(["--seed", "1"], "batchbench run"), (["--seed", "1"], "batchbench agent")]


def test_the_command_list_names_run_first(capsys):
    status, out, _err = output_of(capsys, ["--help"])
    assert status == 0
    lines = out.splitlines()
    start = lines.index("commands:")
    assert lines[start + 1 : start + 3] == [
        "  run          the benchmark: replay trajectories or sampled agents against a server",
        "  agent        the same as run (and as the batchbench-agent script), kept for "
        "existing scripts",
    ]
    assert lines[-1] == "Run `batchbench run --help` for the benchmark's options."


def test_an_unknown_command_lists_run_first(capsys):
    assert output_of(capsys, ["rnu"]) == (
        2,
        "",
        "Error: unknown command 'rnu' (did you mean run?); expected run, agent, sim, "
        "calibrate, validate, capacity, report, merge, import, export-plans, record or "
        "tokenizers\n",
    )


# -- B. --concurrency ----------------------------------------------------------------------
def test_concurrency_is_max_active_agents():
    assert parse_agent_args(["--concurrency", "8"]).max_active_agents == 8
    assert parse_agent_args(["--concurrency=3"]).max_active_agents == 3
    assert parse_agent_args(["--max-active-agents", "5"]).max_active_agents == 5
    with pytest.raises(UsageError) as caught:
        parse_agent_args(["--concurrency", "0"])
    assert str(caught.value) == "argument --concurrency: value must be greater than zero"
    with pytest.raises(UsageError) as caught:
        parse_agent_args(["--max-active-agents=two"])
    assert (
        str(caught.value) == 'argument --max-active-agents: "two" is not a valid positive integer'
    )
    with pytest.raises(UsageError) as caught:  # an older alias: named as typed too
        parse_agent_args(["--initial-prompt-tokens", "x"])
    assert str(caught.value).startswith("argument --initial-prompt-tokens: ")


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--concurrency", "2", "--max-active-agents", "3"],
            "--max-active-agents given twice (as --concurrency and --max-active-agents, the "
            "same option): it takes one value, so give it once",
        ),
        (
            ["--max-active-agents", "2", "--concurrency", "3"],
            "--concurrency given twice (as --max-active-agents and --concurrency, the same "
            "option): it takes one value, so give it once",
        ),
        (
            ["--concurrency", "2", "--concurrency", "3"],
            "--concurrency given twice: it takes one value, so give it once",
        ),
    ],
)
def test_concurrency_and_max_active_agents_together_are_given_twice(argv, message, capsys):
    assert output_of(capsys, ["run", *argv, "--dry-run"]) == (2, "", f"Error: {message}\n")


def test_concurrency_is_in_the_help_and_in_an_options_file(capsys, tmp_path):
    assert "--concurrency" in help_options(capsys, ["run"])
    status, out, _err = output_of(capsys, ["run", "--help"])
    assert status == 0
    # Python 3.13's argparse writes an option's metavar once, after its last spelling.
    if sys.version_info >= (3, 13):
        assert "  --max-active-agents, --concurrency N\n" in out
    else:
        assert "  --max-active-agents N, --concurrency N\n" in out
    options = tmp_path / "run.toml"
    options.write_text("concurrency = 4\n")
    assert parse_agent_args(["--config", str(options)]).max_active_agents == 4


def test_capacity_refuses_concurrency_as_it_refuses_max_active_agents(capsys):
    status, out, err = output_of(capsys, ["capacity", "--concurrency", "4"])
    assert (status, out) == (2, "")
    assert err == (
        "Error: --concurrency does not apply to a capacity search: the search sets it per "
        "step; use --min-agents and --max-agents\n"
    )
    assert "--concurrency" not in help_options(capsys, ["capacity"])


# -- C. each command's --help lists its own options ---------------------------------------
def test_capacity_help_leaves_out_shard_and_start_at(capsys):
    listed = help_options(capsys, ["capacity"])
    assert "--shard" not in listed and "--start-at" not in listed
    assert {"--workers", "--ramp-up", "--sim-args", "--output-dir"} <= set(listed)
    agent = help_options(capsys, ["run"])
    assert {"--shard", "--start-at"} <= set(agent)
    from batchbench.cli.capacity import REFUSED

    refused = {flag for flag, _dest, _why in REFUSED} | {"--dry-run"}
    assert refused & set(listed) == set()


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--shard", "0/2"],
            "--shard does not apply to a capacity search: a shard needs --results-json, and "
            "a search runs its steps itself (--workers spreads each step over processes)",
        ),
        (
            ["--start-at", "2026-12-04T15:00:00Z"],
            "--start-at does not apply to a capacity search: it starts the shards of one run "
            "together; a search starts each step when the previous one ends",
        ),
    ],
)
def test_capacity_refuses_shard_and_start_at_with_a_reason(argv, message, capsys):
    assert output_of(capsys, ["capacity", *argv, "--slo", "e2e_p95=30s"]) == (
        2,
        "",
        f"Error: {message}\n",
    )


# -- D. -o is a file, --output-dir a folder -------------------------------------------------
def test_merge_shows_output_dir_and_still_takes_o(capsys):
    status, out, _err = output_of(capsys, ["merge", "--help"])
    assert status == 0
    assert (
        out.splitlines()[0]
        == "usage: batchbench merge [-h] [--output-dir DIR] [--report-html PATH]"
    )
    assert " -o" not in out
    from batchbench.cli.merge import build_parser

    parser = build_parser("batchbench merge")
    assert parser.parse_args(["a.json", "-o", "out"]).output_dir == "out"
    assert parser.parse_args(["a.json", "--output-dir", "out"]).output_dir == "out"
    assert output_of(capsys, ["merge", "a.json", "-o", "x", "--output-dir", "y"]) == (
        2,
        "",
        "Error: --output-dir given twice (as -o and --output-dir, the same option): it takes "
        "one value, so give it once\n",
    )
    assert output_of(capsys, ["merge", "a.json"]) == (
        2,
        "",
        "Error: batchbench merge needs --output-dir DIR (the directory the merged outputs go "
        "into)\n",
    )


def test_o_names_the_one_file_a_command_writes(capsys):
    from batchbench.cli import export_plans, import_trace, report

    def o_of(module, name: str) -> argparse.Action:
        parser = module.build_parser(f"batchbench {name}")
        action = parser.action_for("-o")
        assert action is not None, name
        return action

    assert o_of(report, "report").option_strings == ["-o", "--output"]
    assert o_of(import_trace, "import").option_strings == ["-o", "--output"]
    assert o_of(export_plans, "export-plans").option_strings == ["-o", "--output"]
    parser = export_plans.build_parser("batchbench export-plans")
    args = parser.parse_args(
        ["--rows-jsonl", "r.jsonl", "--start", "T0", "--end", "T1", "-o", "plans.jsonl"]
    )
    assert args.output == "plans.jsonl"


def test_the_kubernetes_merge_uses_output_dir():
    for name in ("merge-job.yaml", "jobset.yaml"):
        text = (ROOT / "deploy" / "kubernetes" / name).read_text()
        assert "- --output-dir\n" in text and "- -o\n" not in text


# -- E. batchbench tokenizers --help --------------------------------------------------------
def test_tokenizers_help_prints_help_and_the_command_the_list(capsys):
    status, out, err = output_of(capsys, ["tokenizers", "--help"])
    assert (status, err) == (0, "")
    assert out.splitlines()[0] == "usage: batchbench tokenizers"
    assert "deepseek-v3\t" not in out
    status, out, err = output_of(capsys, ["tokenizers"])
    assert (status, err) == (0, "")
    assert any(line.startswith("deepseek-v3\t") for line in out.splitlines())
    assert output_of(capsys, ["tokenizers", "deepseek-v3"]) == (
        2,
        "",
        "Error: batchbench tokenizers takes no arguments, not 'deepseek-v3'\n",
    )


# -- F. compatible with what -------------------------------------------------------------
def test_help_sections_say_what_they_are_added_to(capsys):
    status, out, _err = output_of(capsys, ["run", "--help"])
    assert status == 0
    sections = [line for line in out.splitlines() if line.endswith(":") and not line[0].isspace()]
    assert sections == [
        "options:",
        "target and model:",
        "prompt fidelity (not in the Rust batchbench-agent):",
        "sampled workload shape (without --agent-plans-jsonl):",
        "agents, replay and admission:",
        "routing and identity:",
        "HTTP behaviour and outputs:",
        "live runs (not in the Rust batchbench-agent):",
        "objectives, measured window and report:",
        "scale-out (not in the Rust batchbench-agent):",
        "embedded simulator (not in the Rust batchbench-agent):",
    ]


def test_the_readme_says_what_compatible_means():
    readme = (ROOT / "README.md").read_text()
    assert "compatible columns" not in readme
    assert "first the 51 columns of the Rust\n  batchbench-agent's CSV, in its order" in readme
    assert "## One command line\n" in readme
    assert "`=== Agent Loop Benchmark Configuration ===` (its title is part of that contract)" in (
        " ".join(readme.split("\n"))
    )


# -- G. --sim-args mistakes in one line ---------------------------------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--sim-args", "--max-batc 4"],
            "--sim-args: unknown simulator option --max-batc (did you mean --max-batch?)",
        ),
        (
            ["--sim-args", "--max-batch 4 --speedd 0 --fault-sed 1"],
            "--sim-args: unknown simulator options --speedd (did you mean --speed?), "
            "--fault-sed (did you mean --fault-seed?)",
        ),
        (["--sim-args", "--max-batch x"], "--sim-args: argument --max-batch: not an integer: 'x'"),
        (
            ["--sim-args", "4"],
            "--sim-args: unexpected simulator argument 4 (the simulator takes only options, "
            "each starting with --)",
        ),
        (
            ["--sim-args", "--max-batch", "4"],
            "argument --sim-args: expected one argument: quote the simulator's options as one "
            'value, as in --sim-args "--max-batch 4"',
        ),
        (
            ["--sim-args", "--max-batch", "4", "--speed", "0"],
            "argument --sim-args: expected one argument: quote the simulator's options as one "
            'value, as in --sim-args "--max-batch 4 --speed 0"',
        ),
        (
            ["--sim-args", "--close-after-stream"],
            "argument --sim-args: expected one argument: give the simulator's option with =, "
            "as in --sim-args=--close-after-stream",
        ),
    ],
)
@pytest.mark.parametrize("command", ["run", "capacity", "calibrate"])
def test_a_sim_args_mistake_is_one_line(command, argv, message, capsys, tmp_path):
    extra = ["--agents", "1"] if command == "run" else []
    if command == "capacity":
        extra = ["--slo", "e2e_p95=30s", "--output-dir", str(tmp_path / "out")]
    assert output_of(capsys, [command, "--sim", *argv, *extra]) == (2, "", f"Error: {message}\n")
    assert not (tmp_path / "out").exists()


def test_good_sim_args_pass_the_check():
    """Valid --sim-args pass the check (a mistake raises) and reach the child's command,
    parsed as the simulator will parse them (its model: --model, else its default)."""
    from batchbench.config import RunConfig
    from batchbench.options.simulator import sim_model_name

    for args, model in (
        ("--max-batch 4 --speed 0", "batchbench-sim"),
        ("--close-after-stream --model m1", "m1"),
    ):
        config = RunConfig(sim=True, sim_args=args)
        config.check()
        command = config.sim_child_command()
        assert command[-len(args.split()) :] == args.split()
        assert sim_model_name(command) == model


def test_a_simulator_that_does_not_start_names_its_whole_command():
    from batchbench.drive.simlaunch import SimError, SimProcess

    command = [sys.executable, "-m", "batchbench", "sim", "--port", "not-a-port"]
    with pytest.raises(SimError) as caught:
        SimProcess(command).start(timeout=30.0)
    assert str(caught.value) == (
        f"the simulator did not start (exit status 2); command: {shlex.join(command)}"
    )


def test_pyproject_keeps_the_batchbench_agent_script():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["batchbench-agent"] == "batchbench.cli.agent:console_main"


def test_the_classifiers_name_the_pythons_ci_tests():
    """The Python versions in the classifiers are those CI runs the suite on: the oldest
    supported (requires-python's bound, the default python3) and the newest (3.13, the
    pure-twin pass of .ci/run)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    prefix = "Programming Language :: Python :: "
    versions = [c.removeprefix(prefix) for c in project["classifiers"] if c.startswith(prefix)]
    assert versions == ["3", "3 :: Only", "3.11", "3.13"]
    assert project["requires-python"] == ">=3.11"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "command -v python3.13" in ci and "/versions/3.13*/bin/python3.13" in ci
