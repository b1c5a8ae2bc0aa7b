"""A real vLLM pod that cannot start makes the PDDeployment Stalled, quoting vLLM's own error line.

One Colocated engine on the dev cluster (the CPU build and the tiny model, docs/real-vllm.md), one
engine process at a time. The pod runner, as a kubelet under the rendered
`terminationMessagePolicy: FallbackToLogsOnError`, puts the last 80 lines or 2,048 bytes of the failed
container's log in `lastState.terminated.message`; the operator's status quotes its error line.

- an unknown flag: vLLM's argument parser exits at once, and its `error: unrecognized arguments` line
  is the log's last;
- `--max-model-len` beyond the KV cache (1,000,000 tokens of the tiny model need 1.91 GiB; the CPU
  engine has 1 GiB, `VLLM_ALLOW_LONG_MAX_MODEL_LEN=1` lets the length pass the model's own 2,048):
  vLLM's engine core fails with a ValueError naming both sizes about 60 lines above the end of the
  log, and the front end ends it with `RuntimeError: Engine core initialization failed. See root cause
  above.` A kubelet's 2,048 bytes hold only that last line, so that is what the status can quote.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tandem.api import meta
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import OperatorProcess, eventually, scratch_namespace
from tandem.versions import VLLM_IMAGE

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

NAME = "broken"
ROUTER_IMAGE = "ghcr.io/tandem-dev/tandem:0.1.0"


def manifest(engine_args: list[str], max_model_len: int, env: list[dict[str, str]]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": "tiny-llama", "uri": "file:///models/tiny-llama", "maxModelLen": max_model_len},
        "engine": {"type": "vllm", "image": VLLM_IMAGE, "extraArgs": ["--dtype", "float32"], "env": env},
        "network": {"rdma": {"enabled": False}},
        "router": {"replicas": 1, "image": ROUTER_IMAGE},
        "serving": {"mode": "Colocated"},
        "colocated": {
            "replicas": 1,
            "engineArgs": engine_args,
            "resources": {"requests": {"cpu": "1", "memory": "6Gi"}},
        },
    }
    return {"apiVersion": meta.API_VERSION, "kind": meta.KIND, "metadata": {"name": NAME}, "spec": spec}


@pytest.fixture(scope="module")
def namespace(cluster: ClusterHandle, operator: OperatorProcess) -> Iterator[str]:
    with scratch_namespace(cluster, f"t-broken-{uuid.uuid4().hex[:6]}") as name:
        yield name


def stalled(cluster: ClusterHandle, namespace: str, expected: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", "-n", namespace, "pdd", NAME, "-o", "json").stdout
    conditions = (json.loads(out).get("status") or {}).get("conditions") or []
    for cond in conditions:
        if (
            cond.get("type") == "Stalled"
            and cond.get("status") == "True"
            and expected in cond.get("message", "")
        ):
            return dict(cond)
    return None


def apply(cluster: ClusterHandle, namespace: str, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))


CASES = [
    # id, pool engineArgs, maxModelLen, engine env, the status message's end, how long the failure takes
    (
        "unknown-flag",  # vLLM's parser exits at once
        ["--no-such-flag"],
        2048,
        [],
        "last exit 2: api_server.py: error: unrecognized arguments: --no-such-flag",
        300,
    ),
    (
        "max-model-len-beyond-the-kv-cache",  # the engine core fails after loading the model
        [],
        1_000_000,
        [{"name": "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "value": "1"}],
        "last exit 1: RuntimeError: Engine core initialization failed. See root cause above."
        " Failed core proc(s): {}",
        600,
    ),
]


@pytest.mark.parametrize(
    ("engine_args", "max_model_len", "env", "quoted", "timeout"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_a_pod_that_cannot_start_stalls_with_vllms_error_line(
    cluster: ClusterHandle,
    namespace: str,
    engine_args: list[str],
    max_model_len: int,
    env: list[dict[str, str]],
    quoted: str,
    timeout: float,
) -> None:
    apply(cluster, namespace, manifest(engine_args, max_model_len, env))
    cond = eventually(
        lambda: stalled(cluster, namespace, quoted),
        timeout=timeout,
        interval=2,
        what=f"Stalled quoting {quoted!r}",
    )
    print(f"\nStalled: {cond['message']}")
    assert cond["reason"] == "CrashLoopBackOff"
    assert f"pod {NAME}-colocated-0 (colocated)" in cond["message"]
    assert cond["message"].endswith(quoted)
