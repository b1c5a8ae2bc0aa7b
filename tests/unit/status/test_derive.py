"""Status derivation: conditions, phase and pools from observed workloads (table-driven)."""

from __future__ import annotations

import pytest

from tandem.api.models import PDDeployment
from tandem.api.status import Condition
from tandem.status.derive import Observed, PodProblem, WorkloadState, derive_status

NOW = "2026-11-29T10:00:00Z"
EARLIER = "2026-11-29T09:00:00Z"


def pdd(mode: str = "Disaggregated", generation: int = 3) -> PDDeployment:
    return PDDeployment.model_validate(
        {
            "metadata": {"name": "llama", "namespace": "ns", "uid": "u1", "generation": generation},
            "spec": {
                "model": {"name": "llama-8b", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
                "engine": {"type": "sim", "image": "img"},
                "prefill": {"replicas": 1},
                "decode": {"replicas": 2, "tensorParallelSize": 2},
                "colocated": {"replicas": 1},
                "serving": {"mode": mode},
            },
        }
    )


DESIRED = {"prefill": 1, "decode": 2, "colocated": 0, "router": 1}


def ready(n: int, generation: int = 1) -> WorkloadState:
    return WorkloadState(generation, generation, n, n, n)


ALL_READY = {"prefill": ready(1), "decode": ready(2), "router": ready(1)}


def conditions(status_conditions: list[Condition]) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status_conditions}


@pytest.mark.parametrize(
    ("observed", "phase", "expected"),
    [
        (
            Observed(workloads={}, desired_replicas=DESIRED),
            "Progressing",
            {"Ready": ("False", "WaitingForReplicas"), "Reconciling": ("True", "WaitingForReplicas"),
             "Stalled": ("False", "Progressing"), "Available": ("False", "NoReadyPods")},
        ),
        (
            Observed(workloads=ALL_READY, desired_replicas=DESIRED),
            "Healthy",
            {"Ready": ("True", "AllReplicasReady"), "Reconciling": ("False", "Converged"),
             "Stalled": ("False", "Progressing"), "Available": ("True", "Serving")},
        ),
        (
            Observed(workloads={**ALL_READY, "decode": WorkloadState(1, 1, 2, 1, 2)},
                     desired_replicas=DESIRED),
            "Progressing",
            {"Ready": ("False", "WaitingForReplicas"), "Available": ("True", "Serving")},
        ),
        (
            Observed(workloads={**ALL_READY, "decode": WorkloadState(2, 1, 2, 2, 2)},
                     desired_replicas=DESIRED),
            "Progressing",  # the StatefulSet controller has not seen the latest generation yet
            {"Reconciling": ("True", "WaitingForReplicas")},
        ),
        (
            Observed(
                workloads={**ALL_READY, "decode": ready(1)},
                desired_replicas=DESIRED,
                pod_problems=[PodProblem("llama-decode-1", "decode", "Unschedulable", "no gpu", EARLIER)],
            ),
            "Degraded",
            {"Ready": ("False", "Unschedulable"), "Reconciling": ("False", "Unschedulable"),
             "Stalled": ("True", "Unschedulable"), "Available": ("True", "Serving")},
        ),
        (
            Observed(workloads=ALL_READY, desired_replicas=DESIRED, apply_errors=["StatefulSet/x: no"]),
            "Degraded",
            {"Stalled": ("True", "ApplyFailed")},
        ),
        (
            Observed(desired_replicas=DESIRED, unserved=["the cluster does not serve LeaderWorkerSet"],
                     apply_errors=["StatefulSet/x: no"]),
            "Degraded",  # a missing CRD is named before any apply error
            {"Stalled": ("True", "CRDNotInstalled"), "Ready": ("False", "CRDNotInstalled")},
        ),
    ],
)  # fmt: skip
def test_conditions_and_phase(observed: Observed, phase: str, expected: dict[str, tuple[str, str]]) -> None:
    status = derive_status(pdd(), observed, [], NOW)
    got = conditions(status.conditions)
    assert status.phase == phase
    for kind, value in expected.items():
        assert got[kind] == value, kind
    assert {"Ready", "Reconciling", "Stalled", "Available"} <= set(got)
    assert status.observed_generation == 3
    assert all(c.observed_generation == 3 for c in status.conditions)


def test_pools_report_gpus_and_ready_counts() -> None:
    status = derive_status(pdd(), Observed(workloads=ALL_READY, desired_replicas=DESIRED), [], NOW)
    assert status.pools.decode.gpus == 4
    assert status.pools.decode.ready == "2/2"
    assert status.pools.prefill.gpus == 1
    assert status.pools.router.gpus == 0
    assert status.pools.colocated.desired_replicas == 0
    assert (status.pools.prefill.shape, status.pools.decode.shape, status.pools.router.shape) == (
        "1x1 TP1",
        "1x2 TP2",
        "",
    )


def test_a_multi_node_pool_counts_its_replicas_whole_gpus_and_shows_its_shape() -> None:
    """A replica of TP1 x DP16 over 2 nodes: 16 GPUs each, `2x8 TP1 DP16 EP Hybrid` (printer columns)."""
    doc = pdd().model_dump(by_alias=True, mode="json")
    doc["spec"]["engine"]["type"] = "vllm"
    doc["spec"]["decode"] = {
        "replicas": 2,
        "nodesPerInstance": 2,
        "parallelism": {"data": 16, "expert": True, "loadBalancing": "Hybrid"},
        "gpuType": "NVIDIA-H200",
    }
    observed = Observed(workloads=ALL_READY, desired_replicas=DESIRED)
    status = derive_status(PDDeployment.model_validate(doc), observed, [], NOW)
    assert status.pools.decode.gpus == 32
    assert status.pools.decode.shape == "2x8 TP1 DP16 EP Hybrid NVIDIA-H200"


def test_colocated_mode_needs_colocated_pods_to_be_available() -> None:
    observed = Observed(workloads=ALL_READY, desired_replicas={**DESIRED, "colocated": 1})
    status = derive_status(pdd("Colocated"), observed, [], NOW)
    assert conditions(status.conditions)["Available"] == ("False", "NoReadyPods")
    assert status.mode == "Colocated"


def test_transition_time_kept_while_status_unchanged() -> None:
    observed = Observed(workloads=ALL_READY, desired_replicas=DESIRED)
    first = derive_status(pdd(), observed, [], EARLIER)
    again = derive_status(pdd(), observed, first.conditions, NOW)
    assert [c.last_transition_time for c in again.conditions] == [EARLIER] * 4
    broken = Observed(workloads={**ALL_READY, "decode": ready(1)}, desired_replicas=DESIRED)
    later = derive_status(pdd(), broken, again.conditions, NOW)
    by_type = {c.type: c.last_transition_time for c in later.conditions}
    assert by_type["Ready"] == NOW
    assert by_type["Stalled"] == EARLIER


def test_foreign_conditions_are_kept() -> None:
    foreign = Condition(type="RolloutProgressing", status="True", last_transition_time=EARLIER, reason="Step")
    status = derive_status(pdd(), Observed(desired_replicas=DESIRED), [foreign], NOW)
    assert "RolloutProgressing" in conditions(status.conditions)


def test_kv_transfer_estimate_from_known_architecture() -> None:
    status = derive_status(pdd(), Observed(desired_replicas=DESIRED), [], NOW)
    assert status.kv_transfer.bytes_per_token == 131072
    # 1,000 tokens x 128 KiB at 400 Gb/s = 2.6 ms
    assert status.kv_transfer.ms_per_thousand_tokens == 3


def test_unschedulable_is_progress_until_the_grace_period_ends() -> None:
    problem = PodProblem(
        "llama-decode-1", "decode", "Unschedulable", "0/7 nodes: no gpu", "2026-11-29T09:59:30Z"
    )
    observed = Observed(
        workloads={**ALL_READY, "decode": ready(1)}, desired_replicas=DESIRED, pod_problems=[problem]
    )
    status = derive_status(pdd(), observed, [], NOW)  # 30 s unschedulable
    assert status.phase == "Progressing"
    assert conditions(status.conditions)["Stalled"] == ("False", "Progressing")
    assert "0/7 nodes: no gpu" in next(c.message for c in status.conditions if c.type == "Reconciling")
    later = derive_status(pdd(), observed, status.conditions, "2026-11-29T10:00:31Z")
    assert later.phase == "Degraded"
    assert conditions(later.conditions)["Stalled"] == ("True", "Unschedulable")


@pytest.mark.parametrize(
    ("grace", "seconds_unschedulable", "phase"),
    [
        (600.0, 599.0, "Progressing"),  # a cluster autoscaler still adding the GPU node
        (600.0, 600.0, "Degraded"),
        (10.0, 9.0, "Progressing"),
        (10.0, 10.0, "Degraded"),
        (0.0, 0.0, "Degraded"),  # no grace: unschedulable is stuck at once
    ],
)
def test_the_unschedulable_grace_is_the_operators_setting(
    grace: float, seconds_unschedulable: float, phase: str
) -> None:
    since = "2026-11-29T09:00:00Z"
    now = f"2026-11-29T09:{int(seconds_unschedulable) // 60:02d}:{int(seconds_unschedulable) % 60:02d}Z"
    problem = PodProblem("llama-decode-1", "decode", "Unschedulable", "0/7 nodes: no gpu", since)
    observed = Observed(
        workloads={**ALL_READY, "decode": ready(1)}, desired_replicas=DESIRED, pod_problems=[problem]
    )
    status = derive_status(pdd(), observed, [], now, unschedulable_grace_seconds=grace)
    assert status.phase == phase
    assert (conditions(status.conditions)["Stalled"][0] == "True") is (phase == "Degraded")


def _problem(pod: str, role: str, reason: str) -> PodProblem:
    return PodProblem(pod, role, reason, f"{reason.lower()} on {pod}", EARLIER)


@pytest.mark.parametrize(
    ("problems", "reason", "message"),
    [
        (
            [_problem("p-0", "prefill", "CrashLoopBackOff")],
            "CrashLoopBackOff",
            "pod p-0 (prefill): crashloopbackoff on p-0",
        ),
        # the same problem on two pods of one pool: one shown, one counted
        (
            [_problem("d-0", "decode", "ImagePullFailed"), _problem("d-1", "decode", "ImagePullFailed")],
            "ImagePullFailed",
            "pod d-0 (decode): imagepullfailed on d-0 (and 1 more)",
        ),
        # two pools failing differently: both shown, the first's reason on the condition
        (
            [_problem("d-0", "decode", "ImagePullFailed"), _problem("d-1", "decode", "ImagePullFailed"),
             _problem("p-0", "prefill", "CrashLoopBackOff")],
            "ImagePullFailed",
            "pod d-0 (decode): imagepullfailed on d-0;"
            " pod p-0 (prefill): crashloopbackoff on p-0 (and 1 more)",
        ),
        # a problem of the whole spec (no pod) beside a pod's; problems that do not stall are left out
        (
            [PodProblem("", "decode", "Pending", "waiting"), _problem("r-0", "router", "CrashLoopBackOff")],
            "CrashLoopBackOff",
            "pod r-0 (router): crashloopbackoff on r-0",
        ),
        (
            [PodProblem("", "decode", "ConfigError", "secret hf-token not found"),
             _problem("r-0", "router", "CrashLoopBackOff")],
            "ConfigError",
            "secret hf-token not found; pod r-0 (router): crashloopbackoff on r-0",
        ),
        # at most three distinct shown
        (
            [_problem(f"x-{i}", role, reason) for i, (role, reason) in enumerate(
                [("decode", "Unschedulable"), ("prefill", "ImagePullFailed"), ("router", "CrashLoopBackOff"),
                 ("decode", "ConfigError"), ("decode", "Unschedulable")])],
            "Unschedulable",
            "pod x-0 (decode): unschedulable on x-0; pod x-1 (prefill): imagepullfailed on x-1;"
            " pod x-2 (router): crashloopbackoff on x-2 (and 2 more)",
        ),
    ],
)  # fmt: skip
def test_stalled_names_the_first_problem_of_each_pool_and_reason(
    problems: list[PodProblem], reason: str, message: str
) -> None:
    observed = Observed(
        workloads={**ALL_READY, "decode": ready(1)}, desired_replicas=DESIRED, pod_problems=problems
    )
    status = derive_status(pdd(), observed, [], NOW)
    stalled = next(c for c in status.conditions if c.type == "Stalled")
    assert (stalled.status, stalled.reason, stalled.message) == ("True", reason, message)
