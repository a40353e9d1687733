"""`loadlab profile build/show/list` on small trace files of every format, and the
errors a user gets for bad traces and bad profile files (exit 2, file, line, field, fix)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from loadlab.cli import main
from loadlab.errors import InputError
from loadlab.workload import list_profiles, load_profile

ROWS = 60


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def _lengths(seed: int) -> tuple[np.ndarray, np.ndarray]:
    gen = np.random.default_rng(seed)
    return gen.integers(10, 4000, ROWS), gen.integers(1, 500, ROWS)


def test_build_from_azure_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inp, out = _lengths(1)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [
        f"2023-11-16 18:{15 + k // 30:02d}:{(2 * k) % 60:02d}.5000000,{a},{b}"
        for k, (a, b) in enumerate(zip(inp, out))
    ]
    trace = tmp_path / "requests.csv"
    trace.write_text("\n".join(lines) + "\n")
    target = tmp_path / "mine.yaml"
    code, _, err = run(
        [
            "profile",
            "build",
            str(trace),  # format recognised from the header
            "--name",
            "mine",
            "--out",
            str(target),
        ],
        capsys,
    )
    assert code == 0, err
    model = load_profile(str(target)).model
    assert model.lengths.input_summary.n == ROWS
    assert model.lengths.input_summary.p50 == pytest.approx(np.percentile(inp, 50))
    assert model.arrivals.rate_per_s == pytest.approx(0.5, rel=0.01)  # one request every 2 s


def test_build_from_mooncake_jsonl_finds_sessions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = []
    for k in range(ROWS):
        conv = k % 10  # ten conversations, each turn extends the previous one's blocks
        blocks = [0, 1 + conv] + [1000 * (conv + 1) + j for j in range(k // 10)]
        rows.append(
            {
                "timestamp": 500 * k,
                "input_length": 512 * len(blocks) - 7,
                "output_length": 20 + k,
                "hash_ids": blocks,
            }
        )
    trace = tmp_path / "mooncake_trace.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    target = tmp_path / "mc.yaml"
    code, _, err = run(
        [
            "profile",
            "build",
            str(trace),
            "--format",
            "mooncake",
            "--name",
            "mc",
            "--out",
            str(target),
        ],
        capsys,
    )
    assert code == 0, err
    pre = load_profile(str(target)).model.prefix
    assert pre.kind == "sessions" and pre.common_tokens == 512 and pre.stats["sessions"] == 10
    assert pre.sessions is not None and pre.sessions.turns.v[0] == pre.sessions.turns.v[-1] == 6
    cells = [t for c in pre.sessions.classes for t in c.transitions]
    assert cells and all(t.extend_share == 1.0 and t.growth_tokens is not None for t in cells)
    assert all(
        t.growth_tokens.v[0] == t.growth_tokens.v[-1] == 512 for t in cells if t.growth_tokens
    )
    code, shown, _ = run(["profile", "show", str(target)], capsys)
    assert code == 0 and "every request opens with the same 512 tokens" in shown
    assert (
        "turns per session: median 6" in shown and "extends the previous prompt 100%-100%" in shown
    )


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_build_from_named_columns(
    tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    inp, out = _lengths(2)
    trace = tmp_path / f"mine.{fmt}"
    if fmt == "csv":
        trace.write_text(
            "req,prompt_len,gen_len,t\n"
            + "".join(f"{k},{a},{b},{k * 250}\n" for k, (a, b) in enumerate(zip(inp, out)))
        )
    else:
        trace.write_text(
            "".join(
                json.dumps({"prompt_len": int(a), "gen_len": int(b), "t": k * 250}) + "\n"
                for k, (a, b) in enumerate(zip(inp, out))
            )
        )
    target = tmp_path / "named.yaml"
    code, _, err = run(
        [
            "profile",
            "build",
            str(trace),
            "--format",
            fmt,
            "--input-col",
            "prompt_len",
            "--output-col",
            "gen_len",
            "--time-col",
            "t",
            "--time-unit",
            "ms",
            "--name",
            "named",
            "--out",
            str(target),
        ],
        capsys,
    )
    assert code == 0, err
    model = load_profile(str(target)).model
    assert model.lengths.output_summary.max == out.max()
    assert model.arrivals.rate_per_s == pytest.approx(4.0, rel=0.01)


def test_non_integer_length_names_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = ["a,b"] + [f"{10 + k},{5 + k}" for k in range(20)]
    lines[16] = "12.5,7"  # line 17 of the file
    trace = tmp_path / "bad.csv"
    trace.write_text("\n".join(lines) + "\n")
    code, _, err = run(
        [
            "profile",
            "build",
            str(trace),
            "--format",
            "csv",
            "--input-col",
            "a",
            "--output-col",
            "b",
            "--name",
            "x",
            "--out",
            str(tmp_path / "x.yaml"),
        ],
        capsys,
    )
    assert code == 2
    assert "bad.csv" in err and "line 17" in err and "column a" in err and "fix:" in err


def test_missing_column_lists_the_columns_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "cols.csv"
    trace.write_text("prompt,completion\n5,6\n")
    code, _, err = run(
        [
            "profile",
            "build",
            str(trace),
            "--format",
            "csv",
            "--input-col",
            "input",
            "--output-col",
            "completion",
            "--name",
            "x",
            "--out",
            str(tmp_path / "x.yaml"),
        ],
        capsys,
    )
    assert code == 2 and "input" in err and "columns found: prompt, completion" in err


def test_bad_json_line_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"input_length": 5, "output_length": 3, "timestamp": 0}\n{"input_length": 5,\n'
    )
    code, _, err = run(
        [
            "profile",
            "build",
            str(trace),
            "--format",
            "mooncake",
            "--name",
            "x",
            "--out",
            str(tmp_path / "x.yaml"),
        ],
        capsys,
    )
    assert code == 2 and "line 2" in err and "t.jsonl" in err


def _write_profile(tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    data = yaml.safe_load(Path(str(load_profile("azure-conv").path)).read_text())
    edit(data)
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_bad_profile_fields_are_named_with_allowed_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write_profile(tmp_path, lambda d: d["arrivals"].update(process="weibull"))
    code, _, err = run(["profile", "show", str(path)], capsys)
    assert code == 2 and "edited.yaml" in err and "arrivals.process" in err and "'poisson'" in err
    path = _write_profile(tmp_path, lambda d: d["lengths"]["input"]["v"].reverse())
    with pytest.raises(InputError, match=r"lengths\.input.*non-decreasing"):
        load_profile(str(path))
    path = _write_profile(tmp_path, lambda d: d.pop("source"))
    with pytest.raises(InputError, match="source"):
        load_profile(str(path))
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nlengths: [1, 2\n")
    with pytest.raises(InputError, match="line"):
        load_profile(str(broken))


def test_unknown_name_lists_the_shipped_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["profile", "show", "no-such-profile"], capsys)
    assert code == 2 and "azure-code" in err and "sharegpt" in err


def test_list_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["profile", "list"], capsys)
    assert code == 0 and all(name in out for name in list_profiles())
    code, out, _ = run(["profile", "show", "bwb"], capsys)
    assert code == 0
    header = next(line for line in out.splitlines() if line.startswith("tokens"))
    assert header.split() == ["tokens", "mean", "p10", "p25", "p50", "p75", "p90", "p99", "max"]
    row = next(line for line in out.splitlines() if line.startswith("output")).split()
    assert row[4] == "1,601"  # BWB output median (columns: label, mean, p10, p25, p50, ...)
    assert "Spearman +0.81" in out
