"""The one seam between the streaming client and the network.

Everything above this module (SSE parsing, timing, records) talks to a
:class:`Transport`: one method, :meth:`Transport.open`, that sends a request and
returns a :class:`StreamResponse` whose body arrives as an iterator of raw byte
pieces, each yielded the moment the socket handed it over. Tests put a scripted
transport here; the load generator puts :class:`SocketTransport`.

Why a raw socket client and not Locust's ``FastHttpUser`` (geventhttpclient's
``HTTPClient``)? Its response ``read(n)`` loops until ``n`` bytes are buffered
(4 KiB by default), so SSE events of ~150 bytes would be delivered in bunches and
every per-chunk timestamp after the first would be wrong; ``HttpUser``
(requests/urllib3) streams but costs several times more CPU per request, which on
a 2-core box beside vLLM is exactly what distorts the measurement
(benchmarks/bench_loadgen.py measures the CPU per request). :class:`SocketTransport` keeps
geventhttpclient's C HTTP parser (llhttp: chunked encoding, keep-alive rules) and drives the
socket itself: one ``recv`` -> one ``feed`` -> the body bytes it produced are yielded at
once. Under Locust the stdlib socket is gevent's (Locust monkey-patches on import), so a
blocked ``recv`` yields to other users; outside gevent it is an ordinary blocking
socket.

Connections are kept alive per transport instance (one per Locust user) and
dropped after any error or a response that asks to close. Timeouts are one
deadline per request (connect + headers + body), enforced two ways:

- under gevent (Locust): one gevent timer per request raises :class:`TransportTimeout`
  in the waiting greenlet, and the socket blocks with no timeout of its own. A gevent
  socket with a timeout arms a timer for every wait, a third of the cost of a read
  while the client keeps up with the stream. Reads wait first and then read (the
  connection's :class:`_Readable`): gevent's ``recv`` tries first, fails with EAGAIN
  whenever the client has caught up (a syscall and a Python exception) and only then
  waits; waiting first on one watcher kept per connection and reading with the
  unpatched socket costs 10-16% less CPU per request (a paced server, 16-64 users);
- with plain sockets: the socket's timeout, set again only when it has drifted
  ``_TIMEOUT_SLACK_S`` from the time left, so a read ends at most that long after the
  deadline.

``https://`` targets: the same socket calls, with TLS done in memory between them
(:mod:`loadlab.loadgen.tls_link`: encrypt before ``sendall``, decrypt after ``recv``), so
the watcher, the timers and the idle check above all apply unchanged and a connection is
kept alive over TLS exactly as over plain http. The certificate is checked as the
``ssl.SSLContext`` given says (:meth:`loadlab.spec.tls.TlsSettings.context`; by default
the system trust store), with SNI and the hostname check on the URL's host.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

from geventhttpclient._parser import HTTPParseError, HTTPResponseParser

from loadlab.loadgen.tls_link import TlsEof, TlsLink
from loadlab.spec.tls import TlsSettings

_RECV_BYTES = 65536
# A read may wait this long past the request's deadline; in exchange the socket's timeout
# is set again only when it drifts that far from the time left (not before every read).
_TIMEOUT_SLACK_S = 0.1
# libev's highest watcher priority (EV_MAXPRI): a connection waiting for its first token.
_URGENT_PRIORITY = 2


class TransportTimeout(Exception):
    """The request's deadline passed before the server finished."""


class ConnectionFailed(Exception):
    """No connection could be made (refused, unreachable, DNS)."""


class ProtocolError(ValueError):
    """The bytes received are not valid HTTP (a client_error, not a server status)."""


class StreamClosed(Exception):
    """The server closed the connection before the response was complete."""


@dataclass
class StreamResponse:
    """A response whose body is read incrementally through :attr:`body`; :meth:`close` it
    (or read it whole with :meth:`read_all`) when done."""

    status: int
    headers: dict[str, str]
    body: Iterator[bytes]
    sent_at: float  # clock value taken just before the request bytes were written
    abandon: Callable[[], None] = field(default=lambda: None)

    def close(self) -> None:
        """Stop reading; a connection with unread bytes is dropped, a finished one kept."""
        self.abandon()

    def read_all(self, limit: int = 1 << 20) -> bytes:
        """Whole body (capped), for error responses; the response is closed after it."""
        out = bytearray()
        for piece in self.body:
            out += piece
            if len(out) >= limit:
                break
        self.close()
        return bytes(out)


class Transport(Protocol):
    """Send one HTTP request; the body is streamed back as raw pieces."""

    def open(
        self, method: str, path: str, headers: dict[str, str], body: bytes, deadline: float,
        on_sent: Callable[[float], None] | None = None,
    ) -> StreamResponse:
        """``deadline`` is a ``time.monotonic()`` value; past it, raise TransportTimeout.

        Raises ConnectionFailed, TransportTimeout or StreamClosed; ``sent_at`` of the
        result comes from the clock the transport was built with. ``on_sent`` gets that
        same value the moment the bytes are written, so a request that fails or is
        cancelled before the headers come back still knows when it was sent.
        """
        ...


class _Parser(HTTPResponseParser):
    """llhttp (geventhttpclient's C parser) with lean callbacks: it hands body bytes out
    instead of buffering them and keeps the headers as a flat list.

    The C parser calls ``_on_body`` once per body segment (each HTTP chunk: one SSE event
    from vLLM) with a new bytearray; binding it to ``pieces.append`` keeps those without a
    Python frame or a copy per chunk. Header names and values may arrive in fragments (a
    read can end inside one): a field after a value starts a new header. geventhttpclient's
    own ``HTTPResponse`` keeps headers in a multidict through five Python callbacks per
    header, about 15 us of every request.
    """

    def __init__(self) -> None:
        super().__init__()
        self.headers_complete = False
        self.message_complete = False
        self.pieces: list[bytearray] = []
        self._on_body = self.pieces.append
        self._fields: list[str] = []     # name, value, name, value...
        self._in_value = False

    def _on_message_begin(self) -> None:
        if self.message_complete:   # an interim 1xx response came first: start over
            self.headers_complete = self.message_complete = self._in_value = False
            self._fields.clear()

    def _on_status(self, status: str) -> None:
        pass

    def _on_header_field(self, text: str) -> None:
        if self._in_value or not self._fields:
            self._fields += (text, "")
            self._in_value = False
        else:
            self._fields[-2] += text

    def _on_header_value(self, text: str) -> None:
        self._fields[-1] += text
        self._in_value = True

    def _on_headers_complete(self) -> bool:
        self.headers_complete = True
        return False   # a body follows (never a HEAD request here)

    def _on_message_complete(self) -> None:
        self.message_complete = True

    def headers(self) -> dict[str, str]:
        """Lower-case names; a repeated header keeps its last value."""
        f = self._fields
        return {f[i].lower(): f[i + 1] for i in range(0, len(f), 2)}

    def should_close(self) -> bool:
        return not self.message_complete or self.parser_failed() or not self.should_keep_alive()


class SocketTransport:
    """HTTP/1.1 over one kept-alive socket to ``base_url``; https is verified with ``tls``
    (default: the system trust store)."""

    def __init__(self, base_url: str, clock: Callable[[], float] = time.time,
                 tls: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"only http:// and https:// targets are supported, got {base_url!r}")
        self.host = parts.hostname or "127.0.0.1"
        https = parts.scheme == "https"
        self.port = parts.port or (443 if https else 80)
        self._tls = (tls or TlsSettings().context()) if https else None
        self._link: TlsLink | None = None   # https: the connection's TLS session (with _sock)
        self.prefix = parts.path.rstrip("/")
        self._host_header = parts.netloc
        self._sock: socket.socket | None = None
        self._timeout_s: float | None = None   # plain sockets: the socket's timeout as last set
        self._clock = clock
        self._cooperative = _gevent_sockets()
        self._readable: _Readable | None = None   # gevent: the connection's reader (with _sock)

    def open(
        self, method: str, path: str, headers: dict[str, str], body: bytes, deadline: float,
        on_sent: Callable[[float], None] | None = None,
    ) -> StreamResponse:
        head = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self._host_header}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        head.append(f"Content-Length: {len(body)}")
        payload = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        if self._sock is not None and self._closed_by_peer(self._sock):
            self._drop()
        timer = _Timer(deadline) if self._cooperative else None
        try:
            sock = self._connected(deadline)
            if self._link is not None:
                payload = self._link.encrypt(payload)
            # Blocking again (the peer check left it non-blocking): gevent's timer, or a timeout.
            self._timeout_s = None if timer is not None else max(1e-3, deadline - time.monotonic())
            sock.settimeout(self._timeout_s)
            if self._readable is not None:
                self._readable.urgent(True)
            sent_at = self._clock()
            if on_sent is not None:
                on_sent(sent_at)
            try:
                sock.sendall(payload)
            except OSError as exc:
                self._drop()
                raise StreamClosed(f"send failed: {exc}") from exc
            parser = _Parser()
            while not parser.headers_complete:
                self._recv_into(sock, parser, deadline)
        except BaseException:
            if timer is not None:
                timer.cancel()
            raise
        pending = list(parser.pieces)
        parser.pieces.clear()
        headers_out = parser.headers()

        def abandon() -> None:
            if timer is not None:
                timer.cancel()
            if not parser.message_complete:
                self._drop()

        return StreamResponse(
            status=parser.get_code(),
            headers=headers_out,
            body=self._body(sock, parser, pending, deadline),
            sent_at=sent_at,
            abandon=abandon,
        )

    def _body(
        self, sock: socket.socket, parser: _Parser, pending: list[bytearray], deadline: float
    ) -> Iterator[bytes]:
        first = True   # the first body bytes end the urgency open() set (_Readable.urgent)
        try:
            if pending:   # body bytes that came with the headers: one read, one piece
                self._first_body_read()
                first = False
                yield b"".join(pending)
            pieces = parser.pieces
            while not parser.message_complete:
                self._recv_into(sock, parser, deadline)
                if pieces:
                    piece = b"".join(pieces)
                    pieces.clear()
                    if first:
                        self._first_body_read()
                        first = False
                    yield piece
        except BaseException:
            self._drop()
            raise
        if parser.should_close():
            self._drop()

    def _recv_into(self, sock: socket.socket, parser: _Parser, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self._drop()
            raise TransportTimeout("deadline passed")
        if not self._cooperative and (
            self._timeout_s is None
            or not remaining <= self._timeout_s <= remaining + _TIMEOUT_SLACK_S
        ):
            sock.settimeout(remaining)
            self._timeout_s = remaining
        try:
            if self._readable is not None:
                data = self._readable.recv(_RECV_BYTES)
            else:
                data = sock.recv(_RECV_BYTES)
        except TransportTimeout:   # the request's gevent timer fired while waiting
            self._drop()
            raise
        except TimeoutError:
            self._drop()
            raise TransportTimeout("no data before the deadline") from None
        except OSError as exc:
            self._drop()
            raise StreamClosed(f"connection lost: {exc}") from exc
        if self._link is not None and data:
            plain = self._decrypt(self._link, sock, data)
            if plain is None:   # no whole record yet, or only session housekeeping
                return
            data = plain
        try:
            parser.feed(data)  # b"" tells the parser the peer closed
        except HTTPParseError as exc:
            self._drop()
            if not data:
                raise StreamClosed("server closed the connection mid-response") from exc
            raise ProtocolError(f"malformed HTTP response: {exc}") from exc
        if not data:
            self._drop()
            if not parser.message_complete:
                raise StreamClosed("server closed the connection mid-response")

    def _decrypt(self, link: TlsLink, sock: socket.socket, data: bytes) -> bytes | None:
        """The plaintext of ``data``; b"" when the server ended the session, None when
        nothing is readable yet."""
        try:
            return link.decrypt(data, sock) or None
        except TlsEof:
            return b""
        except (ssl.SSLError, OSError) as exc:
            self._drop()
            raise StreamClosed(f"TLS error: {exc}") from exc

    def _closed_by_peer(self, sock: socket.socket) -> bool:
        """True when an idle kept-alive socket has been closed (or reset) by the server.

        Over TLS the bytes of an idle connection are read (not peeked): a close_notify
        ends it (also one read already, behind the last response), session tickets do not."""
        if self._link is not None and self._link.ended:
            return True
        try:
            sock.settimeout(0)
            if self._link is None:
                return sock.recv(1, socket.MSG_PEEK) == b""
            data = sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        return not data or self._link.idle_closed(data, sock)

    def _connected(self, deadline: float) -> socket.socket:
        if self._sock is not None:
            return self._sock
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TransportTimeout("deadline passed before connecting")
        try:
            sock = socket.create_connection((self.host, self.port), timeout=remaining)
        except TimeoutError:
            raise TransportTimeout("connect timed out") from None
        except OSError as exc:
            raise ConnectionFailed(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is not None:
            self._link = self._handshake(sock, self._tls)
        self._sock = sock
        if self._cooperative:
            self._readable = _Readable(sock)
        return sock

    def _handshake(self, sock: socket.socket, context: ssl.SSLContext) -> TlsLink:
        """The connection's TLS session; the socket is closed when it cannot be made."""
        link = TlsLink(context, self.host)
        try:
            link.handshake(sock)
        except BaseException as exc:
            sock.close()
            if isinstance(exc, TimeoutError):
                raise TransportTimeout("TLS handshake timed out") from None
            if isinstance(exc, OSError):   # ssl.SSLError (a refused certificate) is one too
                raise ConnectionFailed(
                    f"TLS handshake with {self.host}:{self.port} failed: {exc}") from exc
            raise
        return link

    def _first_body_read(self) -> None:
        if self._readable is not None:
            self._readable.urgent(False)

    def _drop(self) -> None:
        self._link = None
        readable, self._readable = self._readable, None
        if readable is not None:
            readable.close()
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


def _gevent_sockets() -> bool:
    """True when the socket module is gevent's (Locust patches it on import)."""
    try:
        from gevent.monkey import is_module_patched
    except ImportError:
        return False
    return bool(is_module_patched("socket"))


class _Timer:
    """One request's deadline under gevent: raises TransportTimeout in the greenlet that
    waits when it passes. Always :meth:`cancel` it, or it fires into a later wait."""

    def __init__(self, deadline: float) -> None:
        import gevent

        self._timeout = gevent.Timeout(max(0.0, deadline - time.monotonic()),
                                       TransportTimeout("no data before the deadline"))
        self._timeout.start()

    def cancel(self) -> None:
        self._timeout.close()


class _Readable:
    """Under gevent: reads one connection by waiting until it is readable, then calling
    ``recv`` on an unpatched socket object over the same descriptor.

    The libev io watcher is kept for the connection's life and started only while a
    greenlet waits (``Hub.wait`` stops it again, also when the wait is interrupted by
    the request's timer or a kill). A wake-up without data (rare) waits again.
    :meth:`close` detaches the descriptor: the connection's own socket closes it.

    :meth:`urgent` marks a connection still waiting for its response's first body bytes.
    libev runs the ready watchers of one loop iteration highest priority first, so when
    many streams are readable at once a first token is read at the start of the
    iteration, not after a random share of every other stream's chunks: the client's own
    part of TTFT stops growing with the number of streams it reads.
    """

    def __init__(self, sock: socket.socket) -> None:
        from gevent import get_hub
        from gevent.monkey import get_original

        self._hub = get_hub()
        self._watcher = self._hub.loop.io(sock.fileno(), 1)   # 1: readable
        self._raw = get_original("socket", "socket")(fileno=sock.fileno())
        self._raw.setblocking(False)

    def urgent(self, flag: bool) -> None:
        """Read ahead of the other connections (libev may change a watcher's priority
        only while it is stopped: between waits, which is where this is called)."""
        self._watcher.priority = _URGENT_PRIORITY if flag else 0

    def recv(self, size: int) -> bytes:
        while True:
            self._hub.wait(self._watcher)
            try:
                return self._raw.recv(size)
            except BlockingIOError:
                continue

    def close(self) -> None:
        self._watcher.close()
        self._raw.detach()
