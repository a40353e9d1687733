"""How much streaming one load-generator process sustains, beside a plain asyncio peer.

Measured in one run, against one simulator in fast mode (``--time-scale``, so the
server streams far faster than a GPU would and the client is what is measured):

1. loadlab: ``loadlab run --workers 1 --concurrency L1,L2,...`` (the worker process
   is the load generator; the master only records). Per step, after the warm-up:
   requests/s and content chunks/s received, the worker's CPU (cores, from its
   own samples in the manifest), chunks per CPU-second, and the client-added TTFT.
2. peer: the same levels from an asyncio + aiohttp closed-loop client shaped like
   ``vllm bench serve``'s request function (perf_counter before the POST, iterate
   ``response.content`` lines, ``json.loads`` each event), in its own process, CPU
   from ``os.times``. Same prompt and output lengths.

Client-added TTFT = mean client TTFT - mean server TTFT over the same window, the
server's taken from its ``vllm:time_to_first_token_seconds`` histogram (sum/count
deltas from a 4 Hz /metrics poll, divided by the time scale). The simulator's
histogram starts at engine arrival, after its HTTP handling (like vLLM's), so this
difference also holds the server's front-end time; it is the same server for both
clients, so the comparison between them is fair even where the absolute is not.

``--vllm`` runs the same pair against a REAL vLLM instead (the tiny model of
``tools/install_vllm.sh``, ``--max-num-seqs 4``, levels 1,2,4,8,16 by default, no time
scale): whatever part of the client-added TTFT both clients share is the server's own
front end (HTTP parsing and tokenising before vLLM stamps its arrival time, and the SSE
write after). Server and clients run on CPUs of their own (tests/vllm/realvllm.py
``ISOLATION``: on 2 cores vLLM on core 0; either client, and the histogram poller, on
core 1); sharing the cores, the client measures its own starvation (real-vllm.md).

A second pass runs both clients against ``tests/loadgen/fault_server.py`` (aiohttp),
which logs the wall time it wrote each request's first token (by ``X-Request-Id``):
there the client-added delay is exact per request, reported as a median.

Ratio reported: chunks per CPU-second (per core), loadlab / peer, at each level.

Usage: ``python benchmarks/bench_loadgen.py [--levels 4,16,64] [--duration 6] [--time-scale 20] [--vllm]``
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from loadlab.sweep.cpus import CpuSet, format_cpu_list, inherited_affinity

PROMPT_TOKENS = 40
OUTPUT_TOKENS = 96
MODEL = "bench-model"
_HIST = re.compile(r"^vllm:time_to_first_token_seconds_(sum|count)(?:\{[^}]*\})? (\S+)$", re.MULTILINE)


# --------------------------------------------------------------------------- peer
async def _peer_user(session, url: str, body: dict, stop_at: float, out: list, ids) -> None:
    while time.time() < stop_at:
        rid = f"peer-{next(ids)}"
        t_wall = time.time()
        st = time.perf_counter()
        ttft, chunks, first_wall = None, 0, None
        async with session.post(url, json=body, headers={"X-Request-Id": rid}) as resp:
            async for raw in resp.content:
                raw = raw.strip()
                if not raw:
                    continue
                text = raw.decode("utf-8").removeprefix("data: ")
                if text == "[DONE]":
                    continue
                data = json.loads(text)
                choices = data.get("choices")
                if choices and choices[0].get("text"):
                    if ttft is None:
                        ttft = time.perf_counter() - st
                        first_wall = time.time()
                    chunks += 1
        out.append((t_wall, ttft, chunks, rid, first_wall))


async def _peer_level(url: str, level: int, duration: float, warmup: float) -> dict:
    import aiohttp

    body = {"model": MODEL, "prompt": " ".join(["the"] * PROMPT_TOKENS), "max_tokens": OUTPUT_TOKENS,
            "min_tokens": OUTPUT_TOKENS, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    out: list = []
    t_start = time.time()
    stop_at = t_start + duration
    conn = aiohttp.TCPConnector(limit=level, keepalive_timeout=60)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def measure_cpu() -> tuple[float, float]:
            await asyncio.sleep(warmup)
            c0, w0 = _cpu(), time.time()
            await asyncio.sleep(max(0.0, stop_at - time.time()))
            return _cpu() - c0, time.time() - w0

        ids = itertools.count(level * 1_000_000)
        users = [_peer_user(session, f"{url}/v1/completions", body, stop_at, out, ids) for _ in range(level)]
        cpu_task = asyncio.ensure_future(measure_cpu())
        await asyncio.gather(*users)
        cpu_s, wall_s = await cpu_task
    return {"level": level, "t_start": t_start, "t_end": stop_at, "warmup_s": warmup, "rows": out,
            "cpu_cores": cpu_s / wall_s}


def peer_main(url: str, levels: list[int], duration: float, warmup: float) -> None:
    for level in levels:
        print(json.dumps(asyncio.run(_peer_level(url, level, duration, warmup))), flush=True)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


# --------------------------------------------------------------------------- server TTFT
class HistPoller(threading.Thread):
    """Polls the TTFT histogram's sum and count (4 Hz) with timestamps."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        import httpx

        self.client = httpx.Client(timeout=5)
        self.url = url + "/metrics"
        self.samples: list[tuple[float, float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.25):
            values = {"sum": 0.0, "count": 0.0}
            for kind, v in _HIST.findall(self.client.get(self.url).text):
                values[kind] += float(v)
            self.samples.append((time.time(), values["sum"], values["count"]))

    def mean_between(self, t0: float, t1: float) -> float | None:
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2 or inside[-1][2] == inside[0][2]:
            return None
        return (inside[-1][1] - inside[0][1]) / (inside[-1][2] - inside[0][2])


# --------------------------------------------------------------------------- runs
def _profile(dir_: Path) -> Path:
    path = dir_ / "bench.yaml"
    path.write_text(textwrap.dedent(f"""\
        format_version: 1
        name: bench
        description: fixed lengths for the load-generator benchmark
        source: {{dataset: none, origin: benchmarks/bench_loadgen.py, licence: none, citation: none,
                 derivation: fixed}}
        lengths:
          input: {{p: [0.0, 1.0], v: [{PROMPT_TOKENS}, {PROMPT_TOKENS}]}}
          output: {{p: [0.0, 1.0], v: [{OUTPUT_TOKENS}, {OUTPUT_TOKENS}]}}
          input_summary: {{n: 1, mean: {PROMPT_TOKENS}, p10: 1, p25: 1, p50: 1, p75: 1, p90: 1, p99: 1, max: 1}}
          output_summary: {{n: 1, mean: {OUTPUT_TOKENS}, p10: 1, p25: 1, p50: 1, p75: 1, p90: 1, p99: 1, max: 1}}
        arrivals: {{process: none}}
        prefix: {{kind: none}}
        """))
    return path


@dataclass
class Measured:
    """One client at one level: what it sent and saw inside the measured window."""

    client: str
    level: int
    t0: float
    t1: float
    cpu_cores: float
    ttfts: list[float]
    chunks: int
    firsts: dict[str, float]      # request id -> client first-token unix time

    def figures(self, server_ttft_s: float | None, server_firsts: dict[str, float]) -> dict:
        span = self.t1 - self.t0
        n = len(self.ttfts)
        client = sum(self.ttfts) / n if n else float("nan")
        delays = sorted(t - server_firsts[r] for r, t in self.firsts.items() if r in server_firsts)
        return {
            "client": self.client, "level": self.level, "req_s": n / span, "chunks_s": self.chunks / span,
            "cpu_cores": self.cpu_cores,
            "chunks_per_cpu_s": self.chunks / span / self.cpu_cores if self.cpu_cores else float("nan"),
            "ttft_ms": client * 1e3,
            "mean_added_ms": (client - server_ttft_s) * 1e3 if server_ttft_s is not None else float("nan"),
            "median_added_ms": delays[len(delays) // 2] * 1e3 if delays else float("nan"),
        }


def run_loadlab(url: str, level: int, duration: float, warmup: float, tmp: Path,
                cpus: CpuSet | None = None) -> Measured:
    from loadlab.runstore import REQUESTS, read_manifest, read_table

    out = tmp / f"loadlab-{level}-{time.time_ns()}"
    cmd = [sys.executable, "-m", "loadlab", "run", "--target", url, "--model", MODEL, "--profile",
           str(_profile(tmp)), "--concurrency", str(level), "--step-duration", str(duration),
           "--warmup", str(warmup), "--workers", "1", "--no-calibrate", "--seed", str(time.time_ns() % 10**9),
           "--out", str(out)] + (["--client-cpus", format_cpu_list(cpus)] if cpus else [])
    # exit 3: the client fell short of the load; the figures below show by how much
    if subprocess.run(cmd, check=False, capture_output=True).returncode not in (0, 3):
        raise RuntimeError(f"loadlab run failed at level {level}; see {out}")
    df = read_table(out / "requests.parquet", REQUESTS)
    w = read_manifest(out)["steps"][0]
    t0, t1 = w["t_start"] + w["warmup_s"], w["t_end"]
    sel = df[(df.t_sent >= t0) & (df.t_sent < t1) & (df.status == "ok")]
    return Measured("loadlab", level, t0, t1, w["client_cpu_cores"], sel.ttft_s.tolist(), int(sel.n_chunks.sum()),
                    dict(zip(sel.request_id, sel.t_first_token)))


def run_peer(url: str, level: int, duration: float, warmup: float, tmp: Path,
             cpus: CpuSet | None = None) -> Measured:
    with inherited_affinity(cpus):
        proc = subprocess.run([sys.executable, __file__, "--peer", url, "--levels", str(level),
                               "--duration", str(duration), "--warmup", str(warmup)],
                              check=True, capture_output=True, text=True)
    r = json.loads(proc.stdout.splitlines()[-1])
    t0, t1 = r["t_start"] + r["warmup_s"], r["t_end"]
    sel = [x for x in r["rows"] if t0 <= x[0] < t1 and x[1] is not None]
    return Measured("peer", level, t0, t1, r["cpu_cores"], [x[1] for x in sel], sum(x[2] for x in sel),
                    {x[3]: x[4] for x in sel})


def compare(url: str, levels: list[int], args: argparse.Namespace, tmp: Path,
            server_ttft: Callable[[float, float], float | None],
            server_firsts: Callable[[], dict[str, float]]) -> list[dict]:
    """Both clients at each level against one server, alternating which goes first (so a
    server state one run leaves behind, a backlog or a lagging clock, is shared fairly)."""
    measured: list[Measured] = []
    for i, level in enumerate(levels):
        pair = [run_peer, run_loadlab]
        for go in pair if i % 2 == 0 else pair[::-1]:
            measured.append(go(url, level, args.duration, args.warmup, tmp, args.client_cpus))
    firsts = server_firsts()
    return [m.figures(server_ttft(m.t0, m.t1), firsts) for m in measured]


def report(title: str, results: list[dict], levels: list[int]) -> None:
    print(f"\n{title}")
    print(f"{'client':8} {'level':>5} {'req/s':>8} {'chunks/s':>9} {'cpu':>6} {'chunks/cpu-s':>12} "
          f"{'ttft ms':>8} {'mean+ ms':>8} {'med+ ms':>8}")
    for r in sorted(results, key=lambda r: (r["level"], r["client"])):
        print(f"{r['client']:8} {r['level']:5d} {r['req_s']:8.1f} {r['chunks_s']:9.0f} {r['cpu_cores']:6.2f} "
              f"{r['chunks_per_cpu_s']:12.0f} {r['ttft_ms']:8.2f} {r['mean_added_ms']:8.2f} "
              f"{r['median_added_ms']:8.2f}")
    by = {(r["client"], r["level"]): r for r in results}
    for level in levels:
        ratio = by[("loadlab", level)]["chunks_per_cpu_s"] / by[("peer", level)]["chunks_per_cpu_s"]
        print(f"level {level}: loadlab/peer chunks per CPU-second = {ratio:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="4,16,64")
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--warmup", type=float, default=1.5)
    ap.add_argument("--time-scale", type=float, default=20.0)
    ap.add_argument("--vllm", action="store_true", help="against a real vLLM (tiny model) instead")
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    args.client_cpus = None
    if args.peer:
        peer_main(args.peer, levels, args.duration, args.warmup)
        return
    if args.vllm:
        vllm_main([int(x) for x in ("1,2,4,8,16" if args.levels == "4,16,64" else args.levels).split(",")],
                  args)
        return
    import httpx

    from loadlab.sim.testing import running_sim

    with tempfile.TemporaryDirectory() as tmp:
        with running_sim(served_model_name=MODEL, time_scale=args.time_scale, max_num_seqs=256) as url:
            poller = HistPoller(url)
            poller.start()
            sim = compare(url, levels, args, Path(tmp),
                          lambda t0, t1: _scaled(poller.mean_between(t0, t1), args.time_scale), dict)
            poller.stop.set()
        report(f"simulator, --time-scale {args.time_scale:g} (mean+ = client TTFT - server histogram TTFT)",
               sim, levels)
        with _fault_server() as url:
            exact = compare(url, levels, args, Path(tmp), lambda t0, t1: None,
                            lambda: httpx.get(f"{url}/debug/first_token").json())
        report("reference SSE server, per request (med+ = client first token - server write time, median)",
               exact, levels)


def vllm_main(levels: list[int], args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "vllm"))
    from realvllm import ISOLATION, missing_reason, tiny_vllm

    if missing_reason():
        sys.exit(missing_reason())
    args.client_cpus = ISOLATION.client_cpus
    with tempfile.TemporaryDirectory() as tmp, \
            tiny_vllm(Path(tmp) / "server", served_model_name=MODEL, max_num_seqs=4,
                      num_gpu_blocks_override=512) as target:
        poller = HistPoller(target.base_url)
        with inherited_affinity(args.client_cpus):
            poller.start()
        results = compare(target.base_url, levels, args, Path(tmp), poller.mean_between, dict)
        poller.stop.set()
    report("real vLLM (tiny model, --max-num-seqs 4, server and clients on their own CPUs; "
           "mean+ = client TTFT - vLLM's TTFT histogram)",
           results, levels)


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value / scale


@contextmanager
def _fault_server() -> Iterator[str]:
    """tests/loadgen/fault_server.py: logs each request's first-token write time by X-Request-Id."""
    script = Path(__file__).resolve().parents[1] / "tests" / "loadgen" / "fault_server.py"
    proc = subprocess.Popen([sys.executable, str(script), "--ttft-ms", "2", "--itl-ms", "0.5", "--model", MODEL],
                            stdout=subprocess.PIPE, text=True)
    try:
        yield f"http://127.0.0.1:{int(proc.stdout.readline().split()[1])}"
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
