"""Draw requests from a profile: ``RequestSampler.spec(seq)`` is pure in (profile, seed, seq).

Steps for request ``seq`` (all uniforms from :mod:`loadlab.workload.rng`, keyed by
(seed, seq), so no state is shared between requests):

1. Kind. With prefix groups, a request is grouped with probability ``group_share``
   (or as its rank pair's third element says, for paired profiles).
2. Lengths. Output: a uniform through the output table (linear interpolation between
   table points, rounded, at least 1). Input: a lone request maps a uniform through
   ``ungrouped_input`` (``lengths.input`` when the profile has no groups); a grouped
   request is its group's prefix plus a tail drawn from ``grouped_tail_tokens``.
   Paired profiles pick one rank pair uniformly and jitter it inside its grid cell;
   its two ranks replace the two uniforms, which keeps the source's input/output
   dependence.
3. Prefix. ``shared``: group 0, prefix = ``common_tokens``. ``groups``: a grouped
   request joins one of a pool of ``group_count`` groups, chosen with probability
   proportional to the group's size (sizes drawn once per seed from ``group_sizes``);
   every ``group_window`` requests (the source's length) a fresh pool with new group
   ids takes over, so a run longer than the trace does not reuse more than it did.
   Each group's prefix length is drawn from ``group_prefix_tokens`` as a pure function
   of (seed, group). Lone requests are in group 0 with just the common prefix, or in no
   group. The prefix always leaves at least one unique token.
4. Arrival. ``arrival_s`` is the request's offset in the profile's own arrival process
   at its recorded rate (None when the profile has no arrival model); a load
   generator that drives its own rate ignores it.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

from loadlab.workload import rng
from loadlab.workload.arrivals import RenewalSchedule
from loadlab.workload.model import ProfileModel, Table
from loadlab.workload.prompts import PromptSynth, TokenCounter

_SAMPLER_STREAM = 0x5A
_GROUP_POOL_STREAM = 0x6B
_GROUP_PREFIX_STREAM = 0x7C


@dataclass(frozen=True)
class RequestSpec:
    """What to send as request ``seq``: lengths in tokens on the target server."""

    seq: int
    prompt_tokens: int
    output_tokens: int
    prefix_group: int | None
    prefix_tokens: int
    arrival_s: float | None


class QuantileFn:
    """Inverse CDF from a table, evaluated with bisect (no numpy in the hot path)."""

    def __init__(self, table: Table) -> None:
        self.p = list(table.p)
        self.v = list(table.v)

    def __call__(self, u: float) -> float:
        k = bisect_right(self.p, u) - 1
        if k >= len(self.p) - 1:
            return self.v[-1]
        p0, p1 = self.p[k], self.p[k + 1]
        return self.v[k] + (self.v[k + 1] - self.v[k]) * (u - p0) / (p1 - p0)


class RequestSampler:
    """Request specs for one (profile, seed)."""

    def __init__(self, model: ProfileModel, seed: int) -> None:
        self.model = model
        self.seed = int(seed)
        lengths = model.lengths
        self._input = QuantileFn(lengths.input)
        self._output = QuantileFn(lengths.output)
        self._pairs = [tuple(p) for p in lengths.joint.pairs] if lengths.joint else None
        self._grid = lengths.joint.grid if lengths.joint else 0
        prefix = model.prefix
        self._common = prefix.common_tokens
        self._share = prefix.group_share if prefix.kind == "groups" else 0.0
        self._lone_input = (
            QuantileFn(prefix.ungrouped_input) if prefix.ungrouped_input else self._input
        )
        self._tail = (
            QuantileFn(prefix.grouped_tail_tokens) if prefix.grouped_tail_tokens else self._input
        )
        self._group_cum: list[float] = []
        self._group_prefix: QuantileFn | None = None
        if prefix.kind == "groups":
            assert prefix.group_sizes is not None and prefix.group_prefix_tokens is not None
            sizes_fn = QuantileFn(prefix.group_sizes)
            draws = rng.uniforms(rng.key(self.seed, _GROUP_POOL_STREAM), prefix.group_count)
            self._group_cum = list(accumulate(max(1.0, round(sizes_fn(u))) for u in draws))
            self._group_prefix = QuantileFn(prefix.group_prefix_tokens)
        arr = model.arrivals
        self._schedule: RenewalSchedule | None = None
        if arr.process != "none" and arr.rate_per_s:
            shape = arr.gamma_shape if arr.process == "gamma" else None
            self._schedule = RenewalSchedule(arr.rate_per_s, shape, self.seed)

    def spec(self, seq: int) -> RequestSpec:
        """The request at position ``seq``; same (profile, seed, seq) -> same spec."""
        u = rng.uniforms(rng.key(self.seed, _SAMPLER_STREAM, seq), 5)
        u_in, u_out = u[1], u[2]
        grouped = u[3] < self._share
        if self._pairs is not None:
            pair = self._pairs[min(int(u[0] * len(self._pairs)), len(self._pairs) - 1)]
            u_in, u_out = (pair[0] + u_in) / self._grid, (pair[1] + u_out) / self._grid
            if len(pair) == 3:
                grouped = pair[2] == 1
        output_tokens = max(1, round(self._output(u_out)))
        if grouped and self._group_prefix is not None:
            g = bisect_right(self._group_cum, u[4] * self._group_cum[-1]) + self._pool_base(seq)
            shared = round(
                self._group_prefix(rng.uniforms(rng.key(self.seed, _GROUP_PREFIX_STREAM, g), 1)[0])
            )
            prompt_tokens = shared + max(1, round(self._tail(u_in)))
            return RequestSpec(seq, prompt_tokens, output_tokens, g + 1, shared, self._arrival(seq))
        prompt_tokens = max(1, round(self._lone_input(u_in)))
        common = min(self._common, prompt_tokens - 1)
        group = 0 if common > 0 else None
        return RequestSpec(seq, prompt_tokens, output_tokens, group, common, self._arrival(seq))

    def _pool_base(self, seq: int) -> int:
        window = self.model.prefix.group_window
        return (seq // window) * len(self._group_cum) if window else 0

    def _arrival(self, seq: int) -> float | None:
        return self._schedule.offset(seq) if self._schedule is not None else None


class Profile:
    """A validated workload profile; ``sampler(seed)`` draws requests from it."""

    def __init__(self, model: ProfileModel, path: str | None = None) -> None:
        self.model = model
        self.path = path

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def common_prefix_tokens(self) -> int:
        """Leading tokens every request shares (group 0's text begins every group's text)."""
        return self.model.prefix.common_tokens

    def sampler(self, seed: int) -> RequestSampler:
        return RequestSampler(self.model, seed)

    def prompt_synth(
        self,
        seed: int,
        *,
        counter: TokenCounter | None = None,
        nonce: str = "",
        words_per_token: float | None = None,
        overhead_tokens: int | None = None,
    ) -> PromptSynth:
        """Prompt builder that knows this profile's common prefix (pass the sampler's seed)."""
        return PromptSynth(
            seed,
            common_prefix_tokens=self.common_prefix_tokens,
            counter=counter,
            nonce=nonce,
            words_per_token=words_per_token,
            overhead_tokens=overhead_tokens,
        )

    def __repr__(self) -> str:
        return f"Profile({self.name!r})"
