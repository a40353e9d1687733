"""``loadlab profile``: list shipped profiles, show one's figures, build one from a trace."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import click

from loadlab.cli.options import out_option
from loadlab.errors import InputError
from loadlab.workload import list_profiles, load_profile
from loadlab.workload.model import ProfileModel, Source, Summary, Table, dump_profile
from loadlab.workload.quantile import QuantileFn
from loadlab.workload.sampler import RequestSampler
from loadlab.workload.traces import FORMATS, Columns, TraceFormat, read_trace

_QUANTILES = ("p10", "p25", "p50", "p75", "p90", "p99")
REUSE_REQUESTS = 20_000


@click.group()
def profile() -> None:
    """Workload profiles: list, show their quantiles, build one from your own trace."""


@profile.command("list")
def list_cmd() -> None:
    """Names of the shipped profiles, with one line on each."""
    for name in list_profiles():
        model = load_profile(name).model
        click.echo(f"{name:24s} {model.description.split(':')[0][:70]}")


def _row(label: str, s: Summary) -> str:
    cells = "".join(f"{getattr(s, q):>9,.0f}" for q in _QUANTILES)
    return f"{label:8s}{s.mean:>9,.0f}{cells}{s.max:>9,.0f}"


def render(model: ProfileModel) -> str:
    """The readable summary `profile show` prints."""
    lengths, arr = model.lengths, model.arrivals
    lines = [
        f"{model.name}: {model.description}",
        f"source: {model.source.dataset} [{model.source.licence}]",
        f"        {model.source.origin}",
        f"cite:   {model.source.citation}",
        f"requests in source: {lengths.input_summary.n:,.0f}",
        "",
        f"{'tokens':8s}{'mean':>9s}" + "".join(f"{q:>9s}" for q in _QUANTILES) + f"{'max':>9s}",
        _row("input", lengths.input_summary),
        _row("output", lengths.output_summary),
    ]
    if lengths.joint:
        lines.append(
            f"lengths sampled as pairs ({len(lengths.joint.pairs)} rank pairs, "
            f"Spearman {lengths.joint.spearman:+.2f} in the source)"
        )
    else:
        lines.append("input and output sampled independently")
    lines.append("")
    if arr.process == "none":
        lines.append("arrivals: none in the source (drive the rate from the load shape)")
    else:
        shape = f", gamma shape {arr.gamma_shape:g}" if arr.gamma_shape else ""
        lines.append(
            f"arrivals: {arr.process}, {arr.rate_per_s:g} req/s, inter-arrival CV {arr.cv:g}{shape}"
        )
        st = arr.stats
        extra = [
            f"{k} {v:g}"
            for k, v in (
                ("span_s", st.span_s),
                ("var/mean 1s", st.dispersion_1s),
                ("var/mean 60s", st.dispersion_60s),
                ("busiest minute/mean", st.peak_minute_over_mean),
            )
            if v is not None
        ]
        if extra:
            lines.append("          " + ", ".join(extra))
        if st.note:
            lines.append(f"          note: {st.note}")
    lines += _prefix_lines(model)
    return "\n".join(lines)


def _prefix_lines(model: ProfileModel) -> list[str]:
    """Prefix structure: sessions, turns, what a cache reuses and what it must hold."""
    pre = model.prefix
    stats = [f"            {k} {v:g}" for k, v in pre.stats.items()]
    if stats:
        stats.insert(0, "          in the source (time order, a cache keeping all):")
    if pre.kind == "none":
        return ["prefix:   none (every prompt unique)", *stats]
    common = f"every request opens with the same {pre.common_tokens:,} tokens"
    if pre.sessions is None:
        return [f"prefix:   {common}", *stats]
    ses = pre.sessions
    sampler = RequestSampler(model, seed=0)
    specs = [sampler.spec(seq) for seq in range(REUSE_REQUESTS)]
    later = sum(s.turn is not None and s.turn > 0 for s in specs) / len(specs)
    mean_prompt = sum(s.prompt_tokens for s in specs) / len(specs)
    reuse = sum(s.reused_tokens for s in specs) / (mean_prompt * len(specs))
    extend = [t.extend_share for c in ses.classes for t in c.transitions]
    active = ses.active
    lines = [
        f"prefix:   sessions{'; ' + common if pre.common_tokens else ''}",
        (f"{active} sessions at once: request seq is a turn of the session in slot seq % "
        f"{active}, so a session's next turn comes {active} requests later"),
        (f"turns per session: median {_at(ses.turns, 0.5):g}, p90 {_at(ses.turns, 0.9):g}, max "
        f"{ses.turns.v[-1]:g}; {later:.0%} of requests are later turns"),
        (f"a later turn extends the previous prompt {min(extend):.0%}-{max(extend):.0%} of the "
        "time (by turn and context class), else keeps part of it and adds its own"),
        (f"expected prefix reuse (first {REUSE_REQUESTS:,} requests, a cache keeping all): "
        f"{reuse:.3f} of prompt tokens"),
        (f"to see it a server's prefix cache must hold ~{active} x {mean_prompt:,.0f} = "
        f"{active * mean_prompt:,.0f} tokens (active sessions x mean prompt)"),
    ]
    if ses.gap_s is not None:
        lines.append(
            f"in the source a turn came a median {ses.gap_s.p50:,.0f} s after the one before"
        )
    return [lines[0]] + ["          " + line for line in lines[1:]] + stats


def _at(table: Table, p: float) -> float:
    return round(QuantileFn(table)(p))


@profile.command("show")
@click.argument("name")
def show(name: str) -> None:
    """Quantiles, arrival and prefix figures of a profile (a shipped NAME or a file)."""
    click.echo(render(load_profile(name).model))


@profile.command("build")
@click.argument("trace", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default=None,
    help="trace format; recognised from the file header (Azure, Mooncake) or suffix when omitted",
)
@click.option("--input-col", default=None, help="column with prompt lengths (csv/jsonl)")
@click.option("--output-col", default=None, help="column with output lengths (csv/jsonl)")
@click.option("--time-col", default=None, help="column with request times (optional)")
@click.option(
    "--time-unit", type=click.Choice(["s", "ms"]), default="s", help="unit of numeric times"
)
@click.option("--name", required=True, help="profile name")
@out_option("profile file to write", file=True, required=True)
@click.option(
    "--pairs/--independent",
    "paired",
    default=None,
    help="keep (input, output) pairs; default: only when they are correlated (|rho| >= 0.3)",
)
@click.option("--licence", default="unknown (user-supplied trace)", help="licence of the trace")
@click.option("--citation", default="none", help="what to cite for the trace")
@click.option("--description", default=None, help="one line on what this workload is")
def build(
    trace: Path,
    fmt: TraceFormat | None,
    input_col: str | None,
    output_col: str | None,
    time_col: str | None,
    time_unit: Literal["s", "ms"],
    name: str,
    out: Path,
    paired: bool | None,
    licence: str,
    citation: str,
    description: str | None,
) -> None:
    """Turn your own TRACE into a profile (only derived figures are written)."""
    from loadlab.workload.derive import fit_profile

    if out.resolve() == trace.resolve():
        raise InputError("is the input trace; writing the profile would overwrite it", source=out,
                         field="--out",
                         fix="give the profile its own path, e.g. profiles/NAME.yaml")
    columns = None
    if input_col or output_col or fmt in ("csv", "jsonl"):
        columns = Columns(
            input_col or "input_tokens", output_col or "output_tokens", time_col, time_unit
        )
    data = read_trace(trace, fmt, columns)
    source = Source(
        dataset=trace.name,
        origin=str(trace),
        licence=licence,
        citation=citation,
        derivation="loadlab profile build: inverse-CDF tables, fitted arrivals, prefix groups",
    )
    model = fit_profile(
        data, name, description or f"Built from {trace.name} ({len(data)} requests)", source, paired
    )
    out.write_text(dump_profile(model), encoding="utf-8")
    click.echo(f"wrote {out} ({len(data)} requests)")
