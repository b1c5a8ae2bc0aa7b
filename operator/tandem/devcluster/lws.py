"""LeaderWorkerSet (sigs.k8s.io/lws) on the dev cluster: its controller manager, CRD and webhooks.

`e2e/build-tools.sh` builds the controller manager from the Go module (`e2e/tools/lws`) into the
binary cache as `lws-controller`, next to the module's CRD (`lws-crd.yaml`) and webhook
configurations (`lws-webhooks.yaml`, `config/webhook/manifests.yaml`). `cluster.start_lws` starts
it on a running cluster (`cluster.up(lws=True)`, `tandem dev cluster up --lws`).

The webhooks: the apiserver here has no Service network, so LWS's own wiring (a Service in
`lws-system`, and its internal cert rotator, which signs for `<service>.<namespace>.svc` only)
cannot be reached. Instead the controller serves its webhooks on 127.0.0.1 with a cert that the
cluster's CA signs for 127.0.0.1 (internal cert management off), and the webhook configurations
name `url: https://127.0.0.1:<port>/<path>` with that CA as caBundle. The pod webhooks are limited
to LWS's pods (`objectSelector` on its name label, as LWS's kustomize patch does), so that no other
pod's create waits on them.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tandem.devcluster import kube, pki

BINARY = "lws-controller"
CRD_FILE = "lws-crd.yaml"
WEBHOOKS_FILE = "lws-webhooks.yaml"
FILES = (BINARY, CRD_FILE, WEBHOOKS_FILE)

GROUP = "leaderworkerset.x-k8s.io"
VERSION = "v1"
PLURAL = "leaderworkersets"
NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
# The names LWS's own install gives them (pkg/cert): kept, so `kubectl get` reads the same.
WEBHOOK_CONFIG_NAMES = {
    "MutatingWebhookConfiguration": "lws-mutating-webhook-configuration",
    "ValidatingWebhookConfiguration": "lws-validating-webhook-configuration",
}


def missing_files(bins: Path) -> list[str]:
    return [name for name in FILES if not (bins / name).exists()]


def config_text(*, port: int, cert_dir: Path) -> str:
    """The controller's `--config`: webhooks on 127.0.0.1:`port` with the certs in `cert_dir`, no
    cert rotator, no leader election, no metrics or probe listeners (nothing here scrapes them)."""
    config = {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": "0"},
    }
    return yaml.safe_dump(config, sort_keys=False)


def argv(bins: Path, config: Path) -> list[str]:
    return [str(bins / BINARY), f"--config={config}", "--zap-devel=false", "--zap-log-level=info"]


def write_certs(p: pki.Pki, cert_dir: Path) -> None:
    """`tls.crt` and `tls.key` (controller-runtime's default names) for 127.0.0.1, from the CA."""
    pki.issue_serving_cert(p, cert_dir / "tls.crt", cert_dir / "tls.key", name="lws-webhook")


def _targets_pods(webhook: dict[str, Any]) -> bool:
    return any("pods" in (rule.get("resources") or []) for rule in webhook.get("rules") or [])


def webhook_configurations(manifests: str, *, port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """LWS's webhook configurations (`config/webhook/manifests.yaml`), each service reference
    replaced by `https://127.0.0.1:<port><path>` with `ca_bundle`, the pod webhooks limited to
    LWS's pods."""
    out = []
    ca = base64.b64encode(ca_bundle).decode()
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        config = copy.deepcopy(doc)
        config["metadata"] = {"name": WEBHOOK_CONFIG_NAMES[config["kind"]]}
        for webhook in config.get("webhooks") or []:
            service = webhook["clientConfig"].get("service") or {}
            webhook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{service.get('path', '')}",
                "caBundle": ca,
            }
            if _targets_pods(webhook):
                webhook["objectSelector"] = {"matchExpressions": [{"key": NAME_LABEL, "operator": "Exists"}]}
            webhook.setdefault("timeoutSeconds", 10)
        out.append(config)
    return out


def apply_webhook_configurations(api: client.ApiClient, configs: list[dict[str, Any]]) -> None:
    """Creates each configuration, or replaces the one an earlier controller of this cluster left
    (its port is stale)."""
    adm = client.AdmissionregistrationV1Api(api)
    for config in configs:
        kind = "mutating" if config["kind"] == "MutatingWebhookConfiguration" else "validating"
        name = config["metadata"]["name"]
        try:
            getattr(adm, f"create_{kind}_webhook_configuration")(config)
            continue
        except ApiException as e:
            if e.status != 409:
                raise
        read = getattr(adm, f"read_{kind}_webhook_configuration")
        current = kube.raw(read(name, _preload_content=False))
        version = current["metadata"]["resourceVersion"]
        body = {**config, "metadata": {**config["metadata"], "resourceVersion": version}}
        getattr(adm, f"replace_{kind}_webhook_configuration")(name, body)


PROBE_BODY = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "LeaderWorkerSet",
    "metadata": {"name": "tandem-webhook-probe"},
    "spec": {
        "replicas": 1,
        "leaderWorkerTemplate": {
            "size": 1,
            "workerTemplate": {"spec": {"containers": [{"name": "c", "image": "probe"}]}},
        },
    },
}


def webhooks_answer(api: client.ApiClient) -> bool:
    """Whether a server-side dry-run create of a LeaderWorkerSet passes: the apiserver reached
    both LWS webhooks (mutating and validating) and they answered."""
    custom = client.CustomObjectsApi(api)
    try:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, copy.deepcopy(PROBE_BODY), dry_run="All"
        )
    except ApiException as e:
        # 409: one exists under that name; the webhooks ran before the storage found the conflict.
        return bool(e.status == 409)
    return True
