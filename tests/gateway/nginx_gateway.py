"""A real nginx in front of several servers, over https, for the gateway tests.

:func:`running_gateway` writes an nginx configuration into a folder of its own, starts
``nginx -p PREFIX -c CONF -e ERRLOG -g 'daemon off;'`` (the pid file, logs and every temp
path inside that folder, so nothing of Debian's packaged nginx is touched and the tests
need no port below 1024), waits until the gateway answers over https, and stops it on the
way out. The configuration is what a production gateway in front of vLLM needs for
streaming: ``proxy_buffering off`` (tokens reach the client as the server sends them), HTTP
/1.1 with an empty ``Connection`` header to a ``keepalive`` upstream (connections reused,
as nginx's ``ngx_http_upstream_module`` documentation prescribes for keepalive).

The access log records ``$upstream_addr`` per request, so a test can count which replica
served what (:meth:`Gateway.routed`). ``proxy_next_upstream off``: a request goes to one
replica only, and a replica's failure reaches the client (a 502 row) instead of being
retried on the other, so each request is one log line naming one replica.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from loadlab.collect.testing import free_port

METHODS = ("round-robin", "least_conn")
HEALTH = "/gateway-health"
# one line per request: when it ended, what it was, which replica served it, for how long
LOG_FORMAT = "$msec $request_method $uri $status $upstream_addr $request_time"


def nginx_binary() -> str | None:
    """nginx on PATH, or Debian's location (``/usr/sbin`` is not on every user's PATH)."""
    found = shutil.which("nginx")
    if found is None and Path("/usr/sbin/nginx").exists():
        found = "/usr/sbin/nginx"
    return found


@dataclass(frozen=True)
class Routed:
    """One request as nginx logged it."""

    ended: float          # unix seconds
    method: str
    path: str
    status: int
    upstream: str         # host:port of the replica, "-" when nginx answered itself
    seconds: float        # $request_time: from the request's first byte to the last sent

    @property
    def started(self) -> float:
        return self.ended - self.seconds

    @property
    def completion(self) -> bool:
        """A completion (or chat completion) the replica answered 200."""
        return self.method == "POST" and self.path.startswith("/v1/") and self.status == 200


@dataclass(frozen=True)
class Gateway:
    url: str              # https://127.0.0.1:PORT
    access_log: Path

    def routed(self) -> list[Routed]:
        """The proxied requests logged so far (nginx writes each line as it ends)."""
        rows = []
        for line in self.access_log.read_text().splitlines():
            ended, method, path, status, upstream, seconds = line.split()
            if upstream != "-":
                rows.append(Routed(float(ended), method, path, int(status), upstream,
                                   float(seconds)))
        return rows


def completions(routed: Iterable[Routed], replica: str, since: float = 0.0,
                until: float = float("inf")) -> int:
    """How many completions the replica (base URL) answered that ended in [since, until]."""
    return sum(1 for r in routed if r.upstream == netloc(replica) and r.completion
               and since <= r.ended <= until)


def mean_in_flight(routed: Iterable[Routed], t0: float, t1: float) -> Counter[str]:
    """Per replica, how many of its requests nginx had in flight on average between t0 and
    t1 (unix seconds): each request's time inside the window, summed, over its length. This
    is what ``least_conn`` balances (the upstream's active connections, as nginx counts)."""
    busy: Counter[str] = Counter()
    for r in routed:
        busy[r.upstream] += max(min(r.ended, t1) - max(r.started, t0), 0.0) / (t1 - t0)
    return busy


def netloc(url: str) -> str:
    """A base URL as nginx's ``$upstream_addr`` names it (host:port)."""
    return urlsplit(url).netloc


def gateway_config(prefix: Path, port: int, replicas: list[str], method: str,
                   cert: Path, key: Path) -> str:
    """nginx.conf for an https gateway on ``port`` balancing ``/v1/`` over ``replicas``
    (base URLs) with ``method``."""
    if method not in METHODS:
        raise ValueError(f"method {method!r}: one of {', '.join(METHODS)}")
    servers = "\n".join(f"        server {netloc(u)};" for u in replicas)
    balance = "        least_conn;\n" if method == "least_conn" else ""
    # nginx run by root starts its workers as "nobody", who cannot enter pytest's private
    # temp folders (request bodies are spooled there): as root the workers stay root.
    user = "user root;\n" if os.geteuid() == 0 else ""
    temp = "\n".join(f"    {kind}_temp_path {prefix}/{kind}_temp;"
                     for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""{user}worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format upstream '{LOG_FORMAT}';
    access_log {prefix}/access.log upstream;
{temp}
    upstream replicas {{
{balance}{servers}
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        location = {HEALTH} {{ access_log off; return 200 "ok\\n"; }}
        location /v1/ {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_next_upstream off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


@contextmanager
def running_gateway(folder: Path, replicas: list[str], cert: Path, key: Path,
                    method: str = "round-robin", ready_timeout_s: float = 15.0,
                    attempts: int = 3) -> Iterator[Gateway]:
    """nginx balancing ``replicas`` behind https on a free port; yields it once it answers.

    The port is picked free and then bound by nginx, so another process can take it in
    between: a start that fails on a taken port is retried on another."""
    binary = nginx_binary()
    if binary is None:
        raise FileNotFoundError("nginx not found (apt-get install -y nginx)")
    folder.mkdir(parents=True, exist_ok=True)
    for attempt in range(attempts):
        port = free_port()
        conf = folder / "nginx.conf"
        conf.write_text(gateway_config(folder, port, replicas, method, cert, key))
        proc = subprocess.Popen(
            [binary, "-p", str(folder), "-c", str(conf), "-e", str(folder / "error.log"),
             "-g", "daemon off;"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url = f"https://127.0.0.1:{port}"
        try:
            _wait_answering(url, cert, proc, ready_timeout_s)
        except _PortTaken:
            _stop(proc)
            if attempt + 1 == attempts:
                raise
            continue
        except BaseException:
            _stop(proc)
            raise
        try:
            yield Gateway(url, folder / "access.log")
        finally:
            _stop(proc)
        return


class _PortTaken(RuntimeError):
    pass


def _wait_answering(url: str, cert: Path, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(verify=ssl.create_default_context(cafile=cert), timeout=1.0) as client:
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read() if proc.stderr else ""
                if "Address already in use" in err:
                    raise _PortTaken(err)
                raise RuntimeError(f"nginx exited with {proc.returncode}: {err[-800:]}")
            try:
                if client.get(url + HEALTH).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"nginx did not answer at {url}{HEALTH} in {timeout_s} s")
            time.sleep(0.02)   # poll pause, not synchronisation: the deadline bounds it


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM is nginx's fast shutdown: the master ends its workers and exits."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stderr:
        proc.stderr.close()
