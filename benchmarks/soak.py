"""Soak: a long run through resets and a server restart loses no request and grows no memory.

``python benchmarks/soak.py --duration-s 3600`` (from the repository root):

1. ``loadlab sim serve`` on a fixed loopback port, in a subprocess.
2. A TCP proxy in this process (:class:`ResettingProxy`) in front of it. It counts every
   completion request the clients send through it (``POST /v1/completions``), and resets
   (TCP RST) about ``--reset-fraction`` of them once the response has begun streaming.
   While the server is down it holds a new connection up to 20 s for the server to come
   back (as a load balancer retries), then closes it: the client records a request that
   got no answer. Requests in flight when the server dies are cut: their rows say so.
   (Without the wait, a restart slower than 5 s, as the simulator's is on a busy 2-core
   machine, stops the run: :mod:`loadlab.loadgen.guards`' "no connection" rule.)
3. ``loadlab run --target <proxy>`` for the duration, one closed-loop step of
   ``--users`` users, ``--workers 1``.
4. At half time the simulator is killed (SIGKILL) and started again on the same port.
5. Every 30 s the RSS of the run's process tree (``loadlab run``, the point's child, the
   Locust worker) is sampled.

Printed: requests the proxy accepted beside the rows in ``requests.parquet`` (they must be
equal: every request issued has a row, whatever its outcome), the rows by status and
error, the restart's down time, and the tree's RSS first / last / max with its slope
(least squares, MB per hour; flat is the goal).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from loadlab.pystart import module_argv
from loadlab.runstore import REQUESTS, read_manifest, read_table

REQUEST_LINE = re.compile(rb"POST /v1/(?:chat/)?completions ")
UPSTREAM_WAIT_S = 20.0
RSS_EVERY_S = 30.0


@dataclass
class ProxyCounts:
    accepted: int = 0          # completion requests read from clients
    resets: int = 0            # of them, reset mid-stream on purpose
    refused: int = 0           # of them, closed because the server was down
    connections: int = 0


@dataclass
class ResettingProxy:
    """Loopback TCP proxy to ``upstream_port`` that counts and resets requests."""

    upstream_port: int
    reset_fraction: float
    seed: int = 0
    counts: ProxyCounts = field(default_factory=ProxyCounts)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.port = 0

    def start(self) -> ResettingProxy:
        threading.Thread(target=self._serve, daemon=True, name="proxy").start()
        self._ready.wait()
        return self

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.counts.connections += 1
        first = await creader.read(65536)
        if not first:
            cwriter.close()
            return
        pending_reset = [self._count(first)]
        upstream = await self._connect()
        if upstream is None:
            self.counts.refused += len(REQUEST_LINE.findall(first))
            _abort(cwriter)
            return
        ureader, uwriter = upstream
        uwriter.write(first)

        async def client_to_server() -> None:
            while data := await creader.read(65536):
                pending_reset.append(self._count(data))
                uwriter.write(data)
                await uwriter.drain()
            uwriter.close()

        async def server_to_client() -> None:
            while data := await ureader.read(65536):
                cwriter.write(data)
                await cwriter.drain()
                if any(pending_reset):      # the marked request's response has begun
                    self.counts.resets += 1
                    _abort(cwriter)
                    _abort(uwriter)
                    return
            cwriter.close()

        up = asyncio.ensure_future(client_to_server())
        down = asyncio.ensure_future(server_to_client())
        await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0)
        for task in (up, down):
            if not task.done():
                task.cancel()
        for writer in (cwriter, uwriter):
            if not writer.is_closing():
                writer.close()

    def _count(self, data: bytes) -> bool:
        """Count the requests in ``data``; True when the (last) one is to be reset."""
        n = len(REQUEST_LINE.findall(data))
        self.counts.accepted += n
        return n > 0 and self._rng.random() < self.reset_fraction

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        deadline = time.monotonic() + UPSTREAM_WAIT_S
        while True:
            try:
                return await asyncio.open_connection("127.0.0.1", self.upstream_port)
            except OSError:
                if time.monotonic() > deadline:
                    return None
                await asyncio.sleep(0.1)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a crashed peer or a middlebox does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sim(port: int, log: Path) -> subprocess.Popen:
    argv = module_argv("loadlab", "sim", "serve", "--host", "127.0.0.1", "--port", str(port))
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out, env=_env())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the simulator exited; see {log}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the simulator did not get healthy in 60 s; see {log}")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}


def tree_rss_mb(pid: int) -> float | None:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration-s", type=float, default=3600.0)
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--reset-fraction", type=float, default=0.05)
    ap.add_argument("--profile", default="sharegpt")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="loadlab-soak-"))
    out = args.out or work / "run"
    sim_port = free_port()
    sim_log = work / "sim.log"
    sim = start_sim(sim_port, sim_log)
    model = httpx.get(f"http://127.0.0.1:{sim_port}/v1/models").json()["data"][0]["id"]
    proxy = ResettingProxy(sim_port, args.reset_fraction).start()
    run_argv = module_argv("loadlab", "run", "--target", f"http://127.0.0.1:{proxy.port}",
                           "--model", model, "--profile", args.profile, "--concurrency",
                           str(args.users), "--step-duration", str(args.duration_s),
                           "--workers", "1", "--no-calibrate", "--out", str(out))
    t0 = time.monotonic()
    run = subprocess.Popen(run_argv, env=_env(), stdout=subprocess.PIPE,
                           stderr=(work / "run.log").open("w"), text=True)
    rss: list[tuple[float, float]] = []
    restart_at, down_s = args.duration_s / 2, None
    next_rss = RSS_EVERY_S  # the first sample once the worker is up and warm
    while run.poll() is None:
        now = time.monotonic() - t0
        if down_s is None and now >= restart_at:
            sim.send_signal(signal.SIGKILL)
            sim.wait()
            t_kill = time.monotonic()
            sim = start_sim(sim_port, sim_log)
            down_s = time.monotonic() - t_kill
        if now >= next_rss:
            mb = tree_rss_mb(run.pid)
            if mb is not None:
                rss.append((now, mb))
            next_rss += RSS_EVERY_S
        time.sleep(0.5)
    stdout = run.stdout.read() if run.stdout else ""
    sim.terminate()
    sim.wait()

    rows = read_table(out / "requests.parquet", REQUESTS, columns=["status", "error"])
    manifest = read_manifest(out)
    kinds = rows.assign(error=rows.error.fillna("").str.slice(0, 60)).groupby(
        ["status", "error"], dropna=False).size().sort_values(ascending=False)
    c = proxy.counts
    print(f"soak: {args.duration_s:.0f} s, {args.users} users, reset fraction "
          f"{args.reset_fraction:g}, run exit {run.returncode}, manifest {manifest.get('status')}")
    print(stdout.strip())
    print(f"{'figure':<44}{'value':>12}")
    for name, value in (
        ("requests accepted at the proxy", c.accepted),
        ("rows in requests.parquet", len(rows)),
        ("difference (rows - accepted)", len(rows) - c.accepted),
        ("  reset mid-stream by the proxy", c.resets),
        ("  closed: server down too long", c.refused),
        ("connections accepted", c.connections),
        ("server down during restart, s", f"{down_s:.1f}" if down_s is not None else "-"),
    ):
        print(f"{name:<44}{value!s:>12}")
    print("rows by status / error:")
    for (status, error), n in kinds.items():
        print(f"  {n:>8}  {status:<10} {error}")
    if len(rss) >= 2:
        t, mb = np.array(rss).T
        slope = np.polyfit(t / 3600.0, mb, 1)[0]
        print(f"RSS of the run's tree ({len(rss)} samples, every {RSS_EVERY_S:.0f} s): first "
              f"{mb[0]:.1f} MB, last {mb[-1]:.1f} MB, max {mb.max():.1f} MB, "
              f"slope {slope:+.1f} MB/hour")
    else:
        print(f"RSS: {len(rss)} sample(s) only; run longer than {RSS_EVERY_S:.0f} s")
    print(f"run folder: {out}; logs: {work}")
    if len(rows) != c.accepted:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
