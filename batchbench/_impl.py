"""Chooses between a compiled module and its pure-Python twin, the aio-libs way."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

NATIVE_NAMES = ("synth", "admission")


def extensions_disabled() -> bool:
    """True when ``BATCHBENCH_NO_EXTENSIONS`` asks for the pure-Python twins."""
    return os.environ.get("BATCHBENCH_NO_EXTENSIONS", "") not in ("", "0")


def native_module(name: str) -> ModuleType | None:
    """The compiled ``batchbench._native._<name>``, or None when it is not built."""
    try:
        return importlib.import_module(f"batchbench._native._{name}")
    except ImportError:
        return None


def twin_module(name: str) -> ModuleType:
    """The pure-Python ``batchbench._<name>_py``, which always exists."""
    return importlib.import_module(f"batchbench._{name}_py")


def load(name: str) -> ModuleType:
    """The module the package uses for ``name``: native unless disabled or missing."""
    if not extensions_disabled():
        module = native_module(name)
        if module is not None:
            return module
    return twin_module(name)


def active_implementation() -> str:
    """``native`` when every hot path is compiled and enabled, else which ones are not."""
    if extensions_disabled():
        return "pure-python (BATCHBENCH_NO_EXTENSIONS)"
    missing = [name for name in NATIVE_NAMES if native_module(name) is None]
    if not missing:
        return "native"
    if len(missing) == len(NATIVE_NAMES):
        return "pure-python (extensions not built)"
    return "mixed (pure-python: " + ", ".join(missing) + ")"
