"""Server-sent events of an OpenAI stream, read by read, with as little Python per event as
possible.

The streaming client stamps every event of one socket read with that read's time, so
events only need to be *counted* per read, not handled one by one. Steps per read:

1. :meth:`SseBuffer.feed` appends the read to what was left of the last one, turns CRLF
   line ends into LF (SSE allows both; a ``\\r`` at the very end waits for its ``\\n``),
   and cuts at the last blank line: the complete events go on, the tail waits.
2. :func:`count_content` looks at the complete events as one byte string. When every
   event is a one-line ``data: `` event whose JSON holds one compact content marker
   (``"text":"`` for completions, ``"content":"`` for chat) and none carries usage, the
   content events are the markers not followed by ``"`` (an empty text, e.g. chat's
   role chunk, is not content): four C-level scans per read, whatever the number of
   events. This is the shape vLLM and the simulator send for every token.
   The count covers the events up to the last one holding a marker
   (:func:`content_end`): the last read of a stream often holds content, then the usage
   chunk and ``[DONE]``, which are walked one by one.
3. Anything else returns None: error events and other markerless events among the
   counted ones, spaced JSON, multi-line ``data:``, comments, other fields. Then every
   event of the read is walked with :func:`event_payloads`, parsing JSON where it must;
   :func:`quick_kind` still spares the parse for a compact content chunk among them.

Why the markers are safe: inside a JSON string a quote is always escaped, so no text can
spell ``"text":"``, ``"error"`` or a blank line. An event with two markers would be
miscounted; no OpenAI chunk has one (``choices`` stream one per event; logprobs, tool
calls and reasoning use other keys).
"""

from __future__ import annotations

TEXT_MARKER = b'"text":"'
CHAT_MARKER = b'"content":"'
_QUOTE = ord('"')
_DATA = b"data: "


class SseBuffer:
    """Holds the incomplete tail of an SSE stream between reads."""

    def __init__(self) -> None:
        self.tail = b""

    def feed(self, piece: bytes) -> bytes:
        """The complete events (ending in a blank line) now available; b"" if none yet."""
        data = self.tail + piece if self.tail else piece
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        end = data.rfind(b"\n\n")
        if end < 0:
            self.tail = data
            return b""
        end += 2
        self.tail = data[end:]
        return data[:end] if end < len(data) else data


def count_content(events: bytes, marker: bytes, end: int) -> int | None:
    """Content events among ``events[:end]`` (complete, LF-ended), or None when one needs a
    closer look.

    Each event ends in a blank line, so one of ``k`` lines has ``k + 1`` newlines: twice as
    many newlines as markers means every event is one line holding one marker (no event
    holds two). Events without a marker ([DONE], usage, errors, comments) break the
    equality; a chunk carrying usage is parsed for its counts. Bounds, not a slice: no copy.
    """
    if events.find(b"\n", 0, end) == end - 2:   # one single-line event: the usual read
        kind = quick_kind(events[:end] if end < len(events) else events, marker)
        return None if kind is None or not events.startswith(_DATA) else int(kind)
    m = events.count(marker, 0, end)
    if (events.count(b"\n", 0, end) != 2 * m or not events.startswith(_DATA)
            or events.find(b'"usage":{', 0, end) >= 0):
        return None
    return m - events.count(marker + b'"', 0, end)


def content_end(events: bytes, marker: bytes) -> int:
    """Where the span to count ends: after the last event holding a content marker (0 if
    none; a single event is its own span). What follows (the usage chunk and ``[DONE]`` at
    the end of a stream) is walked event by event."""
    if events.find(b"\n") == len(events) - 2:
        return len(events)
    at = events.rfind(marker)
    return 0 if at < 0 else events.find(b"\n\n", at) + 2


def event_payloads(events: bytes) -> list[bytes]:
    """The ``data`` payload of each event (multi-line data joined by LF); events without
    data dropped."""
    out = []
    for event in events.split(b"\n\n")[:-1]:
        if event.startswith(_DATA) and b"\n" not in event:   # the one-line event servers send
            out.append(event[6:])
            continue
        lines = [ln[5:].removeprefix(b" ") for ln in event.split(b"\n") if ln.startswith(b"data:")]
        if lines:
            out.append(b"\n".join(lines))
    return out


def quick_kind(data: bytes, marker: bytes) -> bool | None:
    """Classify one compact chunk without parsing it: True = content, False = empty text
    (e.g. the chat role chunk), None = parse it (usage, errors, spaced JSON...)."""
    if b'"usage":{' in data:
        return None
    at = data.find(marker)
    if at < 0 or at + len(marker) >= len(data):
        return None
    return data[at + len(marker)] != _QUOTE
