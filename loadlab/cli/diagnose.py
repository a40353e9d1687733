"""``loadlab diagnose --target URL``: its flags (the checklist: :mod:`loadlab.analyze.diagnose`)."""

from __future__ import annotations

import click

from loadlab.cli.options import api_key_env_option, interval_option, target_option
from loadlab.errors import InputError


@click.command()
@target_option("Base URL of the live server, e.g. http://127.0.0.1:8000", aliases=("--url",))
@click.option("--duration", "duration_s", type=float, default=10.0, show_default=True,
              help="Seconds of /metrics per diagnosis (cut into up to three windows).")
@interval_option()
@click.option("--watch", is_flag=True, help="Repeat windows until Ctrl-C, a line each.")
@click.option("--max-num-seqs", type=int, default=None,
              help="The server's --max-num-seqs, if known.")
@click.option("--max-num-batched-tokens", type=int, default=None,
              help="The server's --max-num-batched-tokens, if known.")
@api_key_env_option()
def diagnose(target: str | None, duration_s: float, interval_s: float, watch: bool,
             max_num_seqs: int | None, max_num_batched_tokens: int | None,
             api_key_env: str) -> None:
    """Sample a live server's /metrics (read-only) in up to three windows and walk the
    stall checklist: caliber, running vs waiting vs the cap (inferred only from a running
    plateau across windows), KV usage, preemptions, prefix cache, and the scheduler's own
    reason where the server exports loadlab's probe; then name the likely cause, how sure
    it is, and the knob that moves it."""
    from loadlab.analyze.diagnose import checklist, diagnose_window, sample, watch_line

    if not target:  # not required=True: the --url alias may fill it
        raise click.MissingParameter(param_hint="'--target'", param_type="option")
    if not duration_s > 0:
        raise InputError(f"--duration must be > 0, got {duration_s}", field="--duration",
                         fix="e.g. --duration 10")
    server = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens}
    result = diagnose_window(sample(target, duration_s, interval_s, api_key_env), server)
    click.echo("\n".join(checklist(target, result, duration_s, interval_s)))
    while watch:
        result = diagnose_window(sample(target, duration_s, interval_s, api_key_env), server)
        click.echo(watch_line(result))
