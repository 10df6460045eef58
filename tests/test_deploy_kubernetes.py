"""deploy/kubernetes: the manifests parse, their fields fit together, and every command line
in them is one batchbench's own parsers accept (and, as a dry run, one that works).

The manifests are not applied to a cluster here. Two kinds of placeholder are filled in
as a deployment fills them: ``${NAME}`` (envsubst, before kubectl apply) and ``$(NAME)``
(Kubernetes, from the container's environment, JOB_COMPLETION_INDEX being the pod's index).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from batchbench.cli import main as cli_main
from batchbench.cli import merge as cli_merge
from batchbench.cli.agent import run_console
from batchbench.cli.agent_args import build_parser, config_from_argv, parse_agent_args
from batchbench.scale.partition import Shard
from batchbench.text.tokenizer import builtin_tokenizer_path

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"
# In the past: a dry run waits for --start-at like a live one, and starts at once.
START_AT = "2025-06-01T12:00:00Z"
ENVSUBST = {"IMAGE": "registry.example.com/batchbench:test", "START_AT": START_AT}
RESULTS_CLAIM = "batchbench-results"
SHARD_RESULTS = "/results/shard-$(JOB_COMPLETION_INDEX)/results.json"


# --- reading the manifests -------------------------------------------------------------


def manifest_files() -> list[Path]:
    return sorted(p for p in DEPLOY.iterdir() if p.suffix in (".yaml", ".yml"))


def documents() -> list[tuple[str, dict]]:
    docs = []
    for path in manifest_files():
        with path.open(encoding="utf-8") as handle:
            docs.extend((path.name, doc) for doc in yaml.safe_load_all(handle) if doc is not None)
    return docs


def the(kind: str, name: str) -> dict:
    found = [doc for _, doc in documents() if doc["kind"] == kind]
    found = [doc for doc in found if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def replicated_job(name: str) -> dict:
    jobset = the("JobSet", "batchbench")
    (rjob,) = [r for r in jobset["spec"]["replicatedJobs"] if r["name"] == name]
    return rjob


def shard_job_specs() -> list[tuple[str, dict]]:
    """(where, Job spec) of the shards: the Indexed Job and the JobSet's replicatedJob."""
    return [
        ("job.yaml", the("Job", "batchbench-shards")["spec"]),
        ("jobset.yaml", replicated_job("shards")["template"]["spec"]),
    ]


def merge_job_specs() -> list[tuple[str, dict]]:
    return [
        ("merge-job.yaml", the("Job", "batchbench-merge")["spec"]),
        ("jobset.yaml", replicated_job("merge")["template"]["spec"]),
    ]


def all_job_specs() -> list[tuple[str, dict]]:
    return shard_job_specs() + merge_job_specs()


def container(job_spec: dict, program: str) -> dict:
    """The one container of the pod whose command starts with ``program``."""
    pod = job_spec["template"]["spec"]
    found = [c for c in pod["containers"] if c["command"][0] == program]
    assert len(found) == 1, f"expected one {program} container, found {len(found)}"
    return found[0]


def envsubst(text: str) -> str:
    """``envsubst '$IMAGE $START_AT'``: only the named placeholders, all of them known."""

    def value(match: re.Match) -> str:
        assert match.group(1) in ENVSUBST, f"unknown placeholder {match.group(0)} in {text!r}"
        return ENVSUBST[match.group(1)]

    return re.sub(r"\$\{(\w+)\}", value, text)


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(NAME) expansion in command and args (an unknown name stays as is)."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def literal_env(spec: dict, index: int | None) -> dict[str, str]:
    """The environment Kubernetes expands $(NAME) from: the literal env values (after
    envsubst) and, in an Indexed Job's pod, JOB_COMPLETION_INDEX."""
    env = {e["name"]: envsubst(e["value"]) for e in spec.get("env", []) if "value" in e}
    if index is not None:
        env["JOB_COMPLETION_INDEX"] = str(index)
    return env


def argv(spec: dict, index: int | None = None) -> list[str]:
    """The container's command line after the program name, as the pod runs it."""
    env = literal_env(spec, index)
    words = list(spec["command"][1:]) + list(spec.get("args", []))
    return [expand(envsubst(str(word)), env) for word in words]


def flag_value(words: list[str], flag: str) -> str:
    """The value after ``flag`` (given once)."""
    positions = [i for i, word in enumerate(words) if word == flag]
    assert len(positions) == 1, f"{flag} given {len(positions)} times in {words}"
    return words[positions[0] + 1]


def shard_count(job_spec: dict) -> int:
    shard = flag_value(container(job_spec, "batchbench-agent")["args"], "--shard")
    match = re.fullmatch(r"JOB_COMPLETION_INDEX/(\d+)", shard)
    assert match, f"--shard {shard} does not read JOB_COMPLETION_INDEX"
    return int(match.group(1))


def mounts(spec: dict) -> dict[str, str]:
    """mountPath -> volume name of a container."""
    return {m["mountPath"]: m["name"] for m in spec.get("volumeMounts", [])}


def volumes(job_spec: dict) -> dict[str, dict]:
    return {v["name"]: v for v in job_spec["template"]["spec"].get("volumes", [])}


def mount_of(spec: dict, path: str) -> str:
    """The mountPath a container path lies under (the longest one)."""
    found = [m for m in mounts(spec) if path == m or path.startswith(m.rstrip("/") + "/")]
    assert found, f"{path} is on no volume of container {spec['name']}"
    return max(found, key=len)


def option_strings(parser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


def flags(words: list[str]) -> list[str]:
    return [word.split("=", 1)[0] for word in words if word.startswith("-")]


# --- the files -------------------------------------------------------------------------


def test_every_manifest_parses_and_is_one_of_the_expected_objects():
    names = [path.name for path in manifest_files()]
    assert names == ["job.yaml", "jobset.yaml", "merge-job.yaml", "pvc.yaml"]
    found = sorted((f, d["apiVersion"], d["kind"], d["metadata"]["name"]) for f, d in documents())
    assert found == [
        ("job.yaml", "batch/v1", "Job", "batchbench-shards"),
        ("jobset.yaml", "jobset.x-k8s.io/v1alpha2", "JobSet", "batchbench"),
        ("merge-job.yaml", "batch/v1", "Job", "batchbench-merge"),
        ("pvc.yaml", "v1", "PersistentVolumeClaim", RESULTS_CLAIM),
    ]
    for path in manifest_files():
        text = path.read_text(encoding="utf-8")
        assert set(re.findall(r"\$\{(\w+)\}", text)) <= set(ENVSUBST), path.name


def test_the_deploy_directory_has_its_image_and_readme():
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert "python:3.11-slim" in dockerfile
    assert re.search(r"apt-get install .*\bgcc\b", dockerfile)
    assert 'pip install "/src[${EXTRAS}]"' in dockerfile
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").split("\n")
    assert "*" in ignore and "**/*.so" in ignore  # no locally built extension leaks in
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    for needed in ("envsubst '$IMAGE $START_AT'", "kubectl cp", "kubectl create configmap"):
        assert needed in readme


def test_the_results_claim_is_read_write_many():
    pvc = the("PersistentVolumeClaim", RESULTS_CLAIM)
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    for where, spec in all_job_specs():
        claims = [
            v["persistentVolumeClaim"]["claimName"]
            for v in volumes(spec).values()
            if "persistentVolumeClaim" in v
        ]
        assert claims == [RESULTS_CLAIM], where


# --- the shards ------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["job.yaml", "jobset.yaml"])
def test_shards_are_one_indexed_job_with_one_pod_per_shard(where):
    spec = dict(shard_job_specs())[where]
    n = shard_count(spec)
    assert n == 8
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == n
    assert spec["parallelism"] == n
    agent = container(spec, "batchbench-agent")
    assert flag_value(agent["args"], "--shard") == f"JOB_COMPLETION_INDEX/{n}"
    # A restarted shard would replay from the start: no retry, no in-place restart.
    assert spec["backoffLimit"] == 0
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    # The index is the Job controller's, never set by hand.
    assert "JOB_COMPLETION_INDEX" not in {e["name"] for e in agent.get("env", [])}


@pytest.mark.parametrize("where", ["job.yaml", "jobset.yaml"])
def test_each_shard_writes_its_results_on_the_shared_volume(where):
    spec = dict(shard_job_specs())[where]
    agent = container(spec, "batchbench-agent")
    results = flag_value(agent["args"], "--results-json")
    assert results == SHARD_RESULTS
    mount = mount_of(agent, results)
    assert mount == "/results"
    volume = volumes(spec)[mounts(agent)[mount]]
    assert volume["persistentVolumeClaim"] == {"claimName": RESULTS_CLAIM}
    # merge reads the events files from the results JSON's directory.
    folder = posixpath.dirname(results)
    for flag in ("--agent-events-jsonl", "--request-events-jsonl"):
        assert posixpath.dirname(flag_value(agent["args"], flag)) == folder
    # --results-json needs an existing directory: the init container creates exactly it,
    # on the same volume at the same path.
    (init,) = spec["template"]["spec"]["initContainers"]
    assert init["command"] == ["mkdir", "-p", folder]
    assert mounts(init) == {"/results": mounts(agent)["/results"]}
    for index in (0, 7):
        assert argv(init, index)[-1] == f"/results/shard-{index}"
        assert flag_value(argv(agent, index), "--results-json") == (
            f"/results/shard-{index}/results.json"
        )


@pytest.mark.parametrize("where", ["job.yaml", "jobset.yaml"])
def test_shards_start_together_at_the_placeholder_time(where):
    agent = container(dict(shard_job_specs())[where], "batchbench-agent")
    env = {e["name"]: e for e in agent["env"]}
    assert env["START_AT"] == {"name": "START_AT", "value": "${START_AT}"}
    assert flag_value(agent["args"], "--start-at") == "$(START_AT)"
    words = argv(agent, 3)
    assert flag_value(words, "--start-at") == START_AT
    # Same seed and salt in every shard: one run's content.
    assert flag_value(words, "--seed") == "42"
    assert flag_value(words, "--content-salt") == f"run-{START_AT}"
    assert argv(agent, 0) == [w.replace("shard-3", "shard-0") for w in words]


@pytest.mark.parametrize("where", ["job.yaml", "jobset.yaml"])
def test_the_api_key_comes_from_a_secret(where):
    agent = container(dict(shard_job_specs())[where], "batchbench-agent")
    assert "--api-key" not in flags(agent["args"])
    name = flag_value(agent["args"], "--api-key-env")
    assert name == "OPENAI_API_KEY"
    (entry,) = [e for e in agent["env"] if e["name"] == name]
    assert entry == {
        "name": name,
        "valueFrom": {"secretKeyRef": {"name": "batchbench-api-key", "key": "api-key"}},
    }
    for _, spec in all_job_specs():
        for c in spec["template"]["spec"]["containers"]:
            for e in c.get("env", []):
                if re.search(r"KEY|TOKEN|SECRET|PASSWORD", e["name"]):
                    assert "value" not in e, e["name"]
    assert "Secret" not in {doc["kind"] for _, doc in documents()}


@pytest.mark.parametrize("where", ["job.yaml", "jobset.yaml"])
def test_shards_spread_over_nodes_with_a_core_each(where):
    spec = dict(shard_job_specs())[where]
    pod = spec["template"]["spec"]
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["maxSkew"] == 1
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    labels = spec["template"]["metadata"]["labels"]
    assert spread["labelSelector"]["matchLabels"].items() <= labels.items()
    assert labels["app.kubernetes.io/component"] == "shard"
    resources = container(spec, "batchbench-agent")["resources"]
    assert resources == {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"cpu": "2", "memory": "4Gi"},
    }
    assert "--workers" not in flags(container(spec, "batchbench-agent")["args"])


@pytest.mark.parametrize("where", ["job.yaml", "jobset.yaml"])
def test_the_workload_files_come_from_the_configmap(where):
    spec = dict(shard_job_specs())[where]
    agent = container(spec, "batchbench-agent")
    for flag, key in (
        ("--agent-plans-jsonl", "manifest.jsonl"),
        ("--tokenizer-model", "tokenizer.json"),
    ):
        path = flag_value(agent["args"], flag)
        mount = mount_of(agent, path)
        assert path == f"{mount}/{key}"
        assert volumes(spec)[mounts(agent)[mount]]["configMap"] == {"name": "batchbench-workload"}


# --- the merge -------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["merge-job.yaml", "jobset.yaml"])
def test_the_merge_reads_exactly_the_results_the_shards_write(where):
    spec = dict(merge_job_specs())[where]
    shards = dict(shard_job_specs())["job.yaml" if where == "merge-job.yaml" else where]
    n = shard_count(shards)
    agent = container(shards, "batchbench-agent")
    written = [flag_value(argv(agent, i), "--results-json") for i in range(n)]
    merge = container(spec, "batchbench")
    assert merge["command"] == ["batchbench", "merge"]
    words = argv(merge)
    assert words[0] == "merge"
    args = cli_merge.build_parser("batchbench merge").parse_args(words[1:])
    assert args.results == written
    assert args.output_dir == "/results/merged"
    assert mounts(merge) == {"/results": "results"}
    assert volumes(spec)["results"]["persistentVolumeClaim"] == {"claimName": RESULTS_CLAIM}
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["completions"] == spec["parallelism"] == 1


def test_the_jobset_runs_the_shards_then_the_merge():
    jobset = the("JobSet", "batchbench")
    rjobs = jobset["spec"]["replicatedJobs"]
    assert [r["name"] for r in rjobs] == ["shards", "merge"]
    assert [r["replicas"] for r in rjobs] == [1, 1]
    assert "dependsOn" not in rjobs[0]
    assert rjobs[1]["dependsOn"] == [{"name": "shards", "status": "Complete"}]
    assert "startupPolicy" not in jobset["spec"]  # exclusive with dependsOn
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 0}
    assert jobset["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["merge"]}
    # The JobSet runs the very Jobs of job.yaml and merge-job.yaml.
    assert rjobs[0]["template"]["spec"] == the("Job", "batchbench-shards")["spec"]
    assert rjobs[1]["template"]["spec"] == the("Job", "batchbench-merge")["spec"]


# --- the command lines against the real parsers ----------------------------------------


def command_lines() -> list[tuple[str, str, list[str]]]:
    """(where, program, words) of every batchbench container in the manifests."""
    lines = []
    for where, spec in all_job_specs():
        pod = spec["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            program = c["command"][0]
            if program.startswith("batchbench"):
                lines.append((where, program, argv(c, 0)))
    return lines


def test_every_flag_is_an_option_of_the_real_parsers(monkeypatch):
    lines = command_lines()
    assert sorted(
        {(program, words[0] if program == "batchbench" else "") for _, program, words in lines}
    ) == [
        ("batchbench", "merge"),
        ("batchbench-agent", ""),
    ]
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "0")
    for where, program, words in lines:
        if program == "batchbench-agent":
            known = option_strings(build_parser())
            unknown = [f for f in flags(words) if f not in known]
            assert not unknown, f"{where}: batchbench-agent does not accept {unknown}"
            assert parse_agent_args(words) is not None
        else:
            command, rest = words[0], words[1:]
            assert command in cli_main.COMMANDS
            parser = cli_merge.build_parser(f"batchbench {command}")
            unknown = [f for f in flags(rest) if f not in option_strings(parser)]
            assert not unknown, f"{where}: batchbench {command} does not accept {unknown}"
            parser.parse_args(rest)


def localize(words: list[str], spec: dict, root: Path) -> list[str]:
    """The container's paths moved under ``root`` (each volume a directory there)."""
    moved = []
    for word in words:
        if word.startswith("/"):
            mount = mount_of(spec, word)
            word = str(root / mounts(spec)[mount]) + word[len(mount) :]
        moved.append(word)
    return moved


def write_workload(root: Path, trajectories: int) -> None:
    workload = root / "workload"
    workload.mkdir(parents=True)
    with (workload / "manifest.jsonl").open("w", encoding="utf-8") as handle:
        for i in range(trajectories):
            requests = [{"prompt_tokens": 64 + 32 * turn, "output_tokens": 16} for turn in range(2)]
            line = {"schema_version": 1, "trajectory_id": f"t{i}", "requests": requests}
            handle.write(json.dumps(line) + "\n")
    tokenizer = builtin_tokenizer_path("deepseek-v3")
    assert tokenizer is not None, "the deepseek-v3 tokenizer ships with a dependency"
    os.symlink(tokenizer, workload / "tokenizer.json")


@pytest.mark.parametrize("where", ["job.yaml", "jobset.yaml"])
def test_every_shard_command_line_is_a_valid_shard_run(where, tmp_path, monkeypatch):
    spec = dict(shard_job_specs())[where]
    agent = container(spec, "batchbench-agent")
    (init,) = spec["template"]["spec"]["initContainers"]
    write_workload(tmp_path, 16)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    n = shard_count(spec)
    for index in range(n):
        monkeypatch.setenv("JOB_COMPLETION_INDEX", str(index))
        made = localize(argv(init, index), init, tmp_path)
        assert made[:1] == ["-p"]
        os.makedirs(made[1], exist_ok=True)
        config = config_from_argv(localize(argv(agent, index), agent, tmp_path))
        assert config.shard_spec() == Shard(index, n)
        assert config.start_at == datetime(2025, 6, 1, 12, 0, tzinfo=UTC).timestamp()
        assert config.results_json == str(tmp_path / "results" / f"shard-{index}" / "results.json")
        assert config.max_active_agents == 256
        assert config.api_key_env == "OPENAI_API_KEY"


@pytest.mark.slow
@pytest.mark.native_pass_only  # 8 dry runs and a merge: the pure pass adds nothing here
def test_the_shards_and_the_merge_run_as_a_dry_run(tmp_path, monkeypatch, capsys):
    """All 8 shard command lines of job.yaml as dry runs on local directories, then the
    merge command line of merge-job.yaml: one run's outputs come out."""
    spec = the("Job", "batchbench-shards")["spec"]
    agent = container(spec, "batchbench-agent")
    (init,) = spec["template"]["spec"]["initContainers"]
    write_workload(tmp_path, 24)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    n = shard_count(spec)
    for index in range(n):
        monkeypatch.setenv("JOB_COMPLETION_INDEX", str(index))
        os.makedirs(localize(argv(init, index), init, tmp_path)[1], exist_ok=True)
        words = localize(argv(agent, index), agent, tmp_path)
        assert run_console([*words, "--dry-run"], "batchbench-agent") == 0, capsys.readouterr().err
    capsys.readouterr()
    merge = container(the("Job", "batchbench-merge")["spec"], "batchbench")
    status = cli_main.run(localize(argv(merge), merge, tmp_path))
    out, err = capsys.readouterr()
    assert status == 0, err
    assert f"Merged {n} shards of 24 trajectories" in out
    merged = tmp_path / "results" / "merged"
    for name in ("results.json", "results.csv", "agent-events.jsonl", "report.html"):
        assert (merged / name).is_file(), name
