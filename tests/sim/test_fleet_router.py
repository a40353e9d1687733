"""Routers on hand-made replica states (pure: no engine, no clock), and the fleet's flags."""

from __future__ import annotations

import pytest

from loadlab.errors import InputError
from loadlab.sim.engine.types import EngineRequest
from loadlab.sim.fleet.config import fleet_config
from loadlab.sim.fleet.router import (
    ByLength,
    LeastOutstanding,
    LeastWaiting,
    PrefixAffinity,
    ReplicaView,
    RoundRobin,
    make_router,
)
from loadlab.spec.scenario import Scenario
from loadlab.spec.validate import validate


def req(n: int = 10, first: int = 0) -> EngineRequest:
    return EngineRequest("r", list(range(first, first + n)), 4, 4, 0.0)


def views(*states: tuple[int, int], pools: str = "") -> list[ReplicaView]:
    """(outstanding, waiting) per replica; ``pools``: one letter per replica (l/s)."""
    names = {"l": "long", "s": "short"}
    return [ReplicaView(i, names[pools[i]] if pools else "", o, w)
            for i, (o, w) in enumerate(states)]


def test_round_robin_takes_turns_whatever_the_load() -> None:
    router = RoundRobin()
    state = views((9, 9), (0, 0), (0, 0))
    assert [router.choose(req(), state, 0.0) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_outstanding_picks_the_fewest_in_flight_and_breaks_ties_in_turn() -> None:
    assert LeastOutstanding().choose(req(), views((3, 0), (1, 5), (2, 0)), 0.0) == 1
    router = LeastOutstanding()
    tied = views((1, 0), (4, 0), (1, 0))
    assert [router.choose(req(), tied, 0.0) for _ in range(4)] == [0, 2, 0, 2]


def test_least_waiting_reads_the_queue_before_the_in_flight_count() -> None:
    router = LeastWaiting(refresh_s=0.0)
    # replica 0 has fewer in flight but a queue: least-outstanding would pick it
    state = views((2, 2), (5, 0), (6, 0))
    assert router.choose(req(), state, 0.0) == 1
    assert LeastOutstanding().choose(req(), state, 0.0) == 0


def test_least_waiting_sees_queues_only_as_fresh_as_its_refresh() -> None:
    router = LeastWaiting(refresh_s=0.05)
    state = views((0, 0), (0, 3))
    assert router.choose(req(), state, 0.0) == 0
    state[0].waiting, state[1].waiting = 4, 0          # the queues moved
    assert router.choose(req(), state, 0.04) == 0       # still the look taken at 0.0
    assert router.choose(req(), state, 0.05) == 1       # refreshed


def test_prefix_affinity_keeps_a_prefix_on_one_replica_and_spreads_prefixes() -> None:
    router = PrefixAffinity(block_size=16)
    state = views((0, 0), (0, 0), (0, 0), (0, 0))
    # same first block, different tails: same replica every time
    picks = {router.choose(EngineRequest("r", [7] * 16 + list(range(k, k + 30)), 1, 1, 0.0),
                           state, 0.0) for k in range(20)}
    assert len(picks) == 1
    spread = {router.choose(req(40, first=1000 * k), state, 0.0) for k in range(40)}
    assert len(spread) >= 3


def test_prefix_affinity_uses_precomputed_block_hashes_when_given() -> None:
    router = PrefixAffinity(block_size=16)
    state = views((0, 0), (0, 0), (0, 0))
    a = EngineRequest("a", range(5000, 5040), 1, 1, 0.0, block_hashes=[11, 12])
    b = EngineRequest("b", range(9000, 9040), 1, 1, 0.0, block_hashes=[11, 99])
    assert router.choose(a, state, 0.0) == router.choose(b, state, 0.0) == hash((11,)) % 3


def test_by_length_sends_long_prompts_to_the_long_pool_in_turn() -> None:
    router = ByLength(100)
    state = views((0, 0), (0, 0), (0, 0), (0, 0), pools="llss")
    assert [router.choose(req(101), state, 0.0) for _ in range(3)] == [0, 1, 0]
    assert [router.choose(req(100), state, 0.0) for _ in range(3)] == [2, 3, 2]


def test_unknown_router_is_an_input_error_naming_the_flag() -> None:
    with pytest.raises(InputError) as err:
        make_router("by-length:lots", 16)
    assert err.value.field == "--router" and "by-length:TOKENS" in (err.value.fix or "")


def test_fleet_config_splits_pools_and_applies_their_flags() -> None:
    fleet = fleet_config({"replicas": 3, "router": "by-length:8192", "max_num_seqs": 64,
                          "long_pool": "replicas=1 enable-chunked-prefill=false",
                          "short_pool": "max_num_seqs=512", "seed": 5})
    assert fleet.pools == ("long", "short", "short")
    assert [c.max_num_seqs for c in fleet.configs] == [64, 512, 512]
    assert [c.enable_chunked_prefill for c in fleet.configs] == [False, True, True]
    assert [c.seed for c in fleet.configs] == [5, 6, 7]


@pytest.mark.parametrize("pools, field", [
    ({"long_pool": "replicas=2", "short_pool": "replicas=2"}, "--replicas"),
    ({"long_pool": "max_num_seqs"}, "--long-pool"),
    ({"short_pool": "no_such_flag=1"}, "--short-pool"),
])
def test_bad_pools_name_their_flag(pools: dict[str, str], field: str) -> None:
    with pytest.raises(InputError) as err:
        fleet_config({"replicas": 3, "router": "by-length:10", **pools})
    assert err.value.field == field


def test_scenario_fleet_block_becomes_sweepable_flags() -> None:
    data = {"target": {"launch": "sim"}, "load": {"concurrency": [1]},
            "fleet": {"replicas": 2, "router": "by-length:8192",
                      "pools": {"long": {"replicas": 1,
                                         "flags": {"enable-chunked-prefill": False}}}},
            "sweep": {"arms": {"split": {}, "rr": {"router": "round-robin"}}}}
    scenario = validate(Scenario, data)
    split, rr = scenario.points()
    assert split.flags["router"] == "by-length:8192" and rr.flags["router"] == "round-robin"
    assert split.flags["long_pool"] == "replicas=1 enable_chunked_prefill=false"
    assert fleet_config(dict(split.flags)).pools == ("long", "short")


def test_scenario_with_an_unknown_router_names_the_field() -> None:
    data = {"target": {"launch": "sim"}, "load": {"concurrency": [1]},
            "fleet": {"router": "fastest"}}
    with pytest.raises(InputError) as err:
        validate(Scenario, data, source="s.yaml")
    assert err.value.field == "fleet.router" and err.value.exit_code == 2
