"""Every string from a run folder is text in the report, never markup or script."""

from __future__ import annotations

import json
import shutil

from loadlab.report.page import write_report

HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2"> &amp; &lt;'


def _poison(root) -> None:
    """Put the hostile string everywhere a run folder carries free text."""
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["scenario"]["name"] = f"sweep {HOSTILE}"
    manifest["points"][0]["name"] = f"base {HOSTILE}"
    manifest["sweep"]["baseline"] = f"base {HOSTILE}"
    manifest["points"][1]["flags"] = {"max_num_seqs": 16, "served_model_name": HOSTILE}
    manifest["points"][3]["error"] = f"server said {HOSTILE}"
    (root / "manifest.json").write_text(json.dumps(manifest))
    run = root / "seqs-8"
    point = json.loads((run / "manifest.json").read_text())
    point["target"]["model"] = HOSTILE
    point["workload"]["profile"] = HOSTILE
    (run / "manifest.json").write_text(json.dumps(point))
    analysis = json.loads((run / "analysis.json").read_text())
    analysis["warnings"] = [f"warning {HOSTILE}"]
    analysis["cause"]["knob"] = HOSTILE
    analysis["cause"]["evidence"][0]["what"] = HOSTILE
    analysis["capacity"][HOSTILE] = HOSTILE
    (run / "analysis.json").write_text(json.dumps(analysis))


def test_hostile_strings_stay_text(ab_sweep, tmp_path, open_page):
    root = tmp_path / "hostile"
    shutil.copytree(ab_sweep, root)
    _poison(root)
    path = write_report(root)
    html = path.read_text()
    assert "<img src=x" not in html and "<script>window" not in html
    opened = open_page(path)
    page = opened.page
    assert opened.console_errors == []
    assert page.evaluate("window.__pwned") is None
    assert page.locator("img").count() == 0
    text = page.inner_text("body")
    # shown literally: title, point name, flag, error, model, warning, knob, evidence, capacity key
    assert text.count(HOSTILE) >= 9
    assert HOSTILE in page.title()
    # plotly draws names as SVG text: the legend shows the string too, as text
    legend = page.evaluate("document.querySelector('#comparison-chart .legend').textContent")
    assert f"base {HOSTILE}" in legend
