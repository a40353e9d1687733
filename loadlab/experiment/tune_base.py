"""The server a run measured, as a scenario's target and flags and a what-if of it.

``loadlab tune`` replays candidate configurations of *that* server, so everything starts
from the run's manifest:

- the target: the launched server again (``vllm serve MODEL`` with the same flags, or the
  simulator), or for a run against a URL a vLLM launch of the served model's name, which
  the user edits into a path when confirming;
- the flags vLLM got (``target.launch.flags``), or what the manifest knows of them;
- the simulator profile: the run's own when the simulator served it, else
  ``--model``/``--gpu`` (default llama-3.1-8b on h100): its step times stand in for the
  server's unless `--calibration` (a `loadlab sim calibrate` YAML) replaces them;
- the KV pool: a pool the run pinned (``num_gpu_blocks_override``) stays pinned, as on the
  real server; a simulator's pool follows vLLM's memory formula; any other server's pool
  is the one it reported (``num_gpu_blocks``, vLLM's cache_config_info), scaled by
  :func:`loadlab.experiment.tune_space.scaled_pool`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadlab.analyze.capacity import as_int, pool_config
from loadlab.analyze.steps import RunData
from loadlab.experiment.tune_space import Candidate, scaled_pool
from loadlab.sim.engine import calibration as calibration_file
from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.flags import sim_config
from loadlab.sim.serve.flags import accepted_flags
from loadlab.spec.cpulist import format_cpu_list
from loadlab.spec.scenario import Isolation, LoadgenSettings, Target, WhatIf

SIM_KINDS = ("sim", "sim-replay")
OVERRIDE = "num_gpu_blocks_override"


@dataclass(frozen=True)
class ServerBase:
    """The run's server as a scenario sees it, and how a candidate's KV pool is found."""

    target: Target
    flags: dict[str, Any]
    what_if: WhatIf
    pool_blocks: int | None          # the reported pool, scaled per candidate; None: not scaled
    launched: bool                   # loadlab started the run's server (a URL it only loaded)
    notes: tuple[str, ...] = ()

    def point_flags(self, changes: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
        """A candidate's flags for its what-if (the scaled pool added where it applies;
        ``current``, the resolved current flags, is empty for the current one itself)."""
        flags = {**self.flags, **changes}
        if self.pool_blocks is not None:
            flags[OVERRIDE] = scaled_pool(self.pool_blocks, current, changes) if current \
                else self.pool_blocks
        return flags

    def written_what_if(self) -> WhatIf:
        """The scenario file's ``what_if``: the reported pool pinned for every arm."""
        if self.pool_blocks is None:
            return self.what_if
        return self.what_if.model_copy(
            update={"flags": {**self.what_if.flags, OVERRIDE: self.pool_blocks}})


def server_base(run: RunData, model: str | None, gpu: str | None,
                calibration: Path | None) -> ServerBase:
    """The run's server (see the module docstring)."""
    manifest = run.manifest
    target = manifest.get("target") or {}
    launch = target.get("launch") or {}
    kind = launch.get("kind") or manifest.get("kind")
    server = {k: v for k, v in (manifest.get("server") or {}).items() if v is not None}
    notes: list[str] = []
    if kind in SIM_KINDS:
        known = accepted_flags()
        # the run's own calibration is a what-if setting (a path and its fit errors in the
        # manifest), not a flag: it stands in for --calibration when that is not given
        flags = {k: v for k, v in (launch.get("flags") or server).items()
                 if v is not None and k in known and k not in ("model", "calibration")}
        calibration = calibration or _run_calibration(server, notes)
        profile = sim_config({"model": server.get("model") or SimConfig.model}).model
        tgt = Target(launch="sim", model=model or profile)
        what_if = WhatIf(model=model or profile, gpu=gpu or flags.get("gpu") or SimConfig.gpu)
    else:
        flags = dict(launch.get("flags") or server)
        if target.get("max_model_len") and "max_model_len" not in flags:
            flags["max_model_len"] = target["max_model_len"]
        tgt = Target(launch="vllm", model=_served_model(launch) or target.get("model"),
                     startup_timeout_s=600)
        if not launch:
            notes.append("the run loaded a URL: the scenario launches vLLM with the served "
                         "model's name; put its path there before a real sweep")
        what_if = WhatIf(model=model or SimConfig.model, gpu=gpu or SimConfig.gpu)
        if calibration is None:
            notes.append(f"step times: the simulator's {what_if.model} on {what_if.gpu} "
                         "(no calibration given)")
    if calibration is not None:
        notes.append(f"step times: the calibration {calibration}")
        what_if = what_if.model_copy(update={"calibration": str(calibration.resolve())})
    pool = None
    if OVERRIDE not in flags and kind not in SIM_KINDS:
        pool = as_int(pool_config(run.metrics, manifest).get("num_gpu_blocks"))
        if pool is None:
            notes.append("the run reported no KV pool (num_gpu_blocks): the simulator "
                         "profile's pool stands in")
    return ServerBase(tgt, flags, what_if, pool, bool(launch), tuple(notes))


def extrapolation_note(calibration: str | None, grid: list[Candidate],
                       current: dict[str, Any]) -> str | None:
    """Which candidates run more requests at once than the calibrated server could: a fit
    sees the engine only up to its server's max_num_seqs, so the per-request cost is
    extrapolated past it (benchmarks/README.md, tune_tiny_vllm.py: 8x past a cap of 2
    put ITL 3.4x too high)."""
    if not calibration:
        return None
    seen = calibration_file.load(calibration).server.get("max_num_seqs")
    caps = {c.name: int(c.changes.get("max_num_seqs", current["max_num_seqs"])) for c in grid}
    past = [name for name, cap in caps.items() if seen and cap > int(seen)]
    if not past:
        return None
    return (f"the calibration's server ran at most {seen} requests at once (max_num_seqs): "
            f"step times of {', '.join(past)} are extrapolated past that (fit on a load that "
            "runs as many)")


def _run_calibration(server: dict[str, Any], notes: list[str]) -> Path | None:
    """The calibration a simulator run replayed with, when its file is still there."""
    recorded = server.get("calibration") or {}
    path = recorded.get("path") if isinstance(recorded, dict) else recorded
    if not path:
        return None
    if not Path(path).is_file():
        notes.append(f"the run's calibration {path} is gone: its simulator profile stands in")
        return None
    return Path(path)


def _served_model(launch: dict[str, Any]) -> str | None:
    """``vllm serve MODEL ...``: the model as vLLM was given it."""
    argv = [str(a) for a in launch.get("argv") or []]
    return argv[argv.index("serve") + 1] if "serve" in argv[:-1] else None


def isolation(manifest: dict[str, Any]) -> Isolation | None:
    """The run's CPU split, for the confirming A/B."""
    cpus = manifest.get("isolation") or {}
    server, client = cpus.get("server_cpus"), cpus.get("client_cpus")
    if not server and not client:
        return None
    return Isolation(server_cpus=format_cpu_list(frozenset(server)) if server else None,
                     client_cpus=format_cpu_list(frozenset(client)) if client else None)


def loadgen(manifest: dict[str, Any]) -> LoadgenSettings:
    """The run's scrape interval, and in-process users when it ran them so."""
    interval = (manifest.get("metrics") or {}).get("interval_s") or 1.0
    by_worker = ((manifest.get("records") or {}).get("by_worker") or {})
    workers = 0 if set(by_worker) == {"local"} else 1
    return LoadgenSettings(workers=workers, collect_interval_s=float(interval))
