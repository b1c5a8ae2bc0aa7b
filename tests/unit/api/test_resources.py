"""Pool and router resources are checked as Kubernetes checks a container's: names, quantities, and
requests within limits (so a stored spec never renders a pod template the apiserver refuses)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tandem.api.models import Resources
from tandem.api.models.pool import _quantity
from tandem.controller.drift import parse_quantity

QUANTITIES = ["500m", "1", "1000m", "1Gi", "1024Mi", "2", 4, "1e3", "1.5", ".5", "+1k", "100u", "3n", "1Ei"]


@pytest.mark.parametrize("value", QUANTITIES)
def test_quantities_read_as_the_operator_reads_them(value: int | str) -> None:
    assert _quantity(value) == parse_quantity(str(value).lstrip("+"))


@pytest.mark.parametrize(
    ("resources", "valid"),
    [
        ({"requests": {"cpu": "1"}, "limits": {"cpu": "1000m"}}, True),  # equal in another unit
        ({"requests": {"memory": "1Gi"}, "limits": {"memory": "1024Mi"}}, True),
        ({"requests": {"memory": "1025Mi"}, "limits": {"memory": "1Gi"}}, False),
        ({"requests": {"cpu": 2}, "limits": {"memory": "1Gi"}}, True),  # no limit of that resource
        (
            {
                "requests": {"hugepages-2Mi": "1Gi", "example.com/dev": 1, "ephemeral-storage": "1G"},
                "limits": {"hugepages-2Mi": "1024Mi", "example.com/dev": "1"},
            },
            True,
        ),
        ({"requests": {"example.com/dev": 1}}, False),  # an extended resource needs its limit
        ({"requests": {"example.com/dev": 1}, "limits": {"example.com/dev": 2}}, False),  # equal to it
        ({"limits": {"example.com/dev": 2}}, True),  # (the request defaults to the limit)
        ({"requests": {"hugepages-1Gi": "2Gi"}}, False),
        ({"limits": {"example.com/dev": "500m"}}, False),  # extended resources are whole numbers
        ({"limits": {"example.com/dev": "2k"}}, True),
        ({"requests": {"gpu": 1}}, False),  # neither standard nor domain-prefixed
        ({"limits": {"example.com/bad name": 1}}, False),
        ({"requests": {"cpu": "1.5.5"}}, False),
        ({"requests": {"cpu": "-1"}}, False),
        ({"requests": {"cpu": -1}}, False),
    ],
)
def test_resources_as_kubernetes_checks_them(resources: dict[str, Any], valid: bool) -> None:
    if valid:
        Resources.model_validate(resources)
    else:
        with pytest.raises(ValidationError):
            Resources.model_validate(resources)
