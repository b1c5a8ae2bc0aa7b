"""EventRecorder: in the caller's thread without posters; off the pass with them, bounded, closed
after what is queued is posted; a failure to post logged, never raised."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from tandem.controller.events import EventRecorder
from tandem.kube.rest import KubeError

PDD = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "PDDeployment",
    "metadata": {"name": "chat", "namespace": "team", "uid": "u-1", "resourceVersion": "7"},
}
WAIT = 30.0  # generous: nothing here should take more than milliseconds


class GatedKube:
    """Records each Event create; while `gate` is closed, creates wait at it."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.created: list[dict[str, Any]] = []
        self.threads: list[str] = []
        self.entered = threading.Semaphore(0)
        self.fail = fail
        self._lock = threading.Lock()

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        self.entered.release()
        assert self.gate.wait(WAIT)
        if self.fail is not None:
            raise self.fail
        with self._lock:
            self.created.append(event)
            self.threads.append(threading.current_thread().name)


def test_without_posters_the_create_runs_in_the_callers_thread() -> None:
    kube = GatedKube()
    recorder = EventRecorder(kube)  # type: ignore[arg-type]
    recorder.normal(PDD, "Applied", "applied StatefulSet/chat-decode")
    assert [e["reason"] for e in kube.created] == ["Applied"]
    assert kube.threads == [threading.current_thread().name]
    event = kube.created[0]
    assert event["metadata"]["namespace"] == "team"
    assert event["involvedObject"]["uid"] == "u-1"
    assert event["type"] == "Normal"


def test_with_posters_a_post_returns_before_its_create_and_close_waits_for_it() -> None:
    kube = GatedKube()
    kube.gate.clear()
    recorder = EventRecorder(kube, posters=2)  # type: ignore[arg-type]
    recorder.warning(PDD, "Unschedulable", "no node has 8 GPUs")
    recorder.normal(PDD, "Ready", "every pool ready")
    assert kube.entered.acquire(timeout=WAIT)  # a poster holds the first create at the gate
    assert kube.created == []  # the caller went on
    kube.gate.set()
    recorder.close()
    assert sorted(e["reason"] for e in kube.created) == ["Ready", "Unschedulable"]
    assert all(name.startswith("tandem-events") for name in kube.threads)
    recorder.normal(PDD, "Applied", "after close")  # a pass that outlives the shutdown posts its own
    assert kube.threads[-1] == threading.current_thread().name


def test_past_max_pending_new_events_are_dropped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    kube = GatedKube()
    kube.gate.clear()
    recorder = EventRecorder(kube, posters=1, max_pending=3)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="tandem.controller.events"):
        for i in range(5):
            recorder.normal(PDD, "Applied", f"pass {i}")
    assert recorder.dropped == 2
    assert "1 Events dropped" in caplog.text
    kube.gate.set()
    recorder.close()
    assert [e["message"] for e in kube.created] == ["pass 0", "pass 1", "pass 2"]


@pytest.mark.parametrize(
    "failure",
    [KubeError(500, "InternalError", "etcd is slow"), RuntimeError("connection pool closed")],
    ids=["api-error", "other-error"],
)
def test_a_failed_post_on_a_poster_is_logged_not_raised(
    failure: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    kube = GatedKube(fail=failure)
    recorder = EventRecorder(kube, posters=1)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="tandem.controller.events"):
        recorder.warning(PDD, "ApplyFailed", "the StatefulSet was refused")
        recorder.close()
    assert "could not post event ApplyFailed/chat" in caplog.text


def test_a_failed_api_post_in_the_callers_thread_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = GatedKube(fail=KubeError(500, "InternalError", "etcd is slow"))
    recorder = EventRecorder(kube)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="tandem.controller.events"):
        recorder.normal(PDD, "Applied", "applied Service/chat")
    assert "could not post event Applied/chat" in caplog.text


def test_close_drops_what_is_still_queued_after_its_grace() -> None:
    kube = GatedKube()
    kube.gate.clear()
    recorder = EventRecorder(kube, posters=1)  # type: ignore[arg-type]
    for i in range(3):
        recorder.normal(PDD, "Applied", f"pass {i}")
    assert kube.entered.acquire(timeout=WAIT)  # the first is in its create
    closing = threading.Thread(target=recorder.close, kwargs={"grace_seconds": 0.0})
    closing.start()
    assert recorder.closing.wait(WAIT)  # close has begun: its grace is over
    kube.gate.set()  # the create in flight finishes; the two behind it are past the grace
    closing.join(WAIT)
    assert not closing.is_alive()
    assert [e["message"] for e in kube.created] == ["pass 0"]
    assert recorder.dropped == 2
