"""Level sources: the adaptive knee search finds the linear scan's bracket in fewer steps."""

from __future__ import annotations

import pytest

from loadlab.errors import InputError
from loadlab.spec.knee_search import LevelWalk, SearchResult, coarse_indices, level_source
from loadlab.spec.plan import KneeSearch, LoadPlan


def drive(plan: LoadPlan, stalls_from: float | None) -> SearchResult:
    """Walk a plan's levels with a verdict that is True from ``stalls_from`` up."""
    source = level_source(plan)
    probe, stalled = next(source), False
    while True:
        assert probe.settle_s == (plan.warmup_s if stalled and plan.search else 0.0)
        stalled = stalls_from is not None and probe.level >= stalls_from
        try:
            probe = source.send(stalled)
        except StopIteration as stop:
            return stop.value


def linear_bracket(
    grid: list[float], stalls_from: float | None
) -> tuple[float | None, float | None]:
    first = next((g for g in grid if stalls_from is not None and g >= stalls_from), None)
    if first is None:
        return grid[-1], None
    i = grid.index(first)
    return (grid[i - 1] if i else None), first


def test_coarse_pass_doubles_on_the_grid():
    grid = KneeSearch(start=4, max=128, resolution=4).grid()
    assert [grid[i] for i in coarse_indices(grid, 2.0)] == [4, 8, 16, 32, 64, 128]
    short = KneeSearch(start=1, max=5, resolution=1).grid()
    assert [short[i] for i in coarse_indices(short, 3.0)] == [1, 3, 5]


@pytest.mark.parametrize(("start", "top", "resolution", "factor"), [
    (4, 128, 4, 2.0), (1, 64, 1, 2.0), (8, 512, 8, 2.0), (2, 30, 2, 3.0), (5, 5, 1, 2.0),
])
def test_same_bracket_as_the_linear_scan_for_every_knee(start, top, resolution, factor):
    search = KneeSearch(start=start, max=top, resolution=resolution, factor=factor)
    plan = LoadPlan(search=search)
    grid = search.grid()
    for stalls_from in [*grid, None]:
        result = drive(plan, stalls_from)
        assert (result.lower, result.upper) == linear_bracket(grid, stalls_from)
        levels = [level for level, _ in result.steps]
        assert len(set(levels)) == len(levels), "no level runs twice"
        assert all(stalled == (stalls_from is not None and level >= stalls_from)
                   for level, stalled in result.steps)


def test_a_fraction_of_the_steps_of_a_scan():
    search = KneeSearch(start=4, max=128, resolution=4)
    grid = search.grid()
    worst = max(len(drive(LoadPlan(search=search), k).steps) for k in [*grid, None])
    assert len(grid) == 32 and worst <= 0.4 * len(grid)


def test_fixed_levels_run_in_order_whatever_the_verdict():
    result = drive(LoadPlan(concurrency=[1, 4, 2]), stalls_from=2)
    assert result.steps == [(1.0, False), (4.0, True), (2.0, True)]
    assert (result.lower, result.upper) == (None, None)


def test_a_walk_judges_each_search_step_before_choosing_the_next():
    search = KneeSearch(start=2, max=16, resolution=2)
    asked: list[int] = []
    levels: list[float] = []
    walk = LevelWalk(LoadPlan(search=search, step_duration_s=4, warmup_s=1),
                     lambda k: asked.append(k) or levels[k] >= 8)   # stalls from 8 users up
    for step in walk.steps():
        assert step.index == len(levels) == len(asked), "step k+1 only after step k was judged"
        levels.append(step.concurrency)
    assert levels == [2, 4, 8, 6] and asked == [0, 1, 2, 3]
    assert walk.manifest_entry() == {"search": {"lower": 6, "upper": 8, "steps": [
        (2, False), (4, False), (8, True), (6, False)]}}
    fixed = LevelWalk(LoadPlan(concurrency=[1, 4, 2]))
    assert tuple(fixed.steps()) == fixed.plan.steps and fixed.manifest_entry() == {}
    with pytest.raises(InputError, match="verdict per step"):
        LevelWalk(LoadPlan(search=search))
