"""A deterministic whitespace tokenizer for the simulator.

Why not a real tokenizer: the simulator needs exact, reproducible token counts
(so a load generator that writes an N-word prompt gets ``usage.prompt_tokens == N``)
and identical id prefixes for identical text prefixes (so prefix caching hashes
real shared prefixes), at a cost of about a microsecond per token.

Rules
- Text is split on whitespace (``str.split()``); every piece is one token.
  No BOS/EOS is added: the simulated model has no special prefix token.
- A piece's id is ``FIRST_WORD_ID + crc32(piece as UTF-8) % (VOCAB_SIZE - FIRST_WORD_ID)``:
  stable across processes and Python versions (never ``hash()``, which is salted).
- Ids below ``FIRST_WORD_ID`` are special tokens (roles, end of turn).
- Chat template, for ``/v1/chat/completions`` and ``/tokenize`` with messages:
  each message becomes ``<|role|> content-pieces... <|end|>`` (role one of
  system/user/assistant/tool/developer, others map to user), and the prompt ends with
  the generation prompt ``<|assistant|>``. So a chat prompt has
  ``sum(len(content.split()) + 2 for each message) + 1`` tokens. Content given as a
  list of parts uses the text of its ``{"type": "text"}`` parts, joined by spaces.
- Output tokens are drawn from ``OUTPUT_WORDS``; each renders as ``" " + word`` and its
  id is that word's own id, so generated text re-tokenizes to the same ids and counts
  (a multi-turn client that sends the reply back gets exact counts).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from zlib import crc32

VOCAB_SIZE = 32000
FIRST_WORD_ID = 16

ROLE_TOKENS: dict[str, int] = {
    "system": 3,
    "user": 4,
    "assistant": 5,
    "tool": 6,
    "developer": 7,
}
END_OF_TURN = 8
SPECIAL_TEXT: dict[int, str] = {v: f"<|{k}|>" for k, v in ROLE_TOKENS.items()}
SPECIAL_TEXT[END_OF_TURN] = "<|end|>"

_SPAN = VOCAB_SIZE - FIRST_WORD_ID

def token_id(piece: str) -> int:
    """Id of one whitespace-free piece of text."""
    return FIRST_WORD_ID + crc32(piece.encode("utf-8")) % _SPAN


def encode(text: str) -> list[int]:
    """Token ids of a text: one per whitespace-separated piece."""
    return [FIRST_WORD_ID + crc32(p.encode("utf-8")) % _SPAN for p in text.split()]


_WORD_LIST = tuple(dict.fromkeys(
    """the of and to in is was for on that with as by at from his her it an were are
    which this be or has had not but also have one their its after first new two
    they been other all who more time during she into when would only where most
    over some years these made there while most city may state many world year
    under three between school such both through work well called became used
    since being later known part each several team long game four then area
    people before people family music early high them number season against
    film life series just best any second those around album can same than
    university north because south war river final where government house main
    west east line however still name public club group national based among
    about within local early following including major small without until
    played like large record built another around near history population
    system five last league along began won original county single did place
    three times set including due station won each career form released served
    day left general end led role church old next way town best country made
    along several original point field water field light order right found great
    right power small open field center common short white across today head
    early story level black road level model level local free human range good""".split()  # noqa: SIM905
))




def _unique_ids(words: Iterable[str]) -> tuple[str, ...]:
    """Drop words whose id collides with an earlier word's, so decoding is exact."""
    seen: set[int] = set()
    kept = []
    for word in words:
        if token_id(word) not in seen:
            seen.add(token_id(word))
            kept.append(word)
    return tuple(kept)


OUTPUT_WORDS: tuple[str, ...] = _unique_ids(_WORD_LIST)


def message_text(content: object) -> str:
    """Text of a chat message's ``content`` (a string, a list of parts, or None)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    raise TypeError("message content must be a string or a list of content parts")


def encode_chat(messages: Iterable[tuple[str, str]]) -> list[int]:
    """Token ids of a chat prompt under the fixed template (see module docstring)."""
    ids: list[int] = []
    for role, text in messages:
        ids.append(ROLE_TOKENS.get(role, ROLE_TOKENS["user"]))
        ids.extend(encode(text))
        ids.append(END_OF_TURN)
    ids.append(ROLE_TOKENS["assistant"])
    return ids


OUTPUT_IDS: tuple[int, ...] = tuple(token_id(w) for w in OUTPUT_WORDS)
OUTPUT_PIECES: tuple[str, ...] = tuple(" " + w for w in OUTPUT_WORDS)
_ID_TO_WORD: dict[int, str] = {i: w for w, i in zip(OUTPUT_WORDS, OUTPUT_IDS)}


def output_token(request_seed: int, position: int) -> int:
    """Index into ``OUTPUT_WORDS`` of a request's ``position``-th generated token.

    Deterministic in (request_seed, position) so replies are reproducible and cost
    one multiply-add per token.
    """
    return (request_seed + position * 7919) % len(OUTPUT_WORDS)


def decode(ids: Sequence[int]) -> str:
    """Text of token ids. Output-word ids give their word; specials their marker;
    any other id (a prompt word, whose text is not recoverable from a hash) renders
    as ``<id>`` so the piece count, and hence re-tokenized length, is preserved."""
    pieces = []
    for i in ids:
        word = _ID_TO_WORD.get(i)
        if word is None:
            word = SPECIAL_TEXT.get(i, f"<{i}>")
        pieces.append(word)
    return " ".join(pieces)


def token_str(i: int) -> str:
    """Display string of one token id (``/tokenize`` with ``return_token_strs``)."""
    return _ID_TO_WORD.get(i) or SPECIAL_TEXT.get(i, f"<{i}>")
