"""The dev cluster's LeaderWorkerSet wiring: LWS's webhook configurations pointed at 127.0.0.1."""

from __future__ import annotations

import base64

import yaml

from tandem.devcluster import lws

# The shape of sigs.k8s.io/lws config/webhook/manifests.yaml (v0.7.0), cut to one webhook a kind.
MANIFESTS = """
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: mutating-webhook-configuration}
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service:
      name: webhook-service
      namespace: system
      path: /mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset
  failurePolicy: Fail
  name: mleaderworkerset.kb.io
  rules:
  - apiGroups: [leaderworkerset.x-k8s.io]
    apiVersions: [v1]
    operations: [CREATE, UPDATE]
    resources: [leaderworkersets]
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
  failurePolicy: Fail
  name: mpod.kb.io
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
  sideEffects: None
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: validating-webhook-configuration}
webhooks:
- admissionReviewVersions: [v1]
  clientConfig: {service: {name: webhook-service, namespace: system, path: /validate--v1-pod}}
  failurePolicy: Fail
  name: vpod.kb.io
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [pods]}]
  sideEffects: None
"""


def test_webhooks_are_called_by_url_on_loopback_with_the_cluster_ca() -> None:
    mutating, validating = lws.webhook_configurations(MANIFESTS, port=4443, ca_bundle=b"CA PEM")
    assert mutating["metadata"] == {"name": "lws-mutating-webhook-configuration"}
    assert validating["metadata"] == {"name": "lws-validating-webhook-configuration"}
    urls = [w["clientConfig"]["url"] for c in (mutating, validating) for w in c["webhooks"]]
    assert urls == [
        "https://127.0.0.1:4443/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
        "https://127.0.0.1:4443/mutate--v1-pod",
        "https://127.0.0.1:4443/validate--v1-pod",
    ]
    for config in (mutating, validating):
        for webhook in config["webhooks"]:
            assert "service" not in webhook["clientConfig"]
            assert base64.b64decode(webhook["clientConfig"]["caBundle"]) == b"CA PEM"


def test_only_lws_pods_go_through_the_pod_webhooks() -> None:
    mutating, validating = lws.webhook_configurations(MANIFESTS, port=1, ca_bundle=b"")
    selector = {"matchExpressions": [{"key": lws.NAME_LABEL, "operator": "Exists"}]}
    assert "objectSelector" not in mutating["webhooks"][0]  # LeaderWorkerSets themselves
    assert mutating["webhooks"][1]["objectSelector"] == selector
    assert validating["webhooks"][0]["objectSelector"] == selector


def test_the_controller_serves_its_webhooks_on_loopback_without_its_cert_rotator(tmp_path: object) -> None:
    config = yaml.safe_load(lws.config_text(port=4443, cert_dir=tmp_path))  # type: ignore[arg-type]
    assert config["webhook"] == {"port": 4443, "host": "127.0.0.1", "certDir": str(tmp_path)}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["leaderElection"] == {"leaderElect": False}
