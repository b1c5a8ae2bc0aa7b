"""The status merge patch: removed fields are nulled, other writers' fields are left alone."""

from __future__ import annotations

from tandem.controller.reconcile import merge_patch, status_patch


def test_merge_patch_sets_changes_and_nulls_removals() -> None:
    old = {"a": 1, "b": {"c": 2, "d": 3}, "l": [1, 2]}
    new = {"a": 1, "b": {"c": 5}, "l": [1], "e": "x"}
    assert merge_patch(old, new) == {"b": {"c": 5, "d": None}, "l": [1], "e": "x"}
    assert merge_patch(new, new) == {}


def test_a_finished_drain_is_removed_from_status() -> None:
    old = {"autoscaling": {"pools": {"decode": {"desiredReplicas": 2, "draining": {"pod": "x-decode-2"}}}}}
    new = {"autoscaling": {"pools": {"decode": {"desiredReplicas": 2}}}}
    assert status_patch(old, new) == {"autoscaling": {"pools": {"decode": {"draining": None}}}}


def test_fields_of_other_writers_stay() -> None:
    old = {"phase": "Healthy", "otherWriter": {"step": 2}}
    assert status_patch(old, {"phase": "Progressing"}) == {"phase": "Progressing"}
