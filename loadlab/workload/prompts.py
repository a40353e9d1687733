"""Prompt text whose token count on the target server equals a RequestSpec's prompt_tokens.

Layout of a prompt (words joined by single spaces):

    [shared prefix: first P words of the group's text] [marker "<nonce>#<seq>"] [suffix words]

A *context prompt* (``prefix_tokens >= prompt_tokens - 1``: a session's first or
extending turn, all of it session text) has no suffix: the calibrated part is P.
A session's turns are then prefixes of one text, so each turn's prompt, up to its
marker, opens the next turn's prompt.

- Words come from ``WORDS``, common lowercase English words that are one token (with
  their leading space) on GPT-2/Llama-style BPE vocabularies and exactly one token on
  loadlab's simulator (one token per whitespace-separated piece).
- Group texts are pure functions of (seed, nonce, group): group 0 is the common text;
  every other group's text starts with the first ``common_prefix_tokens`` words of
  group 0 and continues with its own words. So requests of one group share exactly
  their common leading words, and every group shares the common prefix (a system
  prompt). P = round(prefix_tokens x words_per_token).
- The marker is unique per request (and per run, through ``nonce``) and never looks
  like a word of the list, so a shared chain ends exactly where the prefix ends.
- The suffix is drawn from (seed, nonce, seq) and sized to hit the target.
- Drawing: the words of a stream (a group's text, a request's suffix) come from SHAKE-128,
  an extendable-output hash, of (seed, nonce, stream, chunk): two bytes per word, taken
  modulo the list (65536 is not a multiple of its length: its first 65536 mod n words
  are drawn 0.4% more often than the others). A shorter draw is a prefix of a longer one, so
  a request draws only the words it needs; a numpy Generator per request cost ~15 us more, a
  tenth of a load generator's core at 1,000 requests/s.

Calibration. With a ``TokenCounter`` (the server's /tokenize for this request shape,
see :mod:`loadlab.workload.tokenize`):

1. Once per builder, unless given: the fixed overhead (BOS, chat template) is the
   count of the one-word text "the" minus one, and tokens per word come from a count
   of ``RATE_PROBE_WORDS`` words. Words are ~1 token on large BPE vocabularies but 1.5
   or more on small ones, so prefix lengths use the measured rate too.
2. Per prompt, the suffix word count (P for a context prompt) moves by (target -
   count) x words-per-token (Newton steps on a near-linear count), kept inside the
   bracket of word counts already seen to land under and over the target, until the
   count equals the target or the bracket is one word wide (a word worth two tokens).
3. The remaining gap below the target is filled with ``FILLERS`` pieces, each a
   single token on common BPE vocabularies (tried in turn).
At most ``MAX_ROUNDS`` counts per prompt plus one per filler tried; the word count
found for each target length is cached and tried first, so a repeated length usually
costs one count. Without a counter the word count is ``(target - overhead_tokens) x
words_per_token`` (defaults 0 and 1.0) and ``counted_tokens`` is None; the load
generator records target and actual usage either way.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from loadlab.errors import InputError

MAX_ROUNDS = 8
RATE_PROBE_WORDS = 1000
FILLERS: tuple[str, ...] = ("a", "I", "1")
_RATE_STREAM = (1 << 40) - 1
_CHUNK = 4096
_MIN_DRAW = 64
_SUFFIX_STREAM = 1 << 40

_WORD_TEXT = """
the of and to in is was for on that with as by at from his her it an were are which this be
or has had not but also have one their its after first new two they been other all who more
time during she into when would only where most over some years these made there while city
may state many world year under three between school such both through work well called
became used since being later part each several team long game four then area people before
family music early high them number season against film life series just best any second
those around can same than university north because south war river final government house
main west east line however still name public club group national based among about within
local following including major small without until played like large record built another
near history population system five last league along began won original county single did
place times set due station day left general end led role church old next way town country
point water light order right found great power open center common short white across today
head story level black road model free human range good back down make take over great help
line turn move live find show play run give come know think look want tell work call try
need feel become leave put mean keep let begin seem hear talk start might next hand high
place small case week company where group problem fact
"""
WORDS: tuple[str, ...] = tuple(dict.fromkeys(_WORD_TEXT.split()))  # unique, order kept
_WORD_OF_DRAW = tuple(WORDS[i % len(WORDS)] for i in range(1 << 16))  # a 2-byte draw -> its word


class TokenCounter(Protocol):
    """Server-side token count of a request whose variable text is ``text``."""

    def __call__(self, text: str) -> int: ...


@dataclass(frozen=True)
class Prompt:
    """Prompt text for one request, with the target and (when counted) the server's count."""

    text: str
    target_tokens: int
    counted_tokens: int | None

    def messages(self) -> list[dict[str, str]]:
        """Chat form: one user message (count it with a chat-shaped TokenCounter)."""
        return [{"role": "user", "content": self.text}]


def _key_int(*parts: object) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class PromptSynth:
    """Builds prompts for one run: one instance per (target server, request shape)."""

    def __init__(
        self,
        seed: int,
        *,
        common_prefix_tokens: int = 0,
        counter: TokenCounter | None = None,
        words_per_token: float | None = None,
        overhead_tokens: int | None = None,
        nonce: str = "",
    ) -> None:
        if any(ch.isspace() for ch in nonce):
            raise InputError(
                f"prompt nonce {nonce!r} contains whitespace",
                field="nonce",
                fix="use a run id without spaces, e.g. 20261129-2310",
            )
        if words_per_token is not None and not words_per_token > 0:
            raise InputError(
                f"words_per_token must be > 0, got {words_per_token}",
                field="words_per_token",
                fix="use about 1.0 for English words on BPE tokenizers",
            )
        self.seed = int(seed)
        self.common_prefix_tokens = int(common_prefix_tokens)
        self.counter = counter
        # measured from the counter on first use when not given (see the module docstring)
        self._measure = counter is not None and (words_per_token is None or overhead_tokens is None)
        self.words_per_token = 1.0 if words_per_token is None else float(words_per_token)
        self.overhead_tokens = 0 if overhead_tokens is None else int(overhead_tokens)
        self._fixed = (words_per_token, overhead_tokens)
        self.nonce = nonce
        self._base = _key_int(self.seed, nonce)
        # target -> suffix words found minus the estimate, last time that target was built
        self._offset: dict[int, int] = {}
        self._last_offset = 0
        # group texts are reused across requests; a suffix only across one calibration
        self._group_chunk = lru_cache(maxsize=256)(self._make_chunk)
        self._suffix_chunk = lru_cache(maxsize=64)(self._make_chunk)

    def _make_chunk(self, stream: int, index: int, size: int = _CHUNK) -> list[str]:
        """Words ``index * _CHUNK`` onwards of ``stream``. The hash's output is read word
        after word, so a smaller ``size`` gives the same first words: a request's short suffix
        (its own stream, used once) draws only what it needs, not a whole chunk."""
        digest = hashlib.shake_128(b"%d:%d:%d" % (self._base, stream, index)).digest(2 * size)
        return list(map(_WORD_OF_DRAW.__getitem__, struct.unpack(f"<{size}H", digest)))

    def _stream_words(self, stream: int, n: int) -> list[str]:
        if stream >= _SUFFIX_STREAM and n < _CHUNK:   # a power of two: few sizes while calibrating
            return self._suffix_chunk(stream, 0, max(_MIN_DRAW, 1 << (n - 1).bit_length()))[:n]
        chunk = self._suffix_chunk if stream >= _SUFFIX_STREAM else self._group_chunk
        out: list[str] = []
        index = 0
        while len(out) < n:
            out.extend(chunk(stream, index))
            index += 1
        return out[:n]

    def _words(self, tokens: int) -> int:
        return max(0, round(tokens * self.words_per_token))

    def prefix_words(self, group: int, prefix_tokens: int) -> list[str]:
        """The leading words shared by every request of ``group`` with ``prefix_tokens``."""
        return self._group_words(group, self._words(prefix_tokens))

    def _group_words(self, group: int, n: int) -> list[str]:
        """The first ``n`` words of ``group``'s text (group 0's common words open it)."""
        common = min(n, self._words(self.common_prefix_tokens)) if group != 0 else n
        words = self._stream_words(0, common)
        if n > common:
            words += self._stream_words(group, n - common)
        return words

    def _text(self, prefix: str, marker: str, seq: int, n_suffix: int) -> str:
        parts = [prefix] if prefix else []
        parts.append(marker)
        if n_suffix > 0:
            parts.append(" ".join(self._stream_words(_SUFFIX_STREAM + seq, n_suffix)))
        return " ".join(parts)

    def _measure_rates(self) -> None:
        """Fixed overhead (a one-word text minus that word) and tokens per word of this counter."""
        assert self.counter is not None
        self._measure = False
        overhead = max(0, int(self.counter(WORDS[0])) - 1)
        words = self._stream_words(_RATE_STREAM, RATE_PROBE_WORDS)
        per_word = (int(self.counter(" ".join(words))) - overhead) / RATE_PROBE_WORDS
        if self._fixed[1] is None:
            self.overhead_tokens = overhead
        if self._fixed[0] is None and per_word > 0:
            self.words_per_token = 1.0 / per_word

    def _layout(self, spec: SpecLike, target: int) -> tuple[Callable[[int], str], int]:
        """The text as a function of its calibrated word count (the suffix's, or P for a
        context prompt), and the estimate of that count."""
        marker = f"{self.nonce}#{spec.seq}"
        group = spec.prefix_group
        words: list[str] = []
        if group is not None and spec.prefix_tokens > 0:
            if spec.prefix_tokens >= target - 1:
                return (lambda n: " ".join([*self._group_words(group, n), marker]),
                        max(0, self._words(target - self.overhead_tokens) - 1))
            words = self.prefix_words(group, spec.prefix_tokens)
        prefix = " ".join(words)
        return (lambda n: self._text(prefix, marker, spec.seq, n),
                max(0, self._words(target - self.overhead_tokens) - len(words) - 1))

    def prompt(self, spec: SpecLike) -> Prompt:
        """Text for ``spec``: shared prefix, unique marker, suffix sized to
        ``spec.prompt_tokens``."""
        if self._measure:
            self._measure_rates()
        target = int(spec.prompt_tokens)
        text_of, estimate = self._layout(spec, target)
        if self.counter is None:
            return Prompt(text_of(estimate), target, None)
        start = estimate + self._offset.get(target, self._last_offset)
        found = _Search(self.counter, text_of, target, self.words_per_token).run(max(0, start))
        if found.counted == target:
            self._offset[target] = self._last_offset = found.words - estimate
        return Prompt(found.text, target, found.counted)


@dataclass
class _Found:
    text: str
    counted: int
    words: int


class _Search:
    """Steps 2 and 3 of the calibration for one prompt (see the module docstring)."""

    def __init__(self, count: TokenCounter, text_of: Callable[[int], str], target: int,
                 words_per_token: float) -> None:
        self.count, self.text_of, self.target = count, text_of, target
        self.words_per_token = words_per_token
        self.under: _Found | None = None  # most words seen below the target
        self.over: _Found | None = None  # fewest words seen above it

    def _try(self, words: int) -> _Found:
        text = self.text_of(words)
        found = _Found(text, int(self.count(text)), words)
        if found.counted < self.target and (self.under is None or words > self.under.words):
            self.under = found
        if found.counted > self.target and (self.over is None or words < self.over.words):
            self.over = found
        return found

    def run(self, words: int) -> _Found:
        found = self._try(words)
        for _ in range(MAX_ROUNDS - 1):
            if found.counted == self.target:
                return found
            lo = self.under.words + 1 if self.under else 0
            hi = self.over.words - 1 if self.over else None
            if hi is not None and lo > hi:
                break  # adjacent word counts straddle the target
            gap = self.target - found.counted
            step = round(gap * self.words_per_token) or (1 if gap > 0 else -1)
            nxt = max(lo, words + step)
            words = nxt if hi is None else min(nxt, hi)
            found = self._try(words)
        if found.counted == self.target:
            return found
        return self._fill() or min(
            (f for f in (self.under, self.over) if f is not None),
            key=lambda f: abs(f.counted - self.target),
        )

    def _fill(self) -> _Found | None:
        """Top up the closest text below the target with single-token filler pieces."""
        if self.under is None:
            return None
        gap = self.target - self.under.counted
        for filler in FILLERS:
            text = self.under.text + (" " + filler) * gap
            counted = int(self.count(text))
            if counted == self.target:
                return _Found(text, counted, self.under.words)
        return None


class SpecLike(Protocol):
    # Read-only members, so that a frozen dataclass (RequestSpec) satisfies the protocol.
    @property
    def seq(self) -> int: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def prefix_group(self) -> int | None: ...
    @property
    def prefix_tokens(self) -> int: ...
