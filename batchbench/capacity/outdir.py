"""The capacity search's output directory: every step's results JSON (``step-0008.json``)
and ``capacity.json``, rewritten after every step so that an interrupted search keeps what
it measured, and read back so that the same command resumes where it stopped.

A directory is only resumed by the same search: the options that shape the workload, the
target, the objectives and the warm-up must equal the recorded ones, or the search refuses
with one line naming what differs (``--restart`` discards the old steps instead). The
bounds and the window may change: a decided step's verdict holds whichever caps the search
tries and however long the window that decided it was, so those steps are kept; with
another window, unresolved steps are measured again (that is how "measure longer" is done).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from typing import Any

import orjson

from batchbench.capacity.document import CapacityView, step_window
from batchbench.capacity.rejudge import rejudged_window
from batchbench.capacity.search import (
    CLIENT_BOUND,
    FAIL,
    MEASURED,
    OUT_OF_TIME,
    PASS,
    UNRESOLVED,
    StepRecord,
)
from batchbench.config import OUTPUT_OPTIONS, toml_value
from batchbench.errors import BatchbenchError, UsageError
from batchbench.results.slo import Objective

CAPACITY_FILE = "capacity.json"
_STEP_FILE = re.compile(r"^step-[0-9]{4,}(?:\.partial)?(?:\.json|\.config\.toml)$")

# Options that change neither what is sent nor how it is judged: outputs, the console, and
# figures reported but not judged. Everything else must match to resume.
NOT_COMPARED = frozenset(
    {
        *OUTPUT_OPTIONS,
        "no-progress",
        "verbose",
        "grace-seconds",
        "percentiles",
        "server-metrics",
        "server-metrics-interval",
        # set by the search for each step (compared as the "search" settings instead)
        "warmup",
        "duration",
        "window-trajectories",
        "max-active-agents",
    }
)
# The search settings that may change on resume; the warm-up may not: it decides which
# requests a window holds (what is measured), where the window's length only decides how
# many of them (how sure the verdict is).
RESUMABLE = frozenset(
    {
        "min_agents",
        "max_agents",
        "resolution",
        "window_seconds",
        "window_trajectories",
        "max_extensions",
        "sweep",
    }
)
WINDOW_SETTINGS = ("window_seconds", "window_trajectories")
SEARCH_FLAGS = {
    "min_agents": "--min-agents",
    "max_agents": "--max-agents",
    "resolution": "--resolution",
    "warmup_seconds": "--warmup",
    "window_seconds": "--window",
    "window_trajectories": "--window-trajectories",
    "max_extensions": "--max-extensions",
    "sweep": "--sweep",
}


def step_file(agents: int) -> str:
    """``step-0008.json``: the step's results JSON inside the output directory."""
    return f"step-{agents:04d}.json"


def partial_file(agents: int) -> str:
    """Where a step writes while it runs; renamed to ``step_file`` once it finished."""
    return f"step-{agents:04d}.partial.json"


def compared(options: Mapping[str, Any]) -> dict[str, Any]:
    return {
        name: value for name, value in current_names(options).items() if name not in NOT_COMPARED
    }


def older_defaults(options: Mapping[str, Any]) -> bool:
    """Options recorded before streaming and calibration became the defaults (they say
    ``stream`` and ``calibrate``, true or false)."""
    return "stream" in options and "no-stream" not in options


def current_names(options: Mapping[str, Any]) -> dict[str, Any]:
    """Recorded options in today's terms: an older search's ``stream = false`` is
    ``no-stream = true``, and its ``calibrate = false`` (no calibration then) is
    ``no-calibrate = true``; so the same search compares equal to itself."""
    if not older_defaults(options):
        return dict(options)
    current = {k: v for k, v in options.items() if k not in ("stream", "calibrate")}
    current["no-stream"] = not options["stream"]
    if options.get("calibrate"):
        current["calibrate"] = True
    else:
        current["no-calibrate"] = True
    return current


def differences(
    recorded: Mapping[str, Any], current: Mapping[str, Any], flags: Mapping[str, str] | None = None
) -> list[str]:
    """``--max-agents was 64, now 128`` for every key whose value differs."""
    found = []
    for key in sorted(set(recorded) | set(current), key=lambda k: (k not in current, k)):
        before, after = recorded.get(key), current.get(key)
        if before == after:
            continue
        flag = (flags or {}).get(key, f"--{key}")
        found.append(f"{flag} was {_shown(before)}, now {_shown(after)}")
    return found


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value == int(value):
        return str(int(value))
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


class OutputDirectory:
    """One search's directory. ``open`` checks it and returns the steps an earlier run of
    the same search finished; ``write`` replaces ``capacity.json`` atomically."""

    def __init__(
        self,
        path: str,
        configuration: Mapping[str, Any],
        search: Mapping[str, Any],
        manifest_sha256: str | None = None,
        restart: bool = False,
        objectives: tuple[Objective, ...] = (),
        goodput_thresholds: tuple[tuple[str, float], ...] = (),
    ) -> None:
        self.path = path
        # the objectives and goodput thresholds a stored step is re-judged against when the
        # recorded --slo differs
        self.objectives = objectives
        self.goodput_thresholds = goodput_thresholds
        self.slo_changed: str | None = None  # "--slo was X, now Y"
        self.rejudged = 0  # stored steps judged against the new --slo, not run again
        self.remeasured: list[int] = []  # stored steps that could not be, measured again
        self.configuration = dict(configuration)
        self.search = dict(search)
        self.manifest_sha256 = manifest_sha256
        self.restart = restart
        self.changed: list[str] = []  # the resumable settings that differ, as text
        self.window_changed = False  # unresolved steps are then measured again

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def open(self) -> dict[int, StepRecord]:
        """Create the directory, or check an earlier search in it; returns its finished
        steps by agents (client-bound steps are measured again: they judged the client)."""
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise UsageError(f"--output-dir {self.path} is a file; give a directory")
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as exc:
            raise UsageError(
                f"--output-dir {self.path} cannot be created: {exc.strerror or exc}"
            ) from None
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise UsageError(f"--output-dir {self.path} cannot be written (permission denied)")
        if self.restart:
            self._discard()
            return {}
        document = self._read_capacity()
        if document is None:
            return {}
        self._check_same_search(document)
        return self._finished_steps(document)

    def _read_capacity(self) -> CapacityView | None:
        path = self.file(CAPACITY_FILE)
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
        try:
            document = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise UsageError(
                f"{path} is not JSON ({exc}); add --restart to start the search again"
            ) from None
        if not CapacityView.is_capacity(document):
            raise UsageError(
                f"{path} is not a capacity document; add --restart to start the search again"
            )
        return CapacityView.read(document)

    def _check_same_search(self, document: CapacityView) -> None:
        recorded_options = document.configuration
        recorded_search = document.search
        if recorded_options is None or recorded_search is None:
            raise UsageError(
                f"{self.file(CAPACITY_FILE)} has no configuration or search section; add "
                "--restart to start the search again"
            )
        before, after = compared(recorded_options), compared(self.configuration)
        if before.get("slo") != after.get("slo"):  # re-judged from the stored results
            self.slo_changed = differences({"slo": before.get("slo")}, {"slo": after.get("slo")})[0]
            before.pop("slo", None)
            after.pop("slo", None)
        found = differences(before, after)
        fixed = [k for k in set(recorded_search) | set(self.search) if k not in RESUMABLE]
        found += differences(
            {k: recorded_search.get(k) for k in fixed},
            {k: self.search.get(k) for k in fixed},
            SEARCH_FLAGS,
        )
        recorded_sha = document.manifest_sha256
        if self.manifest_sha256 is not None and recorded_sha not in (None, self.manifest_sha256):
            found.append("the manifest's contents changed (SHA-256)")
        if found:
            hint = ""
            if older_defaults(recorded_options) and any(
                text.startswith(("--no-stream", "--no-calibrate")) for text in found
            ):
                hint = (
                    " (it was measured before streamed replies and calibration became the "
                    "defaults: add --no-stream and --no-calibrate as it ran to resume it)"
                )
            raise UsageError(
                f"--output-dir {self.path} holds a search with other options ("
                + "; ".join(found)
                + f"){hint}: run with the same options, add --restart to discard it, or give "
                "another --output-dir"
            )
        self.changed = differences(
            {k: recorded_search.get(k) for k in RESUMABLE},
            {k: self.search.get(k) for k in RESUMABLE},
            SEARCH_FLAGS,
        )
        self.window_changed = any(
            recorded_search.get(k) != self.search.get(k) for k in WINDOW_SETTINGS
        )

    def _finished_steps(self, document: CapacityView) -> dict[int, StepRecord]:
        steps: dict[int, StepRecord] = {}
        for entry in document.steps:
            try:
                record = StepRecord.from_dict(entry)
            except ValueError:
                continue
            if record.verdict == CLIENT_BOUND or record.results_json != step_file(record.agents):
                continue
            if record.note == OUT_OF_TIME:
                continue  # --max-time stopped it: a part of a step, measured again
            document = self._step_document(record.results_json)
            window = step_window(document)
            if window is None:  # its results are gone: measure it again
                continue
            if self.slo_changed is not None:
                rejudged = self._rejudge(record, document)
                if rejudged is None:
                    self.remeasured.append(record.agents)
                    continue
                window = rejudged
            elif isinstance(record.window, dict) and isinstance(record.window.get("slo"), list):
                # the outcomes the step was last judged with: the results JSON keeps those it
                # was measured with, which an earlier resume with another --slo replaced
                window = {
                    **window,
                    "slo": record.window["slo"],
                    "slo_verdict": record.window.get("slo_verdict"),
                }
            if record.verdict == UNRESOLVED and self.window_changed:
                continue  # measured again with the new window
            if self.slo_changed is not None:
                self.rejudged += 1  # kept, judged again: not measured again
            record.window = window
            record.resumed = True
            steps[record.agents] = record
        return steps

    def _rejudge(self, record: StepRecord, document: Any) -> dict[str, Any] | None:
        """The stored step judged against the new objectives (its verdict updated); None
        when its results cannot say. A fail by failed requests stays a fail; without
        objectives (a --sweep) a step is only measured."""
        if not self.objectives:
            window = dict(step_window(document) or {})
            window.update(slo=[], slo_verdict=None)
            if record.note is None:
                record.verdict = MEASURED
            return window
        rejudged = rejudged_window(document, self.objectives, self.goodput_thresholds)
        if rejudged is not None and record.note is None:
            verdict = rejudged.get("slo_verdict")
            record.verdict = verdict if verdict in (PASS, FAIL) else UNRESOLVED
        return rejudged

    def _step_document(self, name: str) -> Any:
        try:
            with open(self.file(name), "rb") as handle:
                return orjson.loads(handle.read())
        except (OSError, orjson.JSONDecodeError):
            return None

    def _discard(self) -> None:
        """--restart: the old capacity document and step files go."""
        for name in os.listdir(self.path):
            if name == CAPACITY_FILE or _STEP_FILE.match(name):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.file(name))

    def finish_step(self, agents: int) -> str:
        """Move a finished step's files from their partial names; returns the JSON's name.
        The options file's (commented) ``results-json`` then names the final file."""
        name = step_file(agents)
        partial = partial_file(agents)
        try:
            os.replace(self.file(partial), self.file(name))
        except OSError as exc:
            raise BatchbenchError(
                f"cannot keep the results of the step at {agents} agents "
                f"({self.file(partial)}): {exc.strerror or exc}"
            ) from None
        toml = self.file(partial.removesuffix(".json") + ".config.toml")
        final = self.file(name.removesuffix(".json") + ".config.toml")
        with contextlib.suppress(OSError, UnicodeError):
            with open(toml, encoding="utf-8") as handle:
                text = handle.read()
            before = f"# results-json = {toml_value(self.file(partial))}\n"
            after = f"# results-json = {toml_value(self.file(name))}\n"
            with open(final + ".tmp", "w", encoding="utf-8") as handle:
                handle.write(text.replace(before, after))
            os.replace(final + ".tmp", final)
            os.remove(toml)
        return name

    def discard_partial(self, agents: int) -> None:
        """Remove what an interrupted step wrote."""
        partial = partial_file(agents)
        for name in (partial, partial.removesuffix(".json") + ".config.toml"):
            with contextlib.suppress(OSError):
                os.remove(self.file(name))

    def write(self, document: dict[str, Any]) -> str:
        """Replace capacity.json (write a temporary file, then rename it over)."""
        path = self.file(CAPACITY_FILE)
        temporary = path + ".tmp"
        data = orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
        try:
            with open(temporary, "wb") as handle:
                handle.write(data + b"\n")
            os.replace(temporary, path)
        except OSError as exc:
            raise BatchbenchError(f"cannot write {path}: {exc.strerror or exc}") from None
        return path
