"""Prompt synthesis: exact token counts through a counter (in process and over the
simulator's real /tokenize), prefix groups sharing identical leading text."""

from __future__ import annotations

from collections import defaultdict
from itertools import combinations

import httpx
import pytest

from loadlab.errors import InputError
from loadlab.sim.serve.testing import running_sim_in_thread
from loadlab.sim.serve.tokenizer import encode, encode_chat
from loadlab.workload import RequestSpec, load_profile
from loadlab.workload.prompts import PromptSynth
from loadlab.workload.tokenize import tokenize_counter


class Counting:
    """Wraps a counter and counts the calls made to it."""

    def __init__(self, fn) -> None:  # type: ignore[no-untyped-def]
        self.fn = fn
        self.calls = 0

    def __call__(self, text: str) -> int:
        self.calls += 1
        return self.fn(text)


def bpe_like(text: str) -> int:
    """A BOS token, two tokens for words of 5+ letters (a third of the list), digits in
    pairs: one word is not one token, as on small BPE vocabularies."""
    n = 1
    for piece in text.split():
        if any(ch.isdigit() for ch in piece):
            n += 1 + sum(ch.isdigit() for ch in piece) // 2
        else:
            n += 2 if len(piece) >= 5 else 1
    return n


def test_exact_counts_with_the_simulator_tokenizer() -> None:
    counter = Counting(lambda t: len(encode(t)))
    profile = load_profile("mooncake-conversation")
    synth = profile.prompt_synth(3, counter=counter)
    sampler = profile.sampler(3)
    specs = [sampler.spec(i) for i in range(150)]
    for spec in specs:
        prompt = synth.prompt(spec)
        assert prompt.counted_tokens == spec.prompt_tokens
        assert len(encode(prompt.text)) == spec.prompt_tokens
    assert counter.calls <= 2 * len(specs)  # the cached correction makes most lengths one count


def test_exact_counts_for_chat_and_bpe_like_counters() -> None:
    chat = PromptSynth(1, counter=lambda t: len(encode_chat([("user", t)])))
    counter = Counting(bpe_like)
    bpe = PromptSynth(1, counter=counter)
    targets = [4, 5, 17, 100, 999, 4096, *range(200, 260)]
    for target in targets:
        spec = RequestSpec(target, target, 10, None, 0, None)
        assert len(encode_chat([("user", chat.prompt(spec).text)])) == target
        prompt = bpe.prompt(spec)
        assert bpe_like(prompt.text) == target == prompt.counted_tokens, target
    assert chat.overhead_tokens == 3  # measured: <|user|> ... <|end|> <|assistant|>
    assert bpe.overhead_tokens == 1 and 0.6 < bpe.words_per_token < 0.85  # BOS; ~1.3 tokens/word
    assert counter.calls <= 2 + 5 * len(targets)


def test_prefix_length_is_in_server_tokens_when_words_cost_more() -> None:
    synth = PromptSynth(6, counter=bpe_like)
    a = synth.prompt(RequestSpec(1, 3000, 10, 4, 2000, None)).text
    b = synth.prompt(RequestSpec(2, 2800, 10, 4, 2000, None)).text
    shared = a[: a.index(" #")]
    assert b.startswith(shared + " #")
    assert bpe_like(shared) - 1 == pytest.approx(2000, rel=0.03)  # minus BOS


def test_without_a_counter_words_track_the_estimate() -> None:
    synth = PromptSynth(1, words_per_token=0.75)
    prompt = synth.prompt(RequestSpec(9, 400, 10, None, 0, None))
    assert prompt.counted_tokens is None and prompt.target_tokens == 400
    assert len(prompt.text.split()) == 300


def test_a_short_suffix_draws_the_same_words_as_a_whole_chunk() -> None:
    """Suffixes draw only the words they need (a power of two of them); the words are the
    leading words of the request's whole stream, so texts do not depend on the draw size."""
    from loadlab.workload.prompts import _CHUNK, _SUFFIX_STREAM

    synth = PromptSynth(11)
    for seq in (0, 7, 12345):
        stream = _SUFFIX_STREAM + seq
        whole = synth._make_chunk(stream, 0) + synth._make_chunk(stream, 1)
        for n in (1, 2, 39, 63, 64, 65, 200, 1000, _CHUNK - 1, _CHUNK, _CHUNK + 5):
            assert synth._stream_words(stream, n) == whole[:n]


def test_same_seed_same_text_and_nonce_changes_it() -> None:
    spec = RequestSpec(5, 300, 10, 2, 120, None)
    assert PromptSynth(4).prompt(spec).text == PromptSynth(4).prompt(spec).text
    assert PromptSynth(4).prompt(spec).text != PromptSynth(4, nonce="run2").prompt(spec).text
    with pytest.raises(InputError, match="whitespace"):
        PromptSynth(4, nonce="a b")


def test_prefix_groups_share_identical_leading_text_then_diverge() -> None:
    synth = PromptSynth(8, common_prefix_tokens=512)
    a = synth.prompt(RequestSpec(1, 3000, 10, 7, 2000, None)).text.split()
    b = synth.prompt(RequestSpec(2, 2500, 10, 7, 1500, None)).text.split()
    other = synth.prompt(RequestSpec(3, 3000, 10, 9, 2000, None)).text.split()
    lone = synth.prompt(RequestSpec(4, 900, 10, 0, 512, None)).text.split()
    assert a[:1500] == b[:1500]
    assert b[1500].startswith("#") and a[1500] != b[1500]  # the unique marker ends the chain
    assert a[:512] == other[:512] == lone[:512]  # the common prefix (system prompt) is everyone's
    assert a[512:530] != other[512:530]
    assert lone[512] == "#4"
    plain = synth.prompt(RequestSpec(5, 50, 10, None, 0, None)).text.split()
    assert plain[0] == "#5"  # no prefix: unique from the first token


def _shared(a: list[object], b: list[object]) -> int:
    """Length of the common leading run of two sequences."""
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_session_turns_share_their_context_in_text_and_simulator_tokens() -> None:
    """Live prompts of sessions under the simulator's tokenizer, counts exact: two turns
    of a session share the shorter of their contexts token for token (a chat's next turn
    opens with the previous prompt up to its marker), other sessions the common prefix."""
    profile = load_profile("mooncake-conversation")
    sampler = profile.sampler(2)
    synth = profile.prompt_synth(2, counter=lambda t: len(encode(t)), nonce="run1")
    sessions: dict[int, list[RequestSpec]] = defaultdict(list)
    for seq in range(400):
        spec = sampler.spec(seq)
        sessions[spec.prefix_group].append(spec)  # type: ignore[index]
    chosen = next(turns for turns in sessions.values() if len(turns) >= 3 and any(
        t.prefix_tokens < t.prompt_tokens - 1 for t in turns[1:]))  # extends and a branch
    other = next(turns[0] for turns in sessions.values() if turns is not chosen)
    texts = {}
    for spec in [*chosen, other]:
        prompt = synth.prompt(spec)
        assert prompt.counted_tokens == spec.prompt_tokens == len(encode(prompt.text))
        texts[spec.seq] = prompt.text
    for a, b in combinations(chosen, 2):
        context = min(a.prefix_tokens, b.prefix_tokens)
        assert _shared(texts[a.seq].split(), texts[b.seq].split()) == context
        assert encode(texts[a.seq])[:context] == encode(texts[b.seq])[:context]
    pieces = [texts[t.seq].split() for t in (chosen[0], other)]
    assert 512 <= _shared(*pieces) < 520  # past the common prefix, two texts agree by chance
    assert pieces[0][512:540] != pieces[1][512:540]


def test_tokenize_counter_against_the_simulator_over_http() -> None:
    with running_sim_in_thread() as url:
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        for chat in (False, True):
            counter = tokenize_counter(url, model, chat=chat)
            assert counter is not None
            synth = PromptSynth(2, common_prefix_tokens=64, counter=counter)
            for target in (70, 333):
                prompt = synth.prompt(RequestSpec(target, target, 5, 1, 64, None))
                assert prompt.counted_tokens == target
                expected = (
                    len(encode_chat([("user", prompt.text)])) if chat else len(encode(prompt.text))
                )
                assert expected == target
        assert (
            tokenize_counter(url + "/no-such-prefix", model) is None
        )  # 404: fall back to estimates


def test_streams_draw_every_word_about_equally_and_differ_by_seed_nonce_and_stream() -> None:
    """Two bytes of the hash per word, modulo the list: every word is drawn within a few
    percent of its share (262,144 draws, ~1,065 per word; seeded, so exact every run)."""
    from collections import Counter

    from loadlab.workload.prompts import _CHUNK, WORDS

    synth = PromptSynth(3, nonce="n")
    drawn = Counter(w for index in range(64) for w in synth._make_chunk(5, index))
    mean = 64 * _CHUNK / len(WORDS)
    assert set(drawn) == set(WORDS)
    assert all(abs(n - mean) < 0.15 * mean for n in drawn.values())
    first = synth._make_chunk(5, 0, 64)
    assert first != synth._make_chunk(6, 0, 64) and first != synth._make_chunk(5, 1, 64)
    assert first != PromptSynth(4, nonce="n")._make_chunk(5, 0, 64)
    assert first != PromptSynth(3, nonce="m")._make_chunk(5, 0, 64)
    assert first == PromptSynth(3, nonce="n")._make_chunk(5, 0, 64)
