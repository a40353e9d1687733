"""loadlab: find where a vLLM server's scheduler stalls, why, and which flag moves it."""

from loadlab.version import __version__

__all__ = ["__version__"]
