"""Real servers for testing the collector: /metrics pages with faults, and Prometheus.

- :class:`PageServer`: an HTTP server on a free loopback port serving a /metrics
  page (by default the real vLLM 0.32 text shipped in ``tests/fixtures``) whose
  sample values a test can change while it runs, or misbehaving on purpose:
  ``mode`` = ``ok`` | ``slow`` (answers only after ``release()``) | ``500`` |
  ``garbage`` | ``close`` (hangs up without answering). :meth:`PageServer.hold` makes
  later requests wait at a gate (``PageServer.held`` is set when one arrives) until
  :meth:`PageServer.let_go`: a scrape that takes exactly as long as a test wants.
- :class:`ManualClock`: a scraper clock that moves only when the test advances it.
- :func:`running_prometheus`: starts a real Prometheus binary with a temporary
  config and storage, scraping given targets every second; yields its URL.
- ``python -m loadlab.collect.testing N PAGE``: serves N ok pages in a separate
  process (for benchmarks); prints one base URL per line, exits when stdin closes.
"""

from __future__ import annotations

import contextlib
import http.server
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

MODES = ("ok", "slow", "500", "garbage", "close")


class _QuietServer(http.server.ThreadingHTTPServer):
    """Clients that time out and hang up are expected here: no tracebacks.

    Open connections are tracked so that stopping the server drops kept-alive
    clients too, as a server process that dies would.
    """

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], handler: type[http.server.BaseHTTPRequestHandler]
    ) -> None:
        super().__init__(address, handler)
        self.open_connections: set[socket.socket] = set()

    # The (bytes, socket) pair in the signatures is what a UDP server gets; over TCP the
    # request is always a socket.
    def process_request(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: object
    ) -> None:
        if isinstance(request, socket.socket):
            self.open_connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: socket.socket | tuple[bytes, socket.socket]) -> None:
        if isinstance(request, socket.socket):
            self.open_connections.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        for conn in list(self.open_connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: object, client_address: object) -> None:
        pass


class PageServer:
    """A /metrics page on ``127.0.0.1:<free port>``, values settable by series key.

    A series key is a sample line without its value, exactly as in the page:
    ``vllm:num_requests_running{engine="0",model_name="tiny"}``.
    """

    def __init__(self, page: str, mode: str = "ok") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode = mode
        self._lines = page.rstrip("\n").split("\n")
        self._index = {line.rpartition(" ")[0]: i for i, line in enumerate(self._lines)
                       if line and not line.startswith("#")}
        self._rates: dict[str, tuple[float, float, float]] = {}
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._gate = threading.Event()
        self._gate.set()
        self.held = threading.Event()
        self.requests = 0
        self.last_authorization: str | None = None
        self._httpd = _QuietServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def set(self, key: str, value: float) -> None:
        """Change one sample's value (the key must exist in the page)."""
        with self._lock:
            self._rates.pop(key, None)
            self._lines[self._index[key]] = f"{key} {float(value)!r}"

    def add(self, key: str, delta: float) -> None:
        with self._lock:
            i = self._index[key]
            current = float(self._lines[i].rpartition(" ")[2])
            self._lines[i] = f"{key} {current + delta!r}"

    def grow(self, key: str, per_s: float) -> None:
        """Make a counter grow steadily from its current value at ``per_s`` a second."""
        with self._lock:
            current = float(self._lines[self._index[key]].rpartition(" ")[2])
            self._rates[key] = (current, per_s, time.time())

    def body(self) -> bytes:
        with self._lock:
            now = time.time()
            for key, (base, per_s, since) in self._rates.items():
                self._lines[self._index[key]] = f"{key} {base + per_s * (now - since)!r}"
            return ("\n".join(self._lines) + "\n").encode()

    def release(self) -> None:
        """Let a ``slow`` server's pending requests finish (they answer 503)."""
        self._released.set()

    def hold(self) -> None:
        """Make requests from now on wait (up to 30 s) until :meth:`let_go`."""
        self.held.clear()
        self._gate.clear()

    def let_go(self) -> None:
        self._gate.set()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server.requests += 1
                server.last_authorization = self.headers.get("Authorization")
                if not server._gate.is_set():
                    server.held.set()
                    server._gate.wait(30)
                mode = server.mode
                if mode == "close":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if mode == "slow":
                    server._released.wait(30)
                    self._send(503, b"released\n")
                    return
                if mode == "500":
                    self._send(500, b"internal error\n")
                    return
                if mode == "garbage":
                    self._send(200, b"<html><body>not metrics</body></html>\n")
                    return
                self._send(200, server.body())

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def start(self) -> PageServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._released.set()
        self._gate.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.drop_connections()

    def __enter__(self) -> PageServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ManualClock:
    """A :class:`~loadlab.collect.scraper.Clock` that moves only on :meth:`advance`.

    ``wait`` blocks until the clock reaches the deadline or the stop event is set; the
    stop event is re-checked every 50 ms of real time, which only bounds how soon a
    stopped scraper notices, never what it records.
    """

    def __init__(self, wall0: float = 1_800_000_000.0) -> None:
        self.wall0 = wall0
        self._now = 0.0
        self._moved = threading.Condition()

    def monotonic(self) -> float:
        with self._moved:
            return self._now

    def time(self) -> float:
        return self.wall0 + self.monotonic()

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        with self._moved:
            deadline = self._now + seconds
            while self._now < deadline and not stop.is_set():
                self._moved.wait(0.05)
        return stop.is_set()

    def advance(self, seconds: float) -> None:
        with self._moved:
            self._now += seconds
            self._moved.notify_all()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


@contextlib.contextmanager
def running_prometheus(targets: list[str], *, scrape_interval: str = "1s",
                       ready_timeout_s: float = 30.0) -> Iterator[str]:
    """A real Prometheus scraping ``targets`` (host:port); yields its base URL."""
    binary = prometheus_binary()
    if binary is None:
        raise FileNotFoundError("prometheus binary not found (apt-get install -y prometheus)")
    with tempfile.TemporaryDirectory(prefix="loadlab-prom-") as tmp:
        config = Path(tmp) / "prometheus.yml"
        quoted = ", ".join(f"'{t}'" for t in targets)
        config.write_text(
            f"global:\n  scrape_interval: {scrape_interval}\n"
            f"  evaluation_interval: {scrape_interval}\n"
            "scrape_configs:\n  - job_name: vllm\n    static_configs:\n"
            f"      - targets: [{quoted}]\n"
        )
        port = free_port()
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(f"{url}/-/ready", proc, ready_timeout_s)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_ready(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"prometheus exited with {proc.returncode}: {err[-500:]}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as resp:
            if resp.status == 200:
                return
        pause.wait(0.1)
    raise TimeoutError(f"prometheus not ready after {timeout_s} s")


def _serve_forever(n: int, page_path: str) -> None:
    """Serve ``n`` copies of a page whose generated-token counter grows; exit on stdin EOF."""
    page = Path(page_path).read_text()
    servers = [PageServer(page).start() for _ in range(n)]
    counter = next(
        (k for k in servers[0]._index if k.startswith("vllm:generation_tokens_total")), None
    )
    for s in servers:
        if counter is not None:
            s.grow(counter, 100.0)
        print(s.url, flush=True)
    sys.stdin.read()
    for s in servers:
        s.stop()


if __name__ == "__main__":
    _serve_forever(int(sys.argv[1]), sys.argv[2])
