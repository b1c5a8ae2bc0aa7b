"""Pod events -> endpoints, and which path a request takes."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.kube.pods import PodInfo, pdd_info_from, pod_info_from, pod_label_selector
from tandem.router.discovery import apply_pod_event, draining_by_role, endpoint_list, endpoints_by_role
from tandem.router.metrics import RouterMetrics
from tandem.router.state import RouterState
from tandem.routing.balancer import Balancer
from tandem.routing.paths import Unavailable, choose_path, disaggregated_share, draw_for, wanted_path


def pod(name: str, role: str = "decode", ip: str | None = "127.20.0.5", **over: Any) -> PodInfo:
    fields: dict[str, Any] = dict(
        name=name, pddeployment="llm", role=role, ip=ip, phase="Running", ready=True, terminating=False
    )
    fields.update(over)
    return PodInfo(**fields)


def test_pod_info_from_a_pod_object() -> None:
    obj = {
        "metadata": {
            "name": "llm-decode-0",
            "labels": {"tandem.dev/pddeployment": "llm", "tandem.dev/role": "decode"},
        },
        "status": {
            "phase": "Running",
            "podIP": "127.20.1.4",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
        },
    }
    assert pod_info_from(obj) == pod("llm-decode-0", ip="127.20.1.4")
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pod_info_from(obj).terminating
    assert not pod_info_from({"metadata": {"name": "x"}}).ready


def test_the_draining_annotation_is_read() -> None:
    obj: dict[str, Any] = {
        "metadata": {
            "name": "llm-decode-1",
            "labels": {"tandem.dev/pddeployment": "llm", "tandem.dev/role": "decode"},
            "annotations": {"tandem.dev/draining": "2026-11-30T09:00:00Z"},
        },
        "status": {
            "phase": "Running",
            "podIP": "127.20.1.5",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    assert pod_info_from(obj).draining
    obj["metadata"]["annotations"] = {"other": "x"}
    assert not pod_info_from(obj).draining
    del obj["metadata"]["annotations"]
    assert not pod_info_from(obj).draining


def test_a_draining_pod_gets_no_new_requests_in_either_pool() -> None:
    pods = {
        p.name: p
        for p in (
            pod("p0", role="prefill", ip="127.20.0.1"),
            pod("p1", role="prefill", ip="127.20.0.2", draining=True),
            pod("d0", role="decode", ip="127.20.0.3", draining=True),
            pod("d1", role="decode", ip="127.20.0.4"),
            pod("d2", role="decode", ip="127.20.0.5", draining=True, ready=False),  # counted nowhere
        )
    }
    view = endpoints_by_role(pods, "llm", 8000)
    assert view["prefill"] == ["http://127.20.0.1:8000"]
    assert view["decode"] == ["http://127.20.0.4:8000"]
    assert draining_by_role(pods, "llm") == {"prefill": 1, "decode": 1, "colocated": 0}


def test_pdd_info_reads_the_slo() -> None:
    spec = {"slo": {"ttftMs": 500, "tpotMs": 50}}
    info = pdd_info_from({"metadata": {"name": "llm"}, "spec": spec})
    assert (info.slo_ttft_ms, info.slo_tpot_ms) == (500, 50)
    info = pdd_info_from({"metadata": {"name": "llm"}, "spec": {"slo": {"tpotMs": 50}}})
    assert (info.slo_ttft_ms, info.slo_tpot_ms) == (None, None)


def test_pdd_info_reads_mode_weight_and_model() -> None:
    info = pdd_info_from(
        {
            "metadata": {"name": "llm"},
            "spec": {"serving": {"mode": "Colocated"}, "model": {"name": "m", "maxModelLen": 4096}},
            "status": {"rollout": {"weight": 10}},
        }
    )
    assert (info.serving_mode, info.rollout_weight, info.model_name, info.max_model_len) == (
        "Colocated",
        10,
        "m",
        4096,
    )


def test_selector() -> None:
    assert pod_label_selector("llm") == (
        "tandem.dev/pddeployment=llm,tandem.dev/role in (prefill,decode,colocated)"
    )


EVENTS = [
    ("SYNC", [pod("p0", "prefill", "127.20.0.1"), pod("d0", "decode", "127.20.0.2")]),
    ("ADDED", [pod("d1", "decode", None, ready=False, phase="Pending")]),  # not yet routable
    ("MODIFIED", [pod("d1", "decode", "127.20.0.3")]),  # now Ready with an IP
    ("MODIFIED", [pod("p0", "prefill", "127.20.0.1", terminating=True)]),  # draining
    ("ADDED", [pod("c0", "colocated", "127.20.0.4")]),
    ("ADDED", [pod("x0", "decode", "127.20.0.9", pddeployment="other")]),  # not ours
    ("ADDED", [pod("r0", "router", "127.20.0.8")]),  # not a pool
    ("DELETED", [pod("d0", "decode", "127.20.0.2")]),
]
EXPECTED = [
    {"prefill": ["127.20.0.1"], "decode": ["127.20.0.2"], "colocated": []},
    {"prefill": ["127.20.0.1"], "decode": ["127.20.0.2"], "colocated": []},
    {"prefill": ["127.20.0.1"], "decode": ["127.20.0.2", "127.20.0.3"], "colocated": []},
    {"prefill": [], "decode": ["127.20.0.2", "127.20.0.3"], "colocated": []},
    {"prefill": [], "decode": ["127.20.0.2", "127.20.0.3"], "colocated": ["127.20.0.4"]},
    {"prefill": [], "decode": ["127.20.0.2", "127.20.0.3"], "colocated": ["127.20.0.4"]},
    {"prefill": [], "decode": ["127.20.0.2", "127.20.0.3"], "colocated": ["127.20.0.4"]},
    {"prefill": [], "decode": ["127.20.0.3"], "colocated": ["127.20.0.4"]},
]


def test_events_fold_into_endpoints_step_by_step() -> None:
    pods: dict[str, PodInfo] = {}
    for (kind, infos), expected in zip(EVENTS, EXPECTED, strict=True):
        pods = apply_pod_event(pods, kind, infos)  # type: ignore[arg-type]
        urls = {role: [f"http://{ip}:8000" for ip in ips] for role, ips in expected.items()}
        assert endpoints_by_role(pods, "llm", 8000) == urls, (kind, infos)


def test_sync_replaces_everything() -> None:
    pods = apply_pod_event({}, "SYNC", [pod("a"), pod("b")])
    assert set(apply_pod_event(pods, "SYNC", [pod("c")])) == {"c"}


def test_ipv6_urls_are_bracketed() -> None:
    assert endpoints_by_role({"a": pod("a", ip="::1")}, "llm", 8000)["decode"] == ["http://[::1]:8000"]


@pytest.mark.parametrize(
    ("mode", "weight", "share"),
    [("Disaggregated", None, 100), ("Colocated", None, 0), (None, None, 100), ("Colocated", 30, 30)],
)
def test_share(mode: str | None, weight: int | None, share: int) -> None:
    assert disaggregated_share(mode, weight) == share


@pytest.mark.parametrize(
    ("share", "draw", "ready", "fallback", "path", "stood_in"),
    [
        (100, 0.5, "pdc", True, "disaggregated", False),
        (0, 0.5, "pdc", True, "colocated", False),
        (30, 0.29, "pdc", True, "disaggregated", False),
        (30, 0.30, "pdc", True, "colocated", False),
        (100, 0.5, "dc", True, "colocated", True),  # no prefill: colocated when allowed
        (100, 0.5, "dc", False, "no ready prefill pod", False),
        (100, 0.5, "", True, "no ready prefill and decode pod", False),
        (0, 0.5, "pd", True, "disaggregated", True),  # colocated wanted but none: P/D serves
        (0, 0.5, "p", True, "no ready colocated pod", False),
        (30, 0.29, "c", True, "colocated", True),  # the gray split's P/D share, P/D gone
    ],
)
def test_choose_path(share: int, draw: float, ready: str, fallback: bool, path: str, stood_in: bool) -> None:
    chosen = choose_path(
        share,
        draw,
        has_prefill="p" in ready,
        has_decode="d" in ready,
        has_colocated="c" in ready,
        colocated_fallback=fallback,
    )
    if isinstance(chosen, Unavailable):
        assert path in chosen.message
        assert chosen.wanted == wanted_path(share, draw)
    else:
        assert chosen == path
    # The router counts a request served by a path other than the one meant as stood in for.
    assert (not isinstance(chosen, Unavailable) and chosen != wanted_path(share, draw)) == stood_in


def test_the_gray_split_is_stable_per_request_id_and_even_across_ids() -> None:
    assert draw_for("req-42") == draw_for("req-42")
    draws = [draw_for(f"5eed5eed5eed5eed-{i}") for i in range(20_000)]  # the ids a router mints
    assert all(0 <= d < 1 for d in draws)
    # A 30 % weight sends about 30 % of distinct ids to P/D (binomial sd is about 0.3 %).
    share = sum(d * 100 < 30 for d in draws) / len(draws)
    assert 0.28 < share < 0.32


def group_pod(lws: str, group: int, index: int, *, http: bool, ready: bool = True) -> dict[str, Any]:
    """A pod of a 2-pod LeaderWorkerSet group as the API shows it."""
    labels = {
        "tandem.dev/pddeployment": "llm",
        "tandem.dev/role": "prefill",
        "leaderworkerset.sigs.k8s.io/group-key": f"{lws}-key-{group}",
        "leaderworkerset.sigs.k8s.io/worker-index": str(index),
    }
    name = f"{lws}-{group}" if index == 0 else f"{lws}-{group}-{index}"
    ports = [{"name": "http", "containerPort": 8000}] if http else []
    return {
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"leaderworkerset.sigs.k8s.io/size": "2"},
        },
        "spec": {"containers": [{"name": "engine", "ports": ports}]},
        "status": {
            "phase": "Running",
            "podIP": f"127.20.{group}.{index + 1}",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_group_members_are_read_from_leaderworkerset_labels() -> None:
    leader = pod_info_from(group_pod("llm-prefill", 0, 0, http=True))
    headless = pod_info_from(group_pod("llm-prefill", 0, 1, http=False))
    serving_worker = pod_info_from(group_pod("llm-prefill", 0, 1, http=True))
    assert (leader.group, leader.group_size, leader.serves) == ("llm-prefill-key-0", 2, True)
    assert (headless.serves, serving_worker.serves) == (False, True)
    plain = pod("llm-decode-0")
    assert (plain.group, plain.group_size, plain.serves) == (None, 1, True)


@pytest.mark.parametrize(
    ("worker_http", "worker_ready", "expected"),
    [
        (False, True, ["http://127.20.0.1:8000", "http://127.20.1.1:8000"]),  # one endpoint per group
        (True, True, ["http://127.20.0.1:8000", "http://127.20.0.2:8000", "http://127.20.1.1:8000",
                      "http://127.20.1.2:8000"]),  # every pod serves (Hybrid)
        # Group 0's worker is down: the whole group is out, its Ready leader with it.
        (False, False, ["http://127.20.1.1:8000"]),
        (True, False, ["http://127.20.1.1:8000", "http://127.20.1.2:8000"]),
    ],
)  # fmt: skip
def test_groups_are_endpoints_as_units(worker_http: bool, worker_ready: bool, expected: list[str]) -> None:
    objs = [
        group_pod("llm-prefill", 0, 0, http=True),
        group_pod("llm-prefill", 0, 1, http=worker_http, ready=worker_ready),
        group_pod("llm-prefill", 1, 0, http=True),
        group_pod("llm-prefill", 1, 1, http=worker_http),
    ]
    pods = apply_pod_event({}, "SYNC", [pod_info_from(o) for o in objs])
    assert endpoints_by_role(pods, "llm", 8000)["prefill"] == expected


def test_a_group_missing_a_pod_is_out() -> None:
    """A worker deleted (LeaderWorkerSet is recreating the group): its leader is no endpoint."""
    objs = [group_pod("llm-prefill", 0, 0, http=True), group_pod("llm-prefill", 1, 0, http=True),
            group_pod("llm-prefill", 1, 1, http=False)]  # fmt: skip
    pods = apply_pod_event({}, "SYNC", [pod_info_from(o) for o in objs])
    assert endpoints_by_role(pods, "llm", 8000)["prefill"] == ["http://127.20.1.1:8000"]


def multiport_pod(group: int, index: int, *, ranks: int = 2, ready: bool = True) -> dict[str, Any]:
    """A pod of a 2-pod MultiPortExternal group: `http` and `http-1` .. (ports 8000 + local rank)."""
    obj = group_pod("llm-prefill", group, index, http=True, ready=ready)
    ports = [{"name": "http", "containerPort": 8000}]
    ports += [{"name": f"http-{i}", "containerPort": 8000 + i} for i in range(1, ranks)]
    obj["spec"]["containers"][0]["ports"] = [*ports, {"name": "supervisor", "containerPort": 9256}]
    return obj


def test_a_pod_with_a_port_per_local_rank_is_an_endpoint_per_rank() -> None:
    assert pod_info_from(multiport_pod(0, 1, ranks=4)).api_ports == 4
    assert pod_info_from(group_pod("llm-prefill", 0, 1, http=True)).api_ports == 1
    assert pod("llm-decode-0").api_ports == 1
    objs = [multiport_pod(0, 0), multiport_pod(0, 1)]
    pods = apply_pod_event({}, "SYNC", [pod_info_from(o) for o in objs])
    listed = endpoint_list(pods, "llm", 8000)
    assert [(e.url, e.pod, e.group, e.local_rank) for e in listed] == [
        ("http://127.20.0.1:8000", "llm-prefill-0", "llm-prefill-key-0", 0),
        ("http://127.20.0.1:8001", "llm-prefill-0", "llm-prefill-key-0", 1),
        ("http://127.20.0.2:8000", "llm-prefill-0-1", "llm-prefill-key-0", 0),
        ("http://127.20.0.2:8001", "llm-prefill-0-1", "llm-prefill-key-0", 1),
    ]
    assert endpoints_by_role(pods, "llm", 8000)["prefill"] == [e.url for e in listed]


@pytest.mark.parametrize(
    ("down", "expected"),
    [
        (None, ["http://127.20.0.1:8000", "http://127.20.0.1:8001", "http://127.20.0.2:8000",
                "http://127.20.0.2:8001", "http://127.20.1.1:8000", "http://127.20.1.1:8001",
                "http://127.20.1.2:8000", "http://127.20.1.2:8001"]),
        # One pod of group 0 not Ready (a rank failed or hung past its probe): all four ranks go.
        ((0, 1), ["http://127.20.1.1:8000", "http://127.20.1.1:8001", "http://127.20.1.2:8000",
                  "http://127.20.1.2:8001"]),
        ((1, 0), ["http://127.20.0.1:8000", "http://127.20.0.1:8001", "http://127.20.0.2:8000",
                  "http://127.20.0.2:8001"]),
    ],
)  # fmt: skip
def test_a_group_of_ranks_leaves_as_a_unit(down: tuple[int, int] | None, expected: list[str]) -> None:
    objs = [multiport_pod(g, i, ready=(g, i) != down) for g in (0, 1) for i in (0, 1)]
    pods = apply_pod_event({}, "SYNC", [pod_info_from(o) for o in objs])
    assert endpoints_by_role(pods, "llm", 8000)["prefill"] == expected


def test_each_endpoint_is_labelled_by_pod_port_and_group() -> None:
    state = RouterState(balancer=Balancer(), metrics=RouterMetrics(), pdd_name="llm")
    state.on_pods("SYNC", [pod_info_from(multiport_pod(0, i)) for i in (0, 1)])
    assert state.balancer.pool("prefill") == state.endpoints["prefill"]
    assert len(state.endpoints["prefill"]) == 4
    assert state.endpoint_labels("http://127.20.0.2:8001") == ("llm-prefill-0-1", "8001", "llm-prefill-key-0")
    static = RouterState(balancer=Balancer(), metrics=RouterMetrics())
    static.set_static({"decode": ["http://127.0.0.1:9000"]})
    assert static.endpoint_labels("http://127.0.0.1:9000") == ("127.0.0.1", "9000", "")


def test_a_deleted_pods_leg_counters_go_and_an_unready_pods_stay() -> None:
    metrics = RouterMetrics()
    state = RouterState(balancer=Balancer(), metrics=metrics, pdd_name="llm")
    objs = [multiport_pod(0, i) for i in (0, 1)]
    state.on_pods("SYNC", [pod_info_from(o) for o in objs])
    for url in state.endpoints["prefill"]:
        metrics.child(metrics.endpoint_legs, "prefill", *state.endpoint_labels(url)).inc()

    def legs(pod: str, port: str) -> float | None:
        labels = {"role": "prefill", "pod": pod, "port": port, "group": "llm-prefill-key-0"}
        return metrics.registry.get_sample_value("tandem_router_endpoint_legs_total", labels)

    state.on_pods("MODIFIED", [pod_info_from(multiport_pod(0, 1, ready=False))])
    assert legs("llm-prefill-0-1", "8001") == 1.0  # unready, not gone: its count goes on later
    state.on_pods("DELETED", [pod_info_from(objs[1])])
    assert legs("llm-prefill-0-1", "8000") is None
    assert legs("llm-prefill-0-1", "8001") is None
    assert legs("llm-prefill-0", "8001") == 1.0
    state.on_pods("ADDED", [pod_info_from(objs[1])])  # the same name back: counts from 0 again
    url = "http://127.20.0.2:8001"
    metrics.child(metrics.endpoint_legs, "prefill", *state.endpoint_labels(url)).inc()
    assert legs("llm-prefill-0-1", "8001") == 1.0
