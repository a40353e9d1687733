"""A stand-in for `vllm serve` used by the launcher tests: real HTTP, controllable faults.

argv: serve MODEL [flags...] --host H --port P.  FAKE_MODE=ok|die|never|log (FAKE_LOG).
In "ok" mode it also starts a child process (like vLLM's engine core) and writes its
pid to FAKE_CHILD_PID_FILE, so tests can check the whole process group is stopped;
with FAKE_CHILD_IGNORES_TERM=1 that child ignores SIGTERM (only SIGKILL stops it), and
with FAKE_CHILD_CPUS (a CPU list) it first binds itself to those CPUs.
"""

import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
host = args[args.index("--host") + 1]
mode = os.environ.get("FAKE_MODE", "ok")
print("fake server argv:", " ".join(args), flush=True)
if mode == "die":
    print("fatal: cannot allocate KV cache", flush=True)
    sys.exit(3)
if mode == "log":   # print a real server's failing log (FAKE_LOG) and exit as it did
    with open(os.environ["FAKE_LOG"]) as log:
        print(log.read(), end="", flush=True)
    sys.exit(int(os.environ.get("FAKE_EXIT", "1")))


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health" and mode == "ok":
            body = b""
        elif self.path == "/v1/models":
            body = json.dumps({"data": [{"id": "fake-model"}]}).encode()
        else:
            self.send_response(503)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a) -> None:
        pass


CHILD = """
import os, signal, sys, time
if sys.argv[1] == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if sys.argv[2]:  # binds itself, as vLLM's worker binds its threads
    os.sched_setaffinity(0, {int(c) for c in sys.argv[2].split(",")})
print("ready", flush=True)
while True:
    time.sleep(1)
"""

if mode == "ok" and os.environ.get("FAKE_CHILD_PID_FILE"):
    ignore = os.environ.get("FAKE_CHILD_IGNORES_TERM", "0")
    bind = os.environ.get("FAKE_CHILD_CPUS", "")
    child = subprocess.Popen([sys.executable, "-c", CHILD, ignore, bind], stdout=subprocess.PIPE)
    assert (
        child.stdout is not None and child.stdout.readline() == b"ready\n"
    )  # handler installed, bound
    with open(os.environ["FAKE_CHILD_PID_FILE"], "w") as f:
        f.write(str(child.pid))
ThreadingHTTPServer((host, port), Handler).serve_forever()
