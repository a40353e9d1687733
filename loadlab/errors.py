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
  - ``RunInterrupted`` (exit 130): Ctrl-C or SIGTERM; raised after everything
    measured so far has been flushed to the run folder.
  - ``StoreError`` (exit 1): rows could not be written to a run-folder table (disk
    full, read-only folder, a row that does not fit the schema). The rows are not
    dropped: they stay in memory for the next attempt (or, when they can never fit,
    go to a ``_rejected-*.jsonl`` file beside the parts).

Messages are written for the person at the terminal: say what to do, not only what
broke.
"""

from __future__ import annotations

from pathlib import Path


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


class RunInterrupted(LoadlabError):
    """The run was stopped by the user; what was measured is already on disk."""

    exit_code = 130


class StoreError(LoadlabError):
    """A run-folder table could not take some rows; the message says where they are now."""
