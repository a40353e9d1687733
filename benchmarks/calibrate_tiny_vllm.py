"""Held-out accuracy of ``loadlab sim calibrate`` on a REAL vLLM (tiny model, CPU).

Needs ``bash tools/install_vllm.sh``. Two phases, so the real-vLLM part runs once and the
fit can be rerun offline on its folders:

    flock /tmp/realvllm.lock python3 benchmarks/calibrate_tiny_vllm.py collect /tmp/caldata s1
    flock /tmp/realvllm.lock python3 benchmarks/calibrate_tiny_vllm.py collect /tmp/caldata s2
    python3 benchmarks/calibrate_tiny_vllm.py report /tmp/caldata

``collect`` (3-5 minutes a server on 2 cores, up to 8 with the gate's re-runs, so each
holds the lock under 10 minutes) starts the named servers of the tiny model one after the
other (``tiny_vllm``: vLLM on the server CPUs, the load generator and its /metrics scraper
on the client CPU), each load one ``loadlab run --target URL --collect`` folder, and
appends the machine's load average before and after each load to ``loadavg.txt``:

- server 1, ``--max-num-seqs 16``, 512 blocks: the FIT loads, ``tiny-prefill`` (512 in,
  4 out) at 1 user, ``tiny-short`` (64 in, 32 out) and ``tiny-decode`` (64 in, 160 out)
  at 1, 4, 8, 16 users. The fit must see as many running requests as the check will
  (9-16): fitted at 4 or fewer, a per-context term is an extrapolation past everything it
  was fitted on. And it must see two contexts per running request: with one length, the
  context a step reads is a fixed multiple of its requests, the two terms cannot be told
  apart, and the fit keeps per-request alone (``loadlab.calibrate.terms``, rule 0).
  ``tiny-long`` (300 in, 400 out) at 4 and 8 users: prompts of a third length at two
  levels, so that with any one level left out the prompts still have two lengths and a
  cost per step carrying prefill is told from a cost per prefill token (rule 0 again;
  ``tiny-prefill``'s one level alone is not enough). ``tiny-chunk`` (256 in, 4 out) at 1
  user: one whole chunk of the 256-token budget alone in its step, beside ``tiny-prefill``'s
  two (the second reading the first's 256 tokens) and ``tiny-short``'s 64 tokens. Without
  it, one level's sum of two chunks and prompts of 64 and 300 left the split of prefill
  between per token, per attention pair and per prefill step to the noise: four fits of
  one server put a 160-token prefill step at 21 to 29 ms;
- server 2, ``--max-num-seqs 32 --num-gpu-blocks-override 64``, no prefix caching: the
  CHECK load ``tiny-check`` (160 in, 48 out) at 4, 12, 16 users (a request holds 7 of
  the 63 usable blocks, so past 9 running the pool is the knee: 12 and 16 are past it),
  :data:`CHECK_PASSES` times back to back (folders ``tiny-check``, ``tiny-check-2``, ...),
  then ``tiny-short`` and ``tiny-prefill`` again, so the two servers can be compared on the
  same load;
- server 1b, server 1's flags started again after server 2, with those two loads: how far
  two servers of one configuration started minutes apart differ, beside how far server 2
  differs (``collect DIR s1 s2 s1b``).

A meter (``hostspeed``) samples the host's speed on the server CPU throughout. After a
server's loads, the gate runs again any load with a level outside ``hostspeed.GATE`` of
the fit levels' median speed after server 1's first pass (:func:`gate_reference`), at
most :data:`RERUNS` rounds; the first folder is kept under ``rejected/``. The gate reads
the meter alone, never a latency or an error.

A ``--target`` run cannot see the server's flags, so its manifest's ``server`` block is
filled with the launch flags afterwards, as ``loadlab sim calibrate``'s refusal says.

``report`` fits server 1's runs with :func:`loadlab.calibrate.fit.fit_with_table` and
checks server 2's with :func:`loadlab.calibrate.check.check_levels` (client TTFT, ITL and
E2E p50 per level, predicted / measured - 1; per pass, then on the passes' median), and
prints how much the two servers differ on the same load; without a server 2 folder
(collected apart, later) it prints the fit alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "vllm"))  # reuse the e2e tests' launch helper

from hostspeed import GATE, at_speed, level_speeds, metering, off_gate, read_speed, reference_speed
from realvllm import ISOLATION, missing_reason, tiny_vllm

from loadlab.calibrate.check import METRICS, check_levels, format_table
from loadlab.calibrate.fit import fit_with_table
from loadlab.calibrate.runs import Run, read_run
from loadlab.experiment.cpus import format_cpu_list

PROFILES = ROOT / "tests" / "vllm" / "profiles"
STEP_S, WARMUP_S = 15.0, 2.0
# the check load runs this many times back to back: one pass's p50 at one host speed still
# moves 6-10% with the host, so a level is judged on the median of its passes
CHECK_PASSES = 3
# the meter gate: after a server's loads, a load with a level outside hostspeed.GATE of the
# fit levels' median speed is run again (its folder kept under rejected/), at most this
# many rounds; a level still outside is kept and marked in the report
RERUNS = 2
GATE_REFERENCE = "gate-reference.json"
SERVERS: dict[str, tuple[dict[str, object], list[tuple[str, str]]]] = {
    "s1": ({"max_num_seqs": 16, "num_gpu_blocks_override": 512},
           [("tiny-prefill", "1"), ("tiny-chunk", "1"), ("tiny-short", "1,4,8,16"),
            ("tiny-decode", "1,4,8,16"), ("tiny-long", "4,8")]),
    "s2": ({"max_num_seqs": 32, "num_gpu_blocks_override": 64, "enable_prefix_caching": False},
           [("tiny-check", "4,12,16")] * CHECK_PASSES
           + [("tiny-short", "1,4,8,16"), ("tiny-prefill", "1")]),
    # server 1's flags again, started after server 2: two servers of one configuration
    # minutes apart, on the loads all three share (the host's own spread)
    "s1b": ({"max_num_seqs": 16, "num_gpu_blocks_override": 512},
            [("tiny-short", "1,4,8,16"), ("tiny-prefill", "1")]),
}
FIT = ["s1/tiny-prefill", "s1/tiny-chunk", "s1/tiny-short", "s1/tiny-decode", "s1/tiny-long"]
CHECK = ["s2/tiny-check"] + [f"s2/tiny-check-{k}" for k in range(2, CHECK_PASSES + 1)]
SAME_LOAD = ["tiny-prefill", "tiny-short"]


def run_load(url: str, out: Path, profile: str, levels: str, server: dict[str, object]) -> None:
    """One closed-loop step load with /metrics sampled into the same run folder."""
    argv = [sys.executable, "-m", "loadlab", "run", "--target", url, "--model", "tiny",
            "--profile", str(PROFILES / f"{profile}.yaml"), "--concurrency", levels,
            "--step-duration", str(STEP_S), "--warmup", str(WARMUP_S), "--workers", "0",
            "--drain", "20", "--collect", "--interval", "0.5", "--out", str(out), "--overwrite"]
    if ISOLATION.client_cpus is not None:
        argv += ["--client-cpus", format_cpu_list(ISOLATION.client_cpus)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    print(f"{out}: exit {proc.returncode}\n{proc.stdout[-600:]}{proc.stderr[-1500:]}", flush=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["server"] = server
    manifest_path.write_text(json.dumps(manifest, indent=2))


def note_load(out: Path, what: str) -> None:
    """Append the machine's load average: a shared host's speed moves with it."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "loadavg.txt").open("a") as f:
        f.write(f"{time.strftime('%H:%M:%S', time.gmtime())} UTC {what}: "
                f"{Path('/proc/loadavg').read_text().strip()}\n")


def collect(out: Path, names: Sequence[str] = ()) -> None:
    reason = missing_reason()
    if reason:
        sys.exit(reason)
    with metering(ISOLATION.server_cpus or range(os.cpu_count() or 1), out):
        for name in names or SERVERS:
            collect_server(out, name)
            note_load(out, f"{name} done")


def collect_server(out: Path, name: str) -> None:
    """Server ``name``'s loads, then the meter gate's re-runs on the same server."""
    flags, loads = SERVERS[name]
    folders = folder_names([profile for profile, _ in loads])
    with tiny_vllm(out / name / "server", **flags) as target:
        def load(k: int, why: str = "start") -> None:
            note_load(out, f"{name}/{folders[k]} {why}")
            run_load(target.base_url, out / name / folders[k], *loads[k],
                     target.server_settings())
        for k in range(len(loads)):
            load(k)
        for round_ in range(1, RERUNS + 1):
            off = off_speed(out, name, folders)
            for k, why in off.items():
                rejected = out / "rejected" / name / f"{folders[k]}-{round_}"
                rejected.parent.mkdir(parents=True, exist_ok=True)
                (out / name / folders[k]).rename(rejected)
                load(k, f"re-run {round_} (host speed {why})")
            if not off:
                break


def folder_names(profiles: list[str]) -> list[str]:
    """Each load's folder: its profile, with ``-2``, ``-3``, ... on a repeated pass."""
    return [p if not profiles[:k].count(p) else f"{p}-{profiles[:k].count(p) + 1}"
            for k, p in enumerate(profiles)]


def off_speed(out: Path, name: str, folders: list[str]) -> dict[int, str]:
    """The gate: server ``name``'s loads (by index) with a level whose host speed lies
    outside :data:`hostspeed.GATE` of :func:`gate_reference`, and those levels' speeds."""
    samples = read_speed(out)
    ref = gate_reference(out, samples)
    off = {}
    for k, folder in enumerate(folders):
        bad = off_gate(level_speeds(samples, read_run(out / name / folder)), ref)
        if bad:
            off[k] = ", ".join(f"{u} users {r:.2f}" for u, r in bad.items())
    return off


def gate_reference(out: Path, samples: pd.DataFrame) -> float:
    """The fit levels' median speed when the gate first looks (after server 1's first pass),
    kept in ``GATE_REFERENCE``: were it the median as the loads stand, each round's
    re-runs would move it, and a later round would re-run loads an earlier one kept (seen
    in calib17 of benchmarks/README.md)."""
    kept = stored_gate_reference(out)
    if kept is not None:
        return kept
    ref = reference_speed(level_speeds(samples, read_run(out / f)) for f in FIT)
    (out / GATE_REFERENCE).write_text(json.dumps({"units_per_cpu_s": ref}) + "\n")
    return ref


def stored_gate_reference(data: Path) -> float | None:
    """The gate's reference speed where its collection kept one (collections before
    afb35d4 did not)."""
    path = data / GATE_REFERENCE
    return float(json.loads(path.read_text())["units_per_cpu_s"]) if path.exists() else None


def markdown(table: pd.DataFrame, title: str) -> list[str]:
    """A benchmarks/README.md table of per-level errors and their medians."""
    lines = [f"| {title} | users | " + " | ".join(
        f"{m.upper()} p50 real / sim ms | err" for m in METRICS) + " |",
             "|---|---:|" + "---:|---:|" * len(METRICS)]
    for r in table.itertuples():
        cells = " | ".join(f"{getattr(r, f'{m}_real_ms'):.1f} / {getattr(r, f'{m}_sim_ms'):.1f}"
                           f" | {getattr(r, f'{m}_err'):+.0%}" for m in METRICS)
        lines.append(f"| {r.run} | {r.concurrency} | {cells} |")
    medians = " | ".join(f" | {table[f'{m}_err'].abs().median():.0%}" for m in METRICS)
    lines.append(f"| median abs | |{medians} |")
    return lines


def median_of_passes(passes: list[pd.DataFrame]) -> pd.DataFrame:
    """Per level, the median over the check's passes of the measured and of the predicted
    p50s, and the error between those medians: the judged held-out table."""
    rows = pd.concat(passes, ignore_index=True)
    table = rows.groupby(["profile", "concurrency"], as_index=False, sort=False)[
        [f"{m}_{k}_ms" for m in METRICS for k in ("real", "sim")]].median()
    table.insert(0, "run", table["profile"])
    for m in METRICS:
        table[f"{m}_err"] = table[f"{m}_sim_ms"] / table[f"{m}_real_ms"] - 1
    return table


def server_spread(runs: dict[str, Run], other: str) -> pd.DataFrame:
    """Server ``other`` against server 1 on the same load: client p50s, other / s1 - 1."""
    rows = []
    for profile in SAME_LOAD:
        one, two = runs[f"s1/{profile}"], runs[f"{other}/{profile}"]
        for a, b in zip(one.levels, two.levels, strict=True):
            rows.append({"load": profile, "users": a.concurrency, **{
                f"{m}_p50_s1_ms": round(a.client[f"{m}_p50_s"] * 1e3, 1) for m in METRICS}, **{
                f"{m}_p50_{other}_ms": round(b.client[f"{m}_p50_s"] * 1e3, 1)
                for m in METRICS}, **{
                f"{m}_diff": f"{b.client[f'{m}_p50_s'] / a.client[f'{m}_p50_s'] - 1:+.0%}"
                for m in METRICS}})
    return pd.DataFrame(rows)


def read_all(data: Path) -> dict[str, Run]:
    """Every collected run folder, as ``server/profile``."""
    return {f"{d.parent.name}/{d.name}": read_run(d)
            for d in sorted(data.glob("*/*")) if (d / "manifest.json").exists()}


def at_host_speed(data: Path, runs: dict[str, Run]) -> dict[str, Run]:
    """``runs`` with their times as the host at the fit levels' median speed would have
    taken them (:mod:`hostspeed`); prints each level's speed against that median."""
    samples = read_speed(data)
    speeds = {name: level_speeds(samples, run) for name, run in runs.items()}
    ref = reference_speed(speeds[name] for name in FIT)
    gate = stored_gate_reference(data) or ref
    print("host speed per level, against the fit levels' median (server CPU, SCHED_IDLE meter;"
          f" the gate's reference {gate / ref:.2f} of it; * outside {GATE[0]}-{GATE[1]} of that):")
    for name, by_level in speeds.items():
        off = off_gate(by_level, gate)
        print(f"  {name}: " + ", ".join(f"{u} users {v / ref:.2f}{'*' * (u in off)}"
                                        for u, v in by_level.items()))
    rejected = sorted(str(d.relative_to(data / "rejected"))
                      for d in data.glob("rejected/*/*") if d.is_dir())
    print(f"re-run by the gate ({len(rejected)}): {', '.join(rejected) or 'none'}")
    return {name: at_speed(run, speeds[name], ref) for name, run in runs.items()}


def report_one(runs: dict[str, Run], data: Path, label: str) -> None:
    cal, fitted = fit_with_table([runs[p] for p in FIT])
    cal.save(data / f"calibration-{label}.yaml")
    print(f"\n=== {label} ===\nfit: {cal.step}\nfront {cal.front_s * 1e3:.2f} ms + "
          f"{cal.front_per_in_flight_s * 1e3:.2f} ms/in flight + {cal.front_busy_s * 1e3:.2f} ms "
          f"with another in flight, turnaround "
          f"{cal.turnaround_s * 1e3:.2f} ms; dropped {cal.dropped}")
    tables = [("fit (server 1)", fitted)]
    held_out = all(p in runs for p in CHECK)    # collected apart, maybe later
    if held_out:
        passes = [check_levels(cal, [runs[p]]) for p in CHECK]
        if len(passes) > 1:
            tables += [(f"held out (server 2), pass {k}", t) for k, t in enumerate(passes, 1)]
        tables.append(("held out (server 2)", median_of_passes(passes)))
    for title, table in tables:
        print(f"\n{title}, {label}:")
        print("\n".join(format_table(table)))
        print("\n".join(markdown(table, title)))
    for other, what in (("s2", "server 2"), ("s1b", "server 1's flags, restarted after 2")):
        if all(f"{other}/{p}" in runs for p in SAME_LOAD):
            print(f"\n{what} against server 1, same load, {label}:")
            print(server_spread(runs, other).to_string(index=False))
    if not held_out:
        print(f"\nno {data / 's2'}: the held-out check waits for `collect {data} s2`")


def report(data: Path) -> None:
    """The fit and the check on the times as measured, then on the times at one host speed."""
    runs = read_all(data)
    missing = [p for p in FIT if p not in runs]
    if missing:
        sys.exit(f"{data}: no {', '.join(missing)} (the fit loads of this version; a collection "
                 "made before tiny-chunk joined them, c7a50a0, reports at an earlier commit)")
    report_one(runs, data, "as measured")
    report_one(at_host_speed(data, runs), data, "at one host speed")


if __name__ == "__main__":
    if sys.argv[1] == "collect":
        collect(Path(sys.argv[2]), sys.argv[3:])
    else:
        report(Path(sys.argv[2]))
