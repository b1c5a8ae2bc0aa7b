"""A stored spec the models refuse (an apiserver with an older, looser CRD) is reported, not acted on:
status Stalled `InvalidSpec` naming the field once, no child touched, and no write on the next pass."""

from __future__ import annotations

from typing import Any

import pytest

from .test_reconcile_autoscaling import NAME, NS, World, manifest


def _stalled(world: World) -> dict[str, Any]:
    return next(c for c in world.pdd["status"]["conditions"] if c["type"] == "Stalled")


def _world(doc: dict[str, Any]) -> World:
    """A world whose status writes go through unconditionally: the fake checks resourceVersion when
    given, and the operator's InvalidSpec write sends none (a merge patch)."""
    world = World(doc)
    patch_status = world.kube.patch_status

    def unconditional(kind: Any, namespace: str, name: str, status: Any, resource_version: Any = None) -> Any:
        rv = world.kube.objects[("PDDeployment", namespace, name)]["metadata"]["resourceVersion"]
        return patch_status(kind, namespace, name, status, resource_version or rv)

    world.kube.patch_status = unconditional  # type: ignore[method-assign]
    return world


@pytest.mark.parametrize(
    ("patch", "named"),
    [
        ({"kvTransfer": {"bandwidthGbps": 4000}}, "spec.kvTransfer.bandwidthGbps: "),
        ({"router": {"replicas": 65}}, "spec.router.replicas: "),
        ({"prefill": {"replicas": 1, "tensorParallelSize": 3}}, "spec.prefill.tensorParallelSize must be"),
    ],
)
def test_invalid_spec_names_the_field_once_and_touches_no_child(patch: dict[str, Any], named: str) -> None:
    doc = manifest()
    doc["spec"].update(patch)
    world = _world(doc)
    result = world.run()
    assert result.applied == []
    assert result.deleted == []
    stalled = _stalled(world)
    assert (stalled["status"], stalled["reason"]) == ("True", "InvalidSpec")
    assert named in stalled["message"], stalled["message"]
    assert "spec.spec." not in stalled["message"]
    assert world.pdd["status"]["observedGeneration"] == 1
    assert [k for k in world.kube.objects if k[0] != "PDDeployment"] == []
    writes = len(world.kube.writes)
    world.run(60.0)  # the same problem again: nothing written, no second Event
    assert len(world.kube.writes) == writes
    assert world.kube.objects[("PDDeployment", NS, NAME)]["status"]["conditions"]


def test_a_validator_that_raises_something_else_is_reported_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in a validator (an exception pydantic does not wrap, as tensorParallelSize 0 once raised
    ZeroDivisionError) still gives the object a Stalled status instead of failing every pass."""
    from tandem.api.models import PDDeployment

    def broken(body: Any) -> Any:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(PDDeployment, "from_object", staticmethod(broken))
    world = _world(manifest())
    result = world.run()
    assert result.applied == []
    stalled = _stalled(world)
    assert (stalled["status"], stalled["reason"]) == ("True", "InvalidSpec")
    assert "ZeroDivisionError: division by zero" in stalled["message"]
    assert stalled["message"].startswith("spec: ")
