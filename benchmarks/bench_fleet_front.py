"""Does the simulator's HTTP front stay responsive while a fleet streams?

Starts ``loadlab sim serve --replicas R --router round-robin --max-num-seqs S`` (one
process: R engines behind one front) and keeps R x S streaming completions open from this
process (aiohttp, closed loop, ``ignore_eos``, fixed lengths). Once every stream is open,
a scraper in a process of its own (so the client's event loop does not delay it) polls
``GET /metrics`` (the front: replica 0's page) and ``GET /replica/<i>/metrics`` for every
replica in turn, a pass every ``--interval`` seconds, as a collector scraping each replica
would, and times each page from request to last byte; each pass also reads ``/health``
(a handler that does nothing) as a control: what any request waits for the event loop.
The scraper stops when the load does. Printed: p50 / p99 / max per page kind (front,
replica, health), the same with no load (before the streams start), the running requests
the replicas' own pages reported (summed over a pass, to show the load was on), the
streams' event rate, and the server's CPU use and the time it sat runnable but not running
(``/proc/PID/schedstat``): on a shared host, how much CPU it was denied.

Goal (issue: fleets): /metrics p99 < 50 ms at 8 replicas x 64 streams.

Usage: python benchmarks/bench_fleet_front.py [--replicas 8] [--streams-per-replica 64]
       [--seconds 30] [--interval 0.25]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import re
import time
from multiprocessing.synchronize import Event

import aiohttp
import httpx
import numpy as np
from bench_sim_live import _children, _cpu_seconds, _runqueue_wait_s

from loadlab.sim.serve.testing import running_sim

RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\} ([0-9.e+]+)$", re.M)


def scrape(base: str, replicas: int, interval: float, stop: Event,
           out: mp.Queue) -> None:
    """Poll the front's and every replica's page until ``stop``; put (kind, seconds) rows
    and the running sums of each pass on ``out``."""
    paths = [("front", "/metrics"), ("health", "/health")] + [
        ("replica", f"/replica/{i}/metrics") for i in range(replicas)]
    rows: list[tuple[str, float]] = []
    running: list[float] = []
    with httpx.Client(base_url=base, timeout=10.0) as client:
        while not stop.is_set():
            start, total = time.perf_counter(), 0.0
            for kind, path in paths:
                t0 = time.perf_counter()
                body = client.get(path).text
                rows.append((kind, time.perf_counter() - t0))
                if kind == "replica":
                    total += sum(float(v) for v in RUNNING.findall(body))
            running.append(total)
            time.sleep(max(0.0, interval - (time.perf_counter() - start)))
    out.put((rows, running))


async def load(base: str, streams: int, seconds: float, prompt_words: int, max_tokens: int,
               opened: asyncio.Event) -> dict[str, float]:
    """``streams`` closed-loop streaming users for ``seconds``; sets ``opened`` once every
    user has its first stream open."""
    prompt = " ".join(f"w{i}" for i in range(prompt_words))
    deadline = time.monotonic() + seconds
    counts = {"requests": 0, "events": 0}
    started = [0]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(base_url=base, connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:

        async def user(u: int) -> None:
            first = True
            while time.monotonic() < deadline:
                body = {"prompt": f"user{u} {prompt}", "max_tokens": max_tokens,
                        "ignore_eos": True, "stream": True}
                async with session.post("/v1/completions", json=body) as r:
                    async for line in r.content:
                        if first:
                            first = False
                            started[0] += 1
                            if started[0] == streams:
                                opened.set()
                        if line.startswith(b"data: {"):
                            counts["events"] += 1
                counts["requests"] += 1

        t0 = time.monotonic()
        await asyncio.gather(*(user(u) for u in range(streams)))
        counts["wall_s"] = time.monotonic() - t0
    return counts


def start_scraper(base: str, args: argparse.Namespace) -> tuple[mp.Process, Event, mp.Queue]:
    stop, out = mp.Event(), mp.Queue()
    scraper = mp.Process(target=scrape, args=(base, args.replicas, args.interval, stop, out))
    scraper.start()
    return scraper, stop, out


def finish_scraper(scraper: mp.Process, stop: Event,
                   out: mp.Queue) -> tuple[list[tuple[str, float]], list[float]]:
    stop.set()
    rows, running = out.get(timeout=30)
    scraper.join()
    return rows, running


def latency_table(title: str, rows: list[tuple[str, float]]) -> None:
    print(f"{title}\n{'page':<8} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for kind in ("front", "replica", "health"):
        ms = np.array([s for k, s in rows if k == kind]) * 1e3
        print(f"{kind:<8} {len(ms):>5} {np.percentile(ms, 50):>8.1f} "
              f"{np.percentile(ms, 99):>8.1f} {ms.max():>8.1f}")


async def run(base: str, server: int | None, args: argparse.Namespace) -> None:
    streams = args.replicas * args.streams_per_replica
    idle = start_scraper(base, args)
    await asyncio.sleep(args.idle_seconds)
    idle_rows, _ = finish_scraper(*idle)
    opened = asyncio.Event()
    t_end = time.monotonic() + args.seconds
    clients = asyncio.create_task(load(base, streams, args.seconds, args.prompt_words,
                                       args.max_tokens, opened))
    await asyncio.wait_for(opened.wait(), timeout=args.seconds)
    busy = start_scraper(base, args)
    t_open, cpu0, wait0 = time.monotonic(), _cpu_seconds(server), _runqueue_wait_s(server)
    await asyncio.sleep(max(0.0, t_end - time.monotonic()))
    rows, running = finish_scraper(*busy)
    span = time.monotonic() - t_open
    cpu, wait = _cpu_seconds(server) - cpu0, _runqueue_wait_s(server) - wait0
    counts = await clients
    print(f"{streams} streams ({args.replicas} replicas x {args.streams_per_replica}), "
          f"{counts['requests']} requests, {counts['events'] / counts['wall_s']:,.0f} events/s; "
          f"scraped for {span:.1f} s under load")
    print(f"server over that span: CPU {cpu / span:.0%} of a core, runnable but waiting for "
          f"a CPU {wait / span:.0%} of the time; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    print(f"running over the replicas' pages, per pass: median {np.median(running):.0f}, "
          f"min {min(running):.0f}, max {max(running):.0f}")
    latency_table("no load:", idle_rows)
    latency_table("under load:", rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--streams-per-replica", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=0.25,
                    help="seconds between scrape passes (each pass reads every page)")
    ap.add_argument("--idle-seconds", type=float, default=5.0,
                    help="scraping before the load starts (the no-load figures)")
    ap.add_argument("--nice", type=int, default=0,
                    help="the server's niceness (negative needs root): on a shared host, "
                         "approximates the dedicated core the goal assumes")
    ap.add_argument("--prompt-words", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=512)
    args = ap.parse_args()
    with running_sim(replicas=args.replicas, router="round-robin",
                     max_num_seqs=args.streams_per_replica, max_model_len=4096,
                     gpu="h100") as base:
        kids = _children()
        server = kids[-1] if kids else None
        if server is not None and args.nice:
            os.setpriority(os.PRIO_PROCESS, server, args.nice)
        asyncio.run(run(base, server, args))


if __name__ == "__main__":
    main()
