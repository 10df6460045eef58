"""``batchbench.load(path)``: a results JSON (``--results-json``) or a capacity document
(``capacity.json``) read back as its typed document, ``SummaryDocument`` or
``CapacityDocument``, the very classes the run and the search write them with;
``to_dict()`` gives the JSON document back.

Its own module above the capacity search (whose document it reads), so that neither the
public face nor ``import batchbench`` loads the search's modules to run a benchmark.
"""

from __future__ import annotations

import os

from batchbench.capacity.document import CapacityDocument
from batchbench.errors import BatchbenchError
from batchbench.report.load import SOURCE_KEY, kind_of, read_document
from batchbench.results.documents import SummaryDocument

__all__ = ["CapacityDocument", "SummaryDocument", "load"]


def load(path: str | os.PathLike[str]) -> SummaryDocument | CapacityDocument:
    """The typed document of a results JSON or a capacity JSON. A file that cannot be read,
    is not JSON or is neither document raises BatchbenchError, one line naming the file
    (the checks ``batchbench report`` makes of its inputs)."""
    name = os.fspath(path)
    document = read_document(name)
    document.pop(SOURCE_KEY, None)
    if kind_of(document) == "run":
        return SummaryDocument.read(document)
    try:
        return CapacityDocument.read(document)
    except ValueError as exc:
        raise BatchbenchError(f"{name}: {exc}") from None
