"""Streaming load generators side by side, per CPU-second, measured the same way for all.

Against one simulator in fast mode (``--time-scale``: it streams far faster than a GPU
would, so the client is what is measured), server and client on disjoint CPUs (the
server on the first, the clients on the last: ``--server-cpus`` / ``--client-cpus``),
each client of ``--clients`` runs each level of ``--levels`` as a closed loop of that many
streams, 40-token prompts, 96 output tokens, ``ignore_eos`` (clients in
benchmarks/clients.py: ``loadlab`` with one worker, ``loadlab-w2`` with two, a plain
``aiohttp`` asyncio client, ``vllm`` = ``vllm bench serve``, ``guidellm``). Rounds repeat
(``--repeat``) and the order of the clients rotates per round and level, so a neighbour's
burst on this shared machine falls on different clients; the table gives medians over
rounds and the load average seen.

Every client is measured by the same code, over the same kind of window:

1. Window: from the client's first call + ``--warmup`` to its last call, from the
   client's own per-request times. Inside it every stream is busy.
2. CPU: all processes of the client's tree (master and workers, launcher and its
   worker pool), user + system, sampled from outside every 50 ms (benchmarks/proctree.py)
   and read at the window's edges.
3. Throughput: content chunks read inside the window (each chunk's read time), and
   requests finished inside it; per second and per CPU-second.
4. Client-added TTFT, per request: the client's TTFT measured from its *call* (see
   clients.py: the one point every client exposes; it charges each its own send path)
   minus the server's own part, ``first token written - request arrived``, from the
   simulator's ``GET /sim/requests`` joined on ``X-Request-Id``. Median and p99 over the
   requests called inside the window; ``send`` (call -> arrival) and ``read``
   (written -> read) medians show where the time goes. ``send`` also holds the
   simulator's own wait before its handler runs (its event loop is busy streaming, the
   more so the faster the client), so for loadlab, which stamps when its bytes went to
   the socket, ``own`` is its own share: call -> bytes written, plus ``read``.
   GuideLLM sends no request id: n/a.
5. loadlab: also its master's CPU per 10k records (with ``--workers N`` it only receives
   and writes rows), to size a distributed run.

Ratio: loadlab (one worker) over the best peer at each level, in chunks per CPU-second.

``--vllm`` runs loadlab and the aiohttp peer against a REAL vLLM instead (the tiny model of
``tools/install_vllm.sh``, ``--max-num-seqs 4``, levels 1,2,4,8,16, no time scale): there is
no timeline there, so the added TTFT is the mean client TTFT (from the call) minus vLLM's
TTFT histogram mean over the window (which starts at engine arrival: the difference also
holds vLLM's front end, the same for both clients). Server and clients on CPUs of their own
here too (sharing the cores, a client measures its own starvation: benchmarks/README.md).

Two regimes. Plain (the default): every process under the normal scheduler, beside
whatever else runs here (the load average is in the table). ``--realtime 10
--client-cap 0.5``: server and clients under SCHED_RR, so neighbours cannot delay them,
and every client held to half of its CPU (benchmarks/cpucap.py), so the server, with a
whole CPU, always out-produces it: throughput is then the client's capacity at half a
core, and per CPU-second its capacity per core. Unheld, on 2 cores, the simulator alone
on its core streams about as fast as loadlab reads, so loadlab's figures there are
partly the server's. Held, client-added TTFT includes the wait for the client's next
share of CPU (up to 5 ms): read TTFT in the plain regime.

Usage: ``python benchmarks/bench_loadgen.py [--levels 16,64,256] [--duration 12] [--warmup 3]
[--repeat 2] [--clients loadlab,loadlab-w2,aiohttp,vllm,guidellm] [--time-scale 50]
[--realtime 10 [--client-cap 0.5]] [--baseline CHECKOUT] [--json out.json] [--vllm]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import httpx
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from clients import MODEL, RUNNERS, ClientRun, RunSpec, Unavailable
from cpucap import rt_share
from proctree import TreeCpu

from loadlab.experiment.cpus import default_split, inherited_affinity, parse_cpu_list

_HIST = re.compile(
    r"^vllm:time_to_first_token_seconds_(sum|count)(?:\{[^}]*\})? (\S+)$", re.MULTILINE
)
CLIENTS = {
    "loadlab": partial(RUNNERS["loadlab"], workers=1),
    "loadlab-w2": partial(RUNNERS["loadlab"], workers=2),
    "aiohttp": RUNNERS["aiohttp"],
    "vllm": RUNNERS["vllm"],
    "guidellm": RUNNERS["guidellm"],
}


@dataclass
class Figures:
    """One client at one level in one round."""

    client: str
    level: int
    round: int
    load_avg: float          # 1-minute load average when the run ended
    window_s: float
    cpu_cores: float         # the client's whole process tree, in the window
    server_cores: float      # the server's, in the same window (near 1.0: the server limits)
    inflight_mean: float     # time-mean requests in flight (a client short of breath: < level)
    req_s: float
    chunks_s: float
    req_per_cpu_s: float
    chunks_per_cpu_s: float
    added_p50_ms: float      # client TTFT from the call - server (first written - arrived)
    added_p99_ms: float
    server_ttft_p50_ms: float  # the server's own part: first token written - arrived
    send_p50_ms: float       # call -> the server has the request
    read_p50_ms: float       # first token written -> the client read it
    own_p50_ms: float        # loadlab: call -> bytes written + read (its own share of added)
    master_ms_per_10k: float  # loadlab: its master's CPU-ms per 10k records (it only records)


def measure(
    run: ClientRun,
    round_: int,
    warmup_s: float,
    server: TreeCpu | None,
    timeline: dict[str, list[float | None]],
    server_ttft: Callable[[float, float], float | None],
) -> Figures:
    """The figures of one run over its window (module docstring, steps 1-5)."""
    r = run.requests
    t0, t1 = float(np.nanmin(r.call)) + warmup_s, float(np.nanmax(r.call))
    span = t1 - t0
    if span <= 1.0:
        raise ValueError(
            f"{run.client} at {run.level}: window of {span:.2f} s; lengthen --duration"
        )
    cpu = run.cpu.cpu_s(t0, t1)
    done_in = r.ok & (r.done >= t0) & (r.done < t1)
    chunks = int(((r.chunk_times >= t0) & (r.chunk_times < t1)).sum())
    ends = np.where(np.isnan(r.done), t1, r.done)
    inflight = float(np.clip(np.minimum(ends, t1) - np.maximum(r.call, t0), 0, None).sum()) / span
    called = r.ok & (r.call >= t0) & (r.call < t1)
    added, send, read, own, mine = [], [], [], [], []
    for i in np.flatnonzero(called):
        srv = timeline.get(r.ids[i])
        if srv is None or srv[1] is None or np.isnan(r.first[i]):
            continue
        added.append(r.first[i] - r.call[i] - (srv[1] - srv[0]))
        send.append(srv[0] - r.call[i])
        own.append(srv[1] - srv[0])
        read.append(r.first[i] - srv[1])
        if r.written is not None:
            mine.append(r.written[i] - r.call[i] + r.first[i] - srv[1])
    nan = float("nan")
    if not added:
        mean_server = server_ttft(t0, t1)
        ttft = r.first[called] - r.call[called]
        if mean_server is not None and len(ttft):
            added = [float(np.nanmean(ttft)) - mean_server]   # --vllm: a mean, reported as p50
    master = nan
    if run.records_pid is not None and done_in.sum():
        master = run.cpu.cpu_s(t0, t1, [run.records_pid]) / done_in.sum() * 1e4 * 1e3
    return Figures(
        client=run.client,
        level=run.level,
        round=round_,
        load_avg=os.getloadavg()[0],
        window_s=span,
        cpu_cores=cpu / span,
        server_cores=server.cpu_s(t0, t1) / span if server else nan,
        inflight_mean=inflight,
        req_s=done_in.sum() / span,
        chunks_s=chunks / span,
        req_per_cpu_s=done_in.sum() / cpu,
        chunks_per_cpu_s=chunks / cpu,
        added_p50_ms=float(np.percentile(added, 50)) * 1e3 if added else nan,
        added_p99_ms=float(np.percentile(added, 99)) * 1e3 if len(added) > 1 else nan,
        server_ttft_p50_ms=float(np.median(own)) * 1e3 if own else nan,
        send_p50_ms=float(np.median(send)) * 1e3 if send else nan,
        read_p50_ms=float(np.median(read)) * 1e3 if read else nan,
        own_p50_ms=float(np.median(mine)) * 1e3 if mine else nan,
        master_ms_per_10k=master,
    )


# --------------------------------------------------------------------------- server TTFT (--vllm)
class HistPoller(threading.Thread):
    """Polls a server's TTFT histogram sum and count (4 Hz) with timestamps."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
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


# --------------------------------------------------------------------------- rounds
def rounds(
    url: str,
    args: argparse.Namespace,
    work: Path,
    server: TreeCpu | None,
    with_timeline: bool,
    server_ttft: Callable[[float, float], float | None],
) -> list[Figures]:
    """Every client at every level, ``--repeat`` times, the order rotating."""
    names = args.clients.split(",")
    skipped: dict[str, str] = {}
    results: list[Figures] = []
    for round_ in range(args.repeat):
        for i, level in enumerate(args.levels):
            shift = (round_ + i) % len(names)
            for name in names[shift:] + names[:shift]:
                if name in skipped:
                    continue
                tag = f"{name}-{level}-{round_}-{time.time_ns() % 10**8}"
                spec = RunSpec(
                    url,
                    level,
                    args.duration,
                    args.client_cpus,
                    args.cap_group,
                    work,
                    tag,
                    _expected_rate(results, level, args.client_cap),
                )
                try:
                    run = CLIENTS[name](spec)
                except Unavailable as exc:
                    skipped[name] = str(exc)
                    print(f"  {name}: not run ({exc})", file=sys.stderr)
                    continue
                timeline = {}
                if with_timeline and run.id_prefix is not None:
                    timeline = httpx.get(
                        f"{url}/sim/requests", params={"prefix": run.id_prefix}, timeout=60
                    ).json()
                try:
                    fig = measure(run, round_, args.warmup, server, timeline, server_ttft)
                except ValueError as exc:  # a run too short for its window: say so, go on
                    print(
                        f"  round {round_} level {level} {name}: not measured ({exc})",
                        file=sys.stderr,
                    )
                    continue
                results.append(fig)
                print(
                    f"  round {round_} level {level:4d} {name:10s} "
                    f"{fig.chunks_per_cpu_s:9.0f} chunks/cpu-s "
                    f"{fig.cpu_cores:5.2f} cores, added p50 {fig.added_p50_ms:6.2f} ms, "
                    f"load {fig.load_avg:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
    for name, why in skipped.items():
        print(f"not run: {name}: {why}")
    return results


def _expected_rate(results: list[Figures], level: int, cap: float | None) -> float:
    """Requests/s to size a fixed-count client (vllm bench serve) for ``--duration``: its own
    rate at this level in an earlier round, else the asyncio peer's, else a guess."""
    for client in ("vllm-bench", "aiohttp"):
        seen = [f.req_s for f in results if f.level == level and f.client == client]
        if seen:
            return seen[-1] * 1.2
    return 1000.0 * (cap or 1.0)


def report(title: str, results: list[Figures]) -> list[dict]:
    """Medians over rounds per (client, level); the loadlab / best peer ratios."""
    groups: dict[tuple[str, int], list[Figures]] = {}
    for f in results:
        groups.setdefault((f.client, f.level), []).append(f)
    rows = []
    for (client, level), figs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        med = {k: statistics.median(getattr(f, k) for f in figs) for k in asdict(figs[0])
               if k not in ("client", "level", "round")}
        rows.append({"client": client, "level": level, "rounds": len(figs), **med})
    print(f"\n{title}\n")
    print(
        "| client | streams | req/s | chunks/s | cores | req/CPU-s | chunks/CPU-s | in flight "
        "| added p50 ms | added p99 ms | send p50 | read p50 | own p50 | server TTFT p50 "
        "| server cores | master ms/10k | load |"
    )
    print("|" + "---|" * 17)
    for r in rows:
        print(
            f"| {r['client']} | {r['level']} | {r['req_s']:.0f} | {r['chunks_s']:.0f} "
            f"| {r['cpu_cores']:.2f} "
            f"| {r['req_per_cpu_s']:.0f} | {r['chunks_per_cpu_s']:.0f} | {r['inflight_mean']:.1f} "
            f"| {r['added_p50_ms']:.2f} | {r['added_p99_ms']:.1f} | {r['send_p50_ms']:.2f} "
            f"| {r['read_p50_ms']:.2f} "
            f"| {r['own_p50_ms']:.2f} | {r['server_ttft_p50_ms']:.2f} | {r['server_cores']:.2f} "
            f"| {r['master_ms_per_10k']:.0f} | {r['load_avg']:.1f} |".replace("nan", "n/a")
        )
    by = {(r["client"], r["level"]): r for r in rows}
    for level in sorted({r["level"] for r in rows}):
        peers = [r for r in rows if r["level"] == level and not r["client"].startswith("loadlab")]
        mine = by.get(("loadlab-w1", level))
        if peers and mine:
            best = max(peers, key=lambda r: r["chunks_per_cpu_s"])
            print(f"level {level}: loadlab / best peer ({best['client']}) per CPU-second: chunks "
                  f"{mine['chunks_per_cpu_s'] / best['chunks_per_cpu_s']:.2f}x, requests "
                  f"{mine['req_per_cpu_s'] / best['req_per_cpu_s']:.2f}x")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--levels", default=None, help="streams per level (default 16,64,256; --vllm 1,2,4,8,16)"
    )
    ap.add_argument("--duration", type=float, default=12.0, help="seconds each client runs a level")
    ap.add_argument(
        "--warmup", type=float, default=3.0, help="seconds cut from each window's start"
    )
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--clients", default=None)
    ap.add_argument("--time-scale", type=float, default=50.0)
    ap.add_argument(
        "--server-cpus",
        type=lambda t: parse_cpu_list(t, "--server-cpus"),
        default=None,
        help="default: all but the last CPU",
    )
    ap.add_argument(
        "--client-cpus",
        type=lambda t: parse_cpu_list(t, "--client-cpus"),
        default=None,
        help="default: the last CPU",
    )
    ap.add_argument(
        "--realtime",
        type=int,
        default=0,
        metavar="PRIO",
        help="run the server and every client alike under SCHED_RR at this priority, so "
        "neighbours on a shared machine do not delay their wake-ups (0: off)",
    )
    ap.add_argument(
        "--client-cap",
        type=float,
        default=None,
        metavar="SHARE",
        help="hold every client to this share of its CPU (RT group; needs --realtime), so the "
        "server out-produces it and its figures are its capacity",
    )
    ap.add_argument(
        "--baseline",
        type=Path,
        metavar="CHECKOUT",
        help="also run this checkout's loadlab (client loadlab-base): before/after side by side",
    )
    ap.add_argument("--json", type=Path, help="write every figure (each round) here")
    ap.add_argument("--vllm", action="store_true", help="against a real vLLM (tiny model) instead")
    args = ap.parse_args()
    # Stop cleanly (servers and clients killed, the RT group removed) on Ctrl-C and on
    # SIGTERM, also when started in the background (which ignores SIGINT).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    split = default_split()
    args.server_cpus = args.server_cpus or split.server_cpus
    args.client_cpus = args.client_cpus or split.client_cpus
    if args.realtime:   # inherited by the server and the clients (nice is not: autogroups)
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(args.realtime))
    args.levels = [
        int(x) for x in (args.levels or ("1,2,4,8,16" if args.vllm else "16,64,256")).split(",")
    ]
    args.clients = args.clients or (
        "loadlab,aiohttp" if args.vllm else "loadlab,loadlab-w2,aiohttp,vllm,guidellm"
    )
    args.clients = ",".join("loadlab" if c == "loadlab-w1" else c for c in args.clients.split(","))
    if args.baseline:
        CLIENTS["loadlab-base"] = partial(RUNNERS["loadlab"], checkout=args.baseline.resolve())
        args.clients += ",loadlab-base"
    if args.client_cap and not args.realtime:
        sys.exit("--client-cap holds real-time tasks only: add --realtime PRIO")
    with tempfile.TemporaryDirectory(prefix="bench-loadgen-") as tmp, \
            (rt_share(args.client_cap) if args.client_cap else nullcontext()) as args.cap_group:
        results = (vllm_main if args.vllm else sim_main)(args, Path(tmp))
    if args.json:
        args.json.write_text(json.dumps([asdict(f) for f in results], indent=1))


def sim_main(args: argparse.Namespace, work: Path) -> list[Figures]:
    from loadlab.sim.serve.testing import running_sim

    # This process (its CPU samplers) and the simulator, a child, on the server CPUs.
    os.sched_setaffinity(0, args.server_cpus)
    with running_sim(served_model_name=MODEL, time_scale=args.time_scale, max_num_seqs=1024) as url:
        sim = [
            p
            for p in psutil.Process().children()
            if "sim" in p.cmdline() and "serve" in p.cmdline()
        ]
        server = TreeCpu(sim[0].pid).start() if sim else None
        results = rounds(url, args, work, server, True, lambda t0, t1: None)
        if server:
            server.stop()
    cap = f" held to {args.client_cap:g} of a CPU" if args.client_cap else ""
    report(
        f"simulator --time-scale {args.time_scale:g} on CPUs {sorted(args.server_cpus)}, "
        f"clients on {sorted(args.client_cpus)}{cap} (medians of {args.repeat} rounds; "
        f"added = client TTFT from its call - server first-token time, ms)",
        results,
    )
    return results


def vllm_main(args: argparse.Namespace, work: Path) -> list[Figures]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "vllm"))
    from realvllm import missing_reason, tiny_vllm

    if missing_reason():
        sys.exit(missing_reason())
    with tiny_vllm(
        work / "server",
        server_cpus=args.server_cpus,
        served_model_name=MODEL,
        max_num_seqs=4,
        num_gpu_blocks_override=512,
    ) as target:
        poller = HistPoller(target.base_url)
        with inherited_affinity(args.client_cpus):   # off the server's CPUs, as the clients
            poller.start()
        results = rounds(target.base_url, args, work, None, False, poller.mean_between)
        poller.stop.set()
    report(
        "real vLLM (tiny model, --max-num-seqs 4; added = mean client TTFT from its call "
        "- vLLM's TTFT histogram mean)",
        results,
    )
    return results


if __name__ == "__main__":
    main()
