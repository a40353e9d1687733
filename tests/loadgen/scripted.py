"""The transport seam filled with a script, for client tests without sockets.

Imported by tests (this directory is on ``sys.path`` under pytest).
"""

from __future__ import annotations

from collections.abc import Iterator

from loadlab.loadgen.transport import StreamResponse


class ScriptedTransport:
    """Body pieces and the clock value at which each arrives (one piece = one socket read)."""

    def __init__(self, status: int, pieces: list[tuple[float, bytes]]) -> None:
        self.status = status
        self.pieces = pieces
        self.now = 100.0
        self.sent: list[tuple[str, dict, bytes]] = []

    def clock(self) -> float:
        return self.now

    def open(self, method, path, headers, body, deadline, on_sent=None) -> StreamResponse:
        self.sent.append((path, headers, body))
        if on_sent is not None:
            on_sent(self.now)

        def gen() -> Iterator[bytes]:
            for t, piece in self.pieces:
                self.now = t
                yield piece

        return StreamResponse(self.status, {}, gen(), sent_at=self.now)
