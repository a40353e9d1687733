"""The load generators bench_loadgen.py compares, each run the same way and read back alike.

Every client runs as its own process tree (started on the client CPUs), does one
closed-loop level with fixed lengths (``PROMPT_TOKENS`` in, ``OUTPUT_TOKENS`` out,
``ignore_eos``, streamed with usage) and comes back as :class:`Requests`: per request
its id (sent as ``X-Request-Id``, so the simulator's timeline can be joined), when the
client *called* (began the request), when it read the first content chunk and when it
was done, plus every content chunk's read time. The call is the one point every client
exposes: ``vllm bench serve`` and the asyncio peer stamp ``perf_counter`` before
``session.post``, loadlab's ``t_issued`` is taken as ``send`` begins, GuideLLM's
``request_start`` as its backend begins the request. Measuring from there charges each
client its own send path (building the request, taking a connection, writing), which a
user of that client sees in its TTFT.

- ``loadlab``: ``loadlab run --workers N`` (master + N worker processes).
- ``aiohttp``: a plain asyncio + aiohttp closed loop shaped like ``vllm bench serve``'s
  request function (this file run with ``--peer``).
- ``vllm``: ``vllm bench serve`` from ``.vllm-venv`` (random dataset with the tiny
  model's tokenizer, ``--max-concurrency L --request-rate inf``; ``--save-detailed``
  gives start times, TTFTs and inter-token gaps, from which chunk times are rebuilt).
- ``guidellm``: ``guidellm benchmark`` from ``.bench-venv`` (benchmark-only venv,
  git-ignored), when it is installed there.

A client that cannot run here (its venv missing) raises :class:`Unavailable` with why.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from proctree import TreeCpu

ROOT = Path(__file__).resolve().parents[1]
PROMPT_TOKENS = 40
OUTPUT_TOKENS = 96
MODEL = "bench-model"
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1"}


class Unavailable(Exception):
    """This client cannot run on this machine (the reason is the message)."""


@dataclass
class Requests:
    """What one client did, per request (unix seconds; nan where it never happened)."""

    ids: list[str]
    call: np.ndarray
    first: np.ndarray
    done: np.ndarray
    ok: np.ndarray          # bool
    chunk_times: np.ndarray  # every content chunk's read time, all requests together
    written: np.ndarray | None = None  # loadlab: when the request bytes went to the socket


@dataclass
class ClientRun:
    """One client at one level: its requests and its process tree's CPU over time."""

    client: str
    level: int
    requests: Requests
    cpu: TreeCpu
    id_prefix: str | None            # the X-Request-Id prefix it sent (None: it sends none)
    records_pid: int | None = None   # loadlab: the master (it records; its workers send)


@dataclass
class RunSpec:
    """Where and how long: the same for every client of a comparison."""

    url: str
    level: int
    duration_s: float
    cpus: set[int] | None
    cap_group: Path | None   # an RT group holding the client to a share of its CPU (cpucap.py)
    work: Path
    tag: str            # request-id prefix, unique per run
    expected_req_s: float | None = None   # sizes fixed-count clients (vllm bench serve)


@contextmanager
def _started(argv: list[str], spec: RunSpec, env: dict[str, str] | None = None,
             cwd: Path | None = None) -> Iterator[tuple[subprocess.Popen, TreeCpu]]:
    """A client process on the client CPUs, its tree's CPU sampled while it runs."""
    place = ["taskset", "-c", ",".join(map(str, sorted(spec.cpus)))] if spec.cpus else []
    if spec.cap_group:   # the shell joins the group, then becomes the client: its tree stays in it
        place += ["sh", "-c", f'echo $$ > {spec.cap_group / "cgroup.procs"} && exec "$@"', "sh"]
    with open(spec.work / f"{spec.tag}.log", "wb") as log:
        proc = subprocess.Popen(place + argv, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                env={**os.environ, **(env or {})})
    cpu = TreeCpu(proc.pid).start()
    try:
        yield proc, cpu
        rc = proc.wait()
        if rc not in (
            0,
            3,
        ):  # loadlab exits 3 when the client fell short of the load: still measured
            tail = (spec.work / f"{spec.tag}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{argv[:4]} exited {rc}:\n{tail}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cpu.stop()


# --------------------------------------------------------------------------- loadlab
def _profile(work: Path) -> Path:
    path = work / "bench.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        format_version: 1
        name: bench
        description: fixed lengths for the load-generator benchmark
        source: {{dataset: none, origin: benchmarks/bench_loadgen.py, licence: none, citation: none,
                 derivation: fixed}}
        lengths:
          input: {{p: [0.0, 1.0], v: [{PROMPT_TOKENS}, {PROMPT_TOKENS}]}}
          output: {{p: [0.0, 1.0], v: [{OUTPUT_TOKENS}, {OUTPUT_TOKENS}]}}
          input_summary: {{n: 1, mean: {PROMPT_TOKENS}, p10: 1, p25: 1, p50: 1, p75: 1, p90: 1,
                          p99: 1, max: 1}}
          output_summary: {{n: 1, mean: {OUTPUT_TOKENS}, p10: 1, p25: 1, p50: 1, p75: 1, p90: 1,
                           p99: 1, max: 1}}
        arrivals: {{process: none}}
        prefix: {{kind: none}}
        """)
    )
    return path


def run_loadlab(spec: RunSpec, workers: int = 1, checkout: Path | None = None) -> ClientRun:
    """``loadlab run --workers N``; ``checkout``: run that checkout's loadlab instead (a
    baseline)."""
    from loadlab.loadgen.prepare import request_id
    from loadlab.runstore import REQUESTS, read_table

    out = spec.work / spec.tag
    seed = time.time_ns() % 10**9
    argv = [sys.executable, "-m", "loadlab", "run", "--target", spec.url, "--model", MODEL,
            "--profile", str(_profile(spec.work)), "--concurrency", str(spec.level),
            "--step-duration", str(spec.duration_s), "--warmup", "0", "--workers", str(workers),
            "--no-calibrate", "--seed", str(seed), "--out", str(out)]
    # ``python -m`` puts the working directory first on sys.path: run from the scratch folder,
    # so PYTHONPATH alone says which loadlab runs (this checkout's, or the baseline's).
    env = {"PYTHONPATH": str(checkout or ROOT)}
    with _started(argv, spec, env, cwd=spec.work) as (proc, cpu):
        pass
    df = read_table(out / "requests.parquet", REQUESTS)
    offsets = df.chunk_offsets_s
    sent = df.t_sent.to_numpy(float)
    chunks = np.concatenate(
        [s + np.asarray(o, float) for s, o in zip(sent, offsets) if o is not None and len(o)]
        or [np.empty(0)]
    )
    reqs = Requests(
        df.request_id.tolist(),
        df.t_issued.to_numpy(float),
        df.t_first_token.to_numpy(float),
        df.t_done.to_numpy(float),
        (df.status == "ok").to_numpy(),
        chunks,
        df.t_sent.to_numpy(float),
    )
    return ClientRun(
        "loadlab-base" if checkout else f"loadlab-w{workers}",
        spec.level,
        reqs,
        cpu,
        request_id(seed, 0)[:-1],
        proc.pid,
    )


# --------------------------------------------------------------------------- aiohttp peer
async def _peer_user(session, url: str, body: dict, stop_at: float, ids, out: list) -> None:
    import json as json_

    while time.time() < stop_at:
        rid = next(ids)
        chunks: list[float] = []
        call = time.time()
        ok = False
        async with session.post(url, json=body, headers={"X-Request-Id": rid}) as resp:
            async for raw in resp.content:
                raw = raw.strip()
                if not raw:
                    continue
                text = raw.decode("utf-8").removeprefix("data: ")
                if text == "[DONE]":
                    ok = True
                    continue
                data = json_.loads(text)
                choices = data.get("choices")
                if choices and choices[0].get("text"):
                    chunks.append(time.time())
        out.append((rid, call, chunks[0] if chunks else np.nan, time.time(), ok, chunks))


async def _peer(url: str, level: int, duration: float, tag: str, dest: Path) -> None:
    import aiohttp

    body = {
        "model": MODEL,
        "prompt": " ".join(["the"] * PROMPT_TOKENS),
        "max_tokens": OUTPUT_TOKENS,
        "min_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    out: list = []
    ids = (f"{tag}-{i}" for i in itertools.count())
    stop_at = time.time() + duration
    conn = aiohttp.TCPConnector(limit=level, keepalive_timeout=60)
    async with aiohttp.ClientSession(
        connector=conn, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:
        await asyncio.gather(*[_peer_user(session, f"{url}/v1/completions", body, stop_at, ids, out)
                               for _ in range(level)])
    rid, call, first, done, ok, chunks = zip(*out)
    np.savez(
        dest,
        ids=np.array(rid),
        call=np.array(call),
        first=np.array(first),
        done=np.array(done),
        ok=np.array(ok),
        chunk_times=np.concatenate([np.asarray(c, float) for c in chunks]),
    )


def run_aiohttp(spec: RunSpec) -> ClientRun:
    dest = spec.work / f"{spec.tag}.npz"
    argv = [sys.executable, __file__, "--peer", spec.url, "--level", str(spec.level),
            "--duration", str(spec.duration_s), "--tag", spec.tag, "--out", str(dest)]
    with _started(argv, spec) as (_, cpu):
        pass
    z = np.load(dest)
    reqs = Requests(
        [str(x) for x in z["ids"]], z["call"], z["first"], z["done"], z["ok"], z["chunk_times"]
    )
    return ClientRun("aiohttp", spec.level, reqs, cpu, f"{spec.tag}-")


def _venv_tool(venv: str, name: str, install: str) -> Path:
    """``ROOT/venv/bin/name``, or :class:`Unavailable` saying how to install it."""
    exe = ROOT / venv / "bin" / name
    if not exe.exists():
        raise Unavailable(f"no {exe}: {install}")
    return exe


# --------------------------------------------------------------------------- vllm bench serve


def run_vllm(spec: RunSpec) -> ClientRun:
    tokenizer = ROOT / ".cache" / "tiny-llama"
    n = max(spec.level * 4, int((spec.expected_req_s or 500.0) * spec.duration_s))
    name = f"{spec.tag}.json"
    vllm = _venv_tool(".vllm-venv", "vllm", "run `bash tools/install_vllm.sh`")
    argv = [
        str(vllm),
        "bench",
        "serve",
        "--backend",
        "openai",
        "--base-url",
        spec.url,
        "--endpoint",
        "/v1/completions",
        "--model",
        MODEL,
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(PROMPT_TOKENS),
        "--random-output-len",
        str(OUTPUT_TOKENS),
        "--random-range-ratio",
        "0",
        "--ignore-eos",
        "--max-concurrency",
        str(spec.level),
        "--request-rate",
        "inf",
        "--num-prompts",
        str(n),
        "--request-id-prefix",
        f"{spec.tag}-",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(spec.work),
        "--result-filename",
        name,
        "--seed",
        str(time.time_ns() % 10**6),
    ]
    offset = (
        time.time() - time.perf_counter()
    )  # perf_counter is CLOCK_MONOTONIC: one clock per host
    with _started(argv, spec, VLLM_ENV, cwd=spec.work) as (_, cpu):
        pass
    r = json.loads((spec.work / name).read_text())
    start = np.asarray(r["start_times"], float) + offset
    ttft = np.asarray(r["ttfts"], float)
    ok = np.array([not e for e in r["errors"]])
    first = np.where(ok, start + ttft, np.nan)
    done = start + np.asarray(r["latencies"], float)
    chunks = [
        f + np.concatenate([[0.0], np.cumsum(itl)])
        for f, itl, good in zip(first, r["itls"], ok)
        if good
    ]
    reqs = Requests([f"{spec.tag}-{i}" for i in range(len(start))], start, first, done, ok,
                    np.concatenate(chunks or [np.empty(0)]))
    return ClientRun("vllm-bench", spec.level, reqs, cpu, f"{spec.tag}-")


# --------------------------------------------------------------------------- GuideLLM


def run_guidellm(spec: RunSpec) -> ClientRun:
    """GuideLLM sends no request id, so its rows cannot be joined with the server's timeline;
    it keeps no per-chunk times either: its ``token_iterations`` are spread evenly between
    its first and last token (``first_token_iteration``, ``last_token_iteration``)."""
    dest = spec.work / f"{spec.tag}.json"
    guidellm = _venv_tool(".bench-venv", "guidellm",
                          "python3 -m venv .bench-venv && .bench-venv/bin/pip install guidellm")
    argv = [
        str(guidellm),
        "run",
        "--backend",
        f"kind=openai_http,target={spec.url},model={MODEL},request_format=/v1/completions",
        "--profile",
        f"kind=concurrent,streams={spec.level}",
        "--constraint",
        f"kind=max_duration,seconds={spec.duration_s:g}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
        "--tokenizer",
        f"kind=hf_auto,model={ROOT / '.cache' / 'tiny-llama'}",
        "--output",
        f"kind=json,path={dest}",
        "--disable-console-interactive",
    ]
    with _started(argv, spec, VLLM_ENV, cwd=spec.work) as (_, cpu):
        pass
    bench = json.loads(dest.read_text())["benchmarks"][0]["requests"]
    rows = [
        (r["info"]["timings"], r["info"]["status"] == "completed")
        for kind in ("successful", "errored", "incomplete")
        for r in bench.get(kind, [])
    ]
    nan = float("nan")

    def when(t: dict, key: str) -> float:
        return nan if t.get(key) is None else float(t[key])

    call = np.array([when(t, "resolve_start") for t, _ in rows])
    first = np.array([when(t, "first_token_iteration") for t, _ in rows])
    last = np.array([when(t, "last_token_iteration") for t, _ in rows])
    done = np.array([when(t, "request_end") for t, _ in rows])
    ok = np.array([good for _, good in rows])
    n = [int(t.get("token_iterations") or 0) for t, _ in rows]
    chunks = [np.linspace(f, la, k) for f, la, k, good in zip(first, last, n, ok) if good and k]
    reqs = Requests([f"{spec.tag}-{i}" for i in range(len(rows))], call, first, done, ok,
                    np.concatenate(chunks or [np.empty(0)]))
    return ClientRun("guidellm", spec.level, reqs, cpu, None)


RUNNERS = {
    "loadlab": run_loadlab,
    "aiohttp": run_aiohttp,
    "vllm": run_vllm,
    "guidellm": run_guidellm,
}


def main() -> None:
    ap = argparse.ArgumentParser(description="the asyncio + aiohttp peer client (one level)")
    ap.add_argument("--peer", required=True)
    ap.add_argument("--level", type=int, required=True)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    asyncio.run(_peer(args.peer, args.level, args.duration, args.tag, args.out))


if __name__ == "__main__":
    main()
