"""The runnable examples of README.md and docs/*.md: find them, run them, compare, update.

An example is a shell block (```sh) right after a marker line the reader does not see,

    <!-- example -->                       or    <!-- example: timeout=30; lines=^Agents: -->

optionally followed (only blank lines between) by the output block it shows (``` or ```text).
The commands run with bash (``set -eo pipefail``) in a fresh temporary directory holding a
copy of the repository's ``examples/`` and its ``tests/fixtures`` (a link), with
``batchbench``, ``batchbench-agent`` and ``batchbench-export-plans`` on PATH running the
same package the tests import. A leading
``pip install ... &&`` on a line is not run (the package is installed already). Options,
separated by ``; ``:

- ``timeout=S``: seconds the block may take (default 60);
- ``status=N``: its expected exit status (default 0);
- ``stream=stdout|stderr|both``: what the output block shows (default stdout; ``both`` is
  stderr after stdout);
- ``lines=REGEX``: the output block shows only the lines that match REGEX (``re.search``),
  in their order: an excerpt that regenerates like a whole output;
- ``mark=NAME[,NAME]``: pytest marks of the example's test (``serial`` for one whose output
  depends on the client keeping up, such as a capacity search's verdicts).

Examples with the same commands run once per test process (and once per update).

The output shown and the real output are compared after masking what varies from run to run
(MASKS below: durations, latencies, rates, timestamps, ports, CPU figures, paths); token
counts, fidelity lines, agent counts, verdicts and capacity answers are compared exactly.
``tests/test_doc_examples.py`` runs every example as its own test item;

    python -m tests.doc_examples --update [FILE...] [-k TEXT]

runs them (in parallel, then those marked serial one by one) and rewrites every output block
with the real output, unmasked.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/*.md")
MARKER = re.compile(r"^\s*<!--\s*example(?::\s*(?P<options>.*?))?\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>[\w-]*)\s*$")
COMMAND_INFOS = ("sh", "bash", "shell", "console")
OUTPUT_INFOS = ("", "text")
DEFAULT_TIMEOUT = 60.0
OPTIONS = ("timeout", "status", "stream", "lines", "mark")
MARKS = ("serial", "slow")  # the project's markers (tests/conftest.py) an example may take
# A command line's leading `pip install ... &&`: the package under test is installed already.
PIP_PREFIX = re.compile(r"^\s*pip install [^&;|]*&&\s*")

# The console commands the docs use, as pyproject.toml's [project.scripts] declares them.
# Each runs under the guard pip's scripts have (worker processes import the main module).
SCRIPTS = {
    "batchbench": "from batchbench.cli.main import main as entry",
    "batchbench-agent": "from batchbench.cli.agent import console_main as entry",
    "batchbench-export-plans": "from batchbench.cli.export_plans import console_main as entry",
}

MASK = "<T>"
# What varies between two runs of the same command, in the order applied after the paths
# (the example's directory, site-packages and the checkout, in mask()); everything else is
# compared as shown. Keep each rule narrow: a count, a fidelity line, an agent count, a
# verdict or a capacity answer must never be masked.
MASKS: tuple[tuple[re.Pattern[str], str], ...] = (
    # the banner's content salt, drawn at random for every run (even with --seed)
    (re.compile(r"^(Content salt: )[0-9a-f]{16}$"), r"\1<SALT>"),
    # the simulator's (or any loopback server's) port, chosen free at run time
    (re.compile(r"(https?://(?:127\.0\.0\.1|localhost|\[::1\])):\d+"), r"\1:<PORT>"),
    # times on the benchmark clock written name_at_ms=N (a dry run's admitted_at_ms: when
    # the run got to admitting, after its own start-up)
    (re.compile(r"\b(\w+_at_ms)=\d+"), r"\1=" + MASK),
    # ISO 8601 timestamps (results, capacity documents, banners)
    (re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?"), MASK),
    # SLO attainment strictly between 0 and 100 %: the share of latencies that land within
    # the limit follows timing; 0.0 % and 100.0 % (all or none) stay compared.
    (re.compile(r"(attainment) (?!100\.0%|0\.0%)\d+(?:\.\d+)?%"), r"\1 <N>%"),
    # ... and its 95 % interval, which also follows the number of requests the window held
    # (one more or less as a request starts just before or after the window's end)
    (re.compile(r"(attainment (?:<N>|[\d.]+)% )\[[\d.]+, [\d.]+\]"), r"\1[<N>, <N>]"),
    # client CPU and its share of a core (client-health and client verdict lines)
    (re.compile(r"(client CPU )\d+(?:\.\d+)?s"), r"\1" + MASK + "s"),
    (re.compile(r"\b\d+(?:\.\d+)?%( of (?:one|a) core)"), MASK + r"%\1"),
    # percentiles and extremes written name=value (latency lines, event-loop lag)
    (re.compile(r"\b(p\d+(?:\.\d+)?|max|min|mean)=\d+(?:\.\d+)?(ms)?"), r"\1=" + MASK + r"\2"),
    # durations and latencies with their unit, but not a limit written after ≤ / ≥ / =
    (
        re.compile(r"(?<![≤≥=]\s)(?<![\w.=])-?\d+(?:\.\d+)?(\s?)(ms|s|µs)(?![\w/])"),
        MASK + r"\1\2",
    ),
    # rates
    (re.compile(r"\b\d+(?:\.\d+)?(\s)(tok/s|req/s|good req/s|per minute)"), MASK + r"\1\2"),
)
# Latency tables ("  Request latency   7  1019.79 ..."): the count stays, the figures go.
LATENCY_ROW = re.compile(
    r"^(\s+(?:TTFT|ITL|TPOT|Request latency|Agent end-to-end|E2E)\s+\d+)\s+\d.*$"
)
# Capacity search table: window, req/s, out tok/s, TTFT p50/p99, ITL p99 and E2E p95 are
# times and rates; cache hit is a share of the prompt tokens of the requests the window
# happened to hold (see the attainment interval above). Agents, goodput, client and verdict
# stay compared.
CAPACITY_ROW = re.compile(r"^\s*\d+\s{2,}\S")
CAPACITY_TIMED_COLUMNS = (1, 2, 3, 4, 5, 6, 7, 9)


@dataclass
class Example:
    """One marked shell block of a doc, and the output block after it (if any)."""

    doc: str  # relative to ROOT
    line: int  # 1-based line of the command block's opening fence
    commands: str
    options: dict[str, str]
    output: list[str] | None = None  # the output block's lines, indent removed
    output_span: tuple[int, int] | None = None  # 0-based [first, end) content lines
    indent: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def timeout(self) -> float:
        return float(self.options.get("timeout", DEFAULT_TIMEOUT))

    @property
    def status(self) -> int:
        return int(self.options.get("status", "0"))

    @property
    def marks(self) -> list[str]:
        return [m.strip() for m in self.options.get("mark", "").split(",") if m.strip()]


@dataclass
class Ran:
    status: int | None  # None: timed out
    stdout: str
    stderr: str
    seconds: float

    def shown(self, example: Example) -> list[str]:
        """The lines the example's output block should hold (unmasked)."""
        stream = example.options.get("stream", "stdout")
        text = {
            "stdout": self.stdout,
            "stderr": self.stderr,
            "both": self.stdout + self.stderr,
        }[stream]
        lines = text.splitlines()
        if "lines" in example.options:
            pattern = re.compile(example.options["lines"])
            lines = [line for line in lines if pattern.search(line)]
        return [line.rstrip() for line in lines]


def doc_files(root: Path = ROOT) -> list[Path]:
    files: list[Path] = []
    for pattern in DOCS:
        files.extend(sorted(root.glob(pattern)))
    return files


def parse_options(text: str | None) -> tuple[dict[str, str], list[str]]:
    options: dict[str, str] = {}
    problems: list[str] = []
    for part in (text or "").split("; "):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if key not in OPTIONS or not sep:
            problems.append(f"unknown example option {part!r} ({'=, '.join(OPTIONS)}=)")
            continue
        options[key] = value.strip()
    if options.get("stream", "stdout") not in ("stdout", "stderr", "both"):
        problems.append(f"stream={options['stream']}: expected stdout, stderr or both")
    for key in ("timeout", "status"):
        if key in options:
            try:
                float(options[key]) if key == "timeout" else int(options[key])
            except ValueError:
                problems.append(f"{key}={options[key]} is not a number")
    for mark in options.get("mark", "").split(","):
        if mark.strip() and mark.strip() not in MARKS:
            problems.append(f"mark={mark.strip()}: expected one of {', '.join(MARKS)}")
    if "lines" in options:
        try:
            re.compile(options["lines"])
        except re.error as error:
            problems.append(f"lines={options['lines']}: {error}")
    return options, problems


def _block(lines: Sequence[str], start: int) -> tuple[str, str, int] | None:
    """(indent, info, index of the closing fence) of the fenced block opening at ``start``."""
    opening = FENCE.match(lines[start])
    if opening is None:
        return None
    indent = opening["indent"]
    for end in range(start + 1, len(lines)):
        if lines[end].strip() == "```" and lines[end].startswith(indent):
            return indent, opening["info"], end
    return None


def _dedent(line: str, indent: str) -> str:
    return line[len(indent) :] if line.startswith(indent) else line.lstrip()


def _fenced_lines(lines: Sequence[str]) -> set[int]:
    """Indices of the lines inside fenced blocks (a marker shown in a block is no marker)."""
    inside: set[int] = set()
    fence = ""
    for index, line in enumerate(lines):
        ticks = re.match(r"^\s*(`{3,})", line)
        if fence:
            if ticks and line.strip() == ticks[1] and len(ticks[1]) >= len(fence):
                fence = ""
            else:
                inside.add(index)
        elif ticks:
            fence = ticks[1]
    return inside


def parse_doc(path: Path, root: Path = ROOT) -> list[Example]:
    lines = path.read_text(encoding="utf-8").splitlines()
    doc = path.relative_to(root).as_posix()
    examples = []
    fenced = _fenced_lines(lines)
    for index, line in enumerate(lines):
        marker = None if index in fenced else MARKER.match(line)
        if marker is None:
            continue
        options, problems = parse_options(marker["options"])
        at = index + 1
        while at < len(lines) and not lines[at].strip():
            at += 1
        block = _block(lines, at) if at < len(lines) else None
        if block is None or block[1] not in COMMAND_INFOS:
            examples.append(
                Example(doc, index + 1, "", options, problems=[
                    *problems, "the example marker is not followed by a ```sh block"
                ])
            )  # fmt: skip
            continue
        indent, _info, end = block
        commands = "\n".join(_dedent(body, indent) for body in lines[at + 1 : end])
        example = Example(doc, at + 1, commands, options, indent=indent, problems=problems)
        after = end + 1
        while after < len(lines) and not lines[after].strip():
            after += 1
        shown = _block(lines, after) if after < len(lines) else None
        if shown is not None and shown[1] in OUTPUT_INFOS:
            _indent, _info, close = shown
            example.output = [_dedent(body, indent) for body in lines[after + 1 : close]]
            example.output_span = (after + 1, close)
        elif "lines" in options or "stream" in options:
            example.problems.append("the example has output options but no output block")
        examples.append(example)
    return examples


def find_examples(files: Iterable[Path] | None = None, root: Path = ROOT) -> list[Example]:
    found = []
    for path in doc_files(root) if files is None else files:
        found.extend(parse_doc(Path(path).resolve(), root))
    return found


def mask(lines: Iterable[str], work: str | None = None) -> list[str]:
    """The lines with what varies from run to run replaced by placeholders (MASKS)."""
    prefixes = {sysconfig.get_paths()["purelib"]: "<SITE-PACKAGES>", str(ROOT): "<CHECKOUT>"}
    if work:
        prefixes[work] = "<WORK>"
    masked = []
    in_capacity_table = False
    for line in lines:
        for prefix, placeholder in prefixes.items():
            line = line.replace(prefix, placeholder)
        if line.startswith("agents ") and line.rstrip().endswith("verdict"):
            in_capacity_table = True
        elif in_capacity_table and CAPACITY_ROW.match(line):
            cells = re.split(r"\s{2,}", line.strip())
            line = "  ".join(
                MASK if index in CAPACITY_TIMED_COLUMNS else cell
                for index, cell in enumerate(cells)
            )
        else:
            in_capacity_table = False
        line = LATENCY_ROW.sub(r"\1 " + MASK, line)
        for pattern, replacement in MASKS:
            line = pattern.sub(replacement, line)
        # column widths follow the masked values
        masked.append(re.sub(r" {2,}", "  ", line).rstrip())
    return masked


def _package_parent() -> str:
    """The directory the tests import batchbench from: the commands run that package."""
    import batchbench

    return str(Path(batchbench.__file__).resolve().parent.parent)


def _bin_dir(base: Path) -> Path:
    bin_dir = base / "bin"
    bin_dir.mkdir()
    for name, body in SCRIPTS.items():
        script = bin_dir / name
        script.write_text(
            f"#!{sys.executable}\nimport sys\n{body}\n\n"
            "if __name__ == '__main__':\n    sys.exit(entry())\n",
            encoding="utf-8",
        )
        script.chmod(0o755)
    return bin_dir


def script_of(example: Example) -> str:
    return "\n".join(PIP_PREFIX.sub("", line) for line in example.commands.splitlines())


_RUNS: dict[tuple[str, str, float], tuple[Ran, str]] = {}
_KEY_LOCKS: dict[tuple[str, str, float], threading.Lock] = {}
_RUNS_LOCK = threading.Lock()


def run(example: Example, root: Path = ROOT) -> tuple[Ran, str]:
    """(what happened, the directory it ran in) of the example's commands, run once per
    process: examples with the same commands (one shown in README.md and in a docs page)
    share the run."""
    key = (str(root), script_of(example), example.timeout)
    with _RUNS_LOCK:
        lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    with lock:
        if key not in _RUNS:
            _RUNS[key] = run_once(example, root)
        return _RUNS[key]


def run_once(example: Example, root: Path = ROOT) -> tuple[Ran, str]:
    """Run the example in a fresh directory; (what happened, the directory's path)."""
    base = Path(tempfile.mkdtemp(prefix="batchbench-doc-example-"))
    work = base / "work"
    work.mkdir()
    if (root / "examples").is_dir():
        shutil.copytree(root / "examples", work / "examples")
    fixtures = root / "tests" / "fixtures"  # the traces an import example may read
    if fixtures.is_dir():
        (work / "tests").mkdir()
        (work / "tests" / "fixtures").symlink_to(fixtures, target_is_directory=True)
    env = dict(os.environ)
    env["PATH"] = f"{_bin_dir(base)}{os.pathsep}{env.get('PATH', '')}"
    parent = _package_parent()
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (parent, env.get("PYTHONPATH", "")) if p
    )  # fmt: skip
    env.pop("COLUMNS", None)
    began = time.monotonic()
    # its own process group, so that a timeout stops the commands and what they started
    process = subprocess.Popen(
        ["bash", "-c", "set -eo pipefail\n" + script_of(example)],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=example.timeout)
        ran = Ran(process.returncode, stdout, stderr, time.monotonic() - began)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # it ended in between
            os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        ran = Ran(None, stdout, stderr, time.monotonic() - began)
    shutil.rmtree(base, ignore_errors=True)
    return ran, str(work)


def check(example: Example, ran: Ran, work: str) -> str | None:
    """None when the example ran as its doc shows; else a readable report naming the doc
    file and line."""
    where = f"{example.doc}:{example.line}"
    if example.problems:
        return f"{where}: " + "; ".join(example.problems)
    if ran.status is None:
        return (
            f"{where}: the example did not finish within {example.timeout:g} s "
            f"(raise timeout= in its marker or shorten it)\n{_tail(ran)}"
        )
    if ran.status != example.status:
        return (
            f"{where}: the example exited with status {ran.status}, "
            f"expected {example.status}\n{_tail(ran)}"
        )
    if example.output is None or example.output_span is None:
        return None
    if not ran.shown(example):
        return f"{where}: the example printed no line for its output block to show"
    expected = mask(example.output, work)
    actual = mask(ran.shown(example), work)
    if expected == actual:
        return None
    first = example.output_span[0] + 1  # 1-based line of the output block's first line
    diff = difflib.unified_diff(
        expected,
        actual,
        fromfile=f"{example.doc}:{first} (shown, masked)",
        tofile="real output (masked)",
        lineterm="",
    )
    return (
        f"{where}: the output shown at {example.doc}:{first} differs from the real output "
        f"(regenerate: python -m tests.doc_examples --update {example.doc})\n" + "\n".join(diff)
    )


def _tail(ran: Ran, lines: int = 20) -> str:
    out = "\n".join(ran.stdout.splitlines()[-lines:])
    err = "\n".join(ran.stderr.splitlines()[-lines:])
    return f"--- stdout (end)\n{out}\n--- stderr (end)\n{err}"


def update(
    files: Sequence[str], keyword: str | None = None, jobs: int = 4, root: Path = ROOT
) -> int:
    """Run the chosen examples and rewrite their output blocks; the exit status is 1 when an
    example failed to run as its marker says (its block is left as it was)."""
    paths = [Path(f).resolve() for f in files] if files else None
    examples = [
        e
        for e in find_examples(paths, root)
        if keyword is None or keyword in f"{e.id} {e.commands}"
    ]
    # as the tests run them: the parallel ones together, then the serial ones one by one
    parallel = [e for e in examples if "serial" not in e.marks]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        done = dict(zip(map(id, parallel), pool.map(lambda e: run(e, root), parallel), strict=True))
    done.update((id(e), run(e, root)) for e in examples if "serial" in e.marks)
    results = [done[id(e)] for e in examples]
    failed = 0
    rewrites: dict[str, list[tuple[Example, list[str]]]] = {}
    for example, (ran, work) in zip(examples, results, strict=True):
        problem = None
        if example.problems or ran.status != example.status or not ran.shown(example):
            problem = check(example, ran, work)
        if problem is not None:
            failed += 1
            print(f"FAILED {problem}", file=sys.stderr)
            continue
        print(f"ran {example.id} in {ran.seconds:.1f} s", file=sys.stderr)
        if example.output_span is not None:
            rewrites.setdefault(example.doc, []).append((example, ran.shown(example)))
    for doc, changes in rewrites.items():
        path = root / doc
        lines = path.read_text(encoding="utf-8").splitlines()
        # from the bottom up, so the earlier spans stay where they are
        for example, shown in sorted(changes, key=lambda c: -c[0].line):
            assert example.output_span is not None
            first, end = example.output_span
            lines[first:end] = [f"{example.indent}{line}".rstrip() for line in shown]
        text = "\n".join(lines) + "\n"
        if text != path.read_text(encoding="utf-8"):
            path.write_text(text, encoding="utf-8")
            print(f"updated {doc}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.doc_examples",
        description="List, or run and regenerate the shown output of, the marked examples "
        "of README.md and docs/*.md.",
    )
    parser.add_argument("files", nargs="*", help="docs to look in (default: all)")
    parser.add_argument("--update", action="store_true", help="rewrite the output blocks")
    parser.add_argument("-k", dest="keyword", help="only examples whose place or text has it")
    parser.add_argument("-j", "--jobs", type=int, default=4, help="examples run at once (4)")
    args = parser.parse_args(argv)
    if not args.update:
        paths = [Path(f).resolve() for f in args.files] if args.files else None
        for example in find_examples(paths):
            if args.keyword is None or args.keyword in f"{example.id} {example.commands}":
                print(example.id, example.commands.splitlines()[0] if example.commands else "")
        return 0
    return update(args.files, args.keyword, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
