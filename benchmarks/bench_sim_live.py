"""Can the live simulator keep the modelled pace with many concurrent streams?

Starts ``loadlab sim serve`` as a subprocess pinned to one core and a lean aiohttp
client in this process pinned to another (when the machine has two); the client
keeps ``--streams`` streaming completions open (closed loop, ``ignore_eos``, fixed
lengths) for ``--seconds``. Reported side by side:

- the server's modelled vs measured step periods over busy steps
  (``GET /sim/stats``; goal: ratio within 5 % of 1.0), steps published late, re-anchors;
- tokens/s the client received vs what the modelled step times allow;
- the server process's CPU use (share of one core), per SSE event, and the share of
  one core it would need to run at the modelled pace (server CPU seconds / modelled
  seconds): on a shared, busy host the measured ratio suffers from CPU the server did
  not get; this figure says whether one dedicated core suffices, and the time the
  server sat runnable on a run queue (/proc/PID/schedstat) shows how much it was denied.

Then the same closed loop straight into a ``LiveDriver`` in this process (no HTTP), to
separate the engine and driver from the HTTP front.

Usage: python benchmarks/bench_sim_live.py [--streams 256] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import time

import aiohttp
import httpx

from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.hardware import resolve
from loadlab.sim.serve.live import LiveDriver
from loadlab.sim.serve.testing import running_sim


async def driver_only(streams: int, seconds: float, prompt_words: int, max_tokens: int,
                      flags: dict) -> tuple[dict, float]:
    """The same closed loop straight into a LiveDriver in this process (no HTTP):
    isolates the engine and driver from the HTTP front. Returns (periods, CPU seconds)."""
    cfg = SimConfig(**flags)
    driver = LiveDriver(cfg, resolve(cfg))
    driver.start()
    cpu0 = time.process_time()
    deadline = time.monotonic() + seconds
    sent = [0]

    async def user(u: int) -> None:
        while time.monotonic() < deadline:
            sent[0] += 1
            ids = [u * 10_000 + sent[0] % 7 + i for i in range(prompt_words + 1)]
            stream = driver.submit(f"r{sent[0]}", ids, max_tokens, ignore_eos=True)
            finish = None
            while finish is None:
                _, _, finish = await stream.next()

    await asyncio.gather(*(user(u) for u in range(streams)))
    cpu = time.process_time() - cpu0
    await driver.stop()
    return dataclasses.asdict(driver.periods), cpu


async def drive(base: str, streams: int, seconds: float, prompt_words: int,
                max_tokens: int) -> dict[str, float]:
    prompt = " ".join(f"w{i}" for i in range(prompt_words))
    deadline = time.monotonic() + seconds
    counts = {"requests": 0, "events": 0, "tokens": 0}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(base_url=base, connector=connector, timeout=timeout) as s:

        async def user(u: int) -> None:
            while time.monotonic() < deadline:
                body = {"prompt": f"user{u} {prompt}", "max_tokens": max_tokens,
                        "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": True}}
                async with s.post("/v1/completions", json=body) as r:
                    async for line in r.content:
                        if line.startswith(b"data: {"):
                            counts["events"] += 1
                            if b'"usage"' in line:
                                counts["tokens"] += json.loads(line[6:])["usage"][
                                    "completion_tokens"]
                counts["requests"] += 1

        t0 = time.monotonic()
        await asyncio.gather(*(user(u) for u in range(streams)))
        counts["wall_s"] = time.monotonic() - t0
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--prompt-words", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--no-pin", action="store_true",
                    help="leave server and client unpinned (on a busy shared host)")
    ap.add_argument("--server-core", type=int, default=0, help="core the server is pinned to")
    ap.add_argument("--nice", type=int, default=0,
                    help="niceness for server and client (negative needs root): on a shared "
                         "host, approximates the dedicated core the goal assumes")
    args = ap.parse_args()

    flags = {"max_num_seqs": args.streams, "max_model_len": 4096,
             "time_scale": args.time_scale, "gpu": "h100"}
    with running_sim(**flags) as base:
        kids = _children()
        server_pid = kids[-1] if kids else None
        if server_pid and (os.cpu_count() or 1) > 1 and not args.no_pin:
            client_core = 1 - args.server_core if args.server_core < 2 else 0
            os.sched_setaffinity(server_pid, {args.server_core})   # the server gets one core
            os.sched_setaffinity(0, {client_core})                 # ... the client another
        if server_pid and args.nice:
            for pid in (server_pid, os.getpid()):
                os.setpriority(os.PRIO_PROCESS, pid, args.nice)
        cpu0, wait0 = _cpu_seconds(server_pid), _runqueue_wait_s(server_pid)
        counts = asyncio.run(drive(base, args.streams, args.seconds, args.prompt_words,
                                   args.max_tokens))
        cpu = _cpu_seconds(server_pid) - cpu0
        waited = _runqueue_wait_s(server_pid) - wait0
        stats = httpx.get(f"{base}/sim/stats").json()

    bare, bare_cpu = asyncio.run(driver_only(args.streams, min(args.seconds, 10.0),
                                             args.prompt_words, args.max_tokens, flags))

    wall = counts["wall_s"]
    print(f"streams={args.streams} wall={wall:.1f}s requests={counts['requests']} "
          f"events={counts['events']} tokens={counts['tokens']}")
    print(f"client tokens/s received      {counts['tokens'] / wall:10.0f}")
    print(f"busy steps measured           {stats['steps']:10d}")
    print(
        f"modelled step period (mean)   "
        f"{1e3 * stats['modelled_s'] / max(stats['steps'], 1):10.3f} ms"
    )
    print(
        f"measured step period (mean)   "
        f"{1e3 * stats['measured_s'] / max(stats['steps'], 1):10.3f} ms"
    )
    print(
        f"measured / modelled           {stats['ratio'] or float('nan'):10.4f}   (goal 0.95-1.05)"
    )
    print(
        f"late steps (> 20 ms)          {stats['late_steps']:10d}   "
        f"max lag {1e3 * stats['max_lag_s']:.1f} ms"
    )
    print(f"re-anchors (fell behind)      {stats['reanchors']:10d}")
    if server_pid:
        print(f"server CPU                    {100 * cpu / wall:10.0f} % of one core "
              f"({1e6 * cpu / max(counts['events'], 1):.1f} us per SSE event, all costs)")
        # CPU the server would need to run at the modelled pace, contention aside.
        need = cpu / stats["modelled_s"] if stats["modelled_s"] else float("nan")
        print(f"core share needed at pace     {100 * need:10.0f} %   "
              f"({'keeps up' if need < 1 else 'cannot keep up'} on one dedicated core)")
        print(f"server runnable, not running  {waited:10.1f} s   ({100 * waited / wall:.0f} % of "
              "wall: CPU taken by other processes)")
    print(f"-- the same load into the driver in-process, no HTTP ({bare['steps']} steps):")
    print(f"measured / modelled           {bare['measured_s'] / bare['modelled_s']:10.4f}   "
          f"CPU {100 * bare_cpu / max(bare['measured_s'], 1e-9):.0f} % of one core, "
          f"{bare['reanchors']} re-anchors")
    print(f"host load average (1 min)     {os.getloadavg()[0]:10.2f}   on {os.cpu_count()} cores")


def _children() -> list[int]:
    """Pids of this process's children (the server), newest last."""
    me = os.getpid()
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == me:
                    kids.append(int(entry))
            except OSError:
                continue
    return sorted(kids)


def _runqueue_wait_s(pid: int | None) -> float:
    """Seconds the process sat runnable on a run queue (/proc/PID/schedstat, field 2)."""
    if pid is None or not os.path.exists(f"/proc/{pid}/schedstat"):
        return 0.0
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


def _cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
