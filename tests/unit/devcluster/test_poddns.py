"""The pod runner's pod DNS names: `<hostname>.<subdomain>.<namespace>` -> the pod's IP (`poddns`)."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.devcluster import poddns
from tandem.devcluster.expand import ConfigError


def pod(name: str, subdomain: str, ip: str = "", **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, **meta},
        "spec": {"hostname": name, "subdomain": subdomain},
        "status": {"podIP": ip} if ip else {},
    }


GROUP = [pod("mn-0", "mn", "127.20.1.4"), pod("mn-0-1", "mn", "127.20.2.7"), pod("web", "", "127.20.7.2")]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("mn-0.mn.ns", "127.20.1.4"),  # LWS_LEADER_ADDRESS
        ("mn-0.mn.ns.svc", "127.20.1.4"),
        ("mn-0.mn.ns.svc.cluster.local", "127.20.1.4"),
        ("--data-parallel-address=mn-0.mn.ns", "--data-parallel-address=127.20.1.4"),
        ("http://mn-0.mn.ns:9400/env", "http://127.20.1.4:9400/env"),
        ("tcp://mn-0-1.mn.ns:29500", "tcp://127.20.2.7:29500"),
        # left alone: another namespace, a subdomain no pod has, dotted words that are no pod names
        ("mn-0.mn.other", "mn-0.mn.other"),
        ("a.b.ns", "a.b.ns"),
        ("0.33.0", "0.33.0"),
        ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-R1"),
        ("x.mn-0.mn.ns", "x.mn-0.mn.ns"),  # four labels before the namespace: not a pod name
    ],
)
def test_pod_names_become_pod_ips(text: str, want: str) -> None:
    assert poddns.resolve([text], "ns", lambda: GROUP) == [want]


def test_pods_are_listed_only_when_a_text_may_name_one() -> None:
    def boom() -> list[dict[str, Any]]:
        raise AssertionError("listed")

    assert poddns.resolve(["serve", "--port", "8000", "v0.33.0"], "ns", boom) == [
        "serve",
        "--port",
        "8000",
        "v0.33.0",
    ]


def test_a_leader_without_an_ip_or_terminating_is_not_resolved_yet() -> None:
    with pytest.raises(ConfigError, match="no IP yet"):
        poddns.resolve(["mn-0.mn.ns"], "ns", lambda: [pod("mn-0", "mn"), pod("mn-0-1", "mn", "127.0.0.9")])
    # The old leader of a group being recreated: its IP is about to go away, the new one has none.
    gone = pod("mn-0", "mn", "127.20.1.4", deletionTimestamp="2026-01-01T00:00:00Z")
    with pytest.raises(ConfigError, match="no pod mn-0"):
        poddns.resolve(["mn-0.mn.ns"], "ns", lambda: [gone, pod("mn-0-1", "mn", "127.0.0.9")])
