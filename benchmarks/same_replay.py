"""Whether two loadlab trees write the same replays: a check for speed work on the replay.

    python benchmarks/same_replay.py --against TREE

Runs fixed-seed replays with this tree and with ``TREE`` (a directory holding
``loadlab/``, e.g. ``git archive main loadlab profiles | tar -x -C /tmp/main``), each in
a fresh process, and compares what they wrote, read back frame by frame: requests.parquet
through ``read_requests`` (the analyzer's columns) and through ``read_table`` (every
column, ``chunk_offsets_s`` included, the token times the ITL figures come from),
metrics.parquet through ``read_metrics``, and the replay summaries. Cases: one replica at
64 and at 256 users; a KV-bound run with preemptions; an open loop; fleets of 4
round-robin and 3 least-waiting. Times differ between two runs only by the epoch, so it
is fixed. Exit status 1 when any frame differs.

Columns one tree's ``read_table`` returns and the other's lacks are allowed only when
they are REQUESTS' token pointers (``token_timeline``, ``token_step``,
``t_sent_clock_s``, added with step_ends.parquet): they are named, and every column
both trees have, ``chunk_offsets_s`` rebuilt from those pointers included, must be equal.
"""

from __future__ import annotations

import argparse
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from trees import tree_env

from loadlab.runstore import token_steps

CHILD = """
import pickle, sys, tempfile
from pathlib import Path
from loadlab.analyze.tables import read_metrics, read_requests
from loadlab.replay.driver import ReplayOptions, run_replay
from loadlab.runstore import REQUESTS, read_table
from loadlab.runstore.layout import REQUESTS_TABLE
from loadlab.sim.engine.config import SimConfig
from loadlab.sim.fleet.config import fleet_config
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import Workload

base = {"model": "qwen2.5-7b", "gpu": "h100"}
closed = {"step_duration_s": 120.0, "warmup_s": 10.0}
cases = {
    "one replica, 64 users": (SimConfig(**base), LoadPlan(concurrency=[64], **closed)),
    "one replica, 256 users": (SimConfig(**base), LoadPlan(concurrency=[256], **closed)),
    "KV-bound, preempting": (SimConfig(**base, num_gpu_blocks_override=1500,
                                       max_model_len=8192, max_num_seqs=128),
                             LoadPlan(concurrency=[48, 96], step_duration_s=60.0, warmup_s=5.0)),
    "open loop": (SimConfig(**base), LoadPlan(rate=[4.0, 12.0], step_duration_s=60.0,
                                              warmup_s=5.0)),
    "fleet of 4, round-robin": (fleet_config({**base, "replicas": 4, "router": "round-robin"}),
                                LoadPlan(concurrency=[256], step_duration_s=60.0, warmup_s=5.0)),
    "fleet of 3, least-waiting": (
        fleet_config({**base, "replicas": 3, "router": "least-waiting", "max_num_seqs": 32}),
        LoadPlan(concurrency=[160], step_duration_s=60.0, warmup_s=5.0)),
}
out = {}
with tempfile.TemporaryDirectory() as tmp:
    for i, (name, (cfg, plan)) in enumerate(cases.items()):
        run = Path(tmp) / str(i)
        s = run_replay(cfg, plan, Workload(profile="sharegpt", seed=7), run,
                       ReplayOptions(start_epoch=1_800_000_000.0))
        out[name] = {
            "summary": (s.requests, s.completed, s.aborted, s.engine_steps, s.metrics_rows,
                        s.virtual_s, s.steps),
            "read_requests": read_requests(run),
            "read_table(requests)": read_table(run / REQUESTS_TABLE, REQUESTS),
            "read_metrics": read_metrics(run),
        }
        m = out[name]["read_metrics"]
        preempted = m[m.family == "vllm:num_preemptions"].groupby("endpoint",
                                                                  observed=True).value.max()
        print(f"{name}: {s.requests} requests, {int(preempted.sum())} preemptions", file=sys.stderr)
pickle.dump(out, open(sys.argv[1], "wb"))
"""


def written(tree: Path, dest: Path) -> dict:
    """What ``tree``'s loadlab writes for every case, read back (in a fresh process;
    ``-P``: the working directory must not stand in for ``tree``)."""
    env = tree_env(tree)
    subprocess.run([sys.executable, "-P", "-c", CHILD, str(dest)], env=env, check=True)
    with open(dest, "rb") as f:
        return pickle.load(f)


POINTERS = set(token_steps.POINTERS) - {"n_chunks"}   # columns REQUESTS gained with them


def differences(ours: dict, theirs: dict) -> list[str]:
    """One line per case and frame that is not equal (values, dtypes and order)."""
    lines = []
    for case, frames in ours.items():
        for what, got in frames.items():
            want = theirs[case][what]
            only = "" if what == "summary" else _pointers_only_in_one(got, want)
            if only:
                got, want = (f.drop(columns=list(POINTERS & set(f.columns))) for f in (got, want))
            same = got == want if what == "summary" else _frames_equal(got, want)
            print(f"{case:28s} {what:22s} {'equal' if same else 'DIFFERENT'}"
                  f"{'' if what == 'summary' else f' ({len(got)} rows)'}{only}")
            if not same:
                lines.append(f"{case}: {what}")
    return lines


def _pointers_only_in_one(a: pd.DataFrame, b: pd.DataFrame) -> str:
    """A note naming the pointer columns only one frame has ("" when their columns agree
    or differ by more than those: then the comparison fails)."""
    extra = set(a.columns) ^ set(b.columns)
    return f", {len(extra)} pointer columns in one tree only" if extra and extra <= POINTERS else ""


def _frames_equal(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Equal columns, dtypes and values; list cells (``chunk_offsets_s``) element by element."""
    if list(a.columns) != list(b.columns) or list(a.dtypes) != list(b.dtypes):
        return False
    return all(_cells(a[c]) == _cells(b[c]) if a[c].dtype == object else a[c].equals(b[c])
               for c in a.columns)


def _cells(column: pd.Series) -> list:
    return [tuple(v) if isinstance(v, np.ndarray) else v for v in column]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", type=Path, required=True)
    args = ap.parse_args()
    here = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        ours = written(here, Path(tmp) / "ours.pkl")
        theirs = written(args.against.resolve(), Path(tmp) / "theirs.pkl")
    bad = differences(ours, theirs)
    print("all equal" if not bad else f"{len(bad)} differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
