"""The one place loadlab's exceptions live.

Hierarchy (every class carries the process exit code the CLI uses):

- ``LoadlabError`` (exit 1): base class; anything loadlab raises on purpose.
  - ``InputError`` (exit 2): the user gave us something we cannot use: a bad flag,
    scenario, profile, trace or config value. The message names the file (when there
    is one), the field or line, what was wrong and how to fix it.
  - ``TargetError`` (exit 1): the server under test misbehaved in a way that stops
    the run (never answered /health, died at start). Per-request failures are
    *records*, not exceptions.
  - ``ClientLimited`` (exit 3): the run finished and everything is written, but at
    some steps the load generator did not apply the load it was asked for (too few
    requests in flight, sends late, its event loop lagging): those steps measured the
    client, not the server. The message names the steps and why.
  - ``NoSuccess`` (exit 4): the run (or ``loadlab collect``) finished and everything is
    written, but not one request (or scrape) succeeded: the server hung, cut every
    stream, sent something that is not an OpenAI stream, or failed every /metrics
    scrape. Such a folder measured nothing usable, so it must not read as a success.
    The message says how many failed and the most common error.
  - ``StorageError`` (exit 5): the run folder's file system refused a write it could
    not do without (disk full, quota, file-size limit, read-only): the manifest, or
    request rows at the end of a run. The rows not on disk travel with the error
    (``rows``) to whoever can still save them, and the message names where they went.
  - ``RunInterrupted`` (exit 130 on SIGINT, 143 on SIGTERM): raised after everything
    measured so far has been flushed to the run folder; the code tells a Ctrl-C from a
    supervisor's stop, as a shell does (128 + the signal's number).
  - ``StoreError`` (exit 1): rows could not be written to a run-folder table (disk
    full, read-only folder, a row that does not fit the schema). The rows are not
    dropped: they stay in memory for the next attempt (or, when they can never fit,
    go to a ``_rejected-*.jsonl`` file beside the parts).

Messages are written for the person at the terminal: say what to do, not only what
broke.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any


class LoadlabError(Exception):
    """Base class of every error loadlab raises on purpose."""

    exit_code = 1


class InputError(LoadlabError):
    """Bad user input: names the source, the field, and the fix.

    ``source`` is a file path or a flag/endpoint description; ``field`` a dotted
    field path, a column name or ``line N``; ``fix`` a sentence telling the user
    what to change. All three are optional so that short CLI-flag errors stay short.
    """

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        source: str | Path | None = None,
        field: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.message = message
        self.source = str(source) if source is not None else None
        self.field = field
        self.fix = fix
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = ""
        if self.source and self.field:
            where = f"{self.source}: {self.field}: "
        elif self.source:
            where = f"{self.source}: "
        elif self.field:
            where = f"{self.field}: "
        text = f"{where}{self.message}"
        if self.fix:
            text += f" (fix: {self.fix})"
        return text


class TargetError(LoadlabError):
    """The server under test cannot be used at all (did not start, never healthy)."""


class ClientLimited(LoadlabError):
    """The run is complete, but the client fell short of the asked load at some steps."""

    exit_code = 3


class NoSuccess(LoadlabError):
    """Everything is written, but no request (or scrape) succeeded: the target's fault."""

    exit_code = 4


class StorageError(LoadlabError):
    """A write the run cannot do without failed; ``rows`` holds request rows not on disk."""

    exit_code = 5

    def __init__(self, message: str, rows: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.rows = rows or []

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled across the point's process boundary with its rows (the default keeps args only)
        return (type(self), (str(self), self.rows))


class RunInterrupted(LoadlabError):
    """The run was stopped by a signal; what was measured is already on disk.

    ``signal_name`` (``SIGINT`` or ``SIGTERM``) sets the exit code: 128 + its number.
    """

    exit_code = 130

    def __init__(self, message: str, signal_name: str = "SIGINT") -> None:
        super().__init__(message)
        self.signal_name = signal_name
        self.exit_code = 128 + int(signal.Signals[signal_name])

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.signal_name))


class StoreError(LoadlabError):
    """A run-folder table could not take some rows; the message says where they are now."""
