"""What the REST layer makes of a response body: the apiserver's JSON, or what a proxy in front of it
sends instead (an HTML error page), which must be a KubeError like any refused call, not a
JSONDecodeError escaping from deep inside a reconcile pass. The last test goes through the real
`kubernetes` client to a real HTTP server on loopback standing in for such a proxy."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import kubernetes
import pytest

from tandem.kube.rest import POD, KubeError, KubeRest, decode_body

BAD_GATEWAY = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"


@pytest.mark.parametrize(
    ("status", "raw", "expected"),
    [
        (200, b"", {}),
        (200, b'{"kind": "ConfigMap"}', {"kind": "ConfigMap"}),
        (404, b'{"kind": "Status", "reason": "NotFound"}', {"kind": "Status", "reason": "NotFound"}),
    ],
)
def test_json_objects_are_returned(status: int, raw: bytes, expected: dict[str, str]) -> None:
    assert decode_body(status, raw) == expected


@pytest.mark.parametrize(
    ("status", "raw", "quoted"),
    [
        (502, BAD_GATEWAY, "502 Bad Gateway"),
        (200, b'{"kind": "ConfigMap", "data"', '"kind": "ConfigMap"'),  # cut short
        (200, b'["a list"]', "a list"),
        (503, b"\xff\xfe not utf-8", "not utf-8"),
    ],
)
def test_anything_else_is_a_kube_error_quoting_it(status: int, raw: bytes, quoted: str) -> None:
    with pytest.raises(KubeError) as caught:
        decode_body(status, raw)
    assert caught.value.status == status
    assert caught.value.reason == "InvalidResponse"
    assert quoted in caught.value.message


def test_the_quote_is_bounded() -> None:
    with pytest.raises(KubeError) as caught:
        decode_body(502, b"x" * 100_000)
    assert len(caught.value.message) < 400


class _BadGateway(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(502)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(BAD_GATEWAY)))
        self.end_headers()
        self.wfile.write(BAD_GATEWAY)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def proxy_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BadGateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_proxy_error_page_through_the_client_is_a_kube_error(proxy_url: str) -> None:
    configuration = kubernetes.client.Configuration()
    configuration.host = proxy_url
    kube = KubeRest(kubernetes.client.ApiClient(configuration))
    with pytest.raises(KubeError) as caught:
        kube.get(POD, "default", "any")
    assert caught.value.status == 502
    assert "502 Bad Gateway" in caught.value.message
