"""Error types whose messages are the single-line chains users see (context: cause)."""

from __future__ import annotations

from batchbench.secrets import redact


class BatchbenchError(Exception):
    """A fatal runtime error; ``str()`` is the whole ``context: cause`` chain, with the
    run's API key masked (a server's error text may echo it)."""

    def __str__(self) -> str:
        return redact(super().__str__())

    def with_context(self, context: str) -> BatchbenchError:
        """A new error of the same type whose message is ``context: <this message>``."""
        return type(self)(f"{context}: {self}")


class UsageError(BatchbenchError):
    """Bad command-line usage: printed as ``Error: ...`` with exit status 2."""


class KeywordError(UsageError, TypeError):
    """A keyword ``RunConfig`` does not take (a TypeError, as Python's own would be, and a
    UsageError, whose one line says which keyword was probably meant)."""


class ManifestError(BatchbenchError):
    """An invalid or unreadable trajectory manifest."""


class PlanError(BatchbenchError):
    """A manifest that parses but cannot be compiled into a workload."""


class TokenizerError(BatchbenchError):
    """A tokenizer that cannot be found or loaded."""


class SynthesisError(BatchbenchError):
    """Exact-length text that cannot be generated for a target."""


class InputError(BatchbenchError):
    """Unusable input or options of an export or import (a row's file, line and field)."""
