"""SSE reading, read by read: counted fast where every event is a plain content chunk, walked
event by event otherwise; the client's timings equal a plain per-event JSON reading for any
way the bytes are cut into reads, LF or CRLF."""

from __future__ import annotations

import json
import random
from itertools import pairwise

import pytest
from scripted import ScriptedTransport

from loadlab.loadgen.client import StreamingClient
from loadlab.loadgen.sse import (
    CHAT_MARKER,
    TEXT_MARKER,
    SseBuffer,
    content_end,
    count_content,
    event_payloads,
    quick_kind,
)


def _event(obj: object) -> bytes:
    data = obj if isinstance(obj, bytes) else json.dumps(obj, separators=(",", ":")).encode()
    return b"data: " + data + b"\n\n"


def _text(t: str) -> bytes:
    return _event({"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": t,
                                                                          "finish_reason": None}]})


def _chat(t: str) -> bytes:
    return _event({"id": "c", "choices": [{"index": 0, "delta": {"content": t}}]})


USAGE = _event({"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
DONE = _event(b"[DONE]")


def _count(events: bytes, marker: bytes = TEXT_MARKER) -> int | None:
    return count_content(events, marker, len(events))


def test_plain_content_chunks_are_counted_in_one_go() -> None:
    events = _text(" a") + _text(" b") + _text("") + _text(" d")
    assert _count(events) == 3           # the empty text is not content
    assert _count(_text(" a")) == 1
    role = _event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    assert _count(role + _chat("x") + _chat("y"), CHAT_MARKER) == 2
    assert _count(_text('say "text":"x" [DONE]')) == 1   # quotes are escaped
    tail = USAGE + DONE
    assert count_content(events + tail, TEXT_MARKER, len(events)) == 3   # bounds, not the tail


@pytest.mark.parametrize("events", [
    _text("a") + USAGE,                                   # usage chunk: no marker
    _text("a") + DONE,                                    # [DONE]
    _event({"error": {"message": "boom"}}) + _text("a"),  # error event
    _text("a").replace(b'"text":"a"', b'"text": "a"'),    # spaced JSON: the marker is not there
    b'data: {"choices":[{"index":0,\ndata: "text":"a"}]}\n\n',   # multi-line data
    b": keep-alive\n\n" + _text("a"),                     # a comment
    b"event: token\n" + _text("a"),                       # another field
    _event({"choices": [{"text": "a"}], "usage": {"completion_tokens": 1}}),  # usage on content
])
def test_anything_but_plain_content_needs_a_closer_look(events: bytes) -> None:
    assert _count(events) is None


def test_buffer_cuts_at_the_last_blank_line_and_turns_crlf_into_lf() -> None:
    buf = SseBuffer()
    stream = (_text("a") + _text("b")).replace(b"\n", b"\r\n")
    cut = stream.index(b"\r\n\r\n") + 3          # the first event's blank line cut after its \r
    assert buf.feed(stream[:cut]) == b""         # "...\r\n\r" waits for its "\n"
    assert buf.feed(stream[cut:cut + 5]) == _text("a")
    assert buf.feed(stream[cut + 5:]) == _text("b")
    assert buf.tail == b""
    assert buf.feed(_text("c")[:10]) == b"" and buf.feed(_text("c")[10:]) == _text("c")


def test_content_end_and_payloads_of_the_rest() -> None:
    events = _text("a") + _text("b") + USAGE + DONE
    cut = content_end(events, TEXT_MARKER)
    assert events[:cut] == _text("a") + _text("b")
    assert content_end(USAGE + DONE, TEXT_MARKER) == 0
    multi = b"data: {\"a\":\ndata:1}\n\n: comment\n\nevent: x\n\n"
    assert event_payloads(events[cut:] + multi) == [USAGE[6:-2], b"[DONE]", b'{"a":\n1}']
    assert quick_kind(_text("a")[6:-2], TEXT_MARKER) is True
    assert quick_kind(_text("")[6:-2], TEXT_MARKER) is False
    assert quick_kind(USAGE[6:-2], TEXT_MARKER) is None


def _reference(
    reads: list[tuple[float, bytes]], api: str
) -> tuple[list[float], float | None, tuple]:
    """Per-event JSON reading: every complete event of a read gets that read's time."""
    text, offsets, done, usage = b"", [], None, (None, None)
    for t, piece in reads:
        text = (text + piece).replace(b"\r\n", b"\n")
        *events, text = text.split(b"\n\n")
        for event in events:
            lines = [
                ln[5:].removeprefix(b" ") for ln in event.split(b"\n") if ln.startswith(b"data:")
            ]
            if not lines or done is not None:
                continue
            data = b"\n".join(lines)
            if data == b"[DONE]":
                done = t
                continue
            obj = json.loads(data)
            choice = (obj.get("choices") or [{}])[0]
            content = (
                (choice.get("delta") or {}).get("content") if api == "chat" else choice.get("text")
            )
            if content:
                offsets.append(t - 100.0)
            if obj.get("usage"):
                usage = (obj["usage"]["prompt_tokens"], obj["usage"]["completion_tokens"])
    return offsets, done, usage


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("crlf", [False, True])
def test_timings_equal_a_per_event_reading_for_any_cut_into_reads(api: str, crlf: bool) -> None:
    rng = random.Random(7)
    piece = _chat if api == "chat" else _text
    role = _event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    spaced = json.dumps(
        {"choices": [{"index": 0, "text": " s", "delta": {"content": " s"}}]}
    ).encode()
    body = ((role if api == "chat" else b"") + piece(" a") + piece("") + b": ping\n\n" + piece(" b")
            + b"data: " + spaced + b"\n\n" + b'data: {"choices":[{"index":0,\ndata: "text":" m",'
            + b'"delta":{"content":" m"}}]}\n\n' + piece(" c") * 20 + USAGE + DONE)
    if crlf:
        body = body.replace(b"\n", b"\r\n")
    for trial in range(60):
        cuts = sorted(rng.sample(range(1, len(body)), rng.randint(1, 40)))
        bounds = [0, *cuts, len(body)]
        reads = [(100.0 + 0.001 * (i + 1), body[a:b]) for i, (a, b) in enumerate(pairwise(bounds))]
        transport = ScriptedTransport(200, reads)
        out = StreamingClient(transport, api, clock=transport.clock).send(b"{}")
        offsets, done, usage = _reference(reads, api)
        assert out.status == "ok", (trial, out.error)
        assert out.timings.chunk_offsets_s == pytest.approx(offsets), trial
        assert out.timings.t_done == done and (out.prompt_tokens, out.output_tokens) == usage
        assert len(offsets) == 24


def test_content_then_an_error_in_one_read_stops_at_the_error() -> None:
    reads = [
        (
            100.01,
            _text("a") + _text("b") + _event({"error": {"message": "engine died"}}) + _text("c"),
        )
    ]
    transport = ScriptedTransport(200, reads)
    out = StreamingClient(transport, "completions", clock=transport.clock).send(b"{}")
    assert (out.status, out.error) == ("http_error", "engine died")
    assert out.timings.chunk_offsets_s == pytest.approx([0.01, 0.01])


def test_usage_on_every_content_chunk_is_counted_and_the_last_kept() -> None:
    def chunk(i: int) -> bytes:
        return _event({"choices": [{"index": 0, "text": f" w{i}"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": i + 1}})

    reads = [(100.01, chunk(0) + chunk(1)), (100.02, chunk(2) + DONE)]
    transport = ScriptedTransport(200, reads)
    out = StreamingClient(transport, "completions", clock=transport.clock).send(b"{}")
    assert out.status == "ok" and out.output_tokens == 3 and len(out.timings.chunk_offsets_s) == 3
