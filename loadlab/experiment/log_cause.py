"""The line of a server's log that says why it failed to start.

A server that dies at start leaves a long log: vLLM prints the engine process's
traceback, then the engine core's and the API server's own, which only point up to it
("RuntimeError: Engine core initialization failed. See root cause above", raised in
``vllm/v1/engine/core_client.py``), then its shutdown.
The last exception line is therefore often not the cause; the one before the
"see root cause above" lines is. A server that refused its flags prints a usage error
instead: click's ``Error: No such option '--x'.`` or argparse's
``vllm serve: error: unrecognized arguments: --x``, and exits 2.
"""

from __future__ import annotations

import re

# "ValueError: ...", "torch.OutOfMemoryError: ...", "KeyError" (a Python exception's last line)
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)(?::\s.*)?$")
_USAGE = re.compile(r"^(?:Error: .*|[\w .-]+: error: .*)$")
# "See root cause above", "please check the stack trace above for the root cause"
_POINTS_UP = re.compile(r"root cause above|above for the root cause", re.IGNORECASE)
_LEVEL = re.compile(r"^(?:\(\w+ pid=\d+\)\s*)?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s")
# vLLM's "(EngineCore_DP0 pid=7) ERROR 12-01 07:39:38 [core.py:710] " before a message
_LOG_PREFIX = re.compile(r"^(?:\(\w+ pid=\d+\)\s*)?"
                         r"(?:(?:ERROR|CRITICAL)\s+\S+\s+\S+\s+\[[^\]]*\]\s*)?")


def root_cause(text: str) -> str | None:
    """The lines naming why the server failed, as one line: the last exception that is not
    a pointer up (with up to two detail lines under it, e.g. pydantic's field and reason),
    else the last ``Error:`` line; None when the log has neither."""
    lines = [_LOG_PREFIX.sub("", raw.strip()) for raw in text.splitlines()]
    exceptions: list[str] = []
    errors: list[str] = []
    for i, line in enumerate(lines):
        if _EXCEPTION.match(line):
            exceptions.append(" / ".join([line, *_details(lines[i + 1:i + 3])]))
        elif "Error:" in line or _USAGE.match(line):
            errors.append(line)
    causes = [e for e in exceptions if not _POINTS_UP.search(e)] or exceptions or errors
    return causes[-1] if causes else None


def _details(following: list[str]) -> list[str]:
    """The lines right under an exception line that belong to it."""
    kept = []
    for line in following:
        if not line or line.startswith(("Traceback", "For further information", "File ")) \
                or _EXCEPTION.match(line) or _LEVEL.match(line):
            break
        kept.append(line)
    return kept


def usage_error(text: str) -> str | None:
    """The usage error of a server that refused its command line, None for any other failure."""
    found = [line.strip() for line in text.splitlines() if _USAGE.match(line.strip())]
    return found[-1] if found else None
