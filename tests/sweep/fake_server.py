"""A stand-in for `vllm serve` used by the launcher tests: real HTTP, controllable faults.

argv: serve MODEL [flags...] --host H --port P.  FAKE_MODE=ok|die|never.
In "ok" mode it also starts a child process (like vLLM's engine core) and writes its
pid to FAKE_CHILD_PID_FILE, so tests can check the whole process group is stopped;
with FAKE_CHILD_CPUS (a CPU list) the child first binds itself to those CPUs.
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


if mode == "ok" and os.environ.get("FAKE_CHILD_PID_FILE"):
    # FAKE_CHILD_CPUS: the child binds itself there first (as vLLM's worker binds its threads).
    bind = os.environ.get("FAKE_CHILD_CPUS")
    code = (f"import os, time\nos.sched_setaffinity(0, {{{bind}}})\nprint('bound', flush=True)\n" if bind
            else "import time\n") + "while True: time.sleep(1)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE if bind else None)
    if bind:
        child.stdout.readline()
    with open(os.environ["FAKE_CHILD_PID_FILE"], "w") as f:
        f.write(str(child.pid))
ThreadingHTTPServer((host, port), Handler).serve_forever()
