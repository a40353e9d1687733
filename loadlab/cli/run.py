"""``loadlab run``: drive a load at a server and record every request.

Load plan (exactly one): ``--concurrency 1,2,4,8`` or ``--geometric 1:2:64``
(closed-loop steps of ``--step-duration`` seconds, first ``--warmup`` cut by the
analyzer); ``--search START:MAX:RESOLUTION`` (an adaptive knee search over closed-loop
users; give ``--collect`` so it sees the server's queue); ``--rate R[,R2...]`` with
optional ``--burstiness B`` (open-loop Poisson, gamma when B != 1); ``--trace-replay FILE``
with ``--time-scale X`` (recorded arrival times x X).

Workers: ``--workers N`` local worker processes (default 1; 0 runs in this process).
Across machines: start the master with ``--master-bind 0.0.0.0:5557 --remote-workers M``
and on each other machine ``loadlab run --join MASTER:5557``.

CPU isolation: ``--client-cpus 1`` runs the load generator on CPU 1; with ``--launch``,
``--server-cpus 0`` runs the server on CPU 0. When the client fell short at any step the
run is still written and the command exits 3 naming the steps and why.

The flags are declared here; what they do is :mod:`loadlab.experiment.run` (the plan is
built by :func:`loadlab.spec.validate.plan_from_flags`).
"""

from __future__ import annotations

from typing import Any

import click

from loadlab.cli.options import (
    api_key_env_option,
    interval_option,
    out_option,
    replica_metrics_option,
    target_option,
    tls_options,
)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
@target_option()
@click.option("--model", help="Model name to send (the server's served name). With --launch: the "
              "model to serve (vllm: its path or name, unless one follows --; sim: a model "
              "profile, e.g. qwen2.5-7b).")
@click.option("--api", type=click.Choice(["completions", "chat"]), default="completions",
              show_default=True)
@click.option("--profile", default="sharegpt", show_default=True,
              help="Workload profile name or file.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--concurrency", help="Closed-loop levels, e.g. 1,2,4,8.")
@click.option("--geometric", help="Closed-loop levels start:factor:max, e.g. 1:2:64.")
@click.option("--search", help="Adaptive knee search over users start:max:resolution, e.g. 2:64:2.")
@click.option("--rate", help="Open-loop arrival rate(s) in requests/s, e.g. 5 or 5,10,20.")
@click.option("--burstiness", type=float, default=None,
              help="Gamma shape of inter-arrivals (1 = Poisson).")
@click.option("--trace-replay", "trace", type=click.Path(),
              help="Replay a trace's arrivals and lengths.")
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="Replay: multiply recorded offsets.")
@click.option("--step-duration", type=float, default=60.0, show_default=True,
              help="Seconds per step.")
@click.option("--warmup", type=float, default=None,
              help="Seconds cut from each step's start [default: a fifth of the step, at most 10].")
@click.option("--max-in-flight", type=int, default=10000, show_default=True,
              help="Open loop: per-worker cap.")
@click.option("--workers", type=int, default=1, show_default=True,
              help="Local worker processes (0: in-process).")
@click.option("--remote-workers", type=click.IntRange(min=0), default=0, show_default=True,
              help="Workers joining from other machines.")
@click.option("--master-bind", default="127.0.0.1:0", show_default=True,
              help="host:port the master listens on.")
@click.option("--join", help="Run as a worker of the master at host:port (nothing else needed).")
@out_option("Run folder to write [default: reports/run-<time>].")
@click.option("--overwrite", is_flag=True, help="Reuse an --out folder that holds a run: its "
              "tables, manifest and server log are removed first.")
@click.option("--point", default="", help="Sweep point name stored in every row.")
@api_key_env_option()
@tls_options()
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=600.0,
              show_default=True, help="Per-request deadline, seconds.")
@click.option("--drain", "drain_s", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True, help="Seconds in-flight requests get at the end.")
@click.option("--collect", is_flag=True,
              help="Also sample the target's /metrics into the run folder.")
@replica_metrics_option("--target is a gateway: scrape each replica's /metrics (base URLs) "
                        "instead of the gateway's, so the analysis judges each replica and "
                        "the routing. Implies --collect.")
@interval_option("With --collect: seconds between /metrics scrapes.",
                 aliases=("--collect-interval",))
@click.option("--launch", type=click.Choice(["sim", "vllm"]),
              help="Start the target first; server flags follow '--'. --target is then not needed.")
@click.option("--probe", is_flag=True,
              help="With --launch vllm: load loadlab_probe into the server (--scheduler-cls) and "
              "collect why its scheduler refuses requests (loadlab: series).")
@click.option("--calibrate/--no-calibrate", default=True, show_default=True,
              help="Fit prompt text to exact token counts with the server's /tokenize.")
@click.option("--server-cpus",
              help="With --launch: run the server's every thread on these CPUs, e.g. 0 or 0-3.")
@click.option("--client-cpus",
              help="Run the load generator (and its local workers) on these CPUs, e.g. 1.")
def run(server_args: tuple[str, ...], join: str | None, **o: Any) -> None:
    """Drive a load (steps, Poisson/gamma rate, trace replay) at a server and record every request.

    Example: loadlab run --launch sim --concurrency 1,2,4 --step-duration 20 --collect
    -- --max-num-seqs 4

    Exit codes: 0 complete, 1 stopped or failed, 2 bad input, 3 client limited, 4 nothing
    succeeded, 5 the run folder's disk refused a write (unwritten rows saved and named),
    130 Ctrl-C, 143 SIGTERM.
    """
    from loadlab.experiment.run import RunRequest, isolation, join_worker, run_load, trace_span_s
    from loadlab.spec.validate import plan_from_flags

    if join:
        join_worker(join, isolation(o["server_cpus"], o["client_cpus"], o["launch"]))
        return
    plan = plan_from_flags(
        concurrency=o.pop("concurrency"), geometric=o.pop("geometric"), search=o.pop("search"),
        rate=o.pop("rate"), burstiness=o.pop("burstiness"), trace=o.pop("trace"),
        time_scale=o.pop("time_scale"), step_duration_s=o.pop("step_duration"),
        warmup_s=o.pop("warmup"), max_in_flight=o.pop("max_in_flight"), trace_span=trace_span_s)
    run_load(RunRequest(server_args=server_args, **o), plan, say=click.echo,
             note=lambda line: click.echo(line, err=True))
