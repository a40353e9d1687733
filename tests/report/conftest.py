"""Fixtures of the report tests: simulator-made sweeps and a real headless Chromium.

Chromium is Debian's package (``apt-get install chromium``), driven by the
``playwright`` Python package pointed at that binary; playwright's own browser
download is never used. Without either the browser tests skip and say how to get
them; CI installs both (.ci/run, the test extra).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from report_folders import replay, sweep, write_verdict

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def ab_sweep(tmp_path_factory) -> Path:
    """max_num_seqs 8 (baseline) / 16 / 32 at 2..32 users, and a point whose server never
    came up."""
    root = tmp_path_factory.mktemp("ab-sweep")
    knees = {8: (8, 16), 16: (16, 32), 32: (None, None)}
    for cap, (lower, upper) in knees.items():
        run = replay(root / f"seqs-{cap}", max_num_seqs=cap, point=f"max_num_seqs={cap}")
        write_verdict(run, lower=lower, upper=upper, slo_level=lower or 32,
                      cause="seq_cap" if upper else "none")
    return sweep(
        root,
        [
            *(
                {"name": f"max_num_seqs={c}", "dir": f"seqs-{c}", "flags": {"max_num_seqs": c}}
                for c in knees
            ),
            {
                "name": "max_num_seqs=64",
                "dir": "seqs-64",
                "status": "failed",
                "flags": {"max_num_seqs": 64},
                "error": "server exited with code 1 before /health: CUDA out of memory",
            },
        ],
        mode="ab",
        baseline="max_num_seqs=8",
        name="max_num_seqs A/B",
    )


@dataclass
class Opened:
    """A page loaded in Chromium, with what it said and fetched."""

    page: object
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    """A headless Debian Chromium driven by playwright, with an empty profile.

    Module-scoped: playwright's sync API keeps an asyncio loop running in this thread
    while it is open, and every later test that calls ``asyncio.run`` would fail.
    """
    binary = os.environ.get("LOADLAB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("needs playwright: pip install -e '.[test]' (the Python package only; "
                    "it drives Debian's chromium, no browser download)")
    if not Path(binary).exists():
        pytest.skip("needs Debian's chromium: apt-get install chromium (or set LOADLAB_CHROMIUM)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=binary, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def open_page(chromium, tmp_path) -> Iterator:
    """open_page(path) loads a file:// page, waits until its charts are drawn, records errors."""
    context = chromium.new_context(viewport={"width": 1360, "height": 900})

    def _open(path: Path) -> Opened:
        page = context.new_page()
        opened = Opened(page=page)
        page.on(
            "console", lambda m: opened.console_errors.append(m.text) if m.type == "error" else None
        )
        page.on("pageerror", lambda e: opened.console_errors.append(str(e)))
        page.on("request", lambda r: opened.requests.append(r.url))
        page.goto(path.resolve().as_uri())
        page.wait_for_function("document.body.hasAttribute('data-charts')")
        return opened

    yield _open
    context.close()
