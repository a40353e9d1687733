"""The minimal HTTP/1.1 client against real servers speaking each framing /metrics may use."""

from __future__ import annotations

import gzip
import http.server
import threading
from collections.abc import Iterator

import pytest

from loadlab.collect.fetch import MetricsFetcher, endpoint_urls

BODY = b"".join(b'vllm:num_requests_running{engine="%d"} 1.0\n' % i for i in range(3000))


class Framed(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        kind = self.path.strip("/").split("/")[0]
        self.send_response(200)
        if kind == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(BODY), 7000):
                piece = BODY[i:i + 7000]
                self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\nX-Trailer: 1\r\n\r\n")
        elif kind == "eof":
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(BODY)
            self.close_connection = True
        elif kind == "gzip":
            data = gzip.compress(BODY)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def framed_url() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Framed)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("kind", ["length", "chunked", "eof", "gzip"])
def test_each_framing_gives_the_whole_body_repeatedly(framed_url, kind):
    fetcher = MetricsFetcher(f"{framed_url}/{kind}/metrics", timeout_s=5)
    for _ in range(3):  # kept-alive (or reopened after Connection: close) each time
        result = fetcher.fetch()
        assert (result.status, result.error) == (200, None)
        assert result.body == BODY
    fetcher.close()


def test_endpoint_labels_drop_credentials_and_known_suffixes():
    assert endpoint_urls("http://u:pw@h:8000/v1/") == ("http://h:8000", "http://h:8000/metrics")
    assert endpoint_urls("127.0.0.1:9/metrics") == ("http://127.0.0.1:9", "http://127.0.0.1:9/metrics")
    assert endpoint_urls("https://gw/a") == ("https://gw/a", "https://gw/a/metrics")
