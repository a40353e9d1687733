"""Keep a launched server (and its children) from outliving the process that launched it.

``python guardian.py [--stop-timeout S] LOG -- ARGV...``, started by the launcher with stdin
a pipe the launcher holds open and never writes to. Run as a plain script (standard library
only), so it costs an interpreter and nothing more.

1. Become a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): descendants orphaned
   when the server dies are re-parented here and reaped here, so none lingers as a
   zombie that still looks alive.
2. Start ARGV in a new session (its own process group, which vLLM's engine-core
   processes join), stdout and stderr appended to LOG; print ``PID <n>``.
3. Wait until stdin reaches EOF (the launcher closed the pipe, or died: the kernel
   closes its end however it dies, SIGKILL included), SIGTERM/SIGINT/SIGHUP arrive,
   or the server exits.
4. Clear the group: SIGTERM to it, up to ``--stop-timeout`` (20 s) for every member to
   go, then SIGKILL, then wait until no process of the group is left.
5. Print ``EXIT <code>`` (``-N``: killed by signal N) for the server, and exit 0.

Why not ``PR_SET_PDEATHSIG`` on the server itself: the death signal reaches only the
direct child (engine-core processes would be orphaned) and fires when the launcher's
forking *thread* ends, not its process; a pipe closes exactly when the launcher is gone.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.2


def _subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: orphans go to init, which reaps them


class Children:
    """Reaps every exited child (the server's orphans land here as a subreaper) and keeps
    the server's own exit status, which ``waitpid(-1)`` may be the one to collect."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.server_code: int | None = None

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.server_pid:
                self.server_code = os.waitstatus_to_exitcode(status)

    def group_alive(self) -> bool:
        """Whether any process of the server's group is left (zombies reaped first)."""
        self.reap()
        try:
            os.killpg(self.server_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def clear_group(self, stop_timeout_s: float) -> None:
        """SIGTERM the group, SIGKILL what is left after ``stop_timeout_s``, wait until it
        is empty."""
        for sig, wait_s in ((signal.SIGTERM, stop_timeout_s), (signal.SIGKILL, 60.0)):
            try:
                os.killpg(self.server_pid, sig)
            except ProcessLookupError:
                return
            end = time.monotonic() + wait_s
            while time.monotonic() < end:
                if not self.group_alive():
                    return
                time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("--stop-timeout", type=float, default=20.0)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.append(True))
    _subreaper()
    with open(args.log, "ab") as log:
        server = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    print(f"PID {server.pid}", flush=True)
    children = Children(server.pid)
    while not stop:
        children.reap()
        if children.server_code is not None:
            break
        try:
            ready, _, _ = select.select([sys.stdin], [], [], POLL_S)
        except InterruptedError:
            continue
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break  # EOF: the launcher is gone or done
    children.clear_group(args.stop_timeout)
    if children.server_code is None:  # it left its group (setpgid): stop it directly
        try:
            os.kill(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    while children.server_code is None:
        children.reap()
        time.sleep(0.05)
    server.returncode = children.server_code  # reaped here, not through Popen
    print(f"EXIT {children.server_code}", flush=True)


if __name__ == "__main__":
    main()
