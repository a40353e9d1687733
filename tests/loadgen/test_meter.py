"""ClientMeter: exact in-flight integral, sends, lags, cuts; where the window edges fall."""

from __future__ import annotations

import pytest

from loadlab.loadgen.meter import ClientMeter, window_edges
from loadlab.loadgen.shapes import concurrency_steps, rate_steps


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_integral_sends_lags_and_cuts() -> None:
    clock, cpu = Clock(), Clock(5.0)
    meter = ClientMeter("w", clock=clock, cpu=cpu)
    meter.begin()                      # 1 in flight from 100.0
    clock.t = 100.5
    meter.begin(t_scheduled=100.4)     # 2 from 100.5, begun 0.1 s late
    clock.t = 101.0
    meter.end()                        # 1 from 101.0
    meter.tick(0.002)
    meter.tick(0.010)
    clock.t, cpu.t = 102.0, 5.5
    first = meter.cut()
    assert first["inflight_s"] == pytest.approx(0.5 * 1 + 0.5 * 2 + 1.0 * 1)
    assert first["interval_s"] == pytest.approx(2.0) and first["in_flight"] == 1
    assert first["sent"] == 2 and first["send_lags_s"] == [pytest.approx(0.1)]
    assert first["loop_lag_mean_s"] == pytest.approx(0.006) and first[
        "loop_lag_max_s"
    ] == pytest.approx(0.010)
    assert first["loop_lag_ticks"] == 2
    assert first["cpu_s"] == pytest.approx(0.5) and first["cpu_frac"] == pytest.approx(0.25)
    # the next sample starts afresh, with the request still in flight
    clock.t = 102.5
    with meter.backoff():
        meter.end()
        clock.t = 103.0
    second = meter.cut()
    assert second["inflight_s"] == pytest.approx(0.5) and second["backoff_s"] == pytest.approx(0.5)
    assert second["sent"] == 0 and second["send_lags_s"] == [] and second["loop_lag_ticks"] == 0
    assert meter.in_flight == 0 and meter.backing_off == 0 and meter.issued == 2
    assert meter.cut() is None  # no time passed since the last cut


def test_window_edges_closed_and_open_loop() -> None:
    closed = concurrency_steps([1, 2], 10.0, 2.0)
    assert window_edges(closed, closed.steps[1], 50.0) == [52.0, 60.0]
    rate = rate_steps([5.0, 10.0], 10.0, 3.0)
    assert window_edges(rate, rate.steps[0], 50.0) == [53.0, 60.0, 63.0, 70.0]
