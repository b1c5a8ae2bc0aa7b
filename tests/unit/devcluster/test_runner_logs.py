"""The pod runner's registration of a pod's KWOK `Logs` object: best effort, and robust to the old
object of a StatefulSet pod (same name) vanishing between the create and the replace."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tandem.devcluster.runner import register_logs


class FakeCustom:
    """Answers each create/replace with the next scripted status (200: done)."""

    def __init__(self, creates: list[int], replaces: list[int]) -> None:
        self.creates, self.replaces = creates, replaces
        self.calls: list[str] = []

    def _answer(self, kind: str, script: list[int]) -> None:
        self.calls.append(kind)
        status = script.pop(0)
        if status != 200:
            raise ApiException(status=status, reason=f"status {status}")

    def create_namespaced_custom_object(self, *args: Any) -> None:
        self._answer("create", self.creates)

    def replace_namespaced_custom_object(self, *args: Any) -> None:
        self._answer("replace", self.replaces)


@pytest.mark.parametrize(
    ("creates", "replaces", "calls"),
    [
        ([200], [], ["create"]),
        ([404], [], ["create"]),  # no Logs CRD: nothing more to do
        ([409], [200], ["create", "replace"]),  # the old pod's object: replaced
        # The old object garbage-collected between the two calls: created again (the soak's case).
        ([409, 200], [404], ["create", "replace", "create"]),
        ([500], [], ["create"]),  # any other failure: logged, not raised
        ([409], [500], ["create", "replace"]),
        ([409, 409, 409], [404, 404, 404], ["create", "replace"] * 3),  # bounded
    ],
)
def test_registering_logs_never_raises_and_recreates_a_vanished_object(
    creates: list[int], replaces: list[int], calls: list[str]
) -> None:
    custom = FakeCustom(list(creates), list(replaces))
    register_logs(custom, "ns", "soak-prefill-1", {"kind": "Logs"})
    assert custom.calls == calls
