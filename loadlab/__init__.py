"""loadlab: find where a vLLM server's scheduler stalls, why, and which flag moves it."""

__version__ = "0.1.0"
