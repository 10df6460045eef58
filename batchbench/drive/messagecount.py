"""A block request counted by the messages that changed since its trajectory's last one.

With a chat template that renders each message on its own (``SegmentCounter.per_message``:
the built-in ChatML and Llama-3 ones), a prompt's tokens are the template's own tokens
outside every segment, the tools' segments and one segment per message. The messages a
request shares with the trajectory's last counted one (``Kept``) keep their counts, so
only the messages after them are built, rendered, searched for stand-ins and counted: a
request costs what it adds, not its whole history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from batchbench.drive.blockmessages import Built, Filled, Kept, Rows, Shorten, build
from batchbench.text.promptcount import SegmentCounter
from batchbench.text.standins import StandIns, trusted

# Gives the stand-in ``Shorten`` of one rendering's ``StandIns``.
Shortener = Callable[[StandIns], Shorten]


@dataclass
class MessageCounts:
    """One trajectory's last counted request, message by message."""

    kept: Kept = field(default_factory=Kept)
    totals: list[int] = field(default_factory=list)  # tokens of messages 0..i
    tools_tokens: int = 0

    def clear(self) -> None:
        """Forget the last request (a reset: its blocks are filled anew)."""
        self.kept.clear()
        self.totals = []
        self.tools_tokens = 0

    def count(
        self,
        counter: SegmentCounter,
        seeds: Sequence[str],
        rows: Rows,
        filled: list[Filled | None],
        shortener: Shortener | None,
    ) -> int:
        """The request's tokens with its generation prompt, in the counter's template (a
        ``per_message`` one); ``shortener`` None counts its texts whole. A message's count
        is its segment's plus the tokens its stand-ins left out."""
        kept = self.kept.shared(rows, filled)
        start, pending = self.kept.resume(kept)

        def render(shorten: Shorten | None) -> tuple[str, tuple[Built, list[str]]]:
            built = build(seeds, rows, filled, start, pending, shorten)
            segments = counter.tool_segments(built.tools) if start == 0 else []
            segments += map(counter.message_segment, built.messages)
            return "".join(segments), (built, segments)

        found = None
        if shortener is not None:
            found = trusted(lambda stand_ins: render(shortener(stand_ins)))
        built, segments = render(None)[1] if found is None else found[1]
        counts = counter.segment_tokens(segments)
        if start == 0:
            tool_segments = len(segments) - len(built.messages)
            self.tools_tokens = sum(counts[:tool_segments]) + built.tools_hidden
            del counts[:tool_segments]
        del self.totals[kept:]
        running = self.totals[-1] if self.totals else 0
        for tokens, hidden in zip(counts, built.hidden, strict=True):
            running += tokens + hidden
            self.totals.append(running)
        self.kept.keep(rows, filled, kept, built)
        return counter.outside_tokens() + self.tools_tokens + running
