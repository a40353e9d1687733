"""Score the analyzer's inferred verdict against the measured one on generated scenarios.

Per seed of the chosen set (``seeds.json``): :func:`generate.generate` draws a scenario,
the simulator replays it in virtual time into a run folder, and the truth is measured
from that folder's ``loadlab:`` refusal series (:func:`loadlab.analyze.measured.measure`
on those series alone, with vLLM's KV usage gauge for the head-of-line split). Then the
folder is copied with every ``loadlab:`` series removed (metrics.parquet rewritten
without those rows, the manifest's lists of families cleaned) and, where the scenario
says so, without the server flags in its manifest: what a live vLLM run would give the
analyzer. The analyzer judges the copy. Scores:

- cause right: the inferred cause is the measured cause;
- knee within one level: the inferred and measured first stalled levels are at most one
  level apart among the plan's distinct levels ("no knee" counts as one past the top);
- calibration: per knee confidence (high, medium, low), the share of right causes,
  right knees and both; and per cause confidence, the share of right causes;
- abstained: the share inferred ``undetermined`` (the analyzer naming candidates /metrics
  cannot tell apart). An abstention is never right; the confusion matrix gives it its own
  column, and "cause right when answered" leaves it out.
- by truth kind: the share of right causes by how plainly the refusals name their cause
  (:func:`truth_kind`: clear, split between reasons, a ``kv_blocks`` split on its line, a
  stall at the top level only, no stall), so that a miss where the scheduler itself was
  split is told from one where it refused for one limit alone.

Prints the confusion matrix (rows truth, columns inferred) and the calibration table, and
writes every seed's row with the summary as JSON; a row carries the cause arbiter's inputs
(``cause.arbiter``), which ``train_arbiter.py`` fits on. At most two processes.

A validation set is scored once, after tuning, and never tuned on; a spent one (seeds.json
``spent``) is refused, unless ``--as-tuning`` says it is scored as tuning data (from the
sixth round on a spent set is no longer held out and may be tuned on). Replays are cached
per seed (``--cache``, default ``$TMPDIR/heldout-cache/<seed>``, keyed by the seed's whole
spec); ``--replay-only`` fills the cache and reads nothing from it.

    PYTHONPATH=. python benchmarks/heldout/score.py --set tuning2 [--limit N] [--out F]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from generate import generate, load_plan, sim_config, write_profile

from loadlab.analyze.analysis import analyze_run
from loadlab.analyze.measured import (
    HEAD_BLOCKED_SHARE,
    SERIES_PREFIX,
    measure,
    typical_request_blocks,
)
from loadlab.analyze.steps import measured_windows
from loadlab.analyze.tables import METRIC_COLUMNS, read_metrics, read_requests
from loadlab.replay.driver import ReplayOptions, run_replay
from loadlab.runstore import read_manifest
from loadlab.runstore.layout import MANIFEST, METRICS_TABLE
from loadlab.spec.scenario import Workload

SEEDS = Path(__file__).resolve().parent / "seeds.json"
CACHE = Path(tempfile.gettempdir()) / "heldout-cache"
MAX_JOBS = 2
CONFIDENCES = ("high", "medium", "low")
ABSTAIN = "undetermined"
SPLIT_BELOW = 0.6
"""A measured cause is *split* when its reason took less than this share of the refused
steps: the scheduler itself refused for two limits in similar measure (budget 52%,
``kv_blocks`` 48%), and the name rests on the larger by a few steps."""
KV_LINE = 0.1
"""A ``kv_blocks`` truth sits *on the line* between a blocked head and a full pool when the
share of refusals whose free blocks held a median request is within this of the line
that names one or the other (:data:`loadlab.analyze.measured.HEAD_BLOCKED_SHARE`)."""
TRUTH_KINDS = ("clear", "split", "kv line", "top level only", "no stall")


def truth_of(run_dir: Path, block_size: int) -> dict[str, Any]:
    """The measured knee and cause of a replayed folder, from its ``loadlab:`` series (and
    vLLM's KV usage gauge) only: nothing the analyzer infers. The ``kv_blocks`` split
    (:func:`loadlab.analyze.measured.kv_cause`) needs the median request's blocks: from the
    lengths sent and the scenario's block size, as the measured verdict of a full run takes
    them (without them every ``kv_blocks`` truth read ``kv_exhausted``)."""
    metrics = read_metrics(run_dir, columns=METRIC_COLUMNS)
    kept = metrics["family"].astype(str)
    metrics = metrics[kept.str.startswith(SERIES_PREFIX) | (kept == "vllm:kv_cache_usage_perc")]
    windows = measured_windows(read_manifest(run_dir))
    windows["level"] = windows["concurrency"].where(windows["concurrency"].notna(),
                                                    windows["target_rate"])
    measured = measure(metrics, windows, typical_request_blocks(read_requests(run_dir),
                                                                block_size))
    if measured is None:
        raise RuntimeError(f"{run_dir}: the replay exported no loadlab: series")
    return measured


def stripped_copy(run_dir: Path, dest: Path, strip_flags: bool) -> Path:
    """``run_dir`` copied to ``dest`` without ``loadlab:`` series (and without the server
    flags when ``strip_flags``): what the analyzer is scored on."""
    shutil.copytree(run_dir, dest)
    for part in sorted((dest / METRICS_TABLE).glob("*.parquet")):
        table = pq.read_table(part)
        keep = pc.invert(pc.starts_with(table.column("family"), SERIES_PREFIX))
        pq.write_table(table.filter(keep), part)
    manifest = json.loads((dest / MANIFEST).read_text())
    _drop_families(manifest.get("metrics") or {})
    if strip_flags:
        manifest.pop("server", None)
        manifest.pop("sim", None)
        launch = (manifest.get("target") or {}).get("launch") or {}
        launch.pop("flags", None)
        launch.pop("argv", None)
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return dest


def _drop_families(info: dict[str, Any]) -> None:
    """Remove ``loadlab:`` families from the manifest's metrics block, endpoints included."""
    for block in [info, *(info.get("endpoints") or {}).values()]:
        if "families" in block:
            block["families"] = [f for f in block["families"] if not f.startswith(SERIES_PREFIX)]
        names = block.get("names_found") or {}
        for role in [r for r, f in names.items() if f.startswith(SERIES_PREFIX)]:
            del names[role]


def knee_index(levels: list[float], upper: float | None) -> int:
    """The position of a first stalled level among the distinct levels; None: past the top."""
    if upper is None:
        return len(levels)
    return min(range(len(levels)), key=lambda i: abs(levels[i] - float(upper)))


def replayed(seed: int, cache: Path) -> tuple[dict[str, Any], Path, float]:
    """The seed's spec and its replayed run folder under ``cache/<seed>``, replayed only when
    the cache has no folder for this very spec (the replay does not depend on the analyzer,
    so re-scoring after an analyzer change only reruns the analysis); and the replay's
    seconds (0 when cached). A replay is written beside its place and renamed into it, so an
    interrupted one is never taken for a finished one."""
    spec = generate(seed)
    folder = cache / str(seed)
    stamp = folder / "spec.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == spec:
        return spec, folder / "run", 0.0
    cache.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=f".{seed}-", dir=cache) as tmp:
        work = Path(tmp) / "seed"
        work.mkdir()
        profile = write_profile(spec, work)
        t0 = time.perf_counter()
        run_replay(sim_config(spec), load_plan(spec), Workload(profile=str(profile), seed=seed),
                   work / "run", ReplayOptions(metrics_interval_s=spec["metrics_interval_s"],
                                               start_epoch=1.7e9))
        replay_s = time.perf_counter() - t0
        (work / "spec.json").write_text(json.dumps(spec))
        work.rename(folder)
    return spec, folder / "run", replay_s


def score_seed(seed: int, keep: Path | None = None, cache: Path = CACHE) -> dict[str, Any]:
    """Replay (or take from the cache), measure, strip, analyse and score one seed."""
    spec, run_dir, replay_s = replayed(seed, cache)
    truth = truth_of(run_dir, spec["server"]["block_size"])
    with tempfile.TemporaryDirectory(prefix=f"heldout-{seed}-") as tmp:
        copy = stripped_copy(run_dir, Path(tmp) / "analysed", spec["strip_flags"])
        t0 = time.perf_counter()
        inferred = analyze_run(copy).as_json()
        analyse_s = time.perf_counter() - t0
        if keep is not None:
            shutil.copytree(run_dir.parent, keep / str(seed), dirs_exist_ok=True)
            shutil.copytree(copy, keep / str(seed) / "analysed", dirs_exist_ok=True)
    plan = spec["plan"]
    levels = sorted({float(v) for v in plan.get("concurrency") or plan.get("rate")})
    knee = inferred["knee"]
    got = knee["upper"] if knee["found"] else None
    want = truth["knee"]["upper"] if truth["knee"]["found"] else None
    return {
        "seed": seed,
        "truth_cause": truth["cause"]["name"],
        "inferred_cause": inferred["cause"]["name"],
        "truth_knee": [truth["knee"]["lower"], want],
        "inferred_knee": [knee.get("lower"), got],
        "confidence": knee.get("confidence"),
        "cause_confidence": inferred["cause"].get("confidence"),
        "cause_right": truth["cause"]["name"] == inferred["cause"]["name"],
        "truth_kind": truth_kind(truth, levels),
        "arbiter": inferred["cause"].get("arbiter"),
        "knee_right": abs(knee_index(levels, got) - knee_index(levels, want)) <= 1,
        "knee_exact": knee_index(levels, got) == knee_index(levels, want),
        "loop": "closed" if "concurrency" in plan else "open",
        "scrape_s": spec["metrics_interval_s"],
        "flags_stripped": spec["strip_flags"],
        "top_step": spec["top_step"],
        "chunked": spec["server"]["enable_chunked_prefill"],
        "family": spec.get("family", "base"),
        "replay_s": round(replay_s, 2),
        "analyse_s": round(analyse_s, 2),
    }


def truth_kind(truth: dict[str, Any], levels: list[float]) -> str:
    """How plainly the scheduler's refusals name their cause (:data:`TRUTH_KINDS`): no
    stall measured; a split between reasons (:data:`SPLIT_BELOW`); a ``kv_blocks`` split
    on its line (:data:`KV_LINE`); a stall at the top level only; else clear. The misses
    of a held-out set are read by these, since a miss where the scheduler itself was
    split is not the same failure as one where it refused for one limit alone."""
    cause = truth["cause"]
    if cause["name"] == "none" or not truth["knee"]["found"]:
        return "no stall"
    if max(cause.get("reason_share", {}).values(), default=1.0) < SPLIT_BELOW:
        return "split"
    fits = cause.get("typical_fits_share")
    on_line = fits is not None and abs(fits - HEAD_BLOCKED_SHARE) < KV_LINE
    if cause.get("reason") == "kv_blocks" and on_line:
        return "kv line"
    if knee_index(levels, float(truth["knee"]["upper"])) == len(levels) - 1:
        return "top level only"
    return "clear"


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals, the confusion matrix and the calibration table of scored rows."""
    n = len(rows)
    confusion = Counter((r["truth_cause"], r["inferred_cause"]) for r in rows)
    answered = [r for r in rows if r["inferred_cause"] != ABSTAIN]
    return {
        "n": n,
        "cause_right": _share(rows, lambda r: r["cause_right"]),
        "abstained": _share(rows, lambda r: r["inferred_cause"] == ABSTAIN),
        "cause_right_answered": _share(answered, lambda r: r["cause_right"]),
        "knee_right": _share(rows, lambda r: r["knee_right"]),
        "knee_exact": _share(rows, lambda r: r.get("knee_exact")),
        "both_right": _share(rows, lambda r: r["cause_right"] and r["knee_right"]),
        "confusion": [{"truth": t, "inferred": i, "n": c}
                      for (t, i), c in sorted(confusion.items())],
        "calibration": _calibration(rows, "confidence"),
        "cause_calibration": _calibration(rows, "cause_confidence"),
        "by_truth_kind": {k: {"n": len(g), "cause_right": sum(r["cause_right"] for r in g)}
                          for k in TRUTH_KINDS
                          if (g := [r for r in rows if r.get("truth_kind") == k])},
    }


def _calibration(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Per value of ``key`` (a confidence): the share of right causes, knees and both."""
    out = {}
    for conf in sorted({str(r.get(key)) for r in rows},
                       key=lambda c: (CONFIDENCES + (c,)).index(c)):
        group = [r for r in rows if str(r.get(key)) == conf]
        out[conf] = {
            "n": len(group),
            "cause_right": _share(group, lambda r: r["cause_right"]),
            "knee_right": _share(group, lambda r: r["knee_right"]),
            "both_right": _share(group, lambda r: r["cause_right"] and r["knee_right"]),
        }
    return out


def _share(rows: list[dict[str, Any]], test: Any) -> float | None:
    return round(sum(bool(test(r)) for r in rows) / len(rows), 4) if rows else None


def render(summary: dict[str, Any]) -> str:
    """The confusion matrix and the calibration table as text."""
    cells = {(c["truth"], c["inferred"]): c["n"] for c in summary["confusion"]}
    names = sorted({t for t, _ in cells} | {i for _, i in cells})
    width = max(len(x) for x in [*names, "truth \\ inferred"]) + 2
    lines = ["confusion (rows: measured truth, columns: inferred)",
             "truth \\ inferred".ljust(width) + "".join(x[:12].rjust(14) for x in names)]
    for t in names:
        if any(cells.get((t, i)) for i in names):
            lines.append(t.ljust(width) + "".join(str(cells.get((t, i), 0)).rjust(14)
                                                  for i in names))
    for key, what in (("calibration", "knee"), ("cause_calibration", "cause")):
        lines += ["", f"calibration ({what} confidence: share right)",
                  f"{'confidence':12s}{'n':>6s}{'cause':>9s}{'knee':>9s}{'both':>9s}"]
        for conf, c in summary.get(key, {}).items():
            lines.append(f"{conf:12s}{c['n']:6d}" + "".join(
                f"{c[k]:9.0%}" for k in ("cause_right", "knee_right", "both_right")))
    kinds = summary.get("by_truth_kind") or {}
    if kinds:
        lines += ["", "cause right by how plainly the refusals name it (truth_kind)"] + [
            f"{k:16s}{c['n']:6d}{c['cause_right'] / c['n']:9.0%}" for k, c in kinds.items()]
    answered = summary.get("cause_right_answered")
    lines.append(f"\nall {summary['n']}: cause right {summary['cause_right']:.0%}, knee within "
                 f"one level {summary['knee_right']:.0%} (the same level "
                 f"{summary.get('knee_exact') or 0:.0%}), both {summary['both_right']:.0%}; "
                 f"abstained ({ABSTAIN}) {summary.get('abstained') or 0:.0%}, cause right when "
                 f"answered {'-' if answered is None else f'{answered:.0%}'}")
    return "\n".join(lines)


def seed_sets() -> dict[str, Any]:
    return {k: v for k, v in json.loads(SEEDS.read_text()).items() if k != "note"}


def seeds_of(name: str) -> list[int]:
    return [int(s) for s in seed_sets()[name]]


def score(seeds: list[int], jobs: int = MAX_JOBS, keep: Path | None = None,
          say: Any = None, cache: Path = CACHE) -> dict[str, Any]:
    """Every seed's row and the summary; ``say`` gets a line per seed as it finishes."""
    jobs = max(1, min(jobs, MAX_JOBS))
    args = [(s, keep, cache) for s in seeds]
    if jobs == 1:
        rows = _collect(map(_score_args, args), say)
    else:
        with Pool(jobs) as pool:
            rows = _collect(pool.imap(_score_args, args), say)
    return {"rows": rows, "summary": summarise(rows)}


def _score_args(args: tuple[int, Path | None, Path]) -> dict[str, Any]:
    return score_seed(*args)


def replay_only(seeds: list[int], cache: Path, jobs: int = MAX_JOBS) -> int:
    """Fill the cache with the seeds' replays and nothing else: no truth is measured and no
    analysis run, so this reads no result (a validation set's replays can be made while
    the analyzer is still being tuned). Returns how many were replayed now."""
    jobs = max(1, min(jobs, MAX_JOBS))
    args = [(s, cache) for s in seeds]
    if jobs == 1:
        return sum(1 for t in map(_replay_args, args) if t > 0)
    with Pool(jobs) as pool:
        return sum(1 for t in pool.imap_unordered(_replay_args, args) if t > 0)


def _replay_args(args: tuple[int, Path]) -> float:
    return replayed(*args)[2]


def _collect(results: Any, say: Any) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        rows.append(r)
        if say:
            say(f"seed {r['seed']:6d}: truth {r['truth_cause']:13s} {str(r['truth_knee']):14s} "
                f"inferred {r['inferred_cause']:17s} {str(r['inferred_knee']):14s} "
                f"{str(r['confidence']):6s} {'ok' if r['cause_right'] else 'CAUSE'} "
                f"{'ok' if r['knee_right'] else 'KNEE'}  ({r['replay_s']} s + {r['analyse_s']} s)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sets = seed_sets()
    names = [k for k in sets if k != "spent"]
    ap.add_argument("--set", dest="which", choices=names, required=True)
    ap.add_argument("--limit", type=int, default=None, help="the first N seeds of the set")
    ap.add_argument("--jobs", type=int, default=MAX_JOBS, help=f"processes (at most {MAX_JOBS})")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON result (default: heldout-SET.json)")
    ap.add_argument("--keep", type=Path, default=None, help="keep each seed's folders here")
    ap.add_argument("--cache", type=Path, default=CACHE,
                    help=f"replayed run folders per seed (default {CACHE})")
    ap.add_argument("--replay-only", action="store_true",
                    help="only fill the cache with the replays: no truth, no analysis, no score")
    ap.add_argument("--as-tuning", action="store_true",
                    help="score a spent validation set as tuning data (never as held-out)")
    args = ap.parse_args()
    if args.which in sets.get("spent", []):
        if not args.as_tuning:
            ap.error(f"the {args.which} set is spent (scored once; seeds.json 'spent'); "
                     "--as-tuning scores it as tuning data")
        print(f"{args.which} is spent: scored as tuning data, not as held-out evidence")
    seeds = seeds_of(args.which)[: args.limit]
    if args.replay_only:
        done = replay_only(seeds, args.cache, args.jobs)
        print(f"{len(seeds)} seeds in {args.cache}; {done} replayed now")
        return
    result = score(seeds, args.jobs, args.keep, say=lambda line: print(line, flush=True),
                   cache=args.cache)
    print()
    print(render(result["summary"]))
    out = args.out or Path(f"heldout-{args.which}.json")
    out.write_text(json.dumps({"set": args.which, **result}, indent=1) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
