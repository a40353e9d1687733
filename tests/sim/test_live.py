"""The live driver without HTTP: output lengths, emission rule, pace, a dying loop."""

from __future__ import annotations

import asyncio

import pytest

from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.hardware import resolve
from loadlab.sim.serve.live import LiveDriver, RequestStream


def driver(**overrides) -> LiveDriver:
    cfg = SimConfig(**{"max_model_len": 1024, "num_gpu_blocks_override": 256,
                       "time_scale": 50.0, **overrides})
    return LiveDriver(cfg, resolve(cfg))


def test_output_length_rules():
    d = driver(output_len_mean=50, output_len_sigma=0.8, seed=3)
    assert d.output_len(prompt_len=10, max_tokens=300, min_tokens=0, ignore_eos=True) == 300
    draws = [d.output_len(10, 300, 0, False) for _ in range(400)]
    assert min(draws) >= 1 and max(draws) <= 300
    assert 35 < sum(draws) / len(draws) < 70            # log-normal with mean 50
    assert min(d.output_len(10, 300, 120, False) for _ in range(50)) >= 120
    assert d.output_len(prompt_len=1000, max_tokens=300, min_tokens=0, ignore_eos=True) == 24
    again = driver(output_len_mean=50, output_len_sigma=0.8, seed=3)
    assert [again.output_len(10, 300, 0, False) for _ in range(400)] == draws


def test_emission_rule_follows_stream_interval():
    s = RequestStream("r", 5, 10, 10, seed=0, streaming=True, interval=3)
    assert not s.ready()
    s.generated = 1
    assert s.ready() and s.take() == (0, 1, None)        # first token at once
    s.generated = 3
    assert not s.ready()                                  # 2 pending < interval 3
    s.generated = 4
    assert s.ready() and s.take() == (1, 3, None)
    s.generated, s.finish_reason = 5, "stop"
    assert s.ready() and s.take() == (4, 1, "stop")       # the rest at the finish
    quiet = RequestStream("q", 5, 10, 10, seed=0, streaming=False, interval=1)
    quiet.generated = 9
    assert not quiet.ready()                              # non-streaming: only the end


def test_requests_finish_with_exact_counts_and_modelled_pace():
    async def run():
        d = driver(max_num_seqs=4)
        d.start()
        streams = [d.submit(f"r{i}", list(range(100 + i * 7, 150 + i * 7)), 20,
                            ignore_eos=True, streaming=False) for i in range(6)]
        results = await asyncio.wait_for(asyncio.gather(*(s.next() for s in streams)), 30)
        await d.stop()
        return d, results

    d, results = asyncio.run(run())
    assert results == [(0, 20, "length")] * 6
    assert d.num_streams == 0
    p = d.periods
    # Published times telescope: measured - modelled = last lag - first lag >= -max lag.
    assert p.steps > 20 and p.modelled_s > 0
    assert p.measured_s >= p.modelled_s - p.max_lag_s - 1e-6


def test_a_crashing_engine_loop_is_reported_dead(capsys):
    async def run():
        cfg = SimConfig(max_model_len=1024, num_gpu_blocks_override=128)

        def broken(batch):
            raise RuntimeError("step model exploded")

        d = LiveDriver(cfg, resolve(cfg), step_time=broken)
        d.start()
        assert d.alive
        d.submit("r", [1, 2, 3], 4)
        deadline = asyncio.get_running_loop().time() + 5
        while d.alive:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        return d

    d = asyncio.run(run())
    assert not d.alive
    assert "step model exploded" in capsys.readouterr().err


@pytest.mark.parametrize("aborted_mid_step", [True, False])
def test_abort_frees_the_request(aborted_mid_step):
    async def run():
        d = driver(time_scale=1.0)
        d.start()
        s = d.submit("r", list(range(40)), 500, ignore_eos=True)
        await s.next()                                    # first token out
        if aborted_mid_step:
            while d._step_end is None:
                await asyncio.sleep(0)
        d.abort(s)
        deadline = asyncio.get_running_loop().time() + 5
        while d.engine.has_unfinished_requests():
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.005)
        await d.stop()
        return s, d

    s, d = asyncio.run(run())
    assert s.finish_reason == "abort" and d.num_streams == 0
