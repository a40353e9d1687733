"""Fleet flags into a :class:`FleetConfig`: how many engines, each one's config, the router.

The flags (``--replicas``, ``--router``, ``--router-refresh-ms``, ``--long-pool``,
``--short-pool``) ride beside the engine flags, so a flag list or a sweep arm configures
a fleet as it configures one engine. A pool is one flag value of ``key=value`` words
(``replicas=1 enable_chunked_prefill=false max_model_len=131072``): its replica count
and the engine flags its replicas take over the shared ones. Pools apply to ``by-length``
only; other routers ignore them and every replica takes the shared flags, so one sweep
can compare routers over the same pool flags. Replica ``i`` draws its output
lengths and jitter from ``seed + i``, so replicas do not move in lockstep.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from loadlab.errors import InputError
from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.flags import sim_config
from loadlab.sim.fleet.router import LONG, REFRESH_MS, SHORT
from loadlab.spec.fields import number_or_word
from loadlab.spec.scenario import ROUTER_FIX, parse_router

_SIM_FIELDS = {f.name for f in dataclasses.fields(SimConfig)}
FLEET_PARAMS = ("replicas", "router", "router_refresh_ms", "long_pool", "short_pool")


@dataclass(frozen=True)
class FleetConfig:
    """Each replica's pool and engine config, in index order, and the router's name."""

    router: str
    refresh_ms: float
    pools: tuple[str, ...]
    configs: tuple[SimConfig, ...]

    @property
    def size(self) -> int:
        return len(self.configs)

    @classmethod
    def single(cls, cfg: SimConfig) -> FleetConfig:
        """One engine: what a plain ``sim serve`` or ``sim replay`` runs."""
        return cls("round-robin", REFRESH_MS, ("",), (cfg,))


def _word(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    return number_or_word(text)


def parse_pool(text: str, flag: str) -> tuple[int | None, dict[str, Any]]:
    """``replicas=1 max_num_seqs=8`` -> (1, {"max_num_seqs": 8}); InputError naming ``flag``."""
    values: dict[str, Any] = {}
    for word in text.split():
        key, eq, value = word.partition("=")
        key = key.lstrip("-").replace("-", "_")
        if not eq or (key != "replicas" and key not in _SIM_FIELDS):
            raise InputError(f"{word!r} is not KEY=VALUE of an engine flag", field=flag,
                             fix="write e.g. 'replicas=1 enable-chunked-prefill=false'")
        values[key] = _word(value)
    replicas = values.pop("replicas", None)
    if replicas is not None and (not isinstance(replicas, int) or replicas < 1):
        raise InputError(f"replicas={replicas} is not a positive count", field=flag,
                         fix="write replicas=N with N >= 1")
    return replicas, values


def fleet_config(params: dict[str, Any]) -> FleetConfig:
    """The fleet of parsed flags (one replica when ``replicas`` is absent)."""
    n = int(params.get("replicas") or 1)
    router = str(params.get("router") or "round-robin")
    if n < 1:
        raise InputError(f"must be >= 1, got {n}", field="--replicas", fix="pass --replicas 1 "
                         "or more")
    try:
        kind, _ = parse_router(router)
    except ValueError:
        raise InputError(f"unknown router {router!r}", field="--router", fix=ROUTER_FIX) from None
    refresh = params.get("router_refresh_ms")
    refresh_ms = REFRESH_MS if refresh is None else float(refresh)
    if refresh_ms < 0:
        raise InputError(f"must be >= 0, got {refresh_ms:g}", field="--router-refresh-ms",
                         fix="pass 0 (exact queues) or a positive age in milliseconds")
    shared = {"model": SimConfig.model,
              **{k: v for k, v in params.items() if k not in FLEET_PARAMS}}
    specs = {pool: params.get(f"{pool}_pool") for pool in (LONG, SHORT)}
    if kind != "by-length":
        return FleetConfig(router, refresh_ms, ("",) * n,
                           tuple(_replica(shared, {}, i) for i in range(n)))
    return _by_length(router, refresh_ms, n, shared, specs)


def _by_length(router: str, refresh_ms: float, n: int, shared: dict[str, Any],
               specs: dict[str, Any]) -> FleetConfig:
    long_n, long_flags = parse_pool(str(specs[LONG] or ""), "--long-pool")
    short_n, short_flags = parse_pool(str(specs[SHORT] or ""), "--short-pool")
    if long_n is None:
        long_n = n - short_n if short_n is not None else max(1, n // 2)
    if short_n is None:
        short_n = n - long_n
    if long_n + short_n != n or short_n < 1:
        raise InputError(f"the pools hold {long_n} + {short_n} replicas, the fleet {n}",
                         field="--replicas", fix="make the pools' replicas add up to "
                         "--replicas, each at least 1")
    pools = (LONG,) * long_n + (SHORT,) * short_n
    configs = [_replica(shared, long_flags if pool == LONG else short_flags, i)
               for i, pool in enumerate(pools)]
    return FleetConfig(router, refresh_ms, pools, tuple(configs))


def _replica(shared: dict[str, Any], own: dict[str, Any], index: int) -> SimConfig:
    cfg = sim_config({**shared, **own})
    return dataclasses.replace(cfg, seed=cfg.seed + index) if index else cfg
