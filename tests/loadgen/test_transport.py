"""The HTTP parser under the transport: fragments, chunked bodies, interim responses."""

from __future__ import annotations

from loadlab.loadgen.transport import _Parser

RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Request-Id: abc\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
            b"8\r\ndata: a\n\r\n8\r\ndata: b\n\r\n0\r\n\r\n")


def test_byte_by_byte_gives_the_same_headers_and_body() -> None:
    whole, bytewise = _Parser(), _Parser()
    whole.feed(RESPONSE)
    for i in range(len(RESPONSE)):
        bytewise.feed(RESPONSE[i:i + 1])
    for p in (whole, bytewise):
        assert p.get_code() == 200 and p.headers_complete and p.message_complete
        assert p.headers() == {"content-type": "text/event-stream", "x-request-id": "abc",
                               "transfer-encoding": "chunked"}
        assert b"".join(p.pieces) == b"data: a\ndata: b\n"
        assert not p.should_close()
    assert len(whole.pieces) == 2   # one piece per HTTP chunk, as they came


def test_an_interim_response_is_replaced_by_the_final_one() -> None:
    p = _Parser()
    p.feed(b"HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\n" + RESPONSE)
    assert p.get_code() == 200 and "x-interim" not in p.headers() and p.message_complete


def test_connection_close_and_an_unfinished_body_close_the_connection() -> None:
    p = _Parser()
    p.feed(RESPONSE.replace(b"X-Request-Id: abc", b"Connection: close"))
    assert p.message_complete and p.should_close()
    unfinished = _Parser()
    unfinished.feed(RESPONSE[:-5])
    assert not unfinished.message_complete and unfinished.should_close()
