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

Ratio reported: chunks per CPU-second (per core), loadlab / peer, at each level.

Usage: ``python benchmarks/bench_loadgen.py [--levels 4,16,64] [--duration 6] [--time-scale 20]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

PROMPT_TOKENS = 40
OUTPUT_TOKENS = 96
MODEL = "bench-model"
_HIST = re.compile(r"^vllm:time_to_first_token_seconds_(sum|count)(?:\{[^}]*\})? (\S+)$", re.M)


# --------------------------------------------------------------------------- peer
async def _peer_user(session, url: str, body: dict, stop_at: float, out: list) -> None:
    while time.time() < stop_at:
        t_wall = time.time()
        st = time.perf_counter()
        ttft, chunks = None, 0
        async with session.post(url, json=body) as resp:
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
                    chunks += 1
        out.append((t_wall, ttft, chunks))


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

        users = [_peer_user(session, f"{url}/v1/completions", body, stop_at, out) for _ in range(level)]
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


def _figures(name: str, level: int, t0: float, t1: float, ttfts: list[float], chunks: int,
             cpu_cores: float, poller: HistPoller, time_scale: float, n: int) -> dict:
    span = t1 - t0
    server = poller.mean_between(t0, t1)
    client = sum(ttfts) / len(ttfts) if ttfts else float("nan")
    return {
        "client": name, "level": level, "req_s": n / span, "chunks_s": chunks / span,
        "cpu_cores": cpu_cores, "chunks_per_cpu_s": chunks / span / cpu_cores if cpu_cores else float("nan"),
        "ttft_ms": client * 1e3,
        "added_ms": (client - server / time_scale) * 1e3 if server is not None else float("nan"),
    }


def run_loadlab(url: str, levels: list[int], duration: float, warmup: float, tmp: Path,
                poller: HistPoller, time_scale: float) -> list[dict]:
    from loadlab.runstore import REQUESTS, read_manifest, read_table

    out = tmp / f"loadlab-{levels[0]}"
    cmd = [sys.executable, "-m", "loadlab", "run", "--target", url, "--model", MODEL, "--profile",
           str(_profile(tmp)), "--concurrency", ",".join(map(str, levels)), "--step-duration", str(duration),
           "--warmup", str(warmup), "--workers", "1", "--no-calibrate", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    df = read_table(out / "requests.parquet", REQUESTS)
    rows = []
    for w in read_manifest(out)["steps"]:
        t0, t1 = w["t_start"] + w["warmup_s"], w["t_end"]
        sel = df[(df.t_sent >= t0) & (df.t_sent < t1) & (df.status == "ok")]
        rows.append(_figures("loadlab", w["concurrency"], t0, t1, sel.ttft_s.tolist(), int(sel.n_chunks.sum()),
                             w["client_cpu_cores"], poller, time_scale, len(sel)))
    return rows


def run_peer(url: str, levels: list[int], duration: float, warmup: float, poller: HistPoller,
             time_scale: float) -> list[dict]:
    proc = subprocess.run([sys.executable, __file__, "--peer", url, "--levels", ",".join(map(str, levels)),
                           "--duration", str(duration), "--warmup", str(warmup)],
                          check=True, capture_output=True, text=True)
    rows = []
    for line in proc.stdout.splitlines():
        r = json.loads(line)
        t0, t1 = r["t_start"] + r["warmup_s"], r["t_end"]
        sel = [x for x in r["rows"] if t0 <= x[0] < t1 and x[1] is not None]
        rows.append(_figures("peer", r["level"], t0, t1, [x[1] for x in sel], sum(x[2] for x in sel),
                             r["cpu_cores"], poller, time_scale, len(sel)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="4,16,64")
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--warmup", type=float, default=1.5)
    ap.add_argument("--time-scale", type=float, default=20.0)
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    if args.peer:
        peer_main(args.peer, levels, args.duration, args.warmup)
        return
    from loadlab.sim.testing import running_sim

    with tempfile.TemporaryDirectory() as tmp, running_sim(served_model_name=MODEL, time_scale=args.time_scale,
                                                           max_num_seqs=256) as url:
        poller = HistPoller(url)
        poller.start()
        results = []
        # Same server; at each level both clients, alternating which goes first, so a
        # server state left by one run (a backlog, a lagging clock) is shared fairly.
        for i, level in enumerate(levels):
            pair = [
                lambda: run_peer(url, [level], args.duration, args.warmup, poller, args.time_scale),
                lambda: run_loadlab(url, [level], args.duration, args.warmup, Path(tmp), poller, args.time_scale),
            ]
            for go in pair if i % 2 == 0 else pair[::-1]:
                results += go()
        poller.stop.set()
    print(f"{'client':8} {'level':>5} {'req/s':>8} {'chunks/s':>9} {'cpu':>6} {'chunks/cpu-s':>12} "
          f"{'ttft ms':>8} {'added ms':>8}")
    for r in sorted(results, key=lambda r: (r["level"], r["client"])):
        print(f"{r['client']:8} {r['level']:5d} {r['req_s']:8.1f} {r['chunks_s']:9.0f} {r['cpu_cores']:6.2f} "
              f"{r['chunks_per_cpu_s']:12.0f} {r['ttft_ms']:8.2f} {r['added_ms']:8.2f}")
    by = {(r["client"], r["level"]): r for r in results}
    for level in levels:
        ratio = by[("loadlab", level)]["chunks_per_cpu_s"] / by[("peer", level)]["chunks_per_cpu_s"]
        print(f"level {level}: loadlab/peer chunks per CPU-second = {ratio:.2f}x")


if __name__ == "__main__":
    main()
