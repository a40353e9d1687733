"""The environment of a benchmark's child process that imports another loadlab tree.

Benchmarks that compare two trees side by side (``--against``) run each in a fresh
process whose ``PYTHONPATH`` names the tree. The parent's own ``import loadlab`` has set
``ARROW_DEFAULT_MEMORY_POOL`` (``loadlab/__init__.py`` picks Arrow's allocator), so a
child that inherited it would run an older tree with this tree's allocator: it is left
out, and each tree picks its own.
"""

from __future__ import annotations

import os
from pathlib import Path

_POOL = "ARROW_DEFAULT_MEMORY_POOL"


def tree_env(tree: Path) -> dict[str, str]:
    """This process's environment for a child importing ``tree``'s loadlab."""
    return {**{k: v for k, v in os.environ.items() if k != _POOL}, "PYTHONPATH": str(tree)}
