"""Engine: clock handling, per-request timestamps, batch shapes, observer, abort."""

from __future__ import annotations

from sched_fixtures import Cfg, make_engine, req, run_until_idle

from loadlab.sim.engine.core import Engine
from loadlab.sim.engine.types import BatchShape


def test_idle_engine_returns_none_and_reports_no_work() -> None:
    e, outs = make_engine()
    assert e.step(5.0) is None and outs == []
    assert not e.has_unfinished_requests()


def test_timestamps_follow_the_callers_clock_and_step_durations() -> None:
    shapes: list[BatchShape] = []

    def step_time(b: BatchShape) -> float:
        shapes.append(b)
        return 0.5 if b.num_prefill_tokens else 0.1

    seen = []
    e = Engine(Cfg(max_num_seqs=1), step_time, seen.append)
    e.add_request(req("a", 20, out=3, t=1.0))
    e.add_request(req("b", 20, out=2, t=1.5))
    now = 2.0
    while (out := e.step(now)) is not None:
        assert out.t_start == now and out.t_end > now
        now = out.t_end + 0.25  # the caller may leave gaps between steps
    fin = {f.request_id: f for o in seen for f in o.finished}
    a, b = fin["a"], fin["b"]
    assert (a.arrival_time, a.first_scheduled_time) == (1.0, 2.0)
    assert a.first_token_time == 2.5 and a.finished_time == 2.5 + 0.25 + 0.1 + 0.25 + 0.1
    assert b.first_scheduled_time == a.finished_time + 0.25  # seq cap 1: b waits for a
    assert b.first_token_time == b.first_scheduled_time + 0.5
    assert (a.output_len, a.finish_reason, b.finish_reason) == (3, "length", "length")
    assert len(seen) == len(shapes) == 5  # observer and timing model see every step
    assert shapes[0] == BatchShape(20, 0, 1, 1, 20)
    assert shapes[1] == BatchShape(0, 1, 1, 0, 21)


def test_stop_versus_length_finish_reason() -> None:
    e, outs = make_engine()
    e.add_request(req("stop", 10, out=2, max_tokens=50))
    e.add_request(req("len", 10, out=2, max_tokens=2))
    run_until_idle(e)
    reasons = {f.request_id: f.finish_reason for o in outs for f in o.finished}
    assert reasons == {"stop": "stop", "len": "length"}


def test_max_model_len_caps_generation() -> None:
    e, outs = make_engine(max_model_len=64, num_gpu_blocks=10)
    e.add_request(req("x", 60, out=20, max_tokens=20))
    run_until_idle(e)
    (fin,) = [f for o in outs for f in o.finished]
    assert fin.output_len == 4 and fin.finish_reason == "length"


def test_abort_frees_blocks_of_running_and_drops_waiting_requests() -> None:
    e, _outs = make_engine(max_num_seqs=1)
    e.add_request(req("run", 100, out=50))
    e.add_request(req("wait", 10, out=5))
    out = e.step(0.0)
    assert e.kv_usage > 0 and (e.num_running, e.num_waiting) == (1, 1)
    fin = e.abort_request("run", out.t_end)
    assert fin is not None and fin.finish_reason == "abort" and fin.output_len == 1
    assert e.kv_usage == 0.0 and e.num_running == 0
    fin2 = e.abort_request("wait", out.t_end)
    assert fin2 is not None and fin2.first_scheduled_time is None
    assert e.abort_request("wait", out.t_end) is None
    assert e.step(out.t_end) is None and not e.has_unfinished_requests()


def test_step_output_counts_are_consistent_over_a_mixed_run() -> None:
    e, outs = make_engine(max_num_seqs=4, max_num_batched_tokens=128)
    for i in range(10):
        e.add_request(req(f"r{i}", 50 + 13 * i, out=3 + i))
    run_until_idle(e)
    for o in outs:
        assert o.batch.num_prefill_tokens + o.batch.num_decode_tokens == sum(o.scheduled.values())
        assert o.batch.num_requests == len(o.scheduled)
        assert set(o.new_tokens) == set(o.scheduled)
        assert set(o.emitted) == {rid for rid, n in o.new_tokens.items() if n}
    gen = sum(sum(o.new_tokens.values()) for o in outs)
    fins = [f for o in outs for f in o.finished]
    assert gen == sum(f.output_len for f in fins) == sum(3 + i for i in range(10))
