"""BurstGPT traces (HPMLL/BurstGPT): ChatGPT and GPT-4 requests on Azure, CSV.

``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``, one request a
row: ``Timestamp`` is the submission in seconds from 0:00 of the trace's first day,
``Model`` ``ChatGPT`` or ``GPT-4``, ``Log Type`` ``Conversation log`` or ``API log``. The
``BurstGPT_3`` release adds ``Session ID`` (conversation mode only: rows sharing it are one
conversation) and ``Elapsed time`` (seconds from submission to the complete response). A
failed request is kept in the files that include failures with ``Response tokens`` 0; it
is read as it is (``output_tokens`` 0) and what to do with it is the importer's choice.

Headers are matched without regard to case, spaces or underscores (``SessionID`` is
``Session ID``); other columns are ignored. ``Total tokens`` repeats the two counts and
``Log Type`` has no place in a record: neither is read. A blank ``Session ID``, ``Model``
or ``Elapsed time`` (an API call, a failure) is no value. ``row`` is the request's position
among the data rows (the header is not a row and blank lines are not counted); error
messages name the physical line. No content hashes: every prompt is new content.
"""

from __future__ import annotations

from collections.abc import Iterator

from batchbench.ingest.formats.fields import cell_count, cell_number, cell_text, csv_table
from batchbench.ingest.record import FormatOptions, Record

NAME = "burstgpt"
SUMMARY = "BurstGPT CSV: Timestamp (s), Model, Request/Response tokens, Session ID, Elapsed time"

REQUIRED = ("Timestamp", "Request tokens", "Response tokens")
OPTIONAL = ("Model", "Session ID", "Elapsed time")


def read(path: str, options: FormatOptions) -> Iterator[Record]:
    """The file's requests in file order, one row at a time (``options`` has nothing for
    this format)."""
    table = csv_table(path, REQUIRED)
    if table is None:
        return
    t_name, i_name, o_name = table.names
    model, session, elapsed = (table.header.find(column) for column in OPTIONAL)
    e_name = "" if elapsed is None else table.header.names[elapsed]
    for row, line, (stamp, request, response), cells in table.rows():
        time_s = cell_number(stamp, t_name, path, line)
        input_tokens = cell_count(request, i_name, path, line)
        output_tokens = cell_count(response, o_name, path, line)
        latency = cell_text(cells, elapsed)
        yield Record(
            source=path,
            row=row,
            time_s=time_s,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            latency_s=None if latency is None else cell_number(latency, e_name, path, line),
            session=cell_text(cells, session),
            model=cell_text(cells, model),
        )
