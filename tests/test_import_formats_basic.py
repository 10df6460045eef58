"""The Mooncake, Azure, BurstGPT and Bailian readers: exact records from hand-written
fixtures (plain, gzip and zstd), one-line errors naming file, line and field, and the real
traces when they are present (``BATCHBENCH_TRACES``, else ``../shared/traces`` next to the
checkout), checked against sums computed here from the raw files."""

from __future__ import annotations

import csv
import gzip
import json
import math
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from types import ModuleType

import pytest
from realtraces import traces_folder

from batchbench.errors import InputError
from batchbench.ingest.formats import azure, bailian, burstgpt, mooncake
from batchbench.ingest.record import FormatOptions, Record

# Pure Python that no compiled module serves: the pure-twin pass would repeat it as is.
pytestmark = pytest.mark.native_pass_only

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"
OPTIONS = FormatOptions()


def fixture(name: str) -> str:
    return str(FIXTURES / name)


def read(module: ModuleType, path: str, options: FormatOptions = OPTIONS) -> list[Record]:
    return list(module.read(path, options))


# Hand-written fixtures -----------------------------------------------------------------

MOONCAKE = fixture("mooncake/requests.jsonl")
AZURE_2023 = fixture("azure/conv_2023.csv")
AZURE_2024 = fixture("azure/code_2024.csv")
BURSTGPT_1 = fixture("burstgpt/burstgpt_1.csv")
BURSTGPT_3 = fixture("burstgpt/burstgpt_3.csv")
BAILIAN = fixture("bailian/qwen_chat_blksz_16.jsonl")

EXPECTED: dict[tuple[str, str], list[Record]] = {
    ("mooncake", MOONCAKE): [
        Record(MOONCAKE, 1, 0.0, 1100, 52, hash_ids=(0, 1, 2), block_size=512),
        Record(MOONCAKE, 2, 1.5005, 700, 0, hash_ids=(0, 3), block_size=512),
        Record(MOONCAKE, 4, 3.0, 512, 8, hash_ids=(0,), block_size=512),
        Record(MOONCAKE, 5, 4.25, 40, 12),
    ],
    ("azure", AZURE_2023): [
        Record(AZURE_2023, 1, 1700158546.68059, 374, 44),
        # 59.9999999 s: the nearest float to the exact time is the next minute's first.
        Record(AZURE_2023, 2, 1700158560.0, 2048, 0),
        Record(AZURE_2023, 3, 1700158560.000001, 96, 310),
    ],
    ("azure", AZURE_2024): [
        Record(AZURE_2024, 1, 1715472000.0, 1452, 3),
        Record(AZURE_2024, 2, 1715472000.041683, 584, 3),
        Record(AZURE_2024, 3, 1715472060.5, 862, 38),  # 02:01:00.5+02:00
    ],
    ("burstgpt", BURSTGPT_1): [
        Record(BURSTGPT_1, 1, 5.0, 472, 18, model="ChatGPT"),
        Record(BURSTGPT_1, 2, 45.0, 1087, 0, model="ChatGPT"),  # a failure, kept
        Record(BURSTGPT_1, 3, 118.5, 417, 276, model="GPT-4"),
    ],
    ("burstgpt", BURSTGPT_3): [
        Record(BURSTGPT_3, 1, 0.0, 120, 35, latency_s=3.25, session="1001", model="ChatGPT"),
        Record(BURSTGPT_3, 2, 2.5, 800, 60, latency_s=1.75, model="GPT-4"),
        Record(BURSTGPT_3, 3, 9.0, 190, 48, latency_s=4.5, session="1001", model="ChatGPT"),
        Record(BURSTGPT_3, 4, 12.0, 300, 0, model="ChatGPT"),
    ],
    ("bailian", BAILIAN): [
        Record(
            BAILIAN, 1, 61.114, 40, 13, key="159", hash_ids=(1089, 1090, 1091),
            block_size=16, hash_scope="file",
        ),
        Record(
            BAILIAN, 2, 61.5, 16, 4, key="160", hash_ids=(2001,), block_size=16,
            hash_scope="file",
        ),
        Record(
            BAILIAN, 3, 75.25, 70, 9, key="171", parent="159",
            hash_ids=(1089, 1090, 1092, 1093, 1094), block_size=16, hash_scope="file",
        ),
        Record(BAILIAN, 5, 80.0, 5, 2, key="180", hash_scope="file"),
    ],
}  # fmt: skip

MODULES = {module.NAME: module for module in (mooncake, azure, burstgpt, bailian)}
CASES = sorted(EXPECTED)


def test_every_module_names_itself_and_says_what_it_reads():
    assert sorted(MODULES) == ["azure", "bailian", "burstgpt", "mooncake"]
    for module in MODULES.values():
        assert module.SUMMARY and "\n" not in module.SUMMARY and len(module.SUMMARY) <= 90


@pytest.mark.parametrize(("name", "path"), CASES)
def test_fixture_records_are_exact(name: str, path: str):
    assert read(MODULES[name], path) == EXPECTED[name, path]


@pytest.mark.parametrize(("name", "path"), CASES)
def test_a_gzip_copy_reads_the_same(name: str, path: str, tmp_path: Path):
    copy = tmp_path / (Path(path).name + ".gz")
    copy.write_bytes(gzip.compress(Path(path).read_bytes()))
    expected = [replace(record, source=str(copy)) for record in EXPECTED[name, path]]
    assert read(MODULES[name], str(copy)) == expected


def test_a_zstd_copy_reads_the_same(tmp_path: Path):
    zstandard = pytest.importorskip("zstandard")
    copy = tmp_path / "requests.jsonl.zst"
    copy.write_bytes(zstandard.ZstdCompressor().compress(Path(MOONCAKE).read_bytes()))
    expected = [replace(record, source=str(copy)) for record in EXPECTED["mooncake", MOONCAKE]]
    assert read(mooncake, str(copy)) == expected


@pytest.mark.parametrize(("module", "size"), [(mooncake, 64), (bailian, 32)])
def test_the_block_size_option_overrides_the_formats_own(module: ModuleType, size: int):
    path = MOONCAKE if module is mooncake else BAILIAN
    sizes = [record.block_size for record in read(module, path, FormatOptions(block_size=size))]
    assert sizes == [size, size, size, 0]


def test_an_empty_file_has_no_requests(tmp_path: Path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert [read(module, str(empty)) for module in MODULES.values()] == [[], [], [], []]


def test_a_byte_order_mark_is_no_part_of_the_first_column(tmp_path: Path):
    path = tmp_path / "trace.csv"
    path.write_bytes(b"\xef\xbb\xbf" + Path(BURSTGPT_1).read_bytes())
    expected = [replace(record, source=str(path)) for record in EXPECTED["burstgpt", BURSTGPT_1]]
    assert read(burstgpt, str(path)) == expected


# Errors: one line naming the file, the line and the field ------------------------------

ERRORS = [
    (
        mooncake,
        '{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
        '{"timestamp": 10, "input_length": "12", "output_length": 3}\n',
        ':2: field "input_length" must be a non-negative integer, got a string',
    ),
    (
        mooncake,
        '{"timestamp": -4, "input_length": 5, "output_length": 1}\n',
        ':1: field "timestamp" must be a non-negative number, got -4',
    ),
    (
        mooncake,
        '\n{"timestamp": 1, "input_length": 5, "hash_ids": [1]}\n',
        ':2: missing field "output_length"',
    ),
    (
        mooncake,
        '{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [1, "2"]}\n',
        ':1: field "hash_ids" must be an array of integers, got a string at index 1',
    ),
    (mooncake, "[1, 2]\n", ":1: a row must be a JSON object, got an array"),
    (
        azure,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,-5\n",
        ':2: field "GeneratedTokens" must be a non-negative integer, got "-5"',
    ),
    (
        azure,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-02-30 18:15:46.6,374,5\n",
        ':2: field "TIMESTAMP" must be a date and time like 2023-11-16 18:15:46.6805900, '
        'got "2023-02-30 18:15:46.6"',
    ),
    (azure, "TIMESTAMP,ContextTokens\n", ':1: missing column "GeneratedTokens"'),
    (
        azure,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n,5,6\n",
        ':2: field "TIMESTAMP" must be a date and time like 2023-11-16 18:15:46.6805900, '
        "got an empty value",
    ),
    (
        azure,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n\n2023-11-16 18:15:46.6,374\n",
        ':3: missing field "GeneratedTokens"',
    ),
    (
        burstgpt,
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,,472,API log\n",
        ':2: field "Response tokens" must be a non-negative integer, got an empty value',
    ),
    (
        burstgpt,
        "Timestamp,Session ID,Elapsed time,Request tokens,Response tokens\n1.5,7,soon,10,2\n",
        ':2: field "Elapsed time" must be a non-negative number, got "soon"',
    ),
    (burstgpt, "Timestamp,Model,Response tokens\n", ':1: missing column "Request tokens"'),
    (
        burstgpt,
        "Timestamp,Request tokens,Response tokens\n1," + "9" * 30 + ",2\n",
        ':2: field "Request tokens" must be a non-negative integer, got "' + "9" * 30 + '"',
    ),
    (
        bailian,
        '{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 3}\n',
        ':1: missing field "output_length"',
    ),
    (
        bailian,
        '{"chat_id": 2, "parent_chat_id": -2, "timestamp": 0.5, "input_length": 3,'
        ' "output_length": 1}\n',
        ':1: field "parent_chat_id" must be -1 or a non-negative integer or a string, got -2',
    ),
    (
        bailian,
        '{"chat_id": [2], "timestamp": 0.5, "input_length": 3, "output_length": 1}\n',
        ':1: field "chat_id" must be a non-negative integer or a string, got an array',
    ),
]


@pytest.mark.parametrize(("module", "text", "message"), ERRORS)
def test_a_bad_row_is_one_line_naming_file_line_and_field(
    module: ModuleType, text: str, message: str, tmp_path: Path
):
    path = tmp_path / "trace"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as caught:
        read(module, str(path))
    assert str(caught.value) == f"{path}{message}"


@pytest.mark.parametrize("module", [mooncake, bailian])
def test_a_line_that_is_no_json_is_named_with_the_parsers_reason(
    module: ModuleType, tmp_path: Path
):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"chat_id": 2,\n', encoding="utf-8")
    with pytest.raises(InputError) as caught:
        read(module, str(path))
    message = str(caught.value)
    assert message.startswith(f"{path}:1: invalid JSON (") and message.endswith(")")
    assert "\n" not in message


def test_an_error_names_the_field_as_the_header_spells_it(tmp_path: Path):
    path = tmp_path / "trace.csv"
    path.write_text("timestamp,contexttokens,generatedtokens\n2024-05-12,1,2\n", encoding="utf-8")
    with pytest.raises(InputError) as caught:
        read(azure, str(path))
    assert str(caught.value) == (
        f'{path}:2: field "timestamp" must be a date and time like '
        '2023-11-16 18:15:46.6805900, got "2024-05-12"'
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1970-01-01 00:00:00", 0.0),
        ("1970-01-01T00:00:00.0000001Z", 1e-07),
        # 1709256599.999999999 exactly: a float 2.4e-7 apart from its neighbours rounds up.
        ("2024-02-29 23:59:59.999999999-01:30", 1709256600.0),
        ("2024-02-29 23:59:59.75-01:30", 1709256599.75),
        ("2023-11-16 18:15:46.6805900", 1700158546.68059),
    ],
)
def test_azure_timestamps_are_the_nearest_float_to_the_exact_time(
    text: str, seconds: float, tmp_path: Path
):
    path = tmp_path / "trace.csv"
    path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n{text},1,1\n", encoding="utf-8")
    assert [record.time_s for record in read(azure, str(path))] == [seconds]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "2023-11-16 18:15:60",
        "2023-11-16 24:00:00",
        "2023-11-16 18:15:46.",
        "2023-11-16 18:15",
        "2023-11-16 18:15:46+1:00",
        "2023-11-16 18:15:46.5+01:60",
    ],
)
def test_azure_rejects_times_that_are_no_times(text: str, tmp_path: Path):
    path = tmp_path / "trace.csv"
    path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n{text},1,1\n", encoding="utf-8")
    with pytest.raises(InputError, match='field "TIMESTAMP" must be a date and time like'):
        read(azure, str(path))


# Real traces, when present -------------------------------------------------------------


def real_files(folder: str, pattern: str) -> list[str]:
    found = sorted(str(path) for path in traces_folder(folder).glob(pattern))
    if not found:
        pytest.skip(f"no {folder}/{pattern} under the traces folder")
    return found


def jsonl_objects(path: str) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                yield number, json.loads(line)


def csv_dicts(path: str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8-sig") as handle:
        return [row for row in csv.DictReader(handle) if any(value for value in row.values())]


def exact_azure_time(text: str) -> float:
    """The timestamp by other means: ``datetime`` for the whole seconds, Decimal for the
    fraction, one rounding at the end."""
    whole = datetime.strptime(text[:19], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    fraction = text[19:].split("+")[0]
    return float(Decimal(int(whole.timestamp())) + Decimal("0" + fraction if fraction else 0))


def jsonl_sizes(raw: list[tuple[int, dict]]) -> list[tuple[int, int, int]]:
    """(line, input, output tokens) of the Mooncake-layout rows, as the files write them."""
    return [(n, o["input_length"], o["output_length"]) for n, o in raw]


def csv_sizes(raw: list[dict[str, str]], prompt: str, output: str) -> list[tuple[int, int, int]]:
    """(data row, input, output tokens) of CSV rows, from the named columns."""
    return [(n, int(row[prompt]), int(row[output])) for n, row in enumerate(raw, 1)]


def check_against(records: list[Record], rows: list[tuple[int, int, int]], monotonic: bool) -> None:
    """``rows``: (row, input, output) as read from the raw file by this test."""
    assert len(records) == len(rows)
    assert [(r.row, r.input_tokens, r.output_tokens) for r in records] == rows
    assert sum(r.input_tokens for r in records) == sum(row[1] for row in rows)
    assert sum(r.output_tokens for r in records) == sum(row[2] for row in rows)
    assert all(math.isfinite(r.time_s) and r.time_s >= 0 for r in records)
    if monotonic:
        assert all(a.time_s <= b.time_s for a, b in pairwise(records))


def test_real_mooncake_traces():
    for path in real_files("mooncake", "*.jsonl"):
        records = read(mooncake, path)
        raw = list(jsonl_objects(path))
        check_against(records, jsonl_sizes(raw), monotonic=True)
        assert [r.time_s for r in records] == [o["timestamp"] / 1000 for _, o in raw]
        assert [r.hash_ids for r in records] == [tuple(o["hash_ids"]) for _, o in raw]
        assert {r.block_size for r in records} == {512}


def test_real_azure_traces():
    for path in real_files("azure-2023", "*.csv"):
        records = read(azure, path)
        raw = csv_dicts(path)
        check_against(records, csv_sizes(raw, "ContextTokens", "GeneratedTokens"), monotonic=True)
        assert [r.time_s for r in records] == [exact_azure_time(row["TIMESTAMP"]) for row in raw]


def test_real_burstgpt_traces():
    for path in real_files("burstgpt", "*.csv"):
        records = read(burstgpt, path)
        raw = csv_dicts(path)
        check_against(records, csv_sizes(raw, "Request tokens", "Response tokens"), monotonic=False)
        assert [r.model for r in records] == [row["Model"] or None for row in raw]


def test_real_bailian_traces():
    for path in real_files("bailian", "*.jsonl"):
        records = read(bailian, path)
        raw = list(jsonl_objects(path))
        check_against(records, jsonl_sizes(raw), monotonic=False)
        assert [r.key for r in records] == [str(o["chat_id"]) for _, o in raw]
        roots = [o.get("parent_chat_id", -1) == -1 for _, o in raw]
        assert [r.parent is None for r in records] == roots
