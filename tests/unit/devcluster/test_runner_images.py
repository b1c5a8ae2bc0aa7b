"""Which images the dev cluster's pod runner refuses to "pull" (it shows ImagePullBackOff for them)."""

from __future__ import annotations

import pytest

from tandem.devcluster.runner import image_unpullable


@pytest.mark.parametrize(
    ("image", "unpullable"),
    [
        ("registry.invalid/tandem:0.1.0", True),
        ("registry.invalid:5000/tandem:0.1.0", True),
        ("invalid/tandem:0.1.0", True),
        ("ghcr.io/tandem-dev/tandem:0.1.0", False),
        ("tandem:dev", False),  # no registry host: Docker Hub
        ("library/tandem.invalid", False),  # `.invalid` in the path, not the host
        ("ghcr.io/invalid/tandem:0.1.0", False),
        ("", False),
    ],
)
def test_only_a_registry_host_under_invalid_fails(image: str, unpullable: bool) -> None:
    assert image_unpullable(image) is unpullable
