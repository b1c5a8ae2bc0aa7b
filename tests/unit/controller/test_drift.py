"""Table-driven tests of the apply-or-skip decision."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tandem.controller.drift import is_subset, parse_quantity


@pytest.mark.parametrize(
    ("desired", "observed", "expected"),
    [
        ({"a": 1}, {"a": 1, "b": 2}, True),
        ({"a": 1}, {"a": 2}, False),
        ({"a": {"b": [1, 2]}}, {"a": {"b": [1, 2], "c": 3}}, True),
        ({"a": [1, 2]}, {"a": [1, 2, 3]}, False),
        ({"a": [{"n": "x"}]}, {"a": [{"n": "x", "default": True}]}, True),
        ({"a": {}}, {}, True),  # empty maps are dropped by the apiserver
        ({"a": []}, {}, True),
        ({"a": False}, {}, True),
        ({"a": "x"}, {}, False),
        ({"limits": {"nvidia.com/gpu": 1}}, {"limits": {"nvidia.com/gpu": "1"}}, True),
        ({"memory": "1024Mi"}, {"memory": "1Gi"}, True),
        ({"cpu": "0.5"}, {"cpu": "500m"}, True),
        ({"cpu": "1"}, {"cpu": "500m"}, False),
        ({"flag": True}, {"flag": "True"}, False),
        ({"port": 8000}, {"port": 8000}, True),
    ],
)
def test_is_subset(desired: dict[str, Any], observed: dict[str, Any], expected: bool) -> None:
    assert is_subset(desired, observed) is expected


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", Decimal(1)),
        ("500m", Decimal("0.5")),
        ("1Ki", Decimal(1024)),
        ("2G", Decimal("2e9")),
        ("1e3", Decimal(1000)),
    ],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


def test_parse_quantity_rejects_words() -> None:
    assert parse_quantity("Parallel") is None
