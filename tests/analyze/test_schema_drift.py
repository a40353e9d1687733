"""A requests part that lost a column exits 2 naming it; a part from another run is left
out with a warning naming it (issue #17, item 11)."""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from loadlab.analyze.analysis import analyze_run
from loadlab.errors import InputError
from loadlab.runstore import REQUESTS, PartWriter, write_manifest


def _folder(run_dir, shift_s: float = 0.0, point: str = "") -> None:
    write_manifest(run_dir, {"kind": "run", "status": "complete", "point": point, "steps": [
        {"step": k, "concurrency": 2, "t_start": 100.0 + 10 * k, "t_end": 110.0 + 10 * k,
         "warmup_s": 0.0} for k in range(2)]})
    rows = [{"point": point, "step": k, "worker": "w", "seq": i, "request_id": f"r{k}-{i}",
             "t_issued": t, "t_sent": t, "t_done": t + 0.2, "status": "ok", "ttft_s": 0.05,
             "e2e_s": 0.2, "n_chunks": 4, "output_tokens": 4}
            for k in range(2) for i in range(12) for t in [shift_s + 101.0 + 10 * k + i * 0.5]]
    with PartWriter(run_dir / "requests.parquet", REQUESTS, writer_id="w") as writer:
        writer.extend(rows)


def _only_part(run_dir):
    (part,) = (run_dir / "requests.parquet").glob("part-*.parquet")
    return part


@pytest.mark.parametrize("change", ["drop", "rename"])
@pytest.mark.parametrize("column", ["status", "ttft_s"])
def test_a_part_without_a_required_column_exits_2_naming_it(tmp_path, change, column) -> None:
    _folder(tmp_path)
    part = _only_part(tmp_path)
    table = pq.read_table(part)
    i = table.schema.get_field_index(column)
    renamed = [f"{n}_old" if n == column else n for n in table.column_names]
    table = table.remove_column(i) if change == "drop" else table.rename_columns(renamed)
    pq.write_table(table, part)
    with pytest.raises(InputError) as err:
        analyze_run(tmp_path)
    assert err.value.field == column and part.name in str(err.value.source)
    res = subprocess.run([sys.executable, "-m", "loadlab", "analyze", str(tmp_path)],
                         capture_output=True, text=True, check=False, timeout=120)
    assert res.returncode == 2, res.stderr
    assert part.name in res.stderr and repr(column) in res.stderr and "move it out" in res.stderr
    assert "no request succeeded" not in res.stdout + res.stderr


def test_a_part_from_another_run_is_left_out_with_a_warning(tmp_path) -> None:
    _folder(tmp_path / "this")
    _folder(tmp_path / "other", shift_s=86_400.0)
    stray = _only_part(tmp_path / "other")
    moved = tmp_path / "this" / "requests.parquet" / stray.name.replace("-w-", "-x-")
    stray.rename(moved)
    data = analyze_run(tmp_path / "this").as_json()
    assert [s["n_sent"] for s in data["steps"]] == [12, 12]
    said = [w for w in data["warnings"] if moved.name in w]
    assert len(said) == 1 and "from another run, left out" in said[0], data["warnings"]


def test_a_part_of_another_sweep_point_is_left_out(tmp_path) -> None:
    _folder(tmp_path / "a", point="a")
    _folder(tmp_path / "b", point="b")
    stray = _only_part(tmp_path / "b")
    moved = tmp_path / "a" / "requests.parquet" / stray.name.replace("-w-", "-x-")
    stray.rename(moved)
    data = analyze_run(tmp_path / "a").as_json()
    assert [s["n_sent"] for s in data["steps"]] == [12, 12]
    assert any(moved.name in w and "point 'b'" in w for w in data["warnings"]), data["warnings"]
