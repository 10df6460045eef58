"""Which hot-path implementation is active: compiled (``batchbench._native``) or its twin.

Each module that has a compiled version imports it the aio-libs way, statically::

    if NO_EXTENSIONS: from batchbench.text import _synth_py as _synth
    else: try the compiled ``batchbench._native._synth``, falling back to the twin

``BATCHBENCH_NO_EXTENSIONS=1`` forces the pure-Python twins. The helpers below name the
implementations for ``--version``, tests and benchmarks.
"""

from __future__ import annotations

import os
from types import ModuleType

NATIVE_NAMES = ("synth", "admission", "sse")


def extensions_disabled() -> bool:
    """True when ``BATCHBENCH_NO_EXTENSIONS`` asks for the pure-Python twins."""
    return os.environ.get("BATCHBENCH_NO_EXTENSIONS", "") not in ("", "0")


NO_EXTENSIONS = extensions_disabled()


def native_module(name: str) -> ModuleType | None:
    """The compiled module for ``name`` (``synth``, ``admission``, ``sse``), or None unbuilt."""
    try:
        if name == "synth":
            from batchbench._native import _synth  # lazy: asked for by --version and tests

            return _synth
        if name == "admission":
            from batchbench._native import _admission  # lazy: asked for by --version and tests

            return _admission
        if name == "sse":
            from batchbench._native import _sse  # lazy: asked for by --version and tests

            return _sse
    except ImportError:
        return None
    raise ValueError(f"no compiled module named {name!r}")


def twin_module(name: str) -> ModuleType:
    """The pure-Python twin for ``name``."""
    if name == "synth":
        from batchbench.text import _synth_py  # lazy: for tests and benchmarks

        return _synth_py
    if name == "admission":
        from batchbench.drive import _admission_py  # lazy: for tests and benchmarks

        return _admission_py
    if name == "sse":
        from batchbench.drive import _sse_py  # lazy: for tests and benchmarks

        return _sse_py
    raise ValueError(f"no twin named {name!r}")


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
