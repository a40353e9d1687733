"""``loadlab tune RUN --search FLAG=VALUES... [--confirm]``."""

from __future__ import annotations

import time
from pathlib import Path

import click

from loadlab.cli.options import out_option


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dir", metavar="RUN", type=click.Path(path_type=Path))
@click.option("--search", "specs", multiple=True, metavar="FLAG=V1,V2,...",
              help="A flag and the values to try (repeat for a grid): max-num-seqs, "
                   "max-num-batched-tokens, block-size, enable-chunked-prefill, "
                   "enable-prefix-caching, gpu-memory-utilization, max-model-len.")
@click.option("--memory", type=click.FloatRange(0, 1, min_open=True), default=None,
              metavar="FRACTION",
              help="The most gpu-memory-utilization the server may take [default: no ceiling].")
@click.option("--longest-prompt", type=click.IntRange(1), default=None, metavar="TOKENS",
              help="The longest prompt every configuration must serve [default: the run's].")
@click.option("--slo", default=None, metavar="NAME=VALUE,...",
              help="Objectives a level must meet, e.g. ttft_p99_ms=500 [default: the run's].")
@click.option("--top", type=click.IntRange(1), default=3, show_default=True,
              help="Candidates in the written scenario beside the current configuration.")
@click.option("--max-candidates", type=click.IntRange(1), default=24, show_default=True,
              help="Configurations replayed at most; the rest of the grid is cut (and said so).")
@click.option("--max-level", type=click.FloatRange(0, min_open=True), default=None,
              help="Extend the run's levels by doubling up to this [default: 4x its top].")
@click.option("--model", default=None,
              help="Simulator model profile for the step times [default: the run's, when the "
                   "simulator served it, else llama-3.1-8b].")
@click.option("--gpu", default=None,
              help="Simulator GPU profile [default: the run's, else h100].")
@click.option("--calibration", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, metavar="FILE",
              help="A fitted step-time model (`loadlab sim calibrate`) to replay with.")
@click.option("--confirm", is_flag=True,
              help="Then run one real A/B (current vs best) on the run's server and print "
                   "predicted against measured.")
@out_option("Folder to write tune.json, tune.yaml and the replays "
            "[default: reports/tune-<run>-<time>].", metavar="DIR")
def tune(run_dir: Path, specs: tuple[str, ...], memory: float | None,
         longest_prompt: int | None, slo: str | None, top: int, max_candidates: int,
         max_level: float | None, model: str | None, gpu: str | None,
         calibration: Path | None, confirm: bool, out: Path | None) -> None:
    """Which flag change moves the knee of RUN: replay the run's server and request
    lengths over a grid of flag values in virtual time, and rank them by predicted knee
    under the run's SLO (ties: TTFT/ITL at the run's top level).

    Example: loadlab tune reports/run-1 --search max-num-seqs=8,16,32
    --search max-num-batched-tokens=2048,8192 --memory 0.9
    """
    from loadlab.experiment.tune import TuneRequest, table
    from loadlab.experiment.tune import tune as run_tune
    from loadlab.experiment.tune_space import parse_search

    request = TuneRequest(parse_search(specs), memory, longest_prompt, slo, top, max_candidates,
                          max_level, model, gpu, calibration)
    folder = out or Path("reports") / f"tune-{run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    result = run_tune(run_dir, request, folder, lambda text: click.echo(text, err=True))
    click.echo("\n".join(table(result)))
    click.echo(f"\nwrote {folder / 'tune.json'} and {folder / 'tune.yaml'} "
               f"(`loadlab sweep {folder / 'tune.yaml'} --what-if` replays it)")
    if confirm:
        from loadlab.experiment.tune_confirm import confirm as run_confirm
        from loadlab.experiment.tune_confirm import confirm_table

        pairs = run_confirm(result, lambda text: click.echo(text, err=True))
        click.echo("\npredicted / measured (one real A/B):")
        click.echo("\n".join(confirm_table(pairs, result.top_level)))
