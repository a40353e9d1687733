"""Sweeps: start the server under test (launcher), expand plans, run points."""

from loadlab.experiment.launcher import LaunchedTarget, find_vllm, launch_target

__all__ = ["LaunchedTarget", "find_vllm", "launch_target"]
