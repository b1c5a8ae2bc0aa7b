"""Serving revisions: the id (pure, stable, which fields count), names within the 63-character limits
for the longest allowed PDDeployment name, no collision between revisions, the legacy revision
rendered exactly as before, and a new revision's objects labelled, selected and told their revision."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.api import meta
from tandem.api.rules import MAX_NAME_LENGTH
from tandem.api.status import RevisionRecord
from tandem.render import render
from tandem.render.revision import (
    MAX_STATEFULSET_NAME,
    REVISION_ID_LENGTH,
    name_prefix,
    revision_fields,
    revision_id,
    short_name,
)

from .conftest import build_pdd

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
PDD_NAMES = st.from_regex(r"[a-z]([-a-z0-9]{0,40}[a-z0-9])?", fullmatch=True).filter(
    lambda n: len(n) <= MAX_NAME_LENGTH
)
REVISIONS = st.from_regex(r"[0-9a-f]{10}", fullmatch=True)

BASE_ID = revision_id(build_pdd().spec)


def test_revision_id_is_a_stable_short_hash() -> None:
    # A fixed value: the id must not change between operator versions for the same fields, or an
    # upgrade would start a revision change on every deployment.
    # The image is spelled out so that moving the vLLM pin (the fixtures' image) does not move it.
    fixed = build_pdd({"engine": {"image": "vllm/vllm-openai:v0.27.1"}}).spec
    assert re.fullmatch(r"[0-9a-f]{10}", BASE_ID)
    assert len(BASE_ID) == REVISION_ID_LENGTH
    assert revision_id(fixed) == "9ce665ab6c"


@pytest.mark.parametrize(
    ("patch", "changes"),
    [
        ({"engine": {"image": "vllm/vllm-openai:v0.28.0"}}, True),
        ({"engine": {"type": "sim"}}, True),
        ({"model": {"name": "other"}}, True),
        ({"model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct@abc123"}}, True),  # model revision
        ({"model": {"kvBytesPerToken": 131072}}, True),
        ({"kvTransfer": {"connector": "MooncakeConnector"}}, True),
        ({"network": {"rdma": {"enabled": False}}}, True),
        # Not revision fields: per-pool sizes and flags, link figures, env, pull policy.
        ({"prefill": {"replicas": 3}}, False),
        ({"decode": {"tensorParallelSize": 2}}, False),
        ({"kvTransfer": {"bandwidthGbps": 100}}, False),
        ({"engine": {"env": [{"name": "X", "value": "1"}]}}, False),
        ({"engine": {"imagePullPolicy": "Always"}}, False),
        ({"model": {"maxModelLen": 4096}}, False),
        # A P/D pool moving between one pod a replica and groups (a StatefulSet and a LeaderWorkerSet
        # would take the same name): a new pair, rolled by the revision rollout.
        ({"decode": {"tensorParallelSize": 16, "nodesPerInstance": 2}}, True),
        ({"prefill": {"nodesPerInstance": 2, "parallelism": {"data": 2}}}, True),
    ],
)
def test_which_fields_define_a_revision(patch: dict[str, Any], changes: bool) -> None:
    assert (revision_id(build_pdd(patch).spec) != BASE_ID) is changes


def test_names_of_a_short_and_the_longest_name() -> None:
    assert name_prefix("demo", "0123456789", legacy=True) == "demo"
    assert name_prefix("demo", "0123456789", legacy=False) == "demo-0123456789"
    longest = "a" * 20 + "-" + "b" * (MAX_NAME_LENGTH - 21)
    short = short_name(longest)
    assert len(short) == 33
    assert short.startswith("a" * 20 + "-" + "b" * 6 + "-")
    assert len(name_prefix(longest, "0123456789", legacy=False)) + len("-prefill") == MAX_STATEFULSET_NAME


@settings(max_examples=300, deadline=None)
@given(PDD_NAMES, REVISIONS, REVISIONS)
def test_revision_names_fit_and_never_collide(pdd_name: str, first: str, second: str) -> None:
    for rev in (first, second):
        for legacy in (True, False):
            prefix = name_prefix(pdd_name, rev, legacy=legacy)
            for role in meta.REVISIONED_ROLES:
                sts = f"{prefix}-{role}"
                assert DNS_LABEL.match(sts), sts
                assert len(sts) <= MAX_STATEFULSET_NAME, sts
                # controller-revision-hash label and the pods' names (ordinals up to 9999).
                assert LABEL_VALUE.match(f"{sts}-7d9c5b8f6d")
                assert len(f"{sts}-7d9c5b8f6d") <= 63
                assert DNS_LABEL.match(f"{sts}-9999")
                assert len(f"{sts}-9999") <= 63
    if first != second:
        assert name_prefix(pdd_name, first, legacy=False) != name_prefix(pdd_name, second, legacy=False)
    # The new pair never takes the legacy pair's names.
    assert name_prefix(pdd_name, first, legacy=False) != name_prefix(pdd_name, first, legacy=True)


@settings(max_examples=100, deadline=None)
@given(PDD_NAMES, PDD_NAMES, REVISIONS)
def test_two_deployments_never_share_a_revision_name(a: str, b: str, rev: str) -> None:
    if a != b:
        assert name_prefix(a, rev, legacy=False) != name_prefix(b, rev, legacy=False)


def _by_kind_name(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_the_legacy_revision_renders_as_before() -> None:
    pdd = build_pdd({"engine": {"type": "sim"}})
    legacy = RevisionRecord(id=revision_id(pdd.spec), prefix=pdd.metadata.name, legacy=True)
    assert render(pdd, revision=legacy) == render(pdd)
    for obj in render(pdd):
        assert meta.LABEL_REVISION not in obj["metadata"]["labels"]


@pytest.mark.parametrize("name", ["demo", "x" * MAX_NAME_LENGTH])
def test_a_new_revision_is_named_labelled_selected_and_told(name: str) -> None:
    pdd = build_pdd({"engine": {"type": "sim"}, "colocated": {"replicas": 1}}, name=name)
    rev = revision_id(pdd.spec)
    record = RevisionRecord(id=rev, prefix=name_prefix(name, rev, legacy=False))
    objects = _by_kind_name(render(pdd, revision=record))
    for role in meta.REVISIONED_ROLES:
        sts_name = f"{record.prefix}-{role}"
        sts = objects[("StatefulSet", sts_name)]
        assert len(sts_name) <= MAX_STATEFULSET_NAME
        selector = sts["spec"]["selector"]["matchLabels"]
        assert selector[meta.LABEL_REVISION] == rev
        template = sts["spec"]["template"]
        assert template["metadata"]["labels"][meta.LABEL_REVISION] == rev
        assert sts["spec"]["serviceName"] == sts_name
        env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
        assert env["TANDEM_SERVING_REVISION"] == rev
        assert objects[("Service", sts_name)]["spec"]["selector"][meta.LABEL_REVISION] == rev
        pdb = objects[("PodDisruptionBudget", sts_name)]["spec"]["selector"]
        assert pdb == {"matchLabels": selector}
        assert ("StatefulSet", f"{name}-{role}") not in objects
    # The colocated pool and the router are not part of a revision: today's names, no label.
    colocated = objects[("StatefulSet", f"{name}-colocated")]
    assert meta.LABEL_REVISION not in colocated["spec"]["template"]["metadata"]["labels"]
    assert ("Deployment", f"{name}-router") in objects


def test_legacy_budgets_leave_out_revisioned_pods() -> None:
    objects = _by_kind_name(render(build_pdd()))
    for role in meta.REVISIONED_ROLES:
        selector = objects[("PodDisruptionBudget", f"demo-{role}")]["spec"]["selector"]
        assert selector["matchExpressions"] == [{"key": meta.LABEL_REVISION, "operator": "DoesNotExist"}]


def test_groups_change_the_revision_only_between_kinds() -> None:
    """Within groups, a new shape is the same revision (LeaderWorkerSet rolls its groups); between one
    pod a replica and groups it is a new one; a spec without groups keeps its id (the value is left
    out), so an operator upgrade starts no change on it."""
    two = build_pdd({"decode": {"tensorParallelSize": 16, "nodesPerInstance": 2}}).spec
    four = build_pdd({"decode": {"tensorParallelSize": 32, "nodesPerInstance": 4}}).spec
    assert revision_id(two) == revision_id(four) != BASE_ID
    assert "groupPools" not in revision_fields(build_pdd().spec)
    assert revision_fields(two)["groupPools"] == ["decode"]
