"""Which level to run next: a fixed list, or an adaptive knee search fed step verdicts.

A level source is a generator (as GuideLLM's sweep profiles are): ``next()``
gives the first :class:`Probe`, ``send(verdict)`` the next one after a step at the
previous level ran, where ``verdict`` is True when that step stalled (the analyzer's
per-step judgement) and None when the source does not need one; StopIteration ends the
run and carries a :class:`SearchResult`. The live driver
(:mod:`loadlab.loadgen.driver`) and the virtual-time replay (:mod:`loadlab.replay.driver`)
both walk a plan with one :class:`LevelWalk`: its :meth:`LevelWalk.steps` yields each
step (:meth:`loadlab.spec.plan.LoadPlan.step` of the next probe) and, when the consumer asks
for the following one, first asks ``judge(k)`` whether step ``k`` stalled (a search only;
the consumer puts step ``k``'s records on disk before it asks); the manifest records the
result under ``search`` (:meth:`LevelWalk.manifest_entry`).

Adaptive search over the grid ``g_0 < g_1 < ... < g_{n-1}`` of
:meth:`loadlab.spec.plan.KneeSearch.grid` (the levels a full linear scan would run):

1. Coarse pass: ``g_0``, then the grid level nearest ``start * factor**k`` for
   k = 1, 2, ... (each strictly above the last), and always ``g_{n-1}``; stop at the
   first step that stalls.
2. No step stalled: no knee up to ``g_{n-1}`` (lower = ``g_{n-1}``, upper None).
   ``g_0`` stalled: stalled from the first level (lower None, upper = ``g_0``).
3. Otherwise the knee lies in (last good, first stalled]: bisect the grid indices
   strictly inside that bracket, moving the upper end down on a stall and the lower end
   up otherwise, until the two are neighbours on the grid.
4. Settling: a step right after a stalled one inherits its queue (vLLM observes a
   request's queue time when it finishes, so requests that queued at the higher level
   are counted seconds into the next step). Such a step is lengthened by ``settle_s``
   and that much more of it is cut (default: the plan's warm-up again), so the verdict
   on it is its own.

With a verdict that is monotone in the level this finds the linear scan's bracket
exactly, in about ``log_factor(n) + log2(n / factor)`` steps instead of ``n``
(32 levels: 8-10 steps). Defaults: ``factor`` 2, ``settle_s`` the warm-up.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from loadlab.errors import InputError
from loadlab.spec.plan import KneeSearch, LoadPlan, Step

LevelSource = Generator["Probe", "bool | None", "SearchResult"]


@dataclass(frozen=True)
class Probe:
    """The next step's level, and the extra seconds it needs to settle first."""

    level: float
    settle_s: float = 0.0


@dataclass
class SearchResult:
    """The bracket (lower = last good level, upper = first stalled) and every step run."""

    lower: float | None = None
    upper: float | None = None
    steps: list[tuple[float, bool | None]] = field(default_factory=list)


def fixed_levels(levels: Sequence[float]) -> LevelSource:
    """Every level in order; verdicts are recorded, never acted on."""
    result = SearchResult()
    for level in levels:
        result.steps.append((level, (yield Probe(level))))
    return result


def coarse_indices(grid: Sequence[float], factor: float) -> list[int]:
    """Grid indices of the coarse pass: 0, nearest to start*factor**k, ..., last."""
    indices = [0]
    target = grid[0]
    while indices[-1] < len(grid) - 1:
        target *= factor
        i = bisect.bisect_left(grid, target)
        if i > 0 and (i == len(grid) or target - grid[i - 1] <= grid[i] - target):
            i -= 1  # the nearer neighbour
        indices.append(min(max(i, indices[-1] + 1), len(grid) - 1))
    return indices


def adaptive_levels(search: KneeSearch, settle_s: float) -> LevelSource:
    """The adaptive knee search of the module docstring."""
    grid = search.grid()
    result = SearchResult()

    def run(index: int) -> Generator[Probe, bool | None, bool]:
        after_stall = bool(result.steps) and bool(result.steps[-1][1])
        stalled = bool((yield Probe(grid[index], settle_s if after_stall else 0.0)))
        result.steps.append((grid[index], stalled))
        return stalled

    good: int | None = None
    bad: int | None = None
    for index in coarse_indices(grid, search.factor):
        if (yield from run(index)):
            bad = index
            break
        good = index
    if bad is None:
        result.lower = grid[-1]
        return result
    if good is None:
        result.upper = grid[0]
        return result
    while bad - good > 1:
        mid = (good + bad) // 2
        if (yield from run(mid)):
            bad = mid
        else:
            good = mid
    result.lower, result.upper = grid[good], grid[bad]
    return result


def level_source(plan: LoadPlan) -> LevelSource:
    """The plan's levels: its search, or its fixed concurrency/rate list."""
    if plan.search is not None:
        settle = plan.search.settle_s if plan.search.settle_s is not None else plan.warmup_s
        return adaptive_levels(plan.search, settle)
    return fixed_levels([float(v) for v in (plan.concurrency or plan.rate or [])])


class LevelWalk:
    """One walk through a plan's levels: the steps to run, each chosen after the verdict
    on the last (see the module docstring).

    ``judge(k)`` (a search needs one; fixed levels never ask it) says whether step ``k``
    stalled. After :meth:`steps` is exhausted, ``result`` is the source's
    :class:`SearchResult`; a walk cut short (Ctrl-C, a dead server) leaves it None.
    """

    def __init__(self, plan: LoadPlan, judge: Callable[[int], bool] | None = None) -> None:
        if plan.search is not None and judge is None:
            raise InputError("a knee search needs a verdict per step", field="plan.search",
                             fix="run it through `loadlab sweep`, or give the levels as a list")
        self.plan = plan
        self.judge = judge if plan.search is not None else None
        self.result: SearchResult | None = None

    @property
    def judging(self) -> bool:
        """True when each step is judged before the next is chosen (a search)."""
        return self.judge is not None

    def steps(self) -> Iterator[Step]:
        """Every step in order; asking for step k + 1 first judges step k (a search)."""
        source = level_source(self.plan)
        probe, index = next(source), 0
        while True:
            yield self.plan.step(index, probe.level, probe.settle_s)
            verdict = self.judge(index) if self.judge is not None else None
            try:
                probe = source.send(verdict)
            except StopIteration as stop:
                self.result = stop.value
                return
            index += 1

    def manifest_entry(self) -> dict[str, Any]:
        """The manifest's ``search`` key (lower, upper, steps run as [level, stalled]) once
        a search has finished; nothing for fixed levels or a search cut short."""
        if self.plan.search is None or self.result is None:
            return {}
        return {"search": asdict(self.result)}
