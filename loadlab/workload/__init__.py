"""Workload profiles: trace-derived length, arrival and prefix-sharing distributions.

Public API (other parts of loadlab code against exactly this):

- ``load_profile(name_or_path) -> Profile``: a shipped name (see ``list_profiles()``)
  or a path to a profile YAML file.
- ``list_profiles() -> list[str]``: names of the profiles shipped in ``profiles/``.
- ``Profile.sampler(seed, active_sessions=None) -> RequestSampler``;
  ``RequestSampler.spec(seq) -> RequestSpec``; sessions in :mod:`loadlab.workload.sessions`.
- Arrival schedules in :mod:`loadlab.workload.arrivals`, prompt text in
  :mod:`loadlab.workload.prompts`, trace readers in :mod:`loadlab.workload.traces`.

Shipped profiles live in the repository's ``profiles/`` folder (inside the package
once installed from a wheel: :func:`loadlab.spec.datafiles.data_dir`) and are regenerated
from the public traces by ``python -m loadlab.workload.shipped``; nothing here needs
the traces at run time.
"""

from __future__ import annotations

from pathlib import Path

from loadlab.errors import InputError
from loadlab.spec.datafiles import data_dir
from loadlab.workload.model import read_profile_file
from loadlab.workload.sampler import Profile, RequestSampler, RequestSpec

PROFILES_DIR = data_dir("profiles")
SUFFIX = ".yaml"

__all__ = [
    "PROFILES_DIR",
    "Profile",
    "RequestSampler",
    "RequestSpec",
    "list_profiles",
    "load_profile",
]


def list_profiles() -> list[str]:
    """Names of the shipped profiles, sorted."""
    if not PROFILES_DIR.is_dir():
        return []
    return sorted(p.stem for p in PROFILES_DIR.glob(f"*{SUFFIX}"))


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name, or a profile file by path."""
    text = str(name_or_path)
    candidate = Path(text)
    if candidate.suffix in (".yaml", ".yml", ".json") or candidate.exists() or "/" in text:
        if not candidate.is_file():
            raise InputError(
                "profile file not found",
                source=text,
                fix=f"check the path, or use a shipped name: {', '.join(list_profiles())}",
            )
        return Profile(read_profile_file(candidate), str(candidate))
    shipped = PROFILES_DIR / f"{text}{SUFFIX}"
    if not shipped.is_file():
        raise InputError(
            f"unknown profile '{text}'",
            field="profile",
            fix=f"use one of: {', '.join(list_profiles()) or '(none shipped)'}, "
            "or a path to a profile file",
        )
    return Profile(read_profile_file(shipped), str(shipped))
