"""TLS for the transport's connections, done in memory so the socket stays the transport's own.

Why ``ssl.SSLContext.wrap_bio`` (an :class:`ssl.SSLObject` over two memory buffers) and not
``wrap_socket``? The transport reads a connection by waiting on its own libev watcher and
calling ``recv`` on an unpatched socket (``transport._Readable``), arms one gevent timer per
request instead of socket timeouts, and peeks at idle sockets to see whether the server
closed them. An ``SSLSocket`` (gevent's or the stdlib's) owns its reads and its timeouts,
so none of that would apply over https. With memory buffers the bytes move through exactly
the same socket calls as over plain http and TLS is two extra steps: encrypt before
``sendall``, decrypt after ``recv``. It behaves the same under gevent and with plain
sockets, since the ``SSLObject`` does no I/O.

A read that completes no TLS record, or only handshake records (TLS 1.3 session tickets
arrive after the handshake), decrypts to ``b""``: that is "nothing yet", not end of stream;
:class:`TlsEof` says the server ended the TLS session (close_notify).
"""

from __future__ import annotations

import socket
import ssl

_RECORD_BYTES = 65536   # more than a TLS record holds (16 KiB): one read returns it whole


class TlsEof(Exception):
    """The server closed the TLS session (close_notify)."""


class TlsLink:
    """One connection's TLS session; :meth:`handshake` once, then encrypt and decrypt."""

    def __init__(self, context: ssl.SSLContext, server_hostname: str) -> None:
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        # SNI and the hostname check both use server_hostname (an IP address gets no SNI).
        self._obj = context.wrap_bio(self._in, self._out, server_hostname=server_hostname)
        self.ended = False   # the server's close_notify came: no request may follow

    def handshake(self, sock: socket.socket) -> None:
        """Complete the handshake over ``sock`` (blocking, under the socket's timeout or the
        caller's gevent timer). Raises ssl.SSLError (ssl.SSLCertVerificationError when the
        certificate is refused) or OSError; EOF mid-handshake is ConnectionResetError."""
        while True:
            try:
                self._obj.do_handshake()
            except ssl.SSLWantReadError:
                self._flush(sock)
                data = sock.recv(_RECORD_BYTES)
                if not data:
                    raise ConnectionResetError("server closed the connection during the TLS "
                                               "handshake") from None
                self._in.write(data)
                continue
            self._flush(sock)
            return

    def encrypt(self, data: bytes) -> bytes:
        """``data`` as TLS records, ready to send."""
        self._obj.write(data)
        return self._out.read()

    def decrypt(self, data: bytes, sock: socket.socket) -> bytes:
        """The plaintext of ``data`` received (``b""``: no whole record yet). Raises TlsEof
        once the session has ended and no plaintext is left (a close_notify right behind a
        response's last bytes ends it after them), or ssl.SSLError for bytes that are not
        this session's records."""
        if self.ended:
            raise TlsEof
        self._in.write(data)
        out = b""
        while self._in.pending:
            try:
                piece = self._obj.read(_RECORD_BYTES)
            except ssl.SSLWantReadError:   # the rest of a record is still on its way
                break
            except ssl.SSLZeroReturnError:
                piece = b""
            if not piece:
                self.ended = True
                break
            out = piece if not out else out + piece
        if self._out.pending:   # a reply the session owes (a key update)
            self._flush(sock)
        if self.ended and not out:
            raise TlsEof
        return out

    def idle_closed(self, data: bytes, sock: socket.socket) -> bool:
        """Bytes that came on an idle connection: True when they end the session (or are
        a response nobody asked for), False for session housekeeping (tickets)."""
        try:
            return bool(self.decrypt(data, sock))
        except (TlsEof, ssl.SSLError, OSError):
            return True

    def _flush(self, sock: socket.socket) -> None:
        if self._out.pending:
            sock.sendall(self._out.read())
