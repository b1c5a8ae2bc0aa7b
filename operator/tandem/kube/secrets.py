"""Reading one Secret again and again: the router's API keys (spec.router.auth.apiKeysSecret).

The router's Role grants `get` on that Secret by name only. A thread reads it every `interval_s`
(every 2 s until a read succeeds, and at once when poked) and hands the decoded data, or why there
is none, to a callback: a rotated key takes effect within one interval, with no restart and no
volume.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from collections.abc import Callable
from typing import Any

from tandem.kube.pods import _api_client, _kubernetes

log = logging.getLogger(__name__)

# (secret name, decoded data or None, gone: the Secret does not exist, error: why no data)
SecretCallback = Callable[[str, dict[str, str] | None, bool, str | None], None]


def decode_data(obj: Any) -> dict[str, str]:
    """A Secret's `data` (base64) decoded as UTF-8 text; an entry that is not text is an error."""
    out: dict[str, str] = {}
    for key, value in (getattr(obj, "data", None) or {}).items():
        try:
            out[key] = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as error:
            raise ValueError(f"entry {key!r} is not UTF-8 text") from error
    return out


class SecretPoller:
    def __init__(
        self,
        namespace: str,
        name_of: Callable[[], str | None],
        on_data: SecretCallback,
        *,
        interval_s: float = 10.0,
    ) -> None:
        self.namespace = namespace
        self._name_of = name_of
        self._on_data = on_data
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tandem-secret", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Read now (the name changed)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        api_client: Any = None
        while not self._stop.is_set():
            name = self._name_of()
            ok = False  # until a read succeeds, read again every 2 s (the router serves nobody meanwhile)
            if name:
                try:
                    if api_client is None:
                        api_client = _api_client()
                    core = _kubernetes("client").CoreV1Api(api_client)
                    obj = core.read_namespaced_secret(name, self.namespace, _request_timeout=10)
                    self._on_data(name, decode_data(obj), False, None)
                    ok = True
                except ValueError as error:
                    self._on_data(name, None, False, f"Secret {name!r}: {error}")
                except Exception as error:
                    status = getattr(error, "status", None)
                    if status == 404:
                        self._on_data(name, None, True, f"Secret {name!r} not found")
                    else:
                        reason = f"HTTP {status}" if status else type(error).__name__
                        self._on_data(name, None, False, f"Secret {name!r} unreadable ({reason})")
            self._wake.wait(self._interval_s if ok else min(2.0, self._interval_s))
            self._wake.clear()
