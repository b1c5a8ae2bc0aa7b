"""The pod watcher against a fake apiserver that goes away and comes back.

The router must keep routing on its last view while the apiserver is unreachable, and pick up
what changed meanwhile once it is back (relist after reconnect).
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tandem.api import meta
from tandem.kube.pods import PddWatcher
from tandem.router.metrics import RouterMetrics
from tandem.router.state import RouterState
from tandem.routing.balancer import Balancer

from .harness import until
from .sim import free_port

pytestmark = pytest.mark.timeout(120)

NS, PDD = "ns", "llm"


def pod(name: str, role: str, ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": meta.selector_labels(PDD, role)},  # type: ignore[arg-type]
        "spec": {"containers": [{"name": "vllm", "image": "x"}]},
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }


class FakeApiserver:
    """Lists and watches pods and one PDDeployment; watches stay open and send nothing new."""

    def __init__(self, port: int, pods: list[dict[str, Any]], mode: str) -> None:
        self.port, self.pods, self.mode = port, pods, mode
        self.runner: web.AppRunner | None = None
        self.lists = 0

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(f"/api/v1/namespaces/{NS}/pods", self.pod_list)
        app.router.add_get(f"/apis/{meta.GROUP}/{meta.VERSION}/namespaces/{NS}/{meta.PLURAL}", self.pdd_list)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    async def _answer(
        self, request: web.Request, kind: str, items: list[dict[str, Any]]
    ) -> web.StreamResponse:
        if request.query.get("watch") in ("true", "1", "True"):
            response = web.StreamResponse()
            await response.prepare(request)
            await asyncio.sleep(3600)  # no news; ends when the server stops
            return response
        self.lists += 1
        return web.json_response(
            {"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": items}
        )

    async def pod_list(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, "PodList", self.pods)

    async def pdd_list(self, request: web.Request) -> web.StreamResponse:
        pdd = {
            "apiVersion": meta.API_VERSION,
            "kind": meta.KIND,
            "metadata": {"name": PDD, "namespace": NS, "resourceVersion": "7"},
            "spec": {"serving": {"mode": self.mode}, "model": {"name": "m", "maxModelLen": 2048}},
        }
        return await self._answer(request, "PDDeploymentList", [pdd])


def kubeconfig(path: Path, port: int) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "fake", "user": "u"}}],
        "current-context": "c",
    }
    file = path / "kubeconfig"
    file.write_text(json.dumps(config))
    return file


def failed_reconnects(caplog: pytest.LogCaptureFixture, what: str) -> int:
    return sum(f"watch of {what} failed" in r.getMessage() for r in caplog.records)


async def test_last_view_survives_an_apiserver_outage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tandem")
    port = free_port()
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path, port)))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    state = RouterState(balancer=Balancer(), metrics=RouterMetrics(), pdd_name=PDD)
    loop = asyncio.get_running_loop()
    watcher = PddWatcher(
        NS,
        PDD,
        lambda kind, infos: loop.call_soon_threadsafe(state.on_pods, kind, infos),
        lambda info: loop.call_soon_threadsafe(state.on_pdd, info),
        watch_timeout_s=2,
        backoff_initial_s=0.2,
        backoff_max_s=0.5,
    )
    first = FakeApiserver(
        port, [pod("p0", "prefill", "127.0.0.11"), pod("d0", "decode", "127.0.0.12")], "Disaggregated"
    )
    await first.start()
    watcher.start()
    try:
        assert not state.synced
        await until(lambda: state.endpoints["decode"] == ["http://127.0.0.12:8000"], 60)
        await until(lambda: state.serving_mode == "Disaggregated", 60)
        assert state.synced
        assert state.endpoints["prefill"] == ["http://127.0.0.11:8000"]
        assert state.catalog.max_model_len("m") == 2048

        await first.stop()
        before = {what: failed_reconnects(caplog, what) for what in ("pods", "pddeployment")}
        # Several failed reconnects of both watches (counted from their warnings, not timed).
        await until(lambda: all(failed_reconnects(caplog, w) >= before[w] + 3 for w in before), 60)
        assert state.endpoints["prefill"] == ["http://127.0.0.11:8000"]
        assert state.endpoints["decode"] == ["http://127.0.0.12:8000"]
        assert state.serving_mode == "Disaggregated"

        # Back, with d0 replaced by d1 and the mode changed while the router could not see.
        second = FakeApiserver(
            port, [pod("p0", "prefill", "127.0.0.11"), pod("d1", "decode", "127.0.0.13")], "Colocated"
        )
        await second.start()
        try:
            await until(lambda: state.endpoints["decode"] == ["http://127.0.0.13:8000"], 60)
            await until(lambda: state.serving_mode == "Colocated", 60)
            assert second.lists >= 2  # relisted pods and the PDDeployment
        finally:
            watcher.stop()
            await second.stop()
    finally:
        watcher.stop()
