"""A recorded run's requests sent again in virtual time (``loadlab sim replay --trace RUN``).

The run's steps are replayed as they ran (their levels and lengths); the requests are the
run's own (:mod:`loadlab.workload.recorded`), in one of two loops:

- open loop: each request is sent at its recorded offset from its step's start, whatever
  the simulated server does, as an open-loop load generator would;
- closed loop: each recorded user re-sends its own requests of the step, in order, the
  next the moment the previous ends (no think time), as the live users did. A user that
  runs out before the step ends (the simulated server is faster than the real one) starts
  its step's sequence over, so the step keeps its users busy; one with requests left at
  the step's end drops them, as its live counterpart never sent them. A user the next
  step does not list stops once its request ends.

Replaying a run with the flags it ran under then reproduces its sends; a what-if with
other flags answers for the same requests, not a resample of the profile.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from loadlab.errors import InputError
from loadlab.replay.driver import (
    _ARRIVAL,
    Progress,
    ReplayOptions,
    ReplaySummary,
    _Replay,
    run_replay,
)
from loadlab.runstore import update_manifest
from loadlab.sim.engine.config import SimConfig
from loadlab.sim.fleet.config import FleetConfig
from loadlab.spec.plan import Step
from loadlab.spec.scenario import Workload
from loadlab.workload import load_profile
from loadlab.workload.recorded import Loop, RecordedRequest, RecordedWorkload
from loadlab.workload.sampler import RequestSpec

__all__ = ["check_loop", "run_trace"]


class _Turns:
    """One user's requests of a step, in order, starting over when they run out."""

    def __init__(self, requests: list[RecordedRequest]) -> None:
        self.requests = requests
        self.n = 0

    def next(self) -> RecordedRequest:
        req = self.requests[self.n % len(self.requests)]
        self.n += 1
        return req


class TraceReplay(_Replay):
    """The replay loop with the recorded run's steps and requests in place of the plan's
    levels and the profile's sampler."""

    def __init__(self, recorded: RecordedWorkload, loop: Loop, *args: Any) -> None:
        self.recorded = recorded
        self.turns: dict[int, _Turns] = {}
        super().__init__(*args)
        steps = [Step(s.index, s.duration_s, s.warmup_s,
                      **({"concurrency": s.concurrency or 0} if loop == "closed"
                         else {"target_rate": recorded.rate(s)}))
                 for s in recorded.steps]
        self.steps = iter(steps)
        self.total_s = sum(s.duration_s for s in steps)

    def load_requests(self, workload: Workload) -> int:
        """The recorded profile's common prefix length, so prefix groups share what they
        shared in the run; 0 when the profile is not on this machine (each group then
        shares only its own prefix)."""
        try:
            return load_profile(workload.profile).common_prefix_tokens
        except InputError:
            return 0

    def start_step(self, k: int, duration_s: float) -> None:
        if not self.closed:
            for req in self.recorded.in_step(k):
                self.push(self.now + req.offset_s, _ARRIVAL, self.on_recorded_arrival, req)
            return
        self.turns = {user: _Turns(reqs) for user, reqs in self.recorded.by_user(k).items()}
        for user in self.turns:
            if user not in self.busy_users:
                self.user_free(user)

    def user_free(self, user: int) -> None:
        turns = self.turns.get(user)
        if turns is not None:
            self.send(user, self.spec(turns.next()))

    def on_recorded_arrival(self, req: RecordedRequest) -> None:
        self.send(None, self.spec(req))

    def spec(self, req: RecordedRequest) -> RequestSpec:
        return RequestSpec(self.seq, req.prompt_tokens, req.output_tokens, req.prefix_group,
                           req.prefix_tokens, None)


def check_loop(recorded: RecordedWorkload, loop: Loop | None, field: str) -> Loop:
    """The loop to replay ``recorded`` in (None: as it was recorded); InputError naming
    ``field`` for a closed loop of an open-loop run (its users, if any, were not a closed
    loop's) or of requests without users."""
    loop = loop or recorded.loop
    if loop == "closed" and (recorded.loop == "open"
                             or not any(r.user is not None for r in recorded.requests)):
        raise InputError(f"the requests of {recorded.source} have no users to replay in "
                         "closed loop", field=field, fix="replay it in open loop")
    return loop


def run_trace(cfg: SimConfig | FleetConfig, recorded: RecordedWorkload, out_dir: str | Path,
              loop: Loop | None = None, opts: ReplayOptions | None = None,
              progress: Progress | None = None, notice: Callable[[str], None] | None = None,
              loop_field: str = "--loop") -> ReplaySummary:
    """Replay ``recorded`` through the simulator of ``cfg`` into the run folder ``out_dir``,
    in ``loop`` (default: the loop the run was recorded in); the manifest's ``sim.trace``
    names the source. InputError (naming ``loop_field``) for a closed loop of a run whose
    requests have no users."""
    loop = check_loop(recorded, loop, loop_field)
    workload = Workload(profile=recorded.profile or "sharegpt", seed=recorded.seed)
    summary = run_replay(cfg, recorded.plan(loop), workload, out_dir, opts, progress,
                         notice=notice, replay_cls=partial(TraceReplay, recorded, loop))
    update_manifest(out_dir, sim={"trace": {"source": str(recorded.source), "loop": loop,
                                            "requests": len(recorded.requests)}})
    return summary
