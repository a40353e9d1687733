"""Level sources: the adaptive knee search finds the linear scan's bracket in fewer steps."""

from __future__ import annotations

import pytest

from loadlab.config import KneeSearch, LoadPlan
from loadlab.loadgen.knee_search import SearchResult, coarse_indices, level_source


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


def linear_bracket(grid: list[float], stalls_from: float | None) -> tuple[float | None, float | None]:
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
