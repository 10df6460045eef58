"""Reading results documents for the report: run results JSON files (``--results-json``) and
capacity documents (``capacity.json``, whose step results are read from beside it)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import orjson

from batchbench.errors import BatchbenchError
from batchbench.report import schema

# Keys the loader adds to a document (never written back to disk): the file it came from
# (legends and table rows name it), a capacity document's step documents keyed by their
# results_json name (None for a step whose file could not be read), and notes for the reader.
SOURCE_KEY = "_report_source"
STEPS_KEY = "_report_steps"
NOTES_KEY = "_report_notes"
REPORT_KEYS = (SOURCE_KEY, STEPS_KEY, NOTES_KEY)


def load_documents(paths: Iterable[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """Each file's document, in order; a capacity document also gets its step documents.

    Raises BatchbenchError with one line naming the file when a file cannot be read, is not
    JSON, is neither a batchbench results document nor a capacity document, or has a field
    the report reads holding the wrong kind of value (see schema)."""
    documents = []
    for path in paths:
        name = os.fspath(path)
        document = read_document(name)
        if document_kind(document, name) == "capacity":
            attach_steps(document, os.path.dirname(name))
        documents.append(document)
    return documents


def read_document(path: str) -> dict[str, Any]:
    """One results or capacity document, checked for its kind and the types of the fields the
    report reads, with SOURCE_KEY set."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = getattr(exc, "strerror", None) or exc
        raise BatchbenchError(f"cannot read {path}: {reason}") from None
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BatchbenchError(f"{path} is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise BatchbenchError(
            f"{path} is not a batchbench results or capacity document (a JSON "
            f"{type(document).__name__}, not an object)"
        )
    for key in REPORT_KEYS:  # the loader's own keys, never taken from a file
        document.pop(key, None)
    validate(document, path)
    document[SOURCE_KEY] = path
    return document


def validate(document: dict[str, Any], where: str) -> str:
    """The document's kind, after checking the types of every field the report reads (and
    the loader's keys, for documents built in memory); raises BatchbenchError naming
    ``where`` and the field."""
    kind = document_kind(document, where)
    schema.check(document, schema.CAPACITY if kind == "capacity" else schema.RUN, where)
    schema.check(document, LOADER_KEYS, where)
    try:  # text() and the page's figure data are orjson: its nesting limit is the page's
        orjson.dumps(document, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as exc:
        raise BatchbenchError(f"{where}: cannot be shown: {json_problem(exc)}") from None
    return kind


def json_problem(exc: Exception) -> str:
    """orjson's reason a value cannot be written, in the reader's words where it is cryptic."""
    reason = str(exc)
    return "a value is nested too deeply" if reason == "Recursion limit reached" else reason


def document_kind(document: dict[str, Any], where: str) -> str:
    """``"run"`` or ``"capacity"``; raises BatchbenchError naming ``where`` otherwise.

    Documents written before ``"kind"`` existed are runs when they carry the summary's
    ``"metrics"`` and ``"batchbench_version"``."""
    kind = document.get("kind")
    if kind == "capacity":
        if not isinstance(document.get("steps"), list):
            raise BatchbenchError(f'{where}: capacity document without a "steps" list')
        return "capacity"
    legacy = isinstance(document.get("metrics"), dict) and "batchbench_version" in document
    if kind == "run" or (kind is None and legacy):
        return "run"
    found = f'"kind": {orjson.dumps(kind).decode()[:40]}' if "kind" in document else 'no "kind"'
    raise BatchbenchError(
        f"{where} is not a batchbench results or capacity document ({found}; expected a "
        "--results-json file or a capacity.json)"
    )


def attach_steps(document: dict[str, Any], directory: str) -> None:
    """Read each step's results JSON from the capacity document's directory.

    A step file that is missing or unreadable is a note, not an error: the curve is drawn
    from the step windows the capacity document carries; only that step's CDF is lost. So is
    a results_json that is not a plain file name (an absolute path or ``../x``): a document
    names its own step files and no other file is read on its say-so."""
    steps: dict[str, dict[str, Any] | None] = {}
    notes: list[str] = document.setdefault(NOTES_KEY, [])
    lost = "step results not loaded, its latency distribution is not drawn"
    for step in document["steps"]:
        name = step.get("results_json") if isinstance(step, dict) else None
        if not isinstance(name, str) or name in steps:
            continue
        steps[name] = None
        if not plain_file_name(name):
            notes.append(
                f"{lost}: results_json {orjson.dumps(name).decode()} is not a file name in the "
                "capacity document's directory"
            )
            continue
        path = os.path.join(directory, name)
        try:
            step_document = read_document(path)
            if kind_of(step_document) != "run":
                raise BatchbenchError(f"{path} is not a run results document")
        except BatchbenchError as exc:
            notes.append(f"{lost}: {exc}")
            continue
        steps[name] = step_document
    document[STEPS_KEY] = steps


def plain_file_name(name: str) -> bool:
    """A name of a file in the directory itself: no directory part, drive, ``.``/``..`` or
    NUL (backslashes are refused on every system, so documents mean the same everywhere)."""
    return (
        name not in ("", ".", "..")
        and not any(c in name for c in "/\\\0")
        and not os.path.splitdrive(name)[0]
        and not os.path.isabs(name)
    )


# The loader's keys in documents built in memory (files never carry them).
LOADER_KEYS = schema.Obj(
    {
        STEPS_KEY: schema.Obj(rest=schema.RUN, name="an object of step documents"),
        NOTES_KEY: schema.Arr(schema.STRING, "a list of strings"),
    }
)


def kind_of(document: dict[str, Any]) -> str:
    """The kind of a document that passed document_kind (``"run"`` when unmarked)."""
    return "capacity" if document.get("kind") == "capacity" else "run"


def labels(documents: list[dict[str, Any]]) -> list[str]:
    """A short distinct name per document for legends and rows: the file name, or the path
    when two files share a name, or ``document N`` for documents not read from a file."""
    sources = [d.get(SOURCE_KEY) if isinstance(d, dict) else None for d in documents]
    names = [
        os.path.basename(s) if isinstance(s, str) else f"document {i + 1}"
        for i, s in enumerate(sources)
    ]
    result: list[str] = []
    for i, name in enumerate(names):
        source = sources[i]
        if names.count(name) > 1 and isinstance(source, str):
            name = source
        if result.count(name):
            name = f"{name} ({i + 1})"
        result.append(name)
    return result
