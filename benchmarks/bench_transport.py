"""CPU per request of loadlab's streaming client alone, against a paced server: A/B of checkouts.

The simulator's pace moves with the load it serves, so the events a client finds per read
(and with them its CPU per chunk) change with the client's own speed; this bench fixes the
pace instead. A small asyncio server (on the first CPU) answers every request with 32
writes of 3 SSE content events, 1 ms apart, then the usage chunk and ``[DONE]``; N gevent
users (the process patched as Locust patches it, on the last CPU) each loop
``StreamingClient.send`` over ``SocketTransport`` for ``--seconds``. The figure: the
client process's CPU (user + system, ``getrusage``) per request after a 1 s warm-up, and
per read. Each checkout given runs in turn, the order alternating per round
(``--rounds``), all under SCHED_RR (``--realtime``, default 10) so neighbours on a shared
machine do not add their wake-up delays; the client uses a fraction of its CPU, so the
figures are the cost of reads that find one write each.

Usage: ``python benchmarks/bench_transport.py CHECKOUT[,CHECKOUT...] [--users 16]
[--seconds 5] [--rounds 4]`` (a checkout is a directory holding ``loadlab/``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import statistics
import subprocess
import sys
import time

PACE_S, EVENTS_PER_WRITE, WRITES = 0.001, 3, 32
EVENT = (
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m",'
    b'"choices":[{"index":0,"text":" word","logprobs":null,"finish_reason":null,'
    b'"stop_reason":null}],"usage":null}\n\n'
)
END = (
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":40,"total_tokens":136,"completion_tokens":96}}\n\ndata: [DONE]\n\n'
)


async def _serve(tls: tuple[str, str] | None = None) -> None:
    """The paced server; https with ``tls`` (certificate, key) for bench_tls.py."""
    import asyncio
    import ssl

    def chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                for _ in range(WRITES):
                    await asyncio.sleep(PACE_S)
                    writer.write(chunk(EVENT) * EVENTS_PER_WRITE)
                await asyncio.sleep(PACE_S)
                writer.write(chunk(END) + b"0\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    ctx = None
    if tls is not None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(*tls)
    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


def _client(url: str, users: int, seconds: float, ca_bundle: str | None = None) -> None:
    from gevent import monkey

    monkey.patch_all()
    import gevent

    from loadlab.loadgen.client import StreamingClient
    from loadlab.loadgen.transport import SocketTransport

    tls = None
    if ca_bundle is not None:   # bench_tls.py: one context for every user, as a worker has
        from loadlab.spec.tls import TlsSettings

        tls = TlsSettings(ca_bundle=ca_bundle).context()

    counts = {"requests": 0, "reads": 0}
    stop_at = time.time() + 1.0 + seconds

    def user() -> None:
        client = StreamingClient(SocketTransport(url, tls=tls), "completions", timeout_s=30)
        while time.time() < stop_at:
            out = client.send(b'{"prompt": "x"}')
            if out.status != "ok":
                raise SystemExit(f"request failed: {out.status} {out.error}")
            offsets = out.timings.chunk_offsets_s
            counts["reads"] += 1 + sum(b > a for a, b in itertools.pairwise(offsets))
            counts["requests"] += 1

    greenlets = [gevent.spawn(user) for _ in range(users)]
    gevent.sleep(1.0)
    before, seen = resource.getrusage(resource.RUSAGE_SELF), dict(counts)
    gevent.joinall(greenlets, raise_error=True)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    n, reads = counts["requests"] - seen["requests"], counts["reads"] - seen["reads"]
    print(f"{cpu / n * 1e6:.1f} {reads / n:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "checkouts",
        nargs="?",
        default=".",
        help="comma-separated directories, each holding loadlab/",
    )
    ap.add_argument("--users", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument(
        "--realtime", type=int, default=10, metavar="PRIO", help="SCHED_RR priority (0: off)"
    )
    ap.add_argument("--client", help=argparse.SUPPRESS)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        import asyncio

        asyncio.run(_serve())
        return
    if args.client:
        _client(args.client, args.users, args.seconds)
        return
    if args.realtime:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(args.realtime))
    cpus = sorted(os.sched_getaffinity(0))
    checkouts = [os.path.abspath(c) for c in args.checkouts.split(",")]
    server = subprocess.Popen(["taskset", "-c", str(cpus[0]), sys.executable, __file__, "--serve"],
                              stdout=subprocess.PIPE, text=True)
    per_request: dict[str, list[float]] = {c: [] for c in checkouts}
    try:
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        for round_ in range(args.rounds):
            for checkout in checkouts if round_ % 2 == 0 else checkouts[::-1]:
                out = subprocess.run(
                    [
                        "taskset",
                        "-c",
                        str(cpus[-1]),
                        sys.executable,
                        __file__,
                        "--client",
                        url,
                        "--users",
                        str(args.users),
                        "--seconds",
                        str(args.seconds),
                    ],
                    env={**os.environ, "PYTHONPATH": checkout},
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
                per_request[checkout].append(float(out[0]))
                print(
                    f"round {round_} {checkout}: {out[0]} us CPU per request, "
                    f"{out[1]} reads per request",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        server.kill()
        server.wait()
    print(
        f"\n{args.users} users, {WRITES} writes of {EVENTS_PER_WRITE} events "
        f"{PACE_S * 1e3:g} ms apart, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    for checkout, values in per_request.items():
        print(f"{checkout}: CPU per request {statistics.median(values):.0f} us median "
              f"({min(values):.0f}-{max(values):.0f} over {len(values)} rounds)")


if __name__ == "__main__":
    main()
