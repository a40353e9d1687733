"""``loadlab sim``: serve the simulator over HTTP, or replay a workload in virtual time.

Flags use ``vllm serve``'s own names, so a flag list written for vLLM configures the
simulator unchanged. The engine flags (model, GPU, scheduler, cache, timing) are
declared once in :data:`ENGINE_OPTIONS` and shared by ``serve`` and ``replay``.
A few vLLM flags that change nothing in a simulation (``--enforce-eager``,
``--disable-log-requests``, ...) are accepted and ignored, so a real server's flag list
still parses. Impossible configurations raise :class:`~loadlab.errors.InputError`
(exit 2) from :func:`loadlab.sim.hardware.resolve`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import click

from loadlab.config import Workload
from loadlab.errors import InputError
from loadlab.sim.config import SimConfig

_SIM_FIELDS = {f.name for f in dataclasses.fields(SimConfig)}


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


def _opt(*decls: str, section: str, **kwargs: Any) -> Callable:
    return click.option(*decls, cls=GroupedOption, section=section, **kwargs)


_MODEL = "Model and hardware"
_SCHED = "Scheduler (vLLM defaults when omitted)"
_CACHE = "KV cache"
_SIMU = "Simulation"
_FRONT = "Server"
_IGNORED = "Accepted for vLLM compatibility, no effect"
_PLAN = "Load plan (virtual time)"
SECTION_ORDER = (_PLAN, _MODEL, _SCHED, _CACHE, _FRONT, _SIMU, _IGNORED, "Options")

ENGINE_OPTIONS: list[Callable] = [
    _opt("--model", section=_MODEL, default="llama-3.1-8b", show_default=True,
         help="Model profile: llama-3.1-8b, qwen2.5-7b, qwen2.5-72b (or its Hugging Face name)."),
    _opt("--gpu", section=_MODEL, default="h100", show_default=True,
         help="GPU profile: h100, h200, a100-80g, a100-40g, l40s."),
    _opt("--tensor-parallel-size", "-tp", section=_MODEL, type=int, default=1, show_default=True,
         help="GPUs the model is split over."),
    _opt("--max-model-len", section=_MODEL, type=int, default=None,
         help="Context length (prompt + output). Default: the model's."),
    _opt("--max-num-seqs", section=_SCHED, type=int, default=None,
         help="Cap on running requests (1024 on >=70 GiB non-A100 GPUs, else 256)."),
    _opt("--max-num-batched-tokens", section=_SCHED, type=int, default=None,
         help="Token budget per step (8192 on >=70 GiB non-A100 GPUs, else 2048)."),
    _opt("--enable-chunked-prefill/--no-enable-chunked-prefill", section=_SCHED, default=True,
         show_default=True, help="Split long prompts over steps."),
    _opt("--long-prefill-token-threshold", section=_SCHED, type=int, default=0, show_default=True,
         help="Cap on one request's prefill tokens per step (0 = none)."),
    _opt("--scheduler-reserve-full-isl/--no-scheduler-reserve-full-isl", section=_SCHED,
         default=True, show_default=True,
         help="Admit a request only if its whole prompt fits in free blocks (newer vLLM)."),
    _opt("--block-size", section=_CACHE, type=int, default=16, show_default=True,
         help="Tokens per KV block."),
    _opt("--gpu-memory-utilization", section=_CACHE, type=float, default=0.92, show_default=True,
         help="Fraction of GPU memory vLLM may use."),
    _opt("--num-gpu-blocks-override", section=_CACHE, type=int, default=None,
         help="Set the KV pool size in blocks exactly."),
    _opt("--enable-prefix-caching/--no-enable-prefix-caching", section=_CACHE, default=True,
         show_default=True, help="Reuse cached blocks of shared prompt prefixes."),
    _opt("--kv-cache-dtype", section=_CACHE, default="auto", show_default=True,
         help="auto (BF16) or fp8 (halves KV bytes per token)."),
    _opt("--seed", section=_SIMU, type=int, default=0, show_default=True,
         help="Seed of output-length draws and step jitter."),
    _opt("--step-jitter", section=_SIMU, type=float, default=0.0, show_default=True,
         help="Relative std-dev of seeded step-time jitter."),
    _opt("--output-len-mean", section=_SIMU, type=float, default=256.0, show_default=True,
         help="Mean output length of requests without ignore_eos (log-normal)."),
    _opt("--output-len-sigma", section=_SIMU, type=float, default=0.8, show_default=True,
         help="Log-normal sigma of those output lengths."),
]

_NO_EFFECT_FLAGS = ("--enforce-eager", "--disable-log-requests", "--disable-log-stats",
                    "--enable-log-requests", "--trust-remote-code", "--async-scheduling",
                    "--disable-frontend-multiprocessing", "--disable-uvicorn-access-log")

SERVE_OPTIONS: list[Callable] = [
    click.argument("model_tag", required=False, metavar="[MODEL]"),
    _opt("--host", section=_FRONT, default="127.0.0.1", show_default=True,
         help="Address to bind."),
    _opt("--port", section=_FRONT, type=click.IntRange(0, 65535), default=8000,
         show_default=True, help="Port to bind; 0 picks a free one (printed)."),
    _opt("--served-model-name", section=_FRONT, default=None,
         help="Model name clients send. Default: the profile's Hugging Face name."),
    _opt("--api-key", section=_FRONT, default=None, envvar="VLLM_API_KEY",
         help="Require 'Authorization: Bearer KEY' on /v1 routes (or $VLLM_API_KEY)."),
    _opt("--stream-interval", section=_FRONT, type=click.IntRange(min=1), default=1,
         show_default=True, help="Stream every N tokens (first and last always sent)."),
    _opt("--metrics-names", section=_FRONT, type=click.Choice(["v1", "v0"]), default="v1",
         show_default=True, help="Metric names of vLLM V1 or of the V0 era."),
    _opt("--time-scale", section=_SIMU, type=float, default=1.0, show_default=True,
         help="Run N times faster than modelled (metrics stay in modelled seconds)."),
    *[_opt(flag, section=_IGNORED, is_flag=True, default=False,
           help="Ignored.") for flag in _NO_EFFECT_FLAGS],
    _opt("--dtype", section=_IGNORED, default=None, help="Ignored (weights are BF16)."),
]


def with_options(options: list[Callable]) -> Callable:
    """Apply a list of click decorators in declaration order."""

    def apply(fn: Callable) -> Callable:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return apply


def sim_config(params: dict[str, Any]) -> SimConfig:
    """A SimConfig from parsed flags; a Hugging Face model name maps to its profile."""
    from loadlab.sim.hardware import MODELS

    values = {k: v for k, v in params.items() if k in _SIM_FIELDS}
    by_hf = {m.hf_name.lower(): name for name, m in MODELS.items()}
    model = str(values.get("model", "")).lower()
    values["model"] = by_hf.get(model, model)
    for flag, low, strict in _LOWER_BOUNDS:
        value = values.get(flag.lstrip("-").replace("-", "_"))
        if value is not None and (value <= low if strict else value < low):
            raise InputError(f"must be {'>' if strict else '>='} {low:g}, got {value:g}", field=flag,
                             fix=f"pass a value {'above' if strict else 'of at least'} {low:g}")
    return SimConfig(**values)


# (flag, bound, strict): numbers a simulation cannot run with below the bound.
_LOWER_BOUNDS = (("--time-scale", 0.0, True), ("--output-len-mean", 0.0, True),
                 ("--output-len-sigma", 0.0, False), ("--step-jitter", 0.0, False))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def sim() -> None:
    """The built-in vLLM V1 scheduling simulator.

    `serve` answers vLLM's OpenAI API in real time; `replay` runs a workload through
    the same engine in virtual time and writes a run folder.
    """


@sim.command(cls=GroupedCommand)
@with_options(SERVE_OPTIONS)
@with_options(ENGINE_OPTIONS)
def serve(model_tag: str | None, host: str, port: int, **params: Any) -> None:
    """Serve vLLM's OpenAI API (completions, chat, /metrics) from the simulator.

    Example: loadlab sim serve --gpu h100 --max-num-seqs 64 --port 0
    """
    from loadlab.sim.hardware import resolve
    from loadlab.sim.server import serve as run_server

    if model_tag is not None:
        params["model"] = model_tag
    cfg = sim_config(params)
    resolved = resolve(cfg)
    for line in resolved.startup_lines():
        click.echo(f"INFO loadlab.sim: {line}")

    def announce(url: str) -> None:
        click.echo(f"INFO loadlab.sim: serving {resolved.served_model_name!r} on {url}")
        click.echo(f"Starting vLLM API server on {url}")
        sys.stdout.flush()

    run_server(cfg, host, port, resolved, announce)


REPLAY_OPTIONS: list[Callable] = [
    _opt("--profile", section=_PLAN, default="sharegpt", show_default=True,
         help="Workload profile name or path (see `loadlab profile list`)."),
    _opt("--concurrency", section=_PLAN,
         help="Closed-loop steps: users per step, e.g. 1,2,4,8 or 1:2:64 (start:factor:max)."),
    _opt("--rate", section=_PLAN,
         help="Open-loop steps: requests/s per step, e.g. 0.5,1,2 or 0.5:2:8."),
    _opt("--burstiness", section=_PLAN, type=float, default=1.0, show_default=True,
         help="Gamma shape of open-loop gaps (1 = Poisson)."),
    _opt("--step-duration", section=_PLAN, type=float, default=60.0, show_default=True,
         help="Virtual seconds per step."),
    _opt("--warmup", section=_PLAN, type=float, default=None,
         help="Seconds at the start of each step the analyzer cuts [default: a fifth of the step, at most 10]."),
    _opt("--metrics-interval", section=_PLAN, type=float, default=1.0, show_default=True,
         help="Virtual seconds between /metrics samples."),
    _opt("--metrics-names", section=_PLAN, type=click.Choice(["v1", "v0"]), default="v1",
         show_default=True, help="Metric names of vLLM V1 or of the V0 era."),
    _opt("--out", section=_PLAN, type=click.Path(file_okay=False), required=True,
         help="Run folder to write (requests.parquet, metrics.parquet, manifest.json)."),
    _opt("--overwrite", section=_PLAN, is_flag=True,
         help="Reuse an --out folder that holds a run: its tables and manifest are removed first."),
]


@sim.command(cls=GroupedCommand)
@with_options(REPLAY_OPTIONS)
@with_options(ENGINE_OPTIONS)
def replay(profile: str, concurrency: str | None, rate: str | None, burstiness: float,
           step_duration: float, warmup: float | None, metrics_interval: float, out: str, overwrite: bool,
           **params: Any) -> None:
    """Run a step load through the simulator in virtual time and write a run folder.

    Example: loadlab sim replay --concurrency 1,2,4,8 --step-duration 60 --out runs/sim
    """
    from loadlab.runstore.claim import claim_run_dir
    from loadlab.sim.replay import ReplayOptions, run_replay
    from loadlab.validate import plan_from_flags, validate

    cfg = sim_config(params)
    plan = plan_from_flags(concurrency=concurrency, rate=rate, step_duration_s=step_duration,
                           warmup_s=warmup, burstiness=burstiness)
    workload = validate(Workload, {"profile": profile, "seed": cfg.seed}, names={"seed": "--seed"})
    claim_run_dir(out, overwrite)
    shown = [-1]

    def progress(virtual_s: float, total_s: float | None) -> None:
        tenth = int(10 * virtual_s / total_s) if total_s else 10
        if tenth > shown[0]:
            shown[0] = tenth
            click.echo(f"replay: {virtual_s:,.0f} / {total_s:,.0f} virtual s", err=True)

    opts = ReplayOptions(metrics_interval_s=metrics_interval)
    summary = run_replay(cfg, plan, workload, out, opts, progress,
                         notice=lambda line: click.echo(f"replay: {line}", err=True))
    click.echo(f"replay: {summary.requests} requests ({summary.completed} completed, "
               f"{summary.aborted} aborted at the end), {summary.engine_steps} engine steps, "
               f"{summary.virtual_s:,.0f} virtual s in {summary.wall_s:.1f} s "
               f"({summary.speed:,.0f}x); run folder {summary.run_dir}")
