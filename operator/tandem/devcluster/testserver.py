"""A tiny HTTP server for the dev cluster's own tests: `/health`, Prometheus `/metrics`, `/env`.

Run by the pod runner as `tandem dev testserver --host $(POD_IP) --port N`. To exercise the runner
it can turn healthy late (`--ready-after`), unhealthy (`--unhealthy-after`) or crash
(`--exit-after`, `--exit-code`). With `--peer URL` it fetches URL (retrying every half second) and
is healthy only once that succeeded; `/peer` answers with what it fetched (a LeaderWorkerSet
worker reaching its leader at `$(LWS_LEADER_ADDRESS)`).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest


def serve(
    host: str,
    port: int,
    *,
    ready_after: float = 0.0,
    unhealthy_after: float = 0.0,
    exit_after: float = 0.0,
    exit_code: int = 1,
    peer: str = "",
) -> int:
    registry = CollectorRegistry()
    requests = Counter("tandem_testserver_requests", "HTTP requests served", ["path"], registry=registry)
    Gauge("tandem_testserver_start_time_seconds", "start time", registry=registry).set(time.time())
    started = time.monotonic()
    fetched: list[bytes] = []  # the peer's answer, once it came

    def fetch_peer() -> None:
        while True:
            try:
                with urllib.request.urlopen(peer, timeout=5) as response:
                    fetched.append(response.read())
                print(f"testserver reached its peer {peer}", flush=True)
                return
            except OSError:
                time.sleep(0.5)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.labels(path=self.path).inc()
            if self.path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif self.path == "/env":
                self._send(200, json.dumps(dict(os.environ)).encode(), "application/json")
            elif self.path == "/peer" and fetched:
                self._send(200, fetched[0], "application/octet-stream")
            elif self.path == "/health":
                age = time.monotonic() - started
                ok = age >= ready_after and not (unhealthy_after > 0 and age >= unhealthy_after)
                ok = ok and (not peer or bool(fetched))
                self._send(200 if ok else 503, b"ok\n" if ok else b"starting\n", "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    print(f"testserver on {host}:{port} (pod {os.environ.get('POD_NAME', '?')})", flush=True)
    if peer:
        threading.Thread(target=fetch_peer, daemon=True).start()
    if exit_after > 0:

        def crash() -> None:
            time.sleep(exit_after)
            print(f"testserver exiting with code {exit_code}", flush=True)
            os._exit(exit_code)

        threading.Thread(target=crash, daemon=True).start()
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever(poll_interval=1.0)
    return 0
