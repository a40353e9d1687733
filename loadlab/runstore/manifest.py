"""manifest.json: what a run folder holds and how it was produced, as typed models.

Written atomically (temporary file, then rename) and updated at step boundaries, so a
crashed run still says which steps finished. Two kinds of folder:

- a run (:class:`RunManifest`, ``kind`` one of :data:`RUN_KINDS`: "run" from
  ``loadlab run``, "sim-replay" from ``loadlab sim replay``; absent when only
  ``loadlab collect`` wrote the folder);
- a sweep (:class:`SweepManifest`, ``kind`` "sweep"): one run folder per point below it.

The models name every key the stages share (what each means is in its description);
any other key is kept as written (``extra="allow"``), so a writer can add one without
touching this module. Writers build the models; :func:`write_manifest` and
:func:`update_manifest` check the result before writing (a wrong type fails there, as a
pydantic ValidationError: a bug in the writer, not bad input) and write what they were
given, defaults not filled in. Readers go through :func:`load_manifest` (the typed
model) or :func:`read_manifest` (the checked JSON object, for code that merges or
indexes it); a file that does not fit is an InputError naming the file and the field.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from loadlab.errors import InputError
from loadlab.runstore.jsonfile import read_object, replace_text, validated
from loadlab.runstore.layout import MANIFEST

_lock = threading.Lock()
_FIX = "restore it, or rerun: the manifest is written by the run itself"

RunStatus = Literal["running", "complete", "interrupted", "failed"]
RunKind = Literal["run", "sim-replay", "sweep-point"]
"""A run folder's ``kind``; "sweep-point" is read for folders from before sweep points
were written as plain runs (nothing writes it now)."""
RUN_KINDS: tuple[str, ...] = get_args(RunKind)
SWEEP_KIND = "sweep"


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class StepWindow(_Open):
    """One load step as it ran (the analyzer cuts ``warmup_s`` from its start)."""

    step: int
    t_start: float = Field(description="unix seconds the step began")
    t_end: float = Field(description="unix seconds it ended (or was cut short)")
    warmup_s: float = 0.0
    concurrency: int | None = Field(None, description="closed loop: users")
    target_rate: float | None = Field(None, description="open loop: requests/s asked for")
    burstiness: float | None = None
    client_cpu_cores: float | None = Field(None, description="CPU the load generator used, "
                                           "in cores")
    client_cpu_max_worker: float | None = None
    inflight_mean: float | None = Field(None, description="time-mean requests in flight "
                                       "after warm-up")
    achieved_ratio: float | None = Field(None, description="closed: inflight_mean / concurrency; "
                                         "open: achieved_rate / target_rate")
    achieved_rate: float | None = Field(None, description="requests sent per second after warm-up")
    send_lag_p50_s: float | None = None
    send_lag_p99_s: float | None = None
    send_lag_max_s: float | None = None
    loop_lag_mean_s: float | None = None
    loop_lag_max_s: float | None = None
    client_limited: bool | None = Field(None, description="the client fell short of the asked load")
    client_limited_reasons: list[str] = Field(default_factory=list)


class Launch(_Open):
    """How loadlab started the server (``target.launch``); secrets redacted."""

    kind: str = Field(description="sim | vllm | sim-replay")
    argv: list[str] = Field(default_factory=list)
    flags: dict[str, Any] = Field(default_factory=dict, description="vLLM names, underscores")
    pid: int | None = None
    log: str | None = Field(None, description="the server's log file")
    startup_s: float | None = None


class TargetInfo(_Open):
    """The server under test; never an API key."""

    base_url: str
    model: str | None = None
    api: str = "completions"
    launch: Launch | None = None
    max_model_len: int | None = Field(None, description="as /v1/models reported it")
    tls: dict[str, Any] | None = Field(None, description="https: how its certificate was "
                                       "checked, {verify, ca_bundle} (verify false: --insecure)")


class EndpointInfo(_Open):
    """What one scraped endpoint exposed."""

    families: list[str] = Field(default_factory=list)
    names_found: dict[str, str] = Field(default_factory=dict, description="role -> metric family")
    vllm_engine: str | None = Field(None, description="v0 | v1 | unknown")
    cache_config_info: dict[str, Any] = Field(default_factory=dict)


class MetricsInfo(_Open):
    """Where the server metrics came from (the collector, or the replay's own engine)."""

    source: str | None = Field(None, description="direct (scraped) | prometheus | sim")
    interval_s: float | None = None
    timeout_s: float | None = None
    api_key_env: str | None = None
    endpoints: dict[str, EndpointInfo] = Field(default_factory=dict)
    names_found: dict[str, str] = Field(default_factory=dict,
                                        description="the first endpoint's roles")
    vllm_engine: str | None = None
    cache_config_info: dict[str, Any] = Field(default_factory=dict)


class WorkloadInfo(_Open):
    profile: str | None = None
    trace: str | None = None
    seed: int = 0
    fit: dict[str, Any] | None = Field(None, description="lengths fitted to max_model_len: "
                                       "max_model_len, clipped, resampled, policy")


class Owner(_Open):
    """The process writing the folder: tells an unfinished run from a live one."""

    pid: int
    hostname: str


class RunManifest(_Open):
    """One run folder (one sweep point)."""

    kind: RunKind | None = None
    point: str = ""
    status: RunStatus | None = None
    error: str | None = None
    stop_reason: str | None = Field(None, description="why the run stopped early")
    stopped_by: str | None = Field(None, description="the signal that interrupted the run: "
                                   "SIGINT (Ctrl-C) or SIGTERM")
    created: float | None = None
    finished: float | None = None
    owner: Owner | None = None
    target: TargetInfo | None = None
    server: dict[str, Any] = Field(default_factory=dict, description="scheduler/cache knobs as set "
                                   "(max_num_seqs, block_size, ...): /metrics never shows them")
    plan: dict[str, Any] | None = Field(None, description="loadlab.spec.plan.LoadPlan.describe()")
    workload: WorkloadInfo | None = None
    metrics: MetricsInfo | None = None
    steps: list[StepWindow] = Field(default_factory=list)
    client_limited_steps: list[int] = Field(default_factory=list)
    isolation: dict[str, list[int] | None] | None = Field(
        None, description="the CPUs each side was pinned to: loadlab.spec.scenario.Isolation."
        "manifest_entry() (runstore and spec are independent layers, so not that model)")
    records: dict[str, Any] | None = Field(None, description="rows written, by worker, missing")
    search: dict[str, Any] | None = Field(None, description="knee search: lower, upper, steps run")
    host: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, Any] = Field(default_factory=dict)


PointStatus = Literal["complete", "failed", "skipped", "running", "interrupted"]


class PointRecord(_Open):
    """One point of a sweep, as the sweep manifest lists it."""

    name: str
    dir: str | None = Field(None, description="the point's run folder, relative to the sweep "
                            "folder (None: the point never got one)")
    status: PointStatus = "running"
    error: str | None = None
    flags: dict[str, Any] = Field(default_factory=dict,
                                  description="the server flags of this point")

    def folder(self, sweep_dir: Path) -> Path:
        """The point's run folder; a point that never got one is named by its own name."""
        return sweep_dir / (self.dir or self.name)
    what_if: bool = Field(False, description="run on the simulator in virtual time (--what-if)")


class SweepInfo(_Open):
    mode: Literal["ab", "matrix", "single"]
    baseline: str | None = None


class SweepManifest(_Open):
    """A sweep folder: the scenario as resolved and one record per point."""

    kind: Literal["sweep"] = "sweep"
    status: RunStatus = "running"
    error: str | None = None
    created: float | None = None
    finished: float | None = None
    scenario: dict[str, Any] = Field(default_factory=dict)
    sweep: SweepInfo
    points: list[PointRecord] = Field(default_factory=list)
    report: str | None = Field(None, description="the report, relative to the sweep folder")


Manifest = RunManifest | SweepManifest


def _model(data: dict[str, Any]) -> type[RunManifest | SweepManifest]:
    return SweepManifest if data.get("kind") == SWEEP_KIND else RunManifest


def check_manifest(data: dict[str, Any], source: Path | str = MANIFEST) -> Manifest:
    """The typed model of manifest data; InputError naming ``source`` and the field that
    does not fit."""
    return validated(_model(data), data, source, _FIX)


def _dump(model: BaseModel) -> dict[str, Any]:
    """The fields that were set, and the kind (it picks the model back when read)."""
    data = model.model_dump(mode="json", exclude_unset=True)
    kind = getattr(model, "kind", None)
    return {"kind": kind, **data} if kind is not None else data


def write_manifest(run_dir: str | Path, data: dict[str, Any] | BaseModel) -> Path:
    """Replace the manifest atomically, after checking it against its model."""
    if isinstance(data, BaseModel):
        data = _dump(data)
    _model(data).model_validate(data)
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    return replace_text(Path(run_dir) / MANIFEST, text)


def _read(run_dir: str | Path) -> tuple[dict[str, Any], Manifest] | None:
    path = Path(run_dir) / MANIFEST
    if not path.exists():
        return None
    data = read_object(path, _FIX)
    return data, check_manifest(data, path)


def read_manifest(run_dir: str | Path) -> dict[str, Any]:
    """The manifest as a JSON object ({} when there is none), checked against its model."""
    found = _read(run_dir)
    return found[0] if found else {}


def load_manifest(run_dir: str | Path) -> Manifest:
    """The typed manifest; InputError (exit 2) naming the file when it is missing or broken."""
    found = _read(run_dir)
    if found is None:
        raise InputError(f"no {MANIFEST} here", source=Path(run_dir),
                         fix="point at a run or sweep folder written by loadlab")
    return found[1]


def update_manifest(run_dir: str | Path, **patch: Any) -> dict[str, Any]:
    """Merge top-level keys into the manifest (dicts merged one level deep)."""
    with _lock:
        data = read_manifest(run_dir)
        for key, value in patch.items():
            if isinstance(value, BaseModel):
                value = _dump(value)
            elif isinstance(value, list):
                value = [_dump(v) if isinstance(v, BaseModel) else v for v in value]
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        write_manifest(run_dir, data)
        return data
