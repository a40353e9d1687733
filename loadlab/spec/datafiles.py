"""Where loadlab finds the data folders it ships (workload profiles, scenarios).

The repository keeps each one as a top-level folder (``profiles/``) where users and
tests edit it. A wheel carries it inside the package as ``loadlab/<folder>/`` (setup.py
maps the top-level folder onto the package ``loadlab.<folder>``; one copy in git).
:func:`data_dir` looks inside the package first (an installed wheel), then beside it
(a checkout, an editable install, a clone on ``PYTHONPATH``, which so reads its own
files). To ship another folder: add it to ``DATA_FOLDERS`` in setup.py and read it
through :func:`data_dir`.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]


def data_dir(name: str) -> Path:
    """The shipped folder ``name``; in neither place, the checkout path (that does not exist)."""
    inside = _PACKAGE / name
    return inside if inside.is_dir() else _PACKAGE.parent / name


def checkout_root() -> Path | None:
    """The repository root when loadlab runs from a checkout, None when it is installed.

    Tools a checkout sets up beside itself (``tools/install_vllm.sh`` makes ``.vllm-venv``)
    exist only there; an installed package's parent is ``site-packages``, not a repository.
    """
    root = _PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() else None
