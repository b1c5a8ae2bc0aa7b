"""Handing a StatefulSet's replicas to an HPA and back, decided from managedFields."""

from __future__ import annotations

import copy
from typing import Any

from tandem.controller import handover


def sts(*managers: tuple[str, bool], replicas: int = 3) -> dict[str, Any]:
    """A live StatefulSet whose managedFields list (manager, owns spec.replicas) Apply entries."""
    fields = [
        {
            "manager": manager,
            "operation": "Apply",
            "fieldsV1": {"f:spec": {"f:replicas": {}, "f:template": {}} if owns else {"f:template": {}}},
        }
        for manager, owns in managers
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "llama-decode", "namespace": "ns", "managedFields": fields},
        "spec": {"replicas": replicas},
    }


def test_an_operator_owned_count_is_handed_over() -> None:
    assert handover.step(sts(("tandem-operator", True)), external=True) == "hand-over"


def test_once_handed_over_nothing_more() -> None:
    live = sts(("tandem-operator", False), ("tandem-handover", True))
    assert handover.step(live, external=True) == "none"
    hpa = sts(("tandem-operator", False))  # the HPA's scale took the field from the hand-over manager
    assert handover.step(hpa, external=True) == "none"


def test_hand_back_takes_the_count_and_releases_the_second_manager() -> None:
    assert (
        handover.step(sts(("tandem-operator", False), ("tandem-handover", True)), external=False)
        == "hand-back"
    )
    assert handover.step(sts(("tandem-operator", False)), external=False) == "hand-back"
    assert handover.step(sts(("tandem-operator", True)), external=False) == "none"
    assert handover.step(None, external=False) == "none"
    assert handover.step(None, external=True) == "none"


def test_the_pin_holds_only_the_current_count() -> None:
    assert handover.pin_replicas(sts(("tandem-operator", True), replicas=5)) == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "llama-decode", "namespace": "ns"},
        "spec": {"replicas": 5},
    }
    assert "spec" not in handover.release(sts())


def test_update_operations_are_not_applied_configurations() -> None:
    live = sts(("tandem-operator", True))
    live["metadata"]["managedFields"].append(
        {"manager": "tandem-handover", "operation": "Update", "fieldsV1": {"f:spec": {"f:replicas": {}}}}
    )
    assert not handover.has_manager(live, "tandem-handover")


def test_the_trimmed_form_the_cache_keeps_decides_as_the_full_one() -> None:
    cases = [
        [("tandem-operator", True)],
        [("tandem-operator", False), ("tandem-handover", True)],
        [("tandem-operator", False)],
        [("tandem-operator", True), ("tandem-handover", True)],
        [("tandem-handover", False)],
        [("kube-controller-manager", True)],
        [],
    ]
    for managers in cases:
        full = sts(*managers)
        full["metadata"]["managedFields"].append(
            {"manager": "tandem-operator", "operation": "Update", "fieldsV1": {"f:spec": {"f:replicas": {}}}}
        )
        trimmed = handover.trim_managed_fields(copy.deepcopy(full))
        assert "f:template" not in str(trimmed)
        if managers:  # their f:template field sets are gone
            assert len(str(trimmed)) < len(str(full))
        for external in (True, False):
            assert handover.step(trimmed, external) == handover.step(full, external), managers
        for manager in ("tandem-operator", "tandem-handover"):
            assert handover.owns_replicas(trimmed, manager) == handover.owns_replicas(full, manager)
            assert handover.has_manager(trimmed, manager) == handover.has_manager(full, manager)
