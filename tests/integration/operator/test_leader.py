"""Two operator replicas: exactly one leads (and reconciles); when it stops, the other takes over."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import OperatorProcess


def test_one_leader_and_fail_over(cluster: ClusterHandle, crd: None, tmp_path: Path) -> None:
    lease = f"test-leader-{uuid.uuid4().hex[:6]}"
    shared = ["--lease-name", lease, "--lease-namespace", "default", "--namespace", "kube-public"]
    replicas = [
        OperatorProcess(cluster, [*shared, "--identity", f"replica-{i}"], tmp_path / f"op{i}.log")
        for i in range(2)
    ]
    try:
        # Generous: two operator processes start (imports, kopf, first lease round) on a busy machine.
        deadline = time.monotonic() + 180
        states: list[bool | None] = [None, None]
        while time.monotonic() < deadline:
            states = [r.is_leader() for r in replicas]
            if None not in states and states.count(True) == 1:
                break
            time.sleep(1)
        assert sorted(states, key=bool) == [False, True], states
        for _ in range(6):  # stays that way: never two leaders
            time.sleep(1)
            assert [r.is_leader() for r in replicas].count(True) <= 1
        leader = states.index(True)
        replicas[leader].stop()
        follower = replicas[1 - leader]
        # The lease is handed over on exit; else it lapses in 30 s and the follower's next round takes it.
        follower.wait_leader(timeout=150)
        holder = cluster.kubectl(
            "get", "lease", lease, "-n", "default", "-o", "jsonpath={.spec.holderIdentity}"
        ).stdout
        assert holder == f"replica-{1 - leader}"
    finally:
        for replica in replicas:
            replica.stop()
        cluster.kubectl("delete", "lease", lease, "-n", "default", check=False)
