"""SocketTransport under gevent, as Locust runs it: statuses, kept-alive connections, and
connections dropped after failures (each read waits on the connection's own watcher, then
reads through an unpatched socket on the same descriptor: transport._Readable).

The client runs in a subprocess patched by gevent (this test process stays unpatched);
it prints, per request, the outcome and which connection carried it.
"""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, sys
from gevent import monkey
monkey.patch_all()
from loadlab.loadgen.client import StreamingClient
from loadlab.loadgen.transport import SocketTransport

url, n = sys.argv[1], int(sys.argv[2])
transport = SocketTransport(url)
client = StreamingClient(transport, "completions", timeout_s=0.5)
body = json.dumps({"model": "m", "prompt": "one two three", "max_tokens": 5, "stream": True,
                   "stream_options": {"include_usage": True}}).encode()
rows = []
for _ in range(n):
    before = transport._sock
    out = client.send(body)
    rows.append({"status": out.status, "http": out.http_status,
                 "chunks": len(out.timings.chunk_offsets_s),
                 "output_tokens": out.output_tokens, "kept_before": before is not None,
                 "kept_after": transport._sock is not None,
                 "same": before is None or transport._sock is None or before is transport._sock})
print(json.dumps(rows))
"""


def test_statuses_and_kept_alive_connections_under_gevent(fault) -> None:
    pattern = "ok,ok,drop,ok,hang,ok,midstream,ok,ok"
    with fault(pattern) as url:
        proc = subprocess.run([sys.executable, "-c", SCRIPT, url, str(len(pattern.split(",")))],
                              capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout.splitlines()[-1])
    assert [(r["status"], r["http"]) for r in rows] == [
        ("ok", 200), ("ok", 200), ("aborted", 200), ("ok", 200), ("timeout", 200), ("ok", 200),
        ("http_error", 200), ("ok", 200), ("ok", 200)]
    ok = [r for r in rows if r["status"] == "ok"]
    assert all((r["chunks"], r["output_tokens"]) == (5, 5) for r in ok)
    # A finished stream keeps its connection for the next request; a failure drops it, and
    # the new connection (often on the same descriptor number) reads whole streams again.
    assert [r["kept_before"] for r in rows] == [
        False,
        True,
        True,
        False,
        True,
        False,
        True,
        False,
        True,
    ]
    assert [r["kept_after"] for r in rows] == [
        True,
        True,
        False,
        True,
        False,
        True,
        False,
        True,
        True,
    ]
    assert all(r["same"] for r in rows)


URGENT_SCRIPT = """
import json, sys
from gevent import monkey
monkey.patch_all()
import gevent, socket
from loadlab.loadgen.transport import _Readable

pairs = [socket.socketpair() for _ in range(9)]
readers = [_Readable(a) for a, _ in pairs]
orders = []
for urgent in map(int, sys.argv[1:]):
    readers[urgent].urgent(True)
    order = []
    def read(i):
        readers[i].recv(100)
        order.append(i)
    greenlets = [gevent.spawn(read, i) for i in range(len(readers))]
    gevent.sleep(0)                  # every reader now waits on its watcher
    for _, writer in pairs:          # all readable before the hub polls again
        writer.send(b"x")
    gevent.joinall(greenlets)
    readers[urgent].urgent(False)
    orders.append(order)
print(json.dumps(orders))
"""


def test_a_connection_waiting_for_its_first_token_is_read_first() -> None:
    """Nine connections readable in one loop iteration: the one marked urgent (waiting for
    its first token) is read before the others, whichever it is."""
    urgent = [4, 7, 1]
    proc = subprocess.run([sys.executable, "-c", URGENT_SCRIPT, *map(str, urgent)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    orders = json.loads(proc.stdout.splitlines()[-1])
    assert [order[0] for order in orders] == urgent
    assert all(sorted(order) == list(range(9)) for order in orders)
