"""The simulator's command-line surface: ``vllm serve``'s own flag names, declared once.

The engine flags (model, GPU, scheduler, cache, timing) are :data:`ENGINE_OPTIONS`,
shared by ``loadlab sim serve`` and ``loadlab sim replay``, as are the fleet's
(:data:`FLEET_OPTIONS`: replicas behind a router, :mod:`loadlab.sim.fleet`);
:data:`SERVE_OPTIONS` adds the HTTP front's. A few vLLM flags that change nothing in a simulation
(``--enforce-eager``, ``--disable-log-requests``, ...) are accepted and ignored, so a
real server's flag list still parses. :func:`accepted_flags` is what a scenario's
simulator points are checked against before anything starts.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

import click

from loadlab.errors import InputError


class GroupedOption(click.Option):
    """An option that names the help section it is listed under."""

    def __init__(self, *args: Any, section: str = "Options", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.section = section


class GroupedCommand(click.Command):
    """Lists options under their sections (Model and hardware, Scheduler, ...)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            section = getattr(param, "section", "Options")
            sections.setdefault(section, []).append(record)
        order = {name: i for i, name in enumerate(SECTION_ORDER)}
        for name in sorted(sections, key=lambda n: order.get(n, len(order))):
            rows = sections[name]
            with formatter.section(name):
                formatter.write_dl(rows)


def option(*decls: str, section: str, **kwargs: Any) -> Callable:
    return click.option(*decls, cls=GroupedOption, section=section, **kwargs)


_MODEL = "Model and hardware"
_SCHED = "Scheduler (vLLM defaults when omitted)"
_CACHE = "KV cache"
_SIMU = "Simulation"
_FRONT = "Server"
_FLEET = "Fleet (replicas behind a router; not vLLM flags)"
_IGNORED = "Accepted for vLLM compatibility, no effect"
PLAN_SECTION = "Load plan (virtual time)"
SECTION_ORDER = (PLAN_SECTION, _MODEL, _SCHED, _CACHE, _FLEET, _FRONT, _SIMU, _IGNORED,
                 "Options")

ENGINE_OPTIONS: list[Callable] = [
    option("--model", section=_MODEL, default="llama-3.1-8b", show_default=True,
         help="Model profile: llama-3.1-8b, qwen2.5-7b, qwen2.5-72b (or its Hugging Face name)."),
    option("--gpu", section=_MODEL, default="h100", show_default=True,
         help="GPU profile: h100, h200, a100-80g, a100-40g, l40s."),
    option("--calibration", section=_MODEL, default=None, metavar="FILE",
         help="Step-time model fitted by `loadlab sim calibrate`: replaces --model/--gpu's, "
              "and the calibrated run's KV pool and flags fill those left at their default."),
    option("--tensor-parallel-size", "-tp", section=_MODEL, type=int, default=1, show_default=True,
         help="GPUs the model is split over."),
    option("--max-model-len", section=_MODEL, type=int, default=None,
         help="Context length (prompt + output). Default: the model's."),
    option("--max-num-seqs", section=_SCHED, type=int, default=None,
         help="Cap on running requests (1024 on >=70 GiB non-A100 GPUs, else 256)."),
    option("--max-num-batched-tokens", section=_SCHED, type=int, default=None,
         help="Token budget per step (8192 on >=70 GiB non-A100 GPUs, else 2048)."),
    option("--enable-chunked-prefill/--no-enable-chunked-prefill", section=_SCHED, default=True,
         show_default=True, help="Split long prompts over steps."),
    option("--long-prefill-token-threshold", section=_SCHED, type=int, default=0, show_default=True,
         help="Cap on one request's prefill tokens per step (0 = none)."),
    option("--scheduler-reserve-full-isl/--no-scheduler-reserve-full-isl", section=_SCHED,
         default=True, show_default=True,
         help="Admit a request only if its whole prompt fits in free blocks (newer vLLM)."),
    option("--block-size", section=_CACHE, type=int, default=16, show_default=True,
         help="Tokens per KV block."),
    option("--gpu-memory-utilization", section=_CACHE, type=float, default=0.92, show_default=True,
         help="Fraction of GPU memory vLLM may use."),
    option("--num-gpu-blocks-override", section=_CACHE, type=int, default=None,
         help="Set the KV pool size in blocks exactly."),
    option("--enable-prefix-caching/--no-enable-prefix-caching", section=_CACHE, default=True,
         show_default=True, help="Reuse cached blocks of shared prompt prefixes."),
    option("--kv-cache-dtype", section=_CACHE, default="auto", show_default=True,
         help="auto (BF16) or fp8 (halves KV bytes per token)."),
    option("--seed", section=_SIMU, type=int, default=0, show_default=True,
         help="Seed of output-length draws and step jitter."),
    option("--step-jitter", section=_SIMU, type=float, default=0.0, show_default=True,
         help="Relative std-dev of seeded step-time jitter."),
    option("--output-len-mean", section=_SIMU, type=float, default=256.0, show_default=True,
         help="Mean output length of requests without ignore_eos (log-normal)."),
    option("--output-len-sigma", section=_SIMU, type=float, default=0.8, show_default=True,
         help="Log-normal sigma of those output lengths."),
]

FLEET_OPTIONS: list[Callable] = [
    option("--replicas", section=_FLEET, type=click.IntRange(min=1), default=1,
           show_default=True, help="Engines behind one front; replica i's /metrics is at "
           "/replica/<i>/metrics (/metrics: replica 0's)."),
    option("--router", section=_FLEET, default="round-robin", show_default=True,
           help="round-robin, least-outstanding, least-waiting, prefix-affinity or "
                "by-length:TOKENS (longer prompts to the long pool)."),
    option("--router-refresh-ms", section=_FLEET, type=click.FloatRange(min=0), default=50.0,
           show_default=True, help="least-waiting: age of its view of the queues (0: exact)."),
    option("--long-pool", section=_FLEET, default=None,
           help="by-length: the long pool, e.g. 'replicas=1 enable-chunked-prefill=false'."),
    option("--short-pool", section=_FLEET, default=None,
           help="by-length: the short pool, e.g. 'replicas=3 max-num-seqs=1024'."),
]

_NO_EFFECT_FLAGS = ("--enforce-eager", "--disable-log-requests", "--disable-log-stats",
                    "--enable-log-requests", "--trust-remote-code", "--async-scheduling",
                    "--disable-frontend-multiprocessing", "--disable-uvicorn-access-log")

SERVE_OPTIONS: list[Callable] = [
    click.argument("model_tag", required=False, metavar="[MODEL]"),
    option("--host", section=_FRONT, default="127.0.0.1", show_default=True,
         help="Address to bind."),
    option("--port", section=_FRONT, type=click.IntRange(0, 65535), default=8000,
         show_default=True, help="Port to bind; 0 picks a free one (printed)."),
    option("--served-model-name", section=_FRONT, default=None,
         help="Model name clients send. Default: the profile's Hugging Face name."),
    option("--api-key", section=_FRONT, default=None, envvar="VLLM_API_KEY",
         help="Require 'Authorization: Bearer KEY' on /v1 routes (or $VLLM_API_KEY)."),
    option("--stream-interval", section=_FRONT, type=click.IntRange(min=1), default=1,
         show_default=True, help="Stream every N tokens (first and last always sent)."),
    option("--ssl-certfile", section=_FRONT, default=None, metavar="FILE",
         help="Serve https with this PEM certificate (chain); needs --ssl-keyfile."),
    option("--ssl-keyfile", section=_FRONT, default=None, metavar="FILE",
         help="The private key of --ssl-certfile (PEM)."),
    option("--metrics-names", section=_FRONT, type=click.Choice(["v1", "v0"]), default="v1",
         show_default=True, help="Metric names of vLLM V1 or of the V0 era."),
    option("--time-scale", section=_SIMU, type=float, default=1.0, show_default=True,
         help="Run N times faster than modelled (metrics stay in modelled seconds)."),
    *[option(flag, section=_IGNORED, is_flag=True, default=False,
           help="Ignored.") for flag in _NO_EFFECT_FLAGS],
    option("--dtype", section=_IGNORED, default=None, help="Ignored (weights are BF16)."),
]


def with_options(options: list[Callable]) -> Callable:
    """Apply a list of click decorators in declaration order."""

    def apply(fn: Callable) -> Callable:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return apply


@click.command()
@with_options(SERVE_OPTIONS)
@with_options(ENGINE_OPTIONS)
@with_options(FLEET_OPTIONS)
def _surface(**_: Any) -> None:
    """``loadlab sim serve``'s parameters, without its body: what :func:`accepted_flags` reads."""


def tls_context(certfile: str | None, keyfile: str | None) -> ssl.SSLContext | None:
    """The server side of ``--ssl-certfile`` / ``--ssl-keyfile`` (None: plain http);
    InputError naming the flag when the pair cannot be loaded."""
    if certfile is None and keyfile is None:
        return None
    if certfile is None or keyfile is None:
        raise InputError("https needs both a certificate and its key",
                         field="--ssl-certfile/--ssl-keyfile", fix="give both flags")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise InputError(f"cannot load the certificate and key ({exc})", source=certfile,
                         field="--ssl-certfile/--ssl-keyfile",
                         fix="give a PEM certificate and the PEM private key that matches it"
                         ) from None
    return ctx


def accepted_flags() -> set[str]:
    """Every flag ``loadlab sim serve`` takes, as parameter names (``max_num_seqs``)."""
    own = {"model_tag", "host", "port", "ssl_certfile", "ssl_keyfile"}  # a launch serves http
    return {str(p.name) for p in _surface.params} - own
