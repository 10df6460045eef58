"""Declares the Cython extensions; everything else lives in pyproject.toml.

Building them is best effort: without a compiler (or with BATCHBENCH_NO_EXTENSIONS=1)
the package installs with its pure-Python twins only.
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE_MODULES = ["_synth", "_admission", "_sse"]


class OptionalBuildExt(build_ext):
    """Build the extensions, but fall back to the twins if compilation fails."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            print(
                f"batchbench: native extensions not built ({exc}); using pure Python",
                file=sys.stderr,
            )

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(
                f"batchbench: could not build {ext.name} ({exc}); using pure Python",
                file=sys.stderr,
            )


def extensions() -> list:
    if os.environ.get("BATCHBENCH_NO_EXTENSIONS") == "1":
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        return []
    exts = [
        Extension(f"batchbench._native.{name}", [f"csrc/{name}.pyx"], extra_compile_args=["-O3"])
        for name in NATIVE_MODULES
        if os.path.exists(f"csrc/{name}.pyx")
    ]
    return cythonize(
        exts, language_level=3, compiler_directives={"boundscheck": False, "wraparound": False}
    )


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
