"""Sessions: request seq -> (session, turn) and the structure, lengths and prefix reuse a
session profile describes, checked against the profile and its source's figures."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import yaml

from loadlab.errors import InputError
from loadlab.workload import RequestSpec, load_profile
from loadlab.workload.derive import correlations

MOONCAKE = ["mooncake-conversation", "mooncake-synthetic"]


def _specs(name: str, seed: int, n: int, active: int | None = None) -> list[RequestSpec]:
    sampler = load_profile(name).sampler(seed, active)
    return [sampler.spec(seq) for seq in range(n)]


@pytest.mark.parametrize("active", [None, 5])
def test_turns_of_a_session_come_active_requests_apart_in_order(active: int | None) -> None:
    profile = load_profile("mooncake-conversation")
    gap = active or profile.model.prefix.sessions.active  # type: ignore[union-attr]
    specs = _specs("mooncake-conversation", 3, 3000, active)
    by_session: dict[int, list[RequestSpec]] = defaultdict(list)
    for spec in specs:
        assert spec.prefix_group is not None and spec.prefix_group >= 1
        by_session[spec.prefix_group].append(spec)
    for turns in by_session.values():
        assert [t.turn for t in turns] == list(range(len(turns)))  # every session starts here
        assert all(b.seq - a.seq == gap for a, b in itertools.pairwise(turns))
    # a slot's next request is the next turn of its session, or a new session's first
    for spec in specs[gap:]:
        before = specs[spec.seq - gap]
        if spec.turn == 0:
            assert spec.prefix_group != before.prefix_group
        else:
            assert (spec.turn, spec.prefix_group) == (before.turn + 1, before.prefix_group)  # type: ignore[operator]
    assert max(len(t) for t in by_session.values()) >= 10 and len(by_session) > 300


@pytest.mark.parametrize("name", MOONCAKE)
def test_reused_tokens_are_what_the_shared_text_gives(name: str) -> None:
    """The turns of a session share the shorter of their contexts, other sessions the common
    prefix: the longest of these sent before is what an everlasting cache hits."""
    profile = load_profile(name)
    common = profile.common_prefix_tokens
    longest: dict[int, int] = {}
    for spec in _specs(name, 8, 4000):
        assert 0 < spec.prefix_tokens < spec.prompt_tokens and spec.prefix_tokens >= common
        hit = min(spec.prefix_tokens, longest.get(spec.prefix_group, 0))  # type: ignore[arg-type]
        if spec.seq > 0:
            hit = max(hit, common)
        assert spec.reused_tokens == hit, spec
        group = spec.prefix_group
        longest[group] = max(longest.get(group, 0), spec.prefix_tokens)  # type: ignore[index]


@pytest.mark.parametrize("name", MOONCAKE)
def test_session_shape_follows_the_source(name: str) -> None:
    pre = load_profile(name).model.prefix
    assert pre.sessions is not None
    specs = _specs(name, 5, 20_000)
    later = [s for s in specs if s.turn]
    assert len(later) / len(specs) == pytest.approx(pre.stats["later_turn_share"], abs=0.03)
    # turns per session: sessions begun and ended inside the sample, after every slot's
    # first (drawn length-biased on purpose)
    first_seen: dict[int, int] = {}
    counts: dict[int, int] = defaultdict(int)
    for s in specs:
        first_seen.setdefault(s.prefix_group, s.seq)  # type: ignore[arg-type]
        counts[s.prefix_group] += 1  # type: ignore[index]
    inner = [c for g, c in counts.items()
             if pre.sessions.active <= first_seen[g] < len(specs) - 50 * pre.sessions.active]
    grid = (np.arange(20_000) + 0.5) / 20_000
    expected = np.maximum(1, np.round(np.interp(grid, pre.sessions.turns.p, pre.sessions.turns.v)))
    assert np.mean(inner) == pytest.approx(expected.mean(), rel=0.05)
    assert np.mean(np.array(inner) == 1) == pytest.approx(np.mean(expected == 1), abs=0.02)
    # an extending turn resends the previous prompt whole: context = prompt - 1 and longer
    by_id = {s.seq: s for s in specs}
    active = pre.sessions.active
    extending = [s for s in later if s.prefix_tokens == s.prompt_tokens - 1]
    assert all(s.prompt_tokens >= by_id[s.seq - active].prompt_tokens for s in extending)
    cells = [t for c in pre.sessions.classes for t in c.transitions]
    share = len(extending) / len(later)
    assert min(t.extend_share for t in cells) - 0.02 <= share <= max(t.extend_share for t in cells)


@pytest.mark.parametrize("name", MOONCAKE)
def test_reuse_matches_the_trace_in_the_long_run_and_within_minutes(name: str) -> None:
    """Long run: the sampler's reuse against the source's token prefix hit ratio. A few
    minutes of load (300 requests, ~5 minutes of mooncake-conversation on one H100 8B):
    averaged over seeds, because heavy-tailed prompts make one run's figure vary."""
    profile = load_profile(name)
    trace = profile.model.prefix.stats["token_prefix_hit_ratio"]
    assert profile.sampler(0).reuse_ratio(20_000) == pytest.approx(trace, abs=0.015)
    short = [profile.sampler(seed).reuse_ratio(300) for seed in range(10)]
    assert np.mean(short) == pytest.approx(trace, abs=0.04)


def test_paired_lengths_keep_their_dependence_with_sessions() -> None:
    joint = load_profile("mooncake-synthetic").model.lengths.joint
    assert joint is not None and joint.spearman < -0.4
    specs = _specs("mooncake-synthetic", 2, 12_000)
    spearman, _ = correlations(np.array([s.prompt_tokens for s in specs], float),
                               np.array([s.output_tokens for s in specs], float))
    assert spearman == pytest.approx(joint.spearman, abs=0.12)


def test_a_cell_without_its_transition_is_named(tmp_path: Path) -> None:
    path = Path(str(load_profile("mooncake-conversation").path))
    data = yaml.safe_load(path.read_text())
    data["prefix"]["sessions"]["classes"][-1]["transitions"].pop()
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(data))
    with pytest.raises(
        InputError, match=r"edited\.yaml.*prefix\.sessions.*one transition per context"
    ):
        load_profile(str(edited))
