"""A pass's API calls on a thread pool (the operator's `--api-parallelism`) decide and write what
the same passes make one call at a time: the same children, the same `applied` list in rendered
order, the same status and Events, and a failed apply reported for its own child alone."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tandem.controller.events import EventRecorder
from tandem.controller.reconcile import Reconciler
from tandem.kube.rest import Kind, KubeError

from .test_reconcile_autoscaling import NAME, NS, World, manifest


def _passes(pool: ThreadPoolExecutor | None) -> tuple[World, list[list[str]]]:
    world = World(manifest())
    if pool is not None:
        world.reconciler = Reconciler(
            world.kube,  # type: ignore[arg-type]
            EventRecorder(world.kube),  # type: ignore[arg-type]
            world.reconciler.autoscaler,
            api_pool=pool,
        )
    applied = [world.run().applied]
    for _ in range(4):
        applied.append(world.run(5.0).applied)
    return world, applied


def _state(world: World) -> tuple[dict[Any, Any], list[Any]]:
    objects = copy.deepcopy(world.kube.objects)
    for obj in objects.values():
        obj.get("status", {}).pop("conditions", None)  # transition times come from the clock alone
    writes = sorted((w for w in world.kube.writes if w[0] != "event"), key=repr)
    return objects, writes


def test_parallel_passes_write_what_sequential_passes_write() -> None:
    sequential, applied_in_turn = _passes(None)
    with ThreadPoolExecutor(max_workers=8) as pool:
        parallel, applied_at_once = _passes(pool)
    assert applied_at_once == applied_in_turn
    assert len(applied_in_turn[0]) > 5, "the first pass applies every child"
    assert _state(parallel) == _state(sequential)
    assert parallel.events() == sequential.events()


def test_a_failed_apply_is_reported_for_its_child_and_the_rest_are_applied() -> None:
    world = World(manifest())
    real_apply = world.kube.apply

    def apply(kind: Kind, obj: dict[str, Any], field_manager: str | None = None) -> dict[str, Any]:
        if obj["kind"] == "Service" and obj["metadata"]["name"] == f"{NAME}-decode":
            raise KubeError(422, "Invalid", "bad port")
        return real_apply(kind, obj, field_manager)

    world.kube.apply = apply  # type: ignore[method-assign]
    with ThreadPoolExecutor(max_workers=8) as pool:
        world.reconciler = Reconciler(
            world.kube,  # type: ignore[arg-type]
            EventRecorder(world.kube),  # type: ignore[arg-type]
            world.reconciler.autoscaler,
            api_pool=pool,
        )
        result = world.run()
    assert f"Service/{NAME}-decode" not in result.applied
    assert f"StatefulSet/{NAME}-decode" in result.applied
    assert ("Service", NS, f"{NAME}-decode") not in world.kube.objects
    stalled = [c for c in world.pdd["status"]["conditions"] if c["type"] == "Stalled"]
    assert stalled
    assert "bad port" in stalled[0]["message"]


@pytest.mark.parametrize(
    ("error", "terminating"),
    [
        (KubeError(403, "Forbidden", "unable to create new content", ("NamespaceTerminating",)), True),
        (KubeError(403, "Forbidden", "RBAC: access denied"), False),
        (KubeError(409, "Conflict", "x", ("NamespaceTerminating",)), False),
    ],
)
def test_only_a_namespace_being_deleted_stops_a_pass_quietly(error: KubeError, terminating: bool) -> None:
    """Children that cannot be created because their namespace is going away: the pass stops after its
    applies, with no Stalled status and no Warning; any other refusal is reported as before."""
    world = World(manifest())
    real_apply = world.kube.apply

    def apply(kind: Kind, obj: dict[str, Any], field_manager: str | None = None) -> dict[str, Any]:
        if obj["kind"] == "Service":
            raise error
        return real_apply(kind, obj, field_manager)

    world.kube.apply = apply  # type: ignore[method-assign]
    result = world.run()
    assert error.namespace_terminating is terminating
    assert f"StatefulSet/{NAME}-decode" in result.applied
    assert result.status_written is not terminating
    assert (world.events() == []) is terminating
    assert ("status" not in world.pdd) is terminating
