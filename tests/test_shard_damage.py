"""``batchbench merge`` refuses damaged shard data with one ``Error:`` line naming the file.

Real shard files come from a real live ``--shard`` run against the simulator; each case
damages a copy the way a disk, a transfer or a hand edit would, and the merge must end
with exit 1, that one line and no traceback."""

from __future__ import annotations

import contextlib
import io
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from batchbench.cli.agent import main
from batchbench.cli.main import run as batchbench
from batchbench.drive.simlaunch import SimProcess, sim_command

ARGS = [
    "--model", "batchbench-sim", "--tokenizer-model", "deepseek-v3", "--no-progress",
    "--no-preflight", "--seed", "3", "--agents", "4", "--max-active-agents", "2",
    "--tool-invocations", "2", "--output-tokens", "4", "--stream",
]  # fmt: skip


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Both shards of a small live run, each in its own folder: s0/r.json, s1/r.json."""
    root = tmp_path_factory.mktemp("shards")
    with SimProcess(sim_command("deepseek-v3", 1, "--speed 0")) as sim:
        for index in range(2):
            folder = root / f"s{index}"
            folder.mkdir()
            argv = ["--host", sim.url, *ARGS, "--shard", f"{index}/2",
                    "--results-json", str(folder / "r.json")]  # fmt: skip
            with contextlib.redirect_stdout(io.StringIO()):
                assert main(argv) == 0
    return root


@pytest.fixture
def copy(shards, tmp_path) -> Path:
    """A fresh copy of both shards' folders, to damage."""
    shutil.copytree(shards, tmp_path / "run")
    return tmp_path / "run"


def merged(capsys, run: Path, out: Path) -> tuple[int, str, str]:
    status = batchbench(["merge", str(run / "s0" / "r.json"), str(run / "s1" / "r.json"),
                         "-o", str(out)])  # fmt: skip
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def rewrite(path: Path, change) -> None:
    """Save the shard file again with ``change`` applied to its arrays (a dict)."""
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    change(arrays)
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)


def data_offset(path: Path, member: str) -> int:
    """Where a member's stored bytes start in the zip file."""
    with zipfile.ZipFile(path) as archive:
        offset = archive.getinfo(member).header_offset
    header = path.read_bytes()[offset : offset + 30]
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    return offset + 30 + name_length + extra_length


def test_undamaged_shards_merge(copy, tmp_path, capsys):
    status, out, err = merged(capsys, copy, tmp_path / "out")
    assert (status, err) == (0, "")
    assert "Merged 2 shards of 4 trajectories" in out


def test_a_truncated_file_is_refused(copy, tmp_path, capsys):
    npz = copy / "s1" / "r.shard.npz"
    npz.write_bytes(npz.read_bytes()[: npz.stat().st_size // 2])
    status, out, err = merged(capsys, copy, tmp_path / "out")
    assert (status, out) == (1, "")
    assert err == f"Error: {npz}: damaged shard data (File is not a zip file)\n"
    assert not (tmp_path / "out").exists()


def test_a_flipped_bit_is_a_crc_error(copy, tmp_path, capsys):
    npz = copy / "s0" / "r.shard.npz"
    data = bytearray(npz.read_bytes())
    with np.load(npz) as archive:
        assert len(archive["latencies_ms"]) > 0
    # The array's first value: past the member's local header and the .npy header.
    with zipfile.ZipFile(npz) as archive, archive.open("latencies_ms.npy") as member:
        npy_header = len(member.read(128).split(b"\n", 1)[0]) + 1
    data[data_offset(npz, "latencies_ms.npy") + npy_header] ^= 0x10
    npz.write_bytes(bytes(data))
    status, out, err = merged(capsys, copy, tmp_path / "out")
    assert (status, out) == (1, "")
    assert err == f"Error: {npz}: damaged shard data (Bad CRC-32 for file 'latencies_ms.npy')\n"


@pytest.mark.parametrize(("member", "reason"), [
    ("meta.npy", "not a zip archive"),  # the first member: the file's own signature
    ("latencies_ms.npy", "Bad magic number for file header"),
])  # fmt: skip
def test_a_damaged_local_header_is_a_zip_error(copy, tmp_path, capsys, member, reason):
    npz = copy / "s1" / "r.shard.npz"
    data = bytearray(npz.read_bytes())
    with zipfile.ZipFile(npz) as archive:
        offset = archive.getinfo(member).header_offset
    data[offset : offset + 4] = b"XXXX"  # the local file header's signature
    npz.write_bytes(bytes(data))
    status, out, err = merged(capsys, copy, tmp_path / "out")
    assert (status, out) == (1, "")
    assert err == f"Error: {npz}: damaged shard data ({reason})\n"


def test_columns_of_different_lengths_are_refused(copy, tmp_path, capsys):
    npz = copy / "s1" / "r.shard.npz"
    rows = {}

    def shorten(arrays):
        rows["n"] = len(arrays["samples.start_s"])
        arrays["samples.latency_ms"] = arrays["samples.latency_ms"][:-1]

    rewrite(npz, shorten)
    n = rows["n"]
    status, out, err = merged(capsys, copy, tmp_path / "out")
    assert (status, out) == (1, "")
    assert err == (
        f"Error: {npz}: damaged shard data (samples.latency_ms has {n - 1} values but "
        f"samples.start_s has {n}: columns of one table differ in length)\n"
    )


def test_a_wrong_dtype_is_refused(copy, tmp_path, capsys):
    npz = copy / "s0" / "r.shard.npz"

    def retype(arrays):
        arrays["samples.rank"] = arrays["samples.rank"].astype(np.float64)

    rewrite(npz, retype)
    status, out, err = merged(capsys, copy, tmp_path / "out")
    assert (status, out) == (1, "")
    assert err == f"Error: {npz}: damaged shard data (samples.rank is float64, expected int32)\n"


def test_a_missing_array_is_refused(copy, tmp_path, capsys):
    npz = copy / "s1" / "r.shard.npz"
    rewrite(npz, lambda arrays: arrays.pop("samples.ok"))
    status, out, err = merged(capsys, copy, tmp_path / "out")
    assert (status, out) == (1, "")
    assert err == f"Error: {npz}: damaged shard data (no array samples.ok)\n"


def test_gaps_outside_the_gap_samples_are_refused(copy, tmp_path, capsys):
    npz = copy / "s0" / "r.shard.npz"
    gaps = {}

    def drop_gaps(arrays):
        gaps["n"] = len(arrays["stream.itl_ms"])
        assert int(arrays["samples.gap_count"].sum()) > 0
        arrays["stream.itl_ms"] = arrays["stream.itl_ms"][:0]

    rewrite(npz, drop_gaps)
    status, out, err = merged(capsys, copy, tmp_path / "out")
    assert (status, out) == (1, "")
    assert err == (
        f"Error: {npz}: damaged shard data (samples.gap_first/gap_count point outside "
        "the 0 stream.itl_ms values)\n"
    )
