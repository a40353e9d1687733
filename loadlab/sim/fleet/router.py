"""Routers: which replica of a simulated fleet gets the next request.

Each router is the policy of a real load balancer or inference gateway, reduced to
what decides a request's replica; the class docstrings say which, and where we differ.
A router sees each replica as a :class:`ReplicaView` (what a gateway can know about a
pod) and the request as its :class:`~loadlab.sim.engine.types.EngineRequest`; it is
pure (no clock of its own, no I/O), so it runs the same in ``sim serve`` and in
``sim replay``, and a unit test can hand it made-up states.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from loadlab.errors import InputError
from loadlab.sim.engine.types import EngineRequest
from loadlab.spec.scenario import POOLS, ROUTER_FIX, parse_router

LONG, SHORT = POOLS
REFRESH_MS = 50.0          # least-waiting's default view age (see LeastWaiting)
AFFINITY_BLOCKS = 1        # prefix-affinity hashes this many leading blocks


@dataclass
class ReplicaView:
    """What a router knows of one replica.

    ``outstanding``: requests sent and not yet finished, as the router counts them itself
    (a proxy's open streams, exact). ``waiting``: ``vllm:num_requests_waiting`` as of the
    router's last look (:class:`LeastWaiting` decides how old it may be).
    """

    index: int
    pool: str = ""
    outstanding: int = 0
    waiting: int = 0


class Router(Protocol):
    # Whether choose() reads ReplicaView.waiting: only then does a caller refresh it per
    # request (reading every engine's queue at every send was ~2% of an 8-replica replay).
    reads_waiting: bool

    def choose(self, req: EngineRequest, replicas: Sequence[ReplicaView], now: float) -> int:
        """The index (into ``replicas``) of the replica that gets ``req`` at ``now`` (s)."""
        ...


class RoundRobin:
    """Each replica in turn, whatever it holds: a Kubernetes Service (kube-proxy picks
    backends without looking at load) and nginx's default ``upstream`` balancing
    (nginx.org/en/docs/http/ngx_http_upstream_module.html). Equal weights only; kube-proxy
    in iptables mode actually picks at random, which evens out the same way on average."""

    reads_waiting = False

    def __init__(self) -> None:
        self._next = 0

    def choose(self, req: EngineRequest, replicas: Sequence[ReplicaView], now: float) -> int:
        return self.turn(len(replicas))

    def turn(self, n: int) -> int:
        """The next of ``n`` places in turn (also the tie-break of the other routers)."""
        i = self._next % n
        self._next = i + 1
        return i


class LeastOutstanding:
    """The replica with the fewest requests in flight: nginx ``least_conn`` (fewest
    active connections, ties taken in round-robin order) and Envoy's ``LEAST_REQUEST``
    (envoyproxy.io docs, "Supported load balancers"). Envoy compares only two random
    hosts by default (power of two choices); this scans every replica, which is what
    both do with a handful of equal-weight hosts in the limit. Ties go round-robin."""

    reads_waiting = False

    def __init__(self) -> None:
        self._tie = RoundRobin()

    def choose(self, req: EngineRequest, replicas: Sequence[ReplicaView], now: float) -> int:
        least = min(r.outstanding for r in replicas)
        tied = [i for i, r in enumerate(replicas) if r.outstanding == least]
        return tied[self._tie.turn(len(tied))]


class LeastWaiting:
    """The replica with the shortest engine queue (``vllm:num_requests_waiting``), then
    the fewest in flight: the queue filter and scorer of the Gateway API inference
    extension's endpoint picker and of llm-d's inference scheduler
    (kubernetes-sigs/gateway-api-inference-extension ``pkg/epp/scheduling``, which reads
    the gauge from each pod's /metrics; docs/proposals/003-model-server-protocol lists it).

    Where we differ: the picker scrapes each pod on an interval (tens of milliseconds), so
    its queue lengths are stale between scrapes; here the queues are re-read only when
    the last look is ``refresh_s`` old (0: every request, exact). The picker's other
    scorers (KV-cache usage, prefix, LoRA) are left out: this isolates the queue signal.
    """

    reads_waiting = True

    def __init__(self, refresh_s: float = REFRESH_MS / 1000) -> None:
        self.refresh_s = refresh_s
        self._seen: list[int] | None = None
        self._seen_at = 0.0
        self._tie = RoundRobin()

    def choose(self, req: EngineRequest, replicas: Sequence[ReplicaView], now: float) -> int:
        if (self._seen is None or len(self._seen) != len(replicas)
                or now - self._seen_at >= self.refresh_s):
            self._seen, self._seen_at = [r.waiting for r in replicas], now
        seen = self._seen
        key = [(seen[i], r.outstanding) for i, r in enumerate(replicas)]
        best = min(key)
        tied = [i for i, k in enumerate(key) if k == best]
        return tied[self._tie.turn(len(tied))]


class PrefixAffinity:
    """Requests whose prompts start alike go to the same replica, so its prefix cache
    hits: a hash of the first ``blocks`` KV blocks of the prompt picks the replica, like
    nginx ``hash $key`` or Envoy's ring-hash/Maglev balancers keyed on a prefix header.

    Where we differ: llm-d's prefix-cache scorer (llm-d/llm-d-inference-scheduler) tracks
    which pod holds which blocks and weighs that against load; this is pure affinity, so a
    hot prefix can overload its replica. Replica count changes remap most keys (plain
    modulo, not consistent hashing): a fleet here never changes size mid-run.
    """

    reads_waiting = False

    def __init__(self, block_size: int, blocks: int = AFFINITY_BLOCKS) -> None:
        self.tokens = block_size * blocks
        self.blocks = blocks

    def choose(self, req: EngineRequest, replicas: Sequence[ReplicaView], now: float) -> int:
        hashes = req.block_hashes
        if hashes is not None and len(hashes) >= self.blocks:
            key = hash(tuple(hashes[:self.blocks]))
        else:
            key = hash(tuple(req.prompt_token_ids[:self.tokens]))
        return key % len(replicas)


class ByLength:
    """Prompts over ``threshold`` tokens to the long pool, the rest to the short pool,
    each pool round-robin: the length-based split of disaggregated or "long-context
    pool" deployments, which a gateway does by header or body-size match (Envoy route
    matching, the inference extension's body-based routing). Each pool may be
    configured apart (e.g. chunked prefill off and a large max_model_len for long
    prompts, a large max_num_seqs for short ones)."""

    reads_waiting = False

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self._pools = {LONG: RoundRobin(), SHORT: RoundRobin()}

    def choose(self, req: EngineRequest, replicas: Sequence[ReplicaView], now: float) -> int:
        pool = LONG if len(req.prompt_token_ids) > self.threshold else SHORT
        members = [i for i, r in enumerate(replicas) if r.pool == pool]
        return members[self._pools[pool].turn(len(members))]


def make_router(name: str, block_size: int, refresh_ms: float = REFRESH_MS) -> Router:
    """The router a ``--router`` name stands for (InputError for an unknown one)."""
    try:
        kind, tokens = parse_router(name)
    except ValueError:
        raise InputError(f"unknown router {name!r}", field="--router", fix=ROUTER_FIX) from None
    if kind == "round-robin":
        return RoundRobin()
    if kind == "least-outstanding":
        return LeastOutstanding()
    if kind == "least-waiting":
        return LeastWaiting(refresh_ms / 1000)
    if kind == "prefix-affinity":
        return PrefixAffinity(block_size)
    assert tokens is not None          # parse_router: by-length always has its threshold
    return ByLength(tokens)
