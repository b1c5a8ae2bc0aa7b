"""The pod runner's status writes for a container that keeps failing the same way: written once, as
a kubelet does, and again when anything in them changes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from tandem.devcluster.layout import ClusterDir
from tandem.devcluster.runner import PodWorker, Runner


@dataclass
class Answer:
    data: bytes


class FakeCore:
    def __init__(self) -> None:
        self.writes: list[dict[str, Any]] = []
        self.fail_next = False

    def patch_namespaced_pod_status(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> Any:
        if self.fail_next:
            self.fail_next = False
            raise ApiException(status=500, reason="etcd timeout")
        self.writes.append(body["status"])
        return Answer(b'{"metadata": {"resourceVersion": "%d"}}' % len(self.writes))


def worker(tmp_path: Path) -> tuple[PodWorker, FakeCore]:
    runner = Runner.__new__(Runner)
    runner.cdir = ClusterDir(tmp_path)
    core = FakeCore()
    runner.core = core  # type: ignore[assignment]
    pod = {
        "metadata": {"name": "p-0", "namespace": "ns", "uid": "0123456789abcdef"},
        "spec": {"containers": [{"name": "engine", "image": "tandem:dev"}]},
        "status": {"podIP": "127.0.0.9"},
    }
    return PodWorker(runner, pod), core


def waiting(status: dict[str, Any]) -> dict[str, Any]:
    return dict(status["containerStatuses"][0]["state"]["waiting"])


def test_the_same_waiting_state_is_written_once(tmp_path: Path) -> None:
    pod, core = worker(tmp_path)
    for _ in range(3):  # three retries of the same missing Secret
        pod._patch_waiting("CreateContainerConfigError", 'secret "creds" not found')
    assert len(core.writes) == 1
    pod._patch_waiting("CreateContainerConfigError", 'secret "other" not found')  # a new message
    pod._patch_waiting("ImagePullBackOff", "Back-off pulling image")  # a new reason
    messages = [waiting(w)["message"] for w in core.writes[1:]]
    assert messages == ['secret "other" not found', "Back-off pulling image"]
    pod.restart_count += 1  # a restart: restartCount changed
    pod._patch_waiting("ImagePullBackOff", "Back-off pulling image")
    assert len(core.writes) == 4
    pod._patch_running("2026-11-30T00:00:00Z", ready=False)  # it ran between the two
    pod._patch_waiting("ImagePullBackOff", "Back-off pulling image")
    assert len(core.writes) == 6


def test_a_failed_write_is_tried_again_on_the_next_retry(tmp_path: Path) -> None:
    pod, core = worker(tmp_path)
    core.fail_next = True
    pod._patch_waiting("CreateContainerConfigError", 'secret "creds" not found')
    assert core.writes == []
    pod._patch_waiting("CreateContainerConfigError", 'secret "creds" not found')
    assert len(core.writes) == 1
