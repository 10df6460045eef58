"""Where the public trace samples are, when this machine has them: ``BATCHBENCH_TRACES``,
else ``shared/traces`` beside the checkout. Tests that use them skip cleanly otherwise;
the samples are never part of the repository."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def traces_folder(name: str) -> Path:
    """The folder of one trace family, or skip the test."""
    root = os.environ.get("BATCHBENCH_TRACES")
    base = Path(root) if root else Path(__file__).resolve().parents[1].parent / "shared" / "traces"
    folder = base / name
    if not folder.is_dir():
        pytest.skip(f"real {name} traces not present")
    return folder
