"""CPU per request of the streaming client over https next to plain http, in one run.

The harness is bench_transport.py's (its paced asyncio server, its gevent users looping
``StreamingClient.send`` over ``SocketTransport``, CPU from ``getrusage`` after a 1 s
warm-up); here one checkout is timed twice per round, against the same server over plain
http and over TLS (a self-signed certificate, trusted with a CA bundle as ``--ca-bundle``
would), the order alternating per round. The goal: over TLS within 25% of plain http at
64 streams (``--users``).

Usage: ``python benchmarks/bench_tls.py [--users 64] [--seconds 5] [--rounds 4]``
(needs the ``cryptography`` package for the certificate).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_transport import EVENTS_PER_WRITE, PACE_S, WRITES, _client, _serve

GOAL = 1.25


def _start_server(cpu: int, *tls: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, __file__, "--serve", *tls],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--serve", nargs="*", help=argparse.SUPPRESS)   # [CERT KEY]
    ap.add_argument("--client", help=argparse.SUPPRESS)
    ap.add_argument("--ca-bundle", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve is not None:
        asyncio.run(_serve((args.serve[0], args.serve[1]) if args.serve else None))
        return
    if args.client:
        _client(args.client, args.users, args.seconds, args.ca_bundle)
        return
    from loadlab.sim.serve.selfsigned import self_signed

    cpus = sorted(os.sched_getaffinity(0))
    folder = Path(tempfile.mkdtemp(prefix="bench-tls-"))
    cert, key = self_signed(folder)
    plain, plain_port = _start_server(cpus[0])
    tls, tls_port = _start_server(cpus[0], str(cert), str(key))
    arms = {"http": (f"http://127.0.0.1:{plain_port}", []),
            "https": (f"https://127.0.0.1:{tls_port}", ["--ca-bundle", str(cert)])}
    per_request: dict[str, list[float]] = {name: [] for name in arms}
    try:
        for round_ in range(args.rounds):
            for name in list(arms) if round_ % 2 == 0 else list(arms)[::-1]:
                url, extra = arms[name]
                out = subprocess.run(
                    ["taskset", "-c", str(cpus[-1]), sys.executable, __file__, "--client", url,
                     "--users", str(args.users), "--seconds", str(args.seconds), *extra],
                    capture_output=True, text=True, check=True,
                ).stdout.split()
                per_request[name].append(float(out[0]))
                print(f"round {round_} {name}: {out[0]} us CPU per request, {out[1]} reads "
                      "per request", file=sys.stderr, flush=True)
    finally:
        for proc in (plain, tls):
            proc.kill()
            proc.wait()
    http, https = (statistics.median(per_request[n]) for n in ("http", "https"))
    print(f"\n{args.users} users, {WRITES} writes of {EVENTS_PER_WRITE} events "
          f"{PACE_S * 1e3:g} ms apart, load average {os.getloadavg()[0]:.1f}")
    for name, values in per_request.items():
        print(f"{name}: CPU per request {statistics.median(values):.0f} us median "
              f"({min(values):.0f}-{max(values):.0f} over {len(values)} rounds)")
    ratio = https / http
    print(f"https / http: {ratio:.2f} (goal <= {GOAL:.2f}: {'met' if ratio <= GOAL else 'MISSED'})")


if __name__ == "__main__":
    main()
