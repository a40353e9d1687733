"""The streaming client: timing derivation through the seam, statuses over real HTTP."""

from __future__ import annotations

import json
import socket

import pytest
from scripted import ScriptedTransport

from loadlab.loadgen.client import StreamingClient
from loadlab.loadgen.transport import SocketTransport

SEPARATORS = {"compact": (",", ":"), "spaced": (", ", ": ")}  # vLLM's spelling; json.dumps' default
_sep = SEPARATORS["spaced"]


def _sse(obj) -> bytes:
    return (
        b"data: "
        + (obj if isinstance(obj, bytes) else json.dumps(obj, separators=_sep).encode())
        + b"\n\n"
    )


def _chat(text: str) -> bytes:
    return _sse({"choices": [{"index": 0, "delta": {"content": text}}]})


@pytest.fixture(params=sorted(SEPARATORS))
def spelling(request):
    """Run a test with compact JSON events (the parse-free fast path) and spaced ones."""
    global _sep
    _sep = SEPARATORS[request.param]
    yield request.param
    _sep = SEPARATORS["spaced"]


def test_chat_timings_come_from_raw_arrival_times(spelling) -> None:
    role = _sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    usage = _sse({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}})
    script = [
        (100.010, role),                       # empty role chunk: not the first token
        (100.050, _chat("a")),
        (100.060, _chat(" b") + _chat(" c")),  # two events in one read share its time
        (100.100, _chat(" d")[:9]),            # an event split across reads
        (100.130, _chat(" d")[9:] + usage + _sse(b"[DONE]")),
    ]
    transport = ScriptedTransport(200, script)
    client = StreamingClient(
        transport, "chat", headers={"Authorization": "Bearer k"}, clock=transport.clock
    )
    out = client.send(b"{}", {"X-Request-Id": "r1"})
    f = out.fields()
    assert out.status == "ok"
    assert f["t_sent"] == 100.0 and f["t_first_token"] == 100.050 and f["t_done"] == 100.130
    assert f["chunk_offsets_s"] == pytest.approx([0.050, 0.060, 0.060, 0.130])
    assert f["ttft_s"] == pytest.approx(0.050)
    assert f["itl_mean_s"] == pytest.approx(0.080 / 3)
    assert f["itl_p50_s"] == pytest.approx(0.010)
    assert f["itl_max_s"] == pytest.approx(0.070)
    assert (f["prompt_tokens"], f["output_tokens"], f["n_chunks"]) == (7, 4, 4)
    path, headers, _ = transport.sent[0]
    assert path == "/v1/chat/completions" and headers["X-Request-Id"] == "r1"


def test_error_event_mid_stream_is_an_error_record(spelling) -> None:
    script = [(100.01, _sse({"choices": [{"text": "x"}]})),
              (100.02, _sse({"error": {"message": "engine died", "code": 500}}))]
    transport = ScriptedTransport(200, script)
    out = StreamingClient(transport, "completions", clock=transport.clock).send(b"{}")
    assert (out.status, out.http_status, out.error) == ("http_error", 200, "engine died")
    assert out.fields()["n_chunks"] == 1


def test_stream_without_done_is_aborted() -> None:
    transport = ScriptedTransport(200, [(100.01, _sse({"choices": [{"text": "x"}]}))])
    out = StreamingClient(transport, "completions", clock=transport.clock).send(b"{}")
    assert out.status == "aborted" and "[DONE]" in out.error


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_statuses_over_real_http(fault, api: str) -> None:
    pattern = "ok,400,429,500,503,midstream,drop,hang,ok"
    with fault(pattern) as url:
        client = StreamingClient(SocketTransport(url), api, timeout_s=0.5)
        body = {
            "model": "m",
            "max_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if api == "chat":
            body["messages"] = [{"role": "user", "content": "one two three"}]
        else:
            body["prompt"] = "one two three"
        outs = [client.send(json.dumps(body).encode()) for _ in pattern.split(",")]
    got = [(o.status, o.http_status) for o in outs]
    assert got == [("ok", 200), ("http_error", 400), ("http_error", 429), ("http_error", 500),
                   ("http_error", 503), ("http_error", 200), ("aborted", 200), ("timeout", 200),
                   ("ok", 200)]
    assert outs[2].error == "injected 429"
    assert outs[5].error == "injected mid-stream failure"
    first = outs[0].fields()
    assert (first["prompt_tokens"], first["output_tokens"], first["n_chunks"]) == (3, 5, 5)
    assert 0.004 < first["ttft_s"] < first["e2e_s"]  # the server waits 5 ms, then streams 5 tokens


def test_connection_refused_is_a_client_error() -> None:
    with socket.socket() as s:  # a port that was free a moment ago and has no listener
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = StreamingClient(
        SocketTransport(f"http://127.0.0.1:{port}"), "completions", timeout_s=2
    ).send(b"{}")
    assert out.status == "client_error" and "cannot connect" in out.error
    assert out.timings.t_sent is None


def test_every_failure_names_the_side_that_failed(fault) -> None:
    """Each server misbehaviour gets its own server-side kind: none reads as the client's."""
    pattern = "ok,400,503,html404,html200,midstream,nodone,reset,drop,notobject,hang"
    body = json.dumps({"model": "m", "max_tokens": 5, "prompt": "one two", "stream": True})
    with fault(pattern) as url:
        client = StreamingClient(SocketTransport(url), "completions", timeout_s=0.5)
        outs = [client.send(body.encode()) for _ in pattern.split(",")]
    got = [(o.status, o.failure) for o in outs]
    assert got == [("ok", None), ("http_error", "http_4xx"), ("http_error", "http_5xx"),
                   ("http_error", "http_4xx"), ("client_error", "not_event_stream"),
                   ("http_error", "error_event"), ("aborted", "truncated"),
                   ("aborted", "reset"), ("aborted", "reset"), ("client_error", "bad_stream"),
                   ("timeout", "timeout")]
    assert "text/html" in outs[4].error and outs[4].fields()["failure"] == "not_event_stream"


def test_refused_connection_is_a_server_side_reset() -> None:
    with socket.socket() as s:  # a port that was free a moment ago and has no listener
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = StreamingClient(
        SocketTransport(f"http://127.0.0.1:{port}"), "completions", timeout_s=2
    ).send(b"{}")
    assert (out.status, out.failure) == ("client_error", "reset")
