"""The load a window achieved, from CLIENT samples, and the client-limited verdict (pure)."""

from __future__ import annotations

import pytest

from loadlab.loadgen.achieved import (
    INFLIGHT_MIN_RATIO,
    LOOP_LAG_MEAN_MAX_S,
    RATE_MIN_DUE,
    SEND_LAG_P99_MAX_S,
    Achieved,
    due_in,
    format_summary,
    limited_message,
    limited_reasons,
    step_fields,
    summarise,
)


def sample(
    worker: str,
    t: float,
    interval: float,
    inflight: float,
    *,
    sent: int = 0,
    lag_mean: float = 0.001,
    lag_max: float = 0.002,
    ticks: int = 20,
    cpu: float = 0.1,
    lags: list[float] | None = None,
    backoff: float = 0.0,
) -> dict:
    """A CLIENT row whose integral is ``inflight`` requests held over the whole interval."""
    return {"t": t, "worker": worker, "interval_s": interval, "cpu_s": cpu * interval,
            "loop_lag_mean_s": lag_mean, "loop_lag_max_s": lag_max, "loop_lag_ticks": ticks,
            "inflight_s": inflight * interval, "backoff_s": backoff * interval, "sent": sent,
            "send_lags_s": lags or []}


def test_workers_add_up_and_edges_count_by_overlap() -> None:
    samples = [
        # worker a: 2 in flight before the window, 4 inside it (cut at 10.0 and 12.0)
        sample("a", 10.0, 1.0, 2, sent=1),
        sample("a", 11.0, 1.0, 4, sent=3),
        sample("a", 12.0, 1.0, 4, sent=5),
        sample(
            "b", 11.0, 2.0, 3, sent=8, lag_mean=0.004, ticks=40, lag_max=0.03
        ),  # 9..11: half inside
        sample("b", 12.0, 1.0, 3, sent=2, lag_mean=0.002, ticks=20),
        sample("a", 13.0, 1.0, 9, sent=50),  # after the window
    ]
    a = summarise(samples, 10.0, 12.0, concurrency=8)
    assert a.inflight_mean == pytest.approx(4 + 3)
    assert a.achieved_ratio == pytest.approx(7 / 8)
    # a: 8 sends over 2 s; b: half of its first sample's 8 plus 2, over its covered 2 s
    assert a.achieved_rate == pytest.approx(8 / 2 + (4 + 2) / 2)
    # the worst worker's tick-weighted mean; b's straddling sample counts half its ticks
    assert a.loop_lag_mean_s == pytest.approx((0.004 * 20 + 0.002 * 20) / 40)
    assert a.loop_lag_max_s == pytest.approx(0.03)  # b's first sample is half inside: f >= 0.5
    assert a.client_cpu_cores == pytest.approx(0.2) and a.client_cpu_max_worker == pytest.approx(
        0.1
    )
    assert a.send_lag_p99_s is None and a.scheduled_rate is None


def test_mean_is_over_the_covered_part_when_a_worker_is_late() -> None:
    samples = [sample("a", 11.0, 1.0, 5)]  # the window runs to 12, a's next sample has not come
    assert summarise(samples, 10.0, 12.0, concurrency=5).inflight_mean == pytest.approx(5)


def test_open_loop_ratio_against_the_schedule_and_send_lags() -> None:
    lags = [0.001] * 98 + [0.2, 0.3]
    samples = [
        sample("a", 10.0 + i, 1.0, 2, sent=20, lags=lags[20 * (i - 1) : 20 * i])
        for i in range(1, 6)
    ]
    a = summarise(samples, 10.0, 15.0, due=125)
    assert a.achieved_rate == pytest.approx(20) and a.scheduled_rate == pytest.approx(25)
    assert a.scheduled_count == 125 and a.achieved_ratio == pytest.approx(0.8)
    assert a.send_lag_p50_s == pytest.approx(0.001) and a.send_lag_max_s == pytest.approx(0.3)
    assert 0.1 < a.send_lag_p99_s < 0.3
    reasons = limited_reasons(a)
    assert len(reasons) == 2, reasons
    assert "sent 20.00 req/s of 25.00 scheduled (80.0% < 90%)" in reasons[0]
    assert reasons[1].startswith("send lag p99") and "> 100 ms" in reasons[1]


def test_no_samples_gives_no_figures_and_no_verdict() -> None:
    a = summarise([sample("a", 5.0, 1.0, 3)], 10.0, 12.0, concurrency=4)
    assert a == Achieved()
    assert limited_reasons(a, 4) == []


def test_closed_loop_verdict_at_the_threshold_and_error_backoff() -> None:
    users = 10
    below = Achieved(inflight_mean=INFLIGHT_MIN_RATIO * users - 0.01, loop_lag_mean_s=0.001)
    at = Achieved(inflight_mean=INFLIGHT_MIN_RATIO * users, loop_lag_mean_s=0.001)
    assert limited_reasons(below, users) == ["in flight 8.99 of 10 users (89.9% < 90%)"]
    assert limited_reasons(at, users) == []
    # users pausing after refused connections are not held back by the client
    refused = Achieved(inflight_mean=0.5, backoff_mean=9.5, loop_lag_mean_s=0.001)
    assert limited_reasons(refused, users) == []
    starved = Achieved(inflight_mean=2.0, backoff_mean=1.0, loop_lag_mean_s=0.7)
    reasons = limited_reasons(starved, users)
    assert reasons[0] == "in flight 2.00 (+1.00 in error backoff) of 10 users (30.0% < 90%)"
    assert reasons[1] == f"event-loop lag mean 700.0 ms > {LOOP_LAG_MEAN_MAX_S * 1e3:.0f} ms"


def test_rate_shortfall_needs_enough_arrivals_to_judge() -> None:
    few = Achieved(
        achieved_rate=6.0, scheduled_rate=7.5, scheduled_count=RATE_MIN_DUE - 1, achieved_ratio=0.8
    )
    many = Achieved(
        achieved_rate=6.0, scheduled_rate=7.5, scheduled_count=RATE_MIN_DUE, achieved_ratio=0.8
    )
    assert limited_reasons(few) == []
    assert len(limited_reasons(many)) == 1
    late = Achieved(send_lag_p99_s=SEND_LAG_P99_MAX_S + 0.001)
    assert (
        len(limited_reasons(late)) == 1
        and limited_reasons(Achieved(send_lag_p99_s=SEND_LAG_P99_MAX_S)) == []
    )


def test_due_in_counts_half_open_windows() -> None:
    offsets = [0.0, 0.5, 1.0, 1.0, 2.5]
    assert due_in(offsets, 0.0, 1.0) == 2
    assert due_in(offsets, 1.0, 2.5) == 2
    assert due_in(offsets, 3.0, 4.0) == 0


def test_step_fields_message_and_summary() -> None:
    ok = {
        "step": 0,
        "concurrency": 4,
        **step_fields(Achieved(inflight_mean=3.9, achieved_ratio=0.975, loop_lag_mean_s=0.0005), 4),
    }
    bad = {
        "step": 1,
        "concurrency": 8,
        **step_fields(Achieved(inflight_mean=2.1, achieved_ratio=0.2625, loop_lag_mean_s=0.67), 8),
    }
    rate = {
        "step": 2,
        "concurrency": None,
        "target_rate": 5.0,
        **step_fields(Achieved(achieved_ratio=1.0, send_lag_p99_s=0.004, loop_lag_mean_s=0.001)),
    }
    assert ok["client_limited"] is False and ok["client_limited_reasons"] == []
    assert bad["client_limited"] is True and len(bad["client_limited_reasons"]) == 2
    assert ok["inflight_mean"] == 3.9 and ok["send_lag_p99_s"] is None
    message = limited_message([ok, bad, rate])
    assert message.startswith(
        "the client did not apply the load asked for at step 1 (8 users): in flight 2.10"
    )
    assert "step 0" not in message and "step 2" not in message and "--client-cpus" in message
    assert limited_message([ok, rate]) is None
    table = format_summary([ok, bad, rate]).splitlines()
    assert table[2].split() == ["0", "4", "users", "3.9", "98%", "-", "0.5", "ms", "ok"]
    assert table[3].split()[-1] == "LIMITED" and "670.0" in table[3]
    assert table[4].split()[:3] == ["2", "5", "req/s"] and "4.0 ms" in table[4]
