"""The gateway through the router the operator deployed, on the local cluster: the API keys Secret
(missing, then malformed: a ConfigError naming it, and a router that serves nobody; then good), keys
enforced, the body limit set and unset in the spec, a tenant over its limit refused while another
is served, the long-prompt cap under a burst, and decode backpressure moving transfers off a decode
pod whose engine reports its KV full.

One PDDeployment for the module, compressed settings: sim engines at TANDEM_SIM_TIME_SCALE=5 (an
answer of 100 tokens takes seconds, so a burst overlaps), decode pods with 64 KV blocks of 16 tokens
(one 600-token prompt fills more than half), team-a at 0.2 requests/s with a burst of 2, long
prompts from 200 tokens at most 2 at once, a decode pod full at 50 % KV usage, read every second.
Every address is a loopback one (127.0.0.0/8).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client

from tandem.api import meta
from tandem.demo import e2e
from tandem.devcluster import kube
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import OperatorProcess, eventually, metric_total, scratch_namespace

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

NAME = "gw"
MODEL = e2e.MODEL
SECRET = "llm-keys"
KEY_A, KEY_B = "sk-team-a-e2e-0001", "sk-team-b-e2e-0001"
SHORT = {"model": MODEL, "prompt": "the quick brown fox", "max_tokens": 4}
LONG = {"model": MODEL, "prompt": " ".join(["word"] * 250), "max_tokens": 100, "stream": True}


def manifest() -> dict[str, Any]:
    return e2e.pddeployment(
        NAME,
        {
            "engine": {
                "type": "sim",
                "image": e2e.IMAGE,
                "env": [{"name": "TANDEM_SIM_TIME_SCALE", "value": "5"}],
            },
            "kvTransfer": {"connector": "NixlConnector"},
            "prefill": e2e.pool(1, requests=e2e.SMALL_POD_REQUESTS),
            "decode": e2e.pool(2, None, "--num-gpu-blocks-override", "64", requests=e2e.SMALL_POD_REQUESTS),
            "router": {
                "replicas": 1,
                "image": e2e.IMAGE,
                "auth": {"apiKeysSecret": SECRET},
                "tenants": [
                    {"name": "team-a", "limits": {"requestsPerSecond": 0.2, "requestBurst": 2}},
                    {"name": "team-b"},
                ],
                "admission": {
                    "longPrompts": {"minTokens": 200, "maxConcurrent": 2},
                    "decodeBackpressure": {
                        "kvUsagePercent": 50,
                        "scrapeIntervalSeconds": 1,
                        "queueSeconds": 1,
                    },
                },
            },
        },
    )


@dataclass
class Deployed:
    cluster: ClusterHandle
    namespace: str

    def pdd(self) -> dict[str, Any]:
        out = self.cluster.kubectl("get", "-n", self.namespace, "pdd", NAME, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def condition(self, kind: str) -> dict[str, Any]:
        for cond in (self.pdd().get("status") or {}).get("conditions") or []:
            if cond["type"] == kind:
                return dict(cond)
        return {}

    def ips(self, role: str, ready: bool = True) -> list[str]:
        with self.cluster.api_client() as api:
            if ready:
                return kube.ready_pod_ips(api, self.namespace, NAME, role)
            pods = kube.raw(
                client.CoreV1Api(api).list_namespaced_pod(
                    self.namespace,
                    label_selector=f"{meta.LABEL_PDD}={NAME},{meta.LABEL_ROLE}={role}",
                    _preload_content=False,
                )
            )["items"]
            return sorted(p["status"]["podIP"] for p in pods if p.get("status", {}).get("podIP"))

    def router(self) -> str:
        ips = self.ips("router", ready=False)
        assert ips, "no router pod with an IP"
        assert ips[0].startswith("127."), ips
        return f"http://{ips[0]}:{meta.ROUTER_PORT}"

    def secret(self, data: dict[str, str]) -> None:
        obj = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }
        self.cluster.kubectl("apply", "-n", self.namespace, "-f", "-", input=yaml.safe_dump(obj))
        # The operator does not watch Secrets: touch the PDDeployment for a pass now, not at resync.
        self.cluster.kubectl(
            "annotate", "-n", self.namespace, "pdd", NAME, f"test.tandem.dev/touch={uuid.uuid4().hex[:8]}",
            "--overwrite",
        )  # fmt: skip


def call(
    url: str, body: dict[str, Any] | None = None, key: str | None = None, timeout: float = 60
) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def metrics(url: str) -> str:
    return call(url + "/metrics")[2].decode()


@pytest.fixture(scope="module")
def deployed(cluster: ClusterHandle, operator: OperatorProcess) -> Iterator[Deployed]:
    with scratch_namespace(cluster, f"t-gateway-{uuid.uuid4().hex[:6]}") as namespace:
        yield Deployed(cluster, namespace)


def test_keys_secret_missing_then_malformed_then_good(deployed: Deployed) -> None:
    """Bad input only the cluster can tell: a ConfigError naming the Secret and the field, and a
    router that refuses everyone (fails closed) until the Secret is good."""
    started = time.monotonic()
    deployed.cluster.kubectl("apply", "-n", deployed.namespace, "-f", "-", input=yaml.safe_dump(manifest()))

    def stalled_with(fragment: str) -> dict[str, Any] | None:
        stalled = deployed.condition("Stalled")
        ok = stalled.get("status") == "True" and fragment in stalled.get("message", "")
        return stalled if ok else None

    stalled = eventually(lambda: stalled_with("not found"), timeout=120, what="Stalled: Secret not found")
    assert stalled["reason"] == "ConfigError"
    assert f"Secret '{SECRET}' (spec.router.auth.apiKeysSecret) not found" in stalled["message"]
    router = eventually(deployed.router, timeout=120, what="a router pod with an IP")
    status, _, body = eventually(
        lambda: call(router + "/v1/completions", SHORT, KEY_A), timeout=60, what="the router to answer"
    )
    assert status == 503, body  # keys configured, none readable: nobody is served
    assert call(router + "/ready")[0] == 503

    deployed.secret({"team-a": "short"})
    stalled = eventually(lambda: stalled_with("entry 'team-a'"), timeout=90, what="Stalled: malformed")
    assert "spec.router.auth.apiKeysSecret" in stalled["message"]
    assert call(router + "/v1/completions", SHORT, KEY_A)[0] == 503

    deployed.secret({"team-a": KEY_A, "team-b": KEY_B})
    eventually(
        lambda: deployed.condition("Ready").get("status") == "True", timeout=180, what="Ready with good keys"
    )
    assert deployed.condition("Stalled").get("status") == "False"
    print(f"keys Secret missing -> malformed -> good -> Ready: {time.monotonic() - started:.1f} s")


def test_keys_are_enforced(deployed: Deployed) -> None:
    router = deployed.router()
    status, headers, body = call(router + "/v1/completions", SHORT)
    assert status == 401
    assert json.loads(body)["error"]["code"] == "invalid_api_key"
    assert headers.get("WWW-Authenticate") == "Bearer"
    assert call(router + "/v1/completions", SHORT, "sk-wrong-key-000000")[0] == 401
    status, _, body = call(router + "/v1/completions", SHORT, KEY_A)
    assert status == 200, body
    assert json.loads(body)["choices"]


def test_the_body_limit_follows_the_spec(deployed: Deployed) -> None:
    """spec.router.admission.maxBodyBytes reaches the running router through its PDDeployment watch:
    set under a request's size, the request gets 413 naming the limit; unset, it is served again."""
    router = deployed.router()
    body = {**SHORT, "prompt": " ".join(["w" * 49] * 100)}  # 5 KB in 100 words
    assert call(router + "/v1/completions", body, KEY_B)[0] == 200

    def admission(value: int | None) -> None:
        patch = json.dumps({"spec": {"router": {"admission": {"maxBodyBytes": value}}}})
        deployed.cluster.kubectl("patch", "-n", deployed.namespace, "pdd", NAME, "--type=merge", "-p", patch)

    admission(2048)
    _, _, raw = eventually(
        lambda: got if (got := call(router + "/v1/completions", body, KEY_B))[0] == 413 else None,
        timeout=60,
        what="413 for a body over the spec's 2048 bytes",
    )
    assert json.loads(raw)["error"]["message"] == "request body over 2048 bytes"
    assert call(router + "/v1/completions", SHORT, KEY_B)[0] == 200  # a small body still passes
    admission(None)  # a merge patch's null removes the field: the router's own 4 MiB again
    eventually(
        lambda: call(router + "/v1/completions", body, KEY_B)[0] == 200,
        timeout=60,
        what="the body served again with maxBodyBytes unset",
    )
    assert "maxBodyBytes" not in deployed.pdd()["spec"]["router"]["admission"]


def test_a_tenant_over_its_limit_is_refused_while_another_is_served(deployed: Deployed) -> None:
    router = deployed.router()
    # team-a: a bucket of 2 at 0.2/s (the test before drew one): refused within 3 requests.
    codes: list[int] = []
    while len(codes) < 3 and 429 not in codes:
        status, headers, body = call(router + "/v1/completions", SHORT, KEY_A)
        codes.append(status)
    assert codes[-1] == 429, codes
    assert set(codes[:-1]) <= {200}
    assert 1 <= int(headers["Retry-After"]) <= 5
    error = json.loads(body)["error"]
    assert (error["type"], error["code"]) == ("rate_limit_exceeded", "tenant_requests")
    assert [call(router + "/v1/completions", SHORT, KEY_B)[0] for _ in range(4)] == [200] * 4
    text = metrics(router)
    assert metric_total(text, "tandem_router_refusals_total", reason="tenant_requests", tenant="team-a") == 1
    assert metric_total(text, "tandem_router_refusals_total", reason="tenant_requests", tenant="team-b") == 0


def test_long_prompt_cap_holds_under_a_burst(deployed: Deployed) -> None:
    router = deployed.router()
    before = metric_total(metrics(router), "tandem_router_refusals_total", reason="long_prompts")
    with ThreadPoolExecutor(max_workers=9) as pool_:
        longs = [pool_.submit(call, router + "/v1/completions", LONG, KEY_B) for _ in range(6)]
        time.sleep(1)  # the long ones are in; short requests meanwhile are not held back by the cap
        shorts = [pool_.submit(call, router + "/v1/completions", SHORT, KEY_B) for _ in range(3)]
        gauge = metric_total(metrics(router), "tandem_router_long_prompts_in_flight")
        long_codes = sorted(f.result()[0] for f in longs)
        short_codes = [f.result()[0] for f in shorts]
    assert long_codes == [200, 200, 429, 429, 429, 429]
    assert short_codes == [200, 200, 200]
    assert gauge == 2  # the router's own count, read mid-burst
    text = metrics(router)
    assert metric_total(text, "tandem_router_refusals_total", reason="long_prompts") - before == 4
    assert metric_total(text, "tandem_router_long_prompts_in_flight") == 0


def engine_successes(ip: str) -> float:
    return metric_total(metrics(f"http://{ip}:{meta.ENGINE_PORT}"), "vllm:request_success_total")


def test_decode_backpressure_moves_transfers(deployed: Deployed) -> None:
    router = deployed.router()
    full, spare = deployed.ips("decode")
    engine = f"http://{full}:{meta.ENGINE_PORT}"
    # Fill one decode pod's KV from outside the router: a 600-token prompt (38 of its 64 blocks)
    # whose generation is slowed 20x so it holds the blocks for the whole test.
    assert call(engine + "/admin/faults", {"slowdown": 20.0})[0] == 200
    filler = ThreadPoolExecutor(max_workers=1)
    fill = {"model": MODEL, "prompt": " ".join(["fill"] * 600), "max_tokens": 300}
    filling = filler.submit(call, engine + "/v1/completions", fill, None, 300)
    try:
        eventually(
            lambda: metric_total(metrics(router), "tandem_router_decode_kv_full_endpoints") == 1,
            timeout=60,
            what="the router to read the decode pod's KV as full",
        )
        full_before, spare_before = engine_successes(full), engine_successes(spare)
        for _ in range(10):
            status, _, body = call(router + "/v1/completions", SHORT, KEY_B)
            assert status == 200, body
        assert engine_successes(full) == full_before  # near full: no new transfer reached it
        assert engine_successes(spare) - spare_before == 10
    finally:
        call(engine + "/admin/faults", {"slowdown": 1.0})
        filling.cancel()
        filler.shutdown(wait=False, cancel_futures=True)
