"""Draw requests from a profile: ``RequestSampler.spec(seq)`` is pure in (profile, seed, seq).

Steps for request ``seq`` (all uniforms from :mod:`loadlab.workload.rng`, keyed by
(seed, seq), so no state is shared between requests):

1. Prompt. With sessions (``prefix.kind: sessions``) the prompt, its context and
   its session come from :mod:`loadlab.workload.sessions` (request ``seq`` is one
   turn of the session in slot ``seq % active``). Otherwise a uniform through the
   input table (linear interpolation between table points, rounded, at least 1).
2. Output. A uniform through the output table. Paired profiles (``lengths.joint``)
   pick one rank pair uniformly and jitter it inside its grid cell, its two ranks
   replacing the input and output uniforms, which keeps the source's input/output
   dependence; with sessions the input is already fixed, so the pair is drawn among
   the ``NEIGHBOURS`` pairs whose input rank is nearest the prompt's rank.
3. Prefix. ``shared``: group 0, prefix = ``common_tokens`` (the prompt always keeps
   at least one token of its own). ``sessions``: group = session id, prefix = the
   turn's context. ``reused_tokens``: what earlier requests already sent of this
   prompt (see :meth:`RequestSampler.reuse_ratio`).
4. Arrival. ``arrival_s`` is the request's offset in the profile's own arrival process
   at its recorded rate (None when the profile has no arrival model); a load
   generator that drives its own rate ignores it.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from loadlab.workload import rng
from loadlab.workload.arrivals import RenewalSchedule
from loadlab.workload.model import Joint, ProfileModel
from loadlab.workload.prompts import PromptSynth, TokenCounter
from loadlab.workload.quantile import QuantileFn
from loadlab.workload.sessions import SessionLayout

_SAMPLER_STREAM = 0x5A
NEIGHBOURS = 30


@dataclass(frozen=True)
class RequestSpec:
    """What to send as request ``seq``: lengths in tokens on the target server.

    ``prefix_group`` and ``prefix_tokens``: the prompt's first ``prefix_tokens`` tokens
    are the text of group (session) ``prefix_group``, shared with every request of the
    group as far as both have it (group 0's text opens every group's: the common
    prefix). ``turn``: the request's turn in its session (None without sessions).
    ``reused_tokens``: of this prompt, the tokens earlier requests already sent.
    """

    seq: int
    prompt_tokens: int
    output_tokens: int
    prefix_group: int | None
    prefix_tokens: int
    arrival_s: float | None
    turn: int | None = None
    reused_tokens: int = 0


class _PairsByInput:
    """Rank pairs sorted by input rank, for an output drawn given the input's rank."""

    def __init__(self, joint: Joint) -> None:
        pairs = sorted((p[0], p[1]) for p in joint.pairs)
        self.grid = joint.grid
        self.inputs = [p[0] for p in pairs]
        self.outputs = [p[1] for p in pairs]

    def output_u(self, input_u: float, u_pick: float, u_jitter: float) -> float:
        """Output uniform: one of the NEIGHBOURS pairs nearest ``input_u`` in input rank."""
        n = len(self.inputs)
        width = min(NEIGHBOURS, n)
        centre = bisect_left(self.inputs, input_u * self.grid)
        first = min(max(0, centre - width // 2), n - width)
        k = first + min(int(u_pick * width), width - 1)
        return (self.outputs[k] + u_jitter) / self.grid


class RequestSampler:
    """Request specs for one (profile, seed); ``active_sessions`` overrides the profile's."""

    def __init__(self, model: ProfileModel, seed: int, active_sessions: int | None = None) -> None:
        self.model = model
        self.seed = int(seed)
        self._stream_key = rng.key(self.seed, _SAMPLER_STREAM)
        lengths = model.lengths
        self._input = QuantileFn(lengths.input)
        self._output = QuantileFn(lengths.output)
        self._pairs = [tuple(p) for p in lengths.joint.pairs] if lengths.joint else None
        self._grid = lengths.joint.grid if lengths.joint else 0
        prefix = model.prefix
        self._common = prefix.common_tokens
        self._sessions: SessionLayout | None = None
        self._by_input: _PairsByInput | None = None
        if prefix.sessions is not None:
            self._sessions = SessionLayout(prefix.sessions, self._common, self.seed,
                                           active_sessions)
            self._by_input = _PairsByInput(lengths.joint) if lengths.joint else None
        arr = model.arrivals
        self._schedule: RenewalSchedule | None = None
        if arr.process != "none" and arr.rate_per_s:
            shape = arr.gamma_shape if arr.process == "gamma" else None
            self._schedule = RenewalSchedule(arr.rate_per_s, shape, self.seed)

    @property
    def active_sessions(self) -> int | None:
        """Sessions in progress at once (None without sessions)."""
        return self._sessions.active if self._sessions is not None else None

    def spec(self, seq: int) -> RequestSpec:
        """The request at position ``seq``; same (profile, seed, seq) -> same spec."""
        u = rng.uniforms(rng.key_after(self._stream_key, seq), 3)
        arrival = self._schedule.offset(seq) if self._schedule is not None else None
        if self._sessions is not None:
            t = self._sessions.turn(seq)
            u_out = u[2]
            if self._by_input is not None:
                u_out = self._by_input.output_u(self._input.cdf(t.prompt_tokens), u[0], u[2])
            return RequestSpec(seq, t.prompt_tokens, max(1, round(self._output(u_out))),
                               t.session, t.context_tokens, arrival, t.turn, t.reused_tokens)
        u_in, u_out = u[1], u[2]
        if self._pairs is not None:
            pair = self._pairs[min(int(u[0] * len(self._pairs)), len(self._pairs) - 1)]
            u_in, u_out = (pair[0] + u_in) / self._grid, (pair[1] + u_out) / self._grid
        prompt_tokens = max(1, round(self._input(u_in)))
        output_tokens = max(1, round(self._output(u_out)))
        common = min(self._common, prompt_tokens - 1)
        if common <= 0:
            return RequestSpec(seq, prompt_tokens, output_tokens, None, 0, arrival)
        return RequestSpec(seq, prompt_tokens, output_tokens, 0, common, arrival,
                           reused_tokens=common if seq > 0 else 0)

    def reuse_ratio(self, n: int) -> float:
        """Share of the prompt tokens of requests 0..n-1 that earlier ones already sent:
        the prefix-cache hit ratio of a server that keeps every block, sent in seq order."""
        reused = total = 0
        for seq in range(n):
            spec = self.spec(seq)
            reused += spec.reused_tokens
            total += spec.prompt_tokens
        return reused / total if total else 0.0


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

    def sampler(self, seed: int, active_sessions: int | None = None) -> RequestSampler:
        """Requests drawn with ``seed``; ``active_sessions`` overrides the profile's count."""
        return RequestSampler(self.model, seed, active_sessions)

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
