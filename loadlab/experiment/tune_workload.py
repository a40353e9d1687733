"""The workload of a what-if of a run: the run's own request lengths, resampled.

Tune tries levels the run never reached, where a trace (:mod:`loadlab.replay.trace`)
has no requests to re-issue, so this writes a workload profile fitted to the run's
recorded prompt and output lengths (:func:`loadlab.workload.derive.fit_profile`, what
``loadlab profile build`` fits), which the replay driver samples at any level: the
lengths' distribution and their pairing, not the exact sequence, and no shared prefixes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from loadlab.errors import InputError
from loadlab.runstore.layout import REQUESTS_TABLE
from loadlab.spec.scenario import Workload
from loadlab.workload.derive import fit_profile
from loadlab.workload.model import Source, dump_profile
from loadlab.workload.traces import TraceData

PROFILE_FILE = "workload.yaml"


def recorded_lengths(requests: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output tokens of the run's successful requests (the server's usage, else
    the lengths asked for)."""
    ok = requests[requests["status"] == "ok"] if not requests.empty else requests
    if ok.empty:
        return np.array([], dtype=int), np.array([], dtype=int)
    prompt = ok["prompt_tokens"].fillna(ok["target_prompt_tokens"])
    output = ok["output_tokens"].fillna(ok["target_output_tokens"])
    keep = prompt.notna() & output.notna() & (output > 0)
    return prompt[keep].to_numpy(dtype=int), output[keep].to_numpy(dtype=int)


def recorded_workload(run_dir: Path, requests: pd.DataFrame, folder: Path, seed: int) -> Workload:
    """A profile of the run's lengths written to ``folder``, and the workload naming it."""
    prompt, output = recorded_lengths(requests)
    if prompt.size < 2:
        raise InputError("fewer than two successful requests with their lengths",
                         source=run_dir / REQUESTS_TABLE, field="prompt_tokens/output_tokens",
                         fix="tune a run that completed requests")
    trace = TraceData(str(run_dir / REQUESTS_TABLE), prompt, output)
    source = Source(dataset=run_dir.name, origin=str(run_dir / REQUESTS_TABLE),
                    licence="as the run", citation="none",
                    derivation="loadlab tune: the run's recorded prompt and output lengths")
    model = fit_profile(trace, f"recorded-{run_dir.name}",
                        f"Lengths of {len(trace)} requests of {run_dir.name}", source)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / PROFILE_FILE
    path.write_text(dump_profile(model), encoding="utf-8")
    return Workload(profile=str(path.resolve()), seed=seed)
