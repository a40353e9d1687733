"""SocketTransport over https against a real TLS server on port 0: verification (CA bundle,
system store, SSL_CERT_FILE, insecure), SNI, hostname checks, and keep-alive counted in TLS
handshakes at the server, with plain sockets and under gevent (as Locust runs it)."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadlab.loadgen.transport import ConnectionFailed, SocketTransport
from loadlab.sim.serve.selfsigned import self_signed
from loadlab.spec.tls import TlsSettings

EVENTS = b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in
                  (b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n")) + b"0\r\n\r\n"


class TlsServer:
    """HTTP/1.1 over TLS: every request gets a chunked event stream on a kept-alive
    connection; ``/bye`` ends the TLS session (close_notify, then FIN) after its response.
    Counts completed handshakes and records the SNI names clients sent."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(cert, key)
        self.sni: list[str | None] = []
        self.ctx.sni_callback = lambda _sock, name, _ctx: self.sni.append(name)
        self.handshakes = 0
        self.said_bye = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            conn = self.ctx.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            raw.close()
            return
        self.handshakes += 1
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n" + EVENTS)
                if head.split(b" ")[1] == b"/bye":
                    conn.setblocking(False)   # send close_notify, wait for no reply
                    try:
                        conn.unwrap()
                    except ssl.SSLWantReadError:
                        pass
                    conn.close()
                    self.said_bye.set()
                    return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("certs")
    cert, key = self_signed(folder)
    ip_only, ip_key = self_signed(folder, "ip-only", hosts=("127.0.0.1",))
    other, _ = self_signed(folder, "other")
    return {"cert": cert, "key": key, "ip_only": ip_only, "ip_key": ip_key, "other": other}


@pytest.fixture
def server(certs: dict[str, Path]) -> Iterator[TlsServer]:
    srv = TlsServer(certs["cert"], certs["key"])
    yield srv
    srv.close()


def _get(transport: SocketTransport, path: str = "/v1/completions") -> tuple[int, bytes]:
    resp = transport.open("POST", path, {}, b"{}", time.monotonic() + 10)
    return resp.status, resp.read_all()


def test_a_ca_bundle_verifies_and_one_tls_connection_carries_every_request(
    server: TlsServer, certs: dict[str, Path]
) -> None:
    t = SocketTransport(f"https://localhost:{server.port}",
                        tls=TlsSettings(ca_bundle=str(certs["cert"])).context())
    results = [_get(t) for _ in range(5)]
    assert results == [(200, b"data: one\n\ndata: two\n\ndata: [DONE]\n\n")] * 5
    assert server.handshakes == 1        # kept alive over TLS: one handshake for five requests
    assert server.sni == ["localhost"]   # SNI names the URL's host


def test_the_system_store_refuses_a_self_signed_server(server: TlsServer) -> None:
    t = SocketTransport(f"https://127.0.0.1:{server.port}")   # default: system trust store
    with pytest.raises(ConnectionFailed, match="self-signed certificate"):
        _get(t)
    assert server.handshakes == 0


def test_ssl_cert_file_replaces_the_system_store(
    server: TlsServer, certs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certs["cert"]))
    t = SocketTransport(f"https://127.0.0.1:{server.port}", tls=TlsSettings().context())
    assert _get(t)[0] == 200


def test_the_wrong_ca_is_refused_and_insecure_accepts_anything(
    server: TlsServer, certs: dict[str, Path]
) -> None:
    wrong = SocketTransport(f"https://127.0.0.1:{server.port}",
                            tls=TlsSettings(ca_bundle=str(certs["other"])).context())
    with pytest.raises(ConnectionFailed, match="certificate verify failed"):
        _get(wrong)
    blind = SocketTransport(f"https://127.0.0.1:{server.port}",
                            tls=TlsSettings(insecure=True).context())
    assert _get(blind)[0] == 200


def test_a_certificate_for_another_host_is_refused(certs: dict[str, Path]) -> None:
    srv = TlsServer(certs["ip_only"], certs["ip_key"])   # names 127.0.0.1, not localhost
    try:
        t = SocketTransport(f"https://localhost:{srv.port}",
                            tls=TlsSettings(ca_bundle=str(certs["ip_only"])).context())
        with pytest.raises(ConnectionFailed, match="Hostname mismatch"):
            _get(t)
    finally:
        srv.close()


def test_a_session_the_server_ended_while_idle_is_replaced(
    server: TlsServer, certs: dict[str, Path]
) -> None:
    t = SocketTransport(f"https://127.0.0.1:{server.port}",
                        tls=TlsSettings(ca_bundle=str(certs["cert"])).context())
    assert _get(t, "/bye")[0] == 200
    assert server.said_bye.wait(10)      # close_notify and FIN are on their way to the idle client
    assert _get(t)[0] == 200             # not a failed request: a fresh connection
    assert server.handshakes == 2


GEVENT_SCRIPT = """
import json, sys, time
from gevent import monkey
monkey.patch_all()
import gevent
from loadlab.loadgen.transport import SocketTransport
from loadlab.spec.tls import TlsSettings

url, bundle = sys.argv[1], sys.argv[2]
ctx = TlsSettings(ca_bundle=bundle).context()

def user():
    t = SocketTransport(url, tls=ctx)
    out = []
    for _ in range(4):
        resp = t.open("POST", "/v1/completions", {}, b"{}", time.monotonic() + 10)
        out.append([resp.status, resp.read_all().decode()])
    return out

users = [gevent.spawn(user) for _ in range(3)]
gevent.joinall(users, raise_error=True)
print(json.dumps([u.value for u in users]))
"""


def test_under_gevent_each_user_keeps_one_tls_connection(
    server: TlsServer, certs: dict[str, Path]
) -> None:
    out = subprocess.run([sys.executable, "-c", GEVENT_SCRIPT, f"https://127.0.0.1:{server.port}",
                          str(certs["cert"])], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows == [[[200, "data: one\n\ndata: two\n\ndata: [DONE]\n\n"]] * 4] * 3
    assert server.handshakes == 3        # 12 requests, 3 users, 3 TLS connections
