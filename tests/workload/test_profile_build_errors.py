"""`loadlab profile build` refuses a binary file and will not write over its own input."""

from __future__ import annotations

import gzip

import pytest

from loadlab.cli import main

AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,10,5\n"
    "2023-11-16 18:15:47.0,20,6\n"
)


def _build(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(["profile", "build", *args, "--name", "mine"])
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "suffix,fmt",
    [
        (".csv.gz", ["--format", "azure"]),
        (".csv", ["--input-col", "a", "--output-col", "b"]),
        (".jsonl", ["--input-col", "a", "--output-col", "b"]),
    ],
)
def test_binary_trace_is_one_line_exit_2(capsys, tmp_path, suffix, fmt) -> None:
    trace = tmp_path / f"trace{suffix}"
    trace.write_bytes(gzip.compress(AZURE.encode()))
    code, err = _build(capsys, str(trace), *fmt, "--out", str(tmp_path / "p.yaml"))
    assert code == 2 and err.count("\n") == 1 and f"{trace}: not a text trace" in err, err
    assert not (tmp_path / "p.yaml").exists()


def test_out_equal_to_the_trace_leaves_the_trace_alone(capsys, tmp_path, monkeypatch) -> None:
    trace = tmp_path / "azure.csv"
    trace.write_text(AZURE)
    monkeypatch.chdir(tmp_path)
    code, err = _build(capsys, str(trace), "--out", "./azure.csv")
    assert code == 2 and "--out: is the input trace" in err, err
    assert trace.read_text() == AZURE
