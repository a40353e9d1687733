"""Scenarios: what to run against what, and which server configurations to compare.

A scenario names the target (a URL, or a server loadlab launches per point), the
seeded workload, the load plan (:mod:`loadlab.spec.plan`), how the load generator runs,
where client and server run (CPU isolation), the sweep (A/B arms or a flag matrix)
and the simulator stand-in for what-if points. :meth:`Scenario.points` expands it into
the server configurations a sweep runs, in order.

A simulator target may be a fleet (``fleet:``: replicas behind a router). The block is
written as the simulator's fleet flags (``replicas``, ``router``, ``long_pool``, ...)
under the scenario's own flags, so an arm or a matrix sweeps a router or a replica count
like any other flag.

Every field carries a description: it is the help text, and the fix an error shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainSerializer,
    ValidationInfo,
    field_validator,
    model_validator,
)

from loadlab.spec.cpulist import FIX as CPU_FIX
from loadlab.spec.cpulist import format_cpu_list, parse_cpu_list
from loadlab.spec.fields import Scalar, Strict, bad
from loadlab.spec.plan import LoadPlan
from loadlab.spec.tls import TlsSettings, check_ca_bundle

_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")
SCRAPE_INTERVAL_MIN_S = 0.1   # the collector's finest interval


class Workload(Strict):
    """Which requests are sent: the same seeded sequence goes to every point of a sweep."""

    profile: str = Field("sharegpt", description="workload profile: a shipped name "
                         "(`loadlab profile list`) or a profile file")
    seed: int = Field(0, ge=0, description="seed of lengths, prefixes and arrivals")
    calibrate: bool = Field(
        True, description="fit prompt text to exact token counts with /tokenize"
    )


class Target(Strict):
    """The server under test: a URL to load, or a server loadlab starts per point."""

    url: str | None = Field(None, description="base URL of a running server, e.g. http://10.0.0.5:8000")
    launch: Literal["sim", "vllm"] | None = Field(
        None,
        description="start this server for each point: "
        "sim (built-in simulator) or vllm (vllm serve)",
    )
    model: str | None = Field(None, description="vllm: model path or name; sim: model profile "
                              "(llama-3.1-8b, qwen2.5-7b, ...); url: the served name")
    api: Literal["completions", "chat"] = Field(
        "completions", description="OpenAI API the requests use"
    )
    api_key_env: str = Field(
        "LOADLAB_API_KEY", description="environment variable holding the API key"
    )
    startup_timeout_s: float | None = Field(None, gt=0, description="seconds a launched server has "
                                            "to answer /health (sim 60, vllm 300)")
    probe: bool = Field(False, description="launched vllm: load loadlab_probe (--scheduler-cls) "
                        "and collect its loadlab: series of the scheduler's refusals")
    ca_bundle: str | None = Field(
        None, description="https url: PEM file of the CAs to trust instead of the system store")
    insecure: bool = Field(False, description="https url: do not verify the server's certificate "
                           "(warned, recorded in the manifest)")

    @field_validator("ca_bundle", "insecure")
    @classmethod
    def _https_only(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None or value is False:
            return value
        if not str(info.data.get("url") or "").startswith("https://"):
            raise bad("only an https:// url is verified", "drop it, or give the server's "
                      "https:// URL (a launched server is served over http)")
        if info.field_name == "insecure" and info.data.get("ca_bundle") is not None:
            raise bad("insecure skips the verification ca_bundle is for", "keep one of them")
        problem = check_ca_bundle(value) if info.field_name == "ca_bundle" else None
        if problem is not None:
            raise bad("CA bundle: {problem}", "give a readable PEM file of the CA certificates "
                      "that signed the server's", problem=problem)
        return value
    replica_metrics: list[str] | None = Field(
        None, description="url behind a gateway: each replica's /metrics base URL; the load "
        "goes to url, the analysis judges each replica and the routing between them")

    @model_validator(mode="after")
    def _one_target(self) -> Target:
        if (self.url is None) == (self.launch is None):
            raise bad(
                "give exactly one of url and launch", "url: http://HOST:PORT, or launch: sim|vllm"
            )
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise bad("url '{url}' is not an http(s) URL", "write e.g. http://127.0.0.1:8000",
                      url=self.url)
        if self.replica_metrics is not None and self.url is None:
            raise bad("replica_metrics are the replicas behind a url target",
                      "give url: the gateway's URL, or drop replica_metrics (launch: sim "
                      "scrapes each replica of its fleet itself)")
        if self.probe and self.launch != "vllm":
            raise bad("probe is for a vllm loadlab launches",
                      "use it with launch: vllm; the simulator exports the loadlab: series "
                      "itself, and a server you start takes the probe as the README shows")
        if self.launch == "vllm" and not self.model:
            raise bad(
                "a launched vllm needs a model",
                "name a model path or name (scenario: target.model; "
                "loadlab run: --model, or first after --)",
            )
        return self

    @property
    def tls(self) -> TlsSettings:
        """How an https url's certificate is checked."""
        return TlsSettings(ca_bundle=self.ca_bundle, insecure=self.insecure)

    @field_validator("replica_metrics")
    @classmethod
    def _replicas(cls, urls: list[str] | None) -> list[str] | None:
        if urls is None:
            return None
        if len(urls) < 2 or len(set(urls)) < len(urls):
            raise bad("{n} distinct replica(s) named; a fleet has two or more",
                      "list each replica's base URL once, e.g. [http://10.0.0.5:8000, "
                      "http://10.0.0.6:8000]", n=len(set(urls)))
        for u in urls:
            if not u.startswith(("http://", "https://")):
                raise bad("'{url}' is not an http(s) URL",
                          "write each replica's base URL, e.g. http://10.0.0.5:8000", url=u)
        return urls


def _cpus(value: Any) -> Any:
    if value is None:
        return None
    try:
        return parse_cpu_list(value)
    except (TypeError, ValueError) as exc:
        raise bad(str(exc), CPU_FIX) from None


Cpus = Annotated[
    frozenset[int], BeforeValidator(_cpus), PlainSerializer(sorted, return_type=list[int])
]


class Isolation(Strict):
    """Server and load generator on disjoint CPUs (taskset syntax: 0, 0,2, 0-3).

    Checked here: the syntax and that the sets do not overlap; whether this machine has
    the CPUs is :func:`loadlab.experiment.cpus.check_available`'s question."""

    server_cpus: Cpus | None = Field(None, description="CPUs of the launched server, e.g. 0-2 "
                                     "(taskset syntax; a launched target only)")
    client_cpus: Cpus | None = Field(None, description="CPUs of the load generator and its local "
                                     "worker processes, e.g. 3 (taskset syntax)")

    @model_validator(mode="after")
    def _disjoint(self) -> Isolation:
        both = (self.server_cpus or frozenset()) & (self.client_cpus or frozenset())
        if both:
            raise bad(
                "server and client CPUs overlap on {cpus}",
                "give each side its own CPUs, e.g. server 0 and client 1",
                cpus=format_cpu_list(both),
            )
        return self

    def manifest_entry(self) -> dict[str, list[int] | None] | None:
        """The manifest's ``isolation`` block, or None when nothing is pinned."""
        if self.server_cpus is None and self.client_cpus is None:
            return None
        return self.model_dump()


def _scrape_interval(value: float) -> float:
    if not value >= SCRAPE_INTERVAL_MIN_S:
        raise bad("must be at least {least} s, got {value}", "e.g. 1 (seconds between scrapes)",
                  least=SCRAPE_INTERVAL_MIN_S, value=f"{value:g}")
    return value


class LoadgenSettings(Strict):
    """How the load generator runs."""

    workers: int = Field(1, ge=0, description="local Locust worker processes (0: in-process)")
    timeout_s: float = Field(600.0, gt=0, description="per-request deadline, seconds")
    drain_s: float = Field(30.0, ge=0, description="seconds in-flight requests get at the end")
    collect_interval_s: Annotated[float, AfterValidator(_scrape_interval)] = Field(
        1.0, description=f"seconds between /metrics scrapes (at least {SCRAPE_INTERVAL_MIN_S})")


def flag_name(name: str) -> str:
    """A vLLM flag in either spelling (``max-num-seqs``, ``--max-num-seqs``) -> ``max_num_seqs``."""
    return name.lstrip("-").replace("-", "_")


def _flags(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    out = {flag_name(str(k)): v for k, v in value.items()}
    owned = sorted({"host", "port"} & set(out))
    if owned:
        raise bad("flag {flags}: loadlab chooses it (a free port per point)", "remove it",
                  flags=", ".join(owned))
    return out


Flags = Annotated[dict[str, Scalar], BeforeValidator(_flags)]
FlagMatrix = Annotated[dict[str, list[Scalar]], BeforeValidator(_flags)]


def _arm_names(arms: Any) -> Any:
    for name in arms if isinstance(arms, dict) else ():
        if not isinstance(name, str):
            raise bad("arm name {name} is not text: YAML reads on/off/yes/no as true/false",
                      "quote the name ('on') or choose another", name=repr(name))
    return arms


Arms = Annotated[dict[str, Flags], BeforeValidator(_arm_names)]


class Sweep(Strict):
    """The points of a sweep: a matrix of flag values, or named A/B arms."""

    matrix: FlagMatrix | None = Field(
        None,
        description="flag -> values; every combination is a point, e.g. {max-num-seqs: [8, 16]}",
    )
    arms: Arms | None = Field(None, description="arm name -> flags, e.g. "
                                          "{caching-on: {enable-prefix-caching: true}, ...}")
    baseline: str | None = Field(None, description="the arm the others are compared with "
                                 "(default: the first)")

    @model_validator(mode="after")
    def _one_kind(self) -> Sweep:
        if (self.matrix is None) == (self.arms is None):
            raise bad("give exactly one of matrix and arms",
                      "matrix: {max-num-seqs: [8, 16]} or arms: {a: {...}, b: {...}}")
        if self.matrix is not None and (not self.matrix or not all(self.matrix.values())):
            raise bad(
                "every matrix flag needs at least one value", "e.g. max-num-seqs: [8, 16, 32]"
            )
        if self.arms is not None and len(self.arms) < 2:
            raise bad("an A/B sweep needs at least two arms", "add a second arm")
        unsafe = [name for name in self.arms or {} if not _SAFE_NAME.fullmatch(name)]
        if unsafe:
            raise bad(
                "arm name '{name}' cannot name a folder",
                "use letters, digits, '.', '_', '-'",
                name=unsafe[0],
            )
        if self.baseline is not None and self.baseline not in (self.arms or {}):
            raise bad(
                "baseline '{name}' is not an arm",
                "name one of the arms (matrix sweeps have none)",
                name=self.baseline,
            )
        return self


ROUTERS = ("round-robin", "least-outstanding", "least-waiting", "prefix-affinity",
           "by-length:TOKENS")
ROUTER_FIX = f"use one of: {', '.join(ROUTERS)} (e.g. by-length:8192)"
POOLS = ("long", "short")


def parse_router(text: str) -> tuple[str, int | None]:
    """``by-length:8192`` -> ("by-length", 8192); another router name -> (name, None).

    The one grammar of router names: the scenario checks it and the fleet builds from it.
    """
    name, colon, arg = str(text).partition(":")
    if name == "by-length" and colon and arg.isdigit() and int(arg) > 0:
        return name, int(arg)
    if not colon and name in ROUTERS:
        return name, None
    raise ValueError(f"unknown router {text!r}")


def _router(value: str) -> str:
    try:
        parse_router(value)
    except ValueError:
        raise bad("unknown router '{name}'", ROUTER_FIX, name=value) from None
    return value


class Pool(Strict):
    """One pool of a ``by-length`` fleet: its replica count and the flags it differs by."""

    replicas: int | None = Field(None, ge=1, description="replicas in this pool (default: "
                                 "half the fleet, the long pool rounding down)")
    flags: Flags = Field(default_factory=dict, description="server flags of this pool's "
                         "replicas over the scenario's, e.g. {enable-chunked-prefill: false}")

    def spec(self) -> str:
        """The pool as one flag value: ``replicas=1 enable_chunked_prefill=false``."""
        items = ({"replicas": self.replicas} if self.replicas else {}) | self.flags
        return " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                        for k, v in items.items())


class Fleet(Strict):
    """The simulator as N replicas behind one router, in one process (live or replay)."""

    replicas: int = Field(2, ge=1, description="engines behind the router")
    router: Annotated[str, AfterValidator(_router)] = Field(
        "round-robin", description=f"how requests are spread: {', '.join(ROUTERS)}")
    refresh_ms: float | None = Field(None, ge=0, description="least-waiting: how old its "
                                     "view of each queue may get, milliseconds (0: exact)")
    pools: dict[Literal["long", "short"], Pool] = Field(
        default_factory=dict, description="by-length: flags per pool, {long: {flags: ...}, "
        "short: {flags: ...}} (other routers ignore them, so arms may compare routers)")

    @model_validator(mode="after")
    def _pools_for_by_length(self) -> Fleet:
        if parse_router(self.router)[0] == "by-length" and self.replicas < 2:
            raise bad("by-length needs a long and a short replica", "replicas: 2 or more")
        return self

    def flags(self) -> dict[str, Scalar]:
        """The fleet as the simulator's flags (what ``loadlab sim serve`` takes)."""
        out: dict[str, Scalar] = {"replicas": self.replicas, "router": self.router}
        if self.refresh_ms is not None:
            out["router_refresh_ms"] = self.refresh_ms
        for name, pool in self.pools.items():
            out[f"{name}_pool"] = pool.spec()
        return out


class WhatIf(Strict):
    """How ``--what-if`` models the server on the simulator (needed for a vllm or url target)."""

    model: str = Field("llama-3.1-8b", description="simulator model profile: llama-3.1-8b, "
                       "qwen2.5-7b, qwen2.5-72b")
    gpu: str = Field(
        "h100", description="simulator GPU profile: h100, h200, a100-80g, a100-40g, l40s"
    )
    flags: Flags = Field(
        default_factory=dict, description="simulator flags added to the scenario's"
    )
    calibration: str | None = Field(
        None, description="`loadlab sim calibrate` YAML: its step time replaces model and gpu, "
        "its run's KV pool and flags fill those the points leave unset")
    trace: str | None = Field(
        None, description="a recorded run folder (or its requests.parquet) whose requests and "
        "steps every point replays instead of the load plan and profile")
    loop: Literal["open", "closed"] | None = Field(
        None, description="how the trace is replayed: open (recorded send times) or closed "
        "(each recorded user's requests in turn); default: as it was recorded")


@dataclass(frozen=True)
class Point:
    """One server configuration of a sweep: its folder name and its full flag set."""

    name: str
    flags: dict[str, Scalar]


def _folder_name(name: str) -> str:
    """A name that stays one folder name: no path separators, no ``..``."""
    if not _SAFE_NAME.fullmatch(name) or set(name) == {"."}:
        raise bad("name '{name}' cannot name a folder", "use letters, digits, '.', '_', '-'",
                  name=name)
    return name


def folder_name(text: str) -> str:
    """``text`` with every character a folder name cannot hold made ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text).strip(".") or "scenario"


class Scenario(Strict):
    """A scenario file: what to run against what, and which configurations to compare."""

    name: Annotated[str, AfterValidator(_folder_name)] = Field(
        "scenario", description="the scenario's name, part of the sweep folder's name "
        "(letters, digits, '.', '_', '-'; default: the file name)")
    description: str = Field("", description="what the scenario is for")
    target: Target = Field(description="url: a running server, or launch: sim|vllm")
    flags: Flags = Field(default_factory=dict, description="server flags by vLLM's names, "
                         "e.g. {max-num-seqs: 64, enable-prefix-caching: true}")
    workload: Workload = Field(default_factory=Workload, description="profile and seed")
    load: LoadPlan = Field(description="the load plan: concurrency, rate, trace or search")
    loadgen: LoadgenSettings = Field(default_factory=LoadgenSettings, description="load generator")
    isolation: Isolation | None = Field(
        None,
        description="server_cpus and client_cpus: each side on "
        "CPUs of its own (taskset syntax, e.g. server_cpus: 0-2)",
    )
    sweep: Sweep | None = Field(None, description="matrix of flag values, or named A/B arms")
    what_if: WhatIf = Field(default_factory=WhatIf, description="simulator model for --what-if")
    fleet: Fleet | None = Field(None, description="simulator replicas behind a router: "
                                "{replicas: 2, router: least-waiting}")

    @model_validator(mode="after")
    def _launch_for_flags(self) -> Scenario:
        if self.target.url is not None and (self.flags or self.sweep is not None):
            raise bad(
                "flags and sweeps need a server loadlab launches; a url target is loaded as is",
                "use target.launch: sim|vllm, or drop flags and sweep",
            )
        if (
            self.target.url is not None
            and self.isolation is not None
            and self.isolation.server_cpus
        ):
            raise bad("server_cpus needs a launched server", "drop isolation.server_cpus")
        if self.fleet is not None and self.target.launch != "sim":
            raise bad("a fleet is the simulator's: loadlab launches it per point",
                      "use target.launch: sim, or drop fleet")
        return self

    @property
    def sweep_mode(self) -> Literal["ab", "matrix", "single"]:
        if self.sweep is None:
            return "single"
        return "ab" if self.sweep.arms is not None else "matrix"

    @property
    def baseline(self) -> str | None:
        if self.sweep is None or self.sweep.arms is None:
            return None
        return self.sweep.baseline or next(iter(self.sweep.arms))

    def points(self) -> list[Point]:
        """Every server configuration, in run order (A/B arms, or the matrix row by row)."""
        base = {**(self.fleet.flags() if self.fleet else {}), **self.flags}
        if self.sweep is None:
            return [Point("run", base)]
        if self.sweep.arms is not None:
            return [Point(name, {**base, **arm}) for name, arm in self.sweep.arms.items()]
        points = [Point("", base)]
        for flag, values in (self.sweep.matrix or {}).items():  # arms is None: matrix is set
            points = [
                Point(_join(p.name, f"{flag.replace('_', '-')}-{_text(v)}"), {**p.flags, flag: v})
                for p in points
                for v in values
            ]
        return points


def _join(a: str, b: str) -> str:
    return f"{a}_{b}" if a else b


def _text(value: Scalar) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return folder_name(str(value))
