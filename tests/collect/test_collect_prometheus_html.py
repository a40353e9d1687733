"""A --prometheus-url that answers an HTML page (a UI, a proxy's login) is named as such.

On main the error was the JSON parser's "Expecting value: line 1 column 1 (char 0)", which
says neither which URL answered, nor what, nor what to give instead.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loadlab.collect.prometheus import read_prometheus
from loadlab.errors import InputError


class _LoginProxy(BaseHTTPRequestHandler):
    """Every path redirects to /login, which answers an HTML form, as an auth proxy does."""

    def do_GET(self) -> None:
        if self.path != "/login":
            self.send_response(302)
            self.send_header("Location", "/login")
            self.end_headers()
            return
        body = b"<!doctype html><html><body><form>Sign in</form></body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def login_proxy() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _LoginProxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()


def test_an_html_answer_names_the_url_what_it_answered_and_the_fix(login_proxy) -> None:
    with pytest.raises(InputError) as caught:
        read_prometheus(login_proxy, 1000.0, 1060.0)
    message = str(caught.value)
    assert message.startswith(
        f"{login_proxy}: --prometheus-url: answered {login_proxy}/api/v1/query?query=up with "
        f"something that is not JSON (HTTP 200, text/html, after a redirect to "
        f"{login_proxy}/login)"), message
    assert "give Prometheus' base URL" in message and "Expecting value" not in message
    assert caught.value.exit_code == 2
