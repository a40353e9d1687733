"""analysis.json as a typed model: the analyzer's verdict on one run folder.

The analyzer (:func:`loadlab.analyze.analysis.analyze_run`) builds an :class:`Analysis`;
the report, ``loadlab compare``, sweeps and CI jobs read it back with
:func:`read_analysis`. The model lives with the run folder, not with the analyzer, so a
reader needs no analyzer code to understand the file.

Every block keeps keys the model does not name (``extra="allow"``): the per-step rows
carry one column per figure of the analyzer's step table, and a newer analyzer may add
a figure without a change here. Numbers are ``int | float`` so an integer level stays an
integer on its way through (a knee "between 8 and 12", not "8.0 and 12.0"). ``schema``
is 1; a reader that needs a key added later checks for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from loadlab.errors import InputError
from loadlab.runstore.jsonfile import read_object, replace_text, validated
from loadlab.runstore.layout import ANALYSIS

SCHEMA = 1
Number = int | float
_FIX = "rerun `loadlab analyze RUN_DIR`: the analyzer rewrites it from the run folder"


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class RunInfo(_Open):
    """Which folder was judged, and what it was."""

    dir: str
    kind: str | None = Field(None, description="the manifest's kind")
    status: str | None = Field(None, description="the manifest's status when analysed")
    point: str | None = None
    unit: Literal["concurrency", "rate"] | None = None
    server_metrics: bool = Field(False, description="metrics.parquet had samples")


class StepRow(_Open):
    """One load step of the analyzer's table; every other figure is an extra key
    (``ttft_p50_ms``, ``running_max``, ``kv_max``, ``prefix_hit_rate``, ...)."""

    step: int
    level: Number | None = Field(None, description="users (closed loop) or requests/s (open)")
    concurrency: Number | None = None
    target_rate: Number | None = None
    state: str | None = Field(None, description="ok | stalled | client_limited | unjudged")


class LevelShare(_Open):
    level: Number
    share: Number = Field(description="refused engine steps / engine steps at this level")


class MeasuredKnee(_Open):
    """The knee from the scheduler's own refusal counters (``loadlab:`` series), not inferred."""

    found: bool
    lower: Number | None = None
    upper: Number | None = Field(None, description="the lowest level from which every higher "
                                 "level refused the head in >= material_share of its steps")
    material_share: Number | None = None
    refused_share: list[LevelShare] = Field(default_factory=list)


class MeasuredCause(_Open):
    """The cause from the scheduler's refusal reasons over the measured stalled levels."""

    name: str = Field(description="seq_cap | kv_exhausted | head_blocked | token_budget | "
                      "unknown | none")
    reason: str | None = Field(None, description="the scheduler's reason behind most refusals")
    reason_share: dict[str, Number] = Field(default_factory=dict,
                                            description="reason -> share of refused steps")
    refused_steps: int = 0
    engine_steps: int = 0
    head_blocks_needed: Number | None = None
    head_free_blocks: Number | None = None
    head_running: Number | None = None
    kv_usage: Number | None = Field(None, description="KV usage over the stalled steps "
                                   "(median of their means)")
    typical_request_blocks: Number | None = Field(
        None, description="blocks of the median request sent; kv_blocks refusals are "
        "head_blocked when the free blocks would have held it")
    typical_fits_share: Number | None = Field(
        None, description="share of kv_blocks refusals whose free blocks would have held "
        "the median request")


class KneeBlock(_Open):
    """The knee: the last level that held and the first that stalled."""

    found: bool
    unit: Literal["concurrency", "rate"] | None = None
    lower: Number | None = Field(None, description="the last level before the stall")
    upper: Number | None = Field(None, description="the first stalled level")
    confidence: str | None = None
    reasons: list[str] = Field(default_factory=list)
    detectors: dict[str, Any] = Field(default_factory=dict, description="each detector's vote")
    psi: Number | None = Field(None, description="the hinge fit's breakpoint")
    client_limited_before_knee: bool | None = None
    measured: MeasuredKnee | None = Field(None, description="from the scheduler's own refusals, "
                                          "where the server exports them")


class Evidence(_Open):
    what: str
    value: Any = None
    step: int | None = None


class Ranked(_Open):
    name: str
    score: Number


class ArbiterBlock(_Open):
    """The learned arbiter's weighing (:mod:`loadlab.analyze.arbiter`)."""

    rule: str = Field(description="the cause the signatures' best score named")
    probabilities: dict[str, Number] | None = Field(
        None, description="per server cause; None where no model ships")
    features: dict[str, Number | None] = Field(default_factory=dict,
                                               description="its inputs (null: not known)")
    outside: list[str] | None = Field(None, description="inputs beyond its fitted range: "
                                      "it stood aside and the rules decided")


class CauseBlock(_Open):
    """Why the knee is where it is, and the knob to turn."""

    name: str | None = Field(
        None, description="seq_cap | kv_exhausted | head_blocked | ... | undetermined | unknown"
    )
    evidence: list[Evidence] = Field(default_factory=list)
    knob: str | None = None
    facts: dict[str, Any] = Field(default_factory=dict)
    ranked: list[Ranked] = Field(default_factory=list)
    confidence: str | None = Field(None, description="high | medium | low (added later)")
    candidates: list[str] | None = Field(
        None, description="undetermined: the causes /metrics cannot tell apart"
    )
    separate_by: str | None = Field(None, description="undetermined: what would tell them apart")
    arbiter: ArbiterBlock | None = Field(None, description="where a sweep stalled on the "
                                         "server: the arbiter's inputs and probabilities")
    measured: MeasuredCause | None = Field(None, description="from the scheduler's own "
                                           "refusals, where the server exports them")


class SloBlock(_Open):
    targets: dict[str, Number] = Field(default_factory=dict, description="name -> limit")
    max_level_meeting: Number | None = Field(None, description="highest level meeting them all")
    goodput: str | None = None


class CapacityBlock(_Open):
    """The KV pool's arithmetic beside the measured knee (None where unknown)."""

    num_gpu_blocks: int | None = None
    block_size: int | None = None
    usable_blocks: Number | None = None
    blocks_per_request: Number | None = None
    formula_max_concurrency: Number | None = None
    practical_range: list[Number] | None = None
    vllm_kv_cache_max_concurrency: Number | None = None
    measured_knee: Any = Field(None, description="the knee's upper level")


class ReplicaStep(_Open):
    """One load step as one replica of a fleet saw it (the fleet's level, that replica's
    series); other figures are extra keys."""

    step: int
    level: Number | None = None
    state: str | None = None
    requests_done: Number | None = Field(None, description="the replica's request_success "
                                         "counter increase over the step")


class ReplicaVerdict(_Open):
    """One replica of a fleet: its knee and cause from its own series, at the fleet's load."""

    endpoint: str
    pool: str | None = None
    knee: KneeBlock
    cause: CauseBlock = Field(default_factory=CauseBlock)
    capacity: CapacityBlock = Field(default_factory=CapacityBlock)
    steps: list[ReplicaStep] = Field(default_factory=list)
    imbalance_share: Number | None = Field(None, description="this replica's share of the "
                                           "fleet's waiting stranded while another had room")


class StepImbalance(_Open):
    step: int
    imbalance: Number | None = Field(None, description="share of the queue stranded at a "
                                     "replica while another had room")
    queued: str | None = Field(None, description="the replica holding most stranded waiting")
    room: str | None = Field(None, description="the replica with room most often meanwhile")
    stranded_mean: Number | None = None


class ImbalanceBlock(_Open):
    """How much of a fleet's queue the router put where another replica had room."""

    definition: str | None = None
    imbalanced_step: Number | None = Field(None, description="a step's imbalance from which "
                                           "it counts as imbalanced")
    material_share: Number | None = Field(None, description="share of stalled steps from "
                                          "which routing_imbalance is chosen")
    stalled_share: Number | None = Field(None, description="share of the fleet's stalled "
                                         "steps that are imbalanced")
    chosen: bool = False
    steps: list[StepImbalance] = Field(default_factory=list)
    fleet_capacity: Number | None = Field(None, description="sum of the replicas' formula "
                                          "max concurrency")
    replica_capacity_sum: Number | None = Field(None, description="sum of the replicas' "
                                                "capacities at their knees (mean running at "
                                                "each one's first stalled level)")
    replica_capacity_bound: str | None = Field(None, description="at | at least (some replica "
                                               "never stalled)")


class Analysis(_Open):
    """The whole of analysis.json."""

    schema_version: int = Field(SCHEMA, alias="schema")
    run: RunInfo | None = None
    steps: list[StepRow] = Field(default_factory=list)
    knee: KneeBlock
    slo: SloBlock = Field(default_factory=SloBlock)
    cause: CauseBlock = Field(default_factory=CauseBlock)
    capacity: CapacityBlock = Field(default_factory=CapacityBlock)
    warnings: list[str] = Field(default_factory=list, description="what could not be used")
    verdict: str | None = Field(None, description="the one-line answer")
    replicas: list[ReplicaVerdict] | None = Field(None, description="a fleet's replicas, "
                                                  "each judged on its own series")
    imbalance: ImbalanceBlock | None = Field(None, description="a fleet's routing imbalance")

    def as_json(self) -> dict[str, Any]:
        """The file's content: the keys that were given (defaults not filled in)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)

    def block(self, key: str) -> dict[str, Any]:
        """One top-level block as JSON ({} when absent), for readers that walk its keys."""
        value = getattr(self, key, None)
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json", exclude_unset=True)
        return value if isinstance(value, dict) else {}


def write_analysis_file(run_dir: str | Path, analysis: Analysis) -> Path:
    """Replace ``<run_dir>/analysis.json`` atomically; return its path."""
    text = json.dumps(analysis.as_json(), indent=2, allow_nan=False) + "\n"
    return replace_text(Path(run_dir) / ANALYSIS, text)


def read_analysis(run_dir: str | Path) -> Analysis:
    """``<run_dir>/analysis.json``; InputError naming the file (and field) when it is
    missing or does not fit the model."""
    path = Path(run_dir) / ANALYSIS
    if not path.is_file():
        raise InputError(f"no {ANALYSIS} here", source=Path(run_dir), fix=_FIX)
    return validated(Analysis, read_object(path, _FIX), path, _FIX)
