"""Starting, inspecting and stopping the dev cluster (`tandem dev cluster up|down|status`).

Order of `up`: PKI, etcd, kube-apiserver (waits for /readyz), kube-controller-manager,
kube-scheduler and the KWOK controller, the fake nodes from `e2e/nodes/`, Prometheus, the pod
runner. Everything listens on 127.0.0.1 on free ports. What was started is recorded in
`state.json` in the cluster directory; `down` stops it and then sweeps any process still carrying
the cluster's marker.
"""

from __future__ import annotations

import base64
import fcntl
import json
import re
import shutil
import ssl
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tandem.devcluster import kube, layout, lws, pki, procs, realvllm
from tandem.devcluster.layout import ClusterDir
from tandem.render import admission

# Never dialled: Service cluster IPs are bookkeeping only here (nothing routes them, and Services
# get no endpoints for loopback pods). Kept inside 127.0.0.0/8 like every other address.
SERVICE_CIDR = "127.100.0.0/16"
# Pod CIDRs: e2e/nodes/ gives each node 127.20.N.0/24; each running cluster on this machine gets
# its own second octet (20, 21, ...) so that two clusters never hand out the same pod IP.
POD_OCTETS = range(20, 100)
# Fallback pod CIDR of KWOK for nodes without spec.podCIDR (every node in e2e/nodes/ has one).
KWOK_FALLBACK_SUBNET = 250
# Serialises the choice of pod octet between clusters starting at the same time.
OCTET_LOCK = Path(tempfile.gettempdir()) / "tandem-devcluster.lock"

# The binaries are listed in start order; the LWS controller only runs when asked (`start_lws`).
START_ORDER = (*layout.CONTROL_PLANE_BINARIES, LWS_COMPONENT := "lws-controller", "pod-runner")


class ClusterError(RuntimeError):
    """The cluster could not be started, or is not running."""


@dataclass
class State:
    """What `up` started; written to `state.json`."""

    dir: str
    bin_dir: str
    apiserver_port: int
    etcd_port: int
    prometheus_port: int
    kwok_port: int
    started_at: float
    etcd_peer_port: int = 0
    pids: dict[str, int] = field(default_factory=dict)
    startup_seconds: float = 0.0
    pod_octet: int = POD_OCTETS[0]
    # A process whose end means the cluster is garbage (a pytest session); 0 for `cluster up`.
    owner_pid: int = 0
    # The LeaderWorkerSet controller's webhook port on 127.0.0.1; 0 while it does not run.
    lws_webhook_port: int = 0

    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    @classmethod
    def load(cls, path: Path) -> State:
        return cls(**json.loads(path.read_text()))

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)


def _log(msg: str) -> None:
    print(f"[tandem dev cluster] {msg}", flush=True)


def load_state(cdir: ClusterDir) -> State | None:
    try:
        return State.load(cdir.state)
    except (OSError, ValueError, TypeError):
        return None


def alive(cdir: ClusterDir, state: State) -> dict[str, bool]:
    """Each recorded component -> whether its process is still running."""
    return {name: procs.has_marker(pid, cdir.marker) for name, pid in state.pids.items()}


def is_running(cdir: ClusterDir) -> bool:
    state = load_state(cdir)
    if state is None or not state.pids:
        return False
    return all(alive(cdir, state).values()) and _apiserver_ready(cdir, state)


def _ssl_context(p: pki.Pki) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(p.ca_crt))
    ctx.load_cert_chain(str(p.admin_crt), str(p.admin_key))
    return ctx


def _apiserver_ready(cdir: ClusterDir, state: State) -> bool:
    try:
        ctx = _ssl_context(pki.Pki(cdir.pki))
        with urllib.request.urlopen(f"{state.apiserver_url}/readyz", context=ctx, timeout=5) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def write_kubeconfig(path: Path, server: str, p: pki.Pki) -> None:
    """A kubeconfig with the CA and the admin client cert inlined, so it may be copied anywhere."""

    def b64(f: Path) -> str:
        return base64.b64encode(f.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "tandem-dev",
                "cluster": {"server": server, "certificate-authority-data": b64(p.ca_crt)},
            }
        ],
        "users": [
            {
                "name": "tandem-admin",
                "user": {
                    "client-certificate-data": b64(p.admin_crt),
                    "client-key-data": b64(p.admin_key),
                },
            }
        ],
        "contexts": [{"name": "tandem-dev", "context": {"cluster": "tandem-dev", "user": "tandem-admin"}}],
        "current-context": "tandem-dev",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


def _fail(cdir: ClusterDir, what: str, log: Path) -> ClusterError:
    tail = "\n".join(procs.iter_lines(log, 25))
    return ClusterError(f"{what} (log: {log})\n{tail}")


def _with_octet(cidr: str, octet: int) -> str:
    return re.sub(r"^127\.\d+\.", f"127.{octet}.", cidr)


def _load_nodes(octet: int) -> list[dict[str, Any]]:
    """The fake nodes of e2e/nodes/, with pod CIDRs moved to 127.<octet>.N.0/24."""
    nodes: list[dict[str, Any]] = []
    for f in sorted(layout.NODES_DIR.glob("*.yaml")):
        nodes += [d for d in yaml.safe_load_all(f.read_text()) if d]
    for node in nodes:
        spec = node.setdefault("spec", {})
        if "podCIDR" in spec:
            spec["podCIDR"] = _with_octet(spec["podCIDR"], octet)
        if "podCIDRs" in spec:
            spec["podCIDRs"] = [_with_octet(c, octet) for c in spec["podCIDRs"]]
    return nodes


def listening_octets(proc_net_tcp: str) -> set[int]:
    """The second octets of the 127.x.y.z addresses sockets listen on, from `/proc/net/tcp`'s text
    (local address as little-endian hex, state 0A = LISTEN)."""
    octets = set()
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] != "0A":
            continue
        address = bytes.fromhex(fields[1].split(":")[0])[::-1]
        if len(address) == 4 and address[0] == 127:
            octets.add(address[1])
    return octets


def _pick_pod_octet(cdir: ClusterDir) -> int:
    """The lowest pod octet no other running cluster on this machine uses, and on which no process
    listens: a pod process that outlived its cluster (its state gone) still holds its pod IP, and a
    pod given that IP again would have its probes answered by the stray process."""
    try:
        used = listening_octets(Path("/proc/net/tcp").read_text())
    except OSError:
        used = set()
    used.discard(0)  # 127.0.x: the control plane's own ports
    for marker in procs.markers():
        if marker == cdir.marker:
            continue
        other = load_state(ClusterDir(Path(marker)))
        if other is not None:
            used.add(other.pod_octet)
    free = [o for o in POD_OCTETS if o not in used]
    if not free:
        raise ClusterError(f"all pod octets {POD_OCTETS.start}-{POD_OCTETS.stop - 1} are in use")
    return free[0]


def reap_orphans() -> list[str]:
    """Stops clusters whose owner process (a pytest session killed before teardown) is gone."""
    reaped = []
    for marker in procs.markers():
        other = ClusterDir(Path(marker))
        state = load_state(other)
        if state is not None and state.owner_pid and not Path(f"/proc/{state.owner_pid}").exists():
            down(other, quiet=True)
            reaped.append(marker)
    return reaped


def kwok_only_stages(text: str) -> str:
    """The KWOK stages without tandem's own (`tandem-*`): every pod, tandem's too, gets KWOK's fast
    lifecycle (Running and Ready at once, deleted at once) and no process runs for it."""
    docs = [d for d in yaml.safe_load_all(text) if d]
    kept = [d for d in docs if not str(d["metadata"]["name"]).startswith("tandem-")]
    return yaml.safe_dump_all(kept, sort_keys=False)


COMMAND_KEY = ".spec.containers[0].command[0]"


def vllm_pod_stages(text: str) -> str:
    """The KWOK stages with pods whose command is `vllm` taken as tandem's own: Running with a pod
    IP but not Ready, for the pod runner to start (`realvllm`), and kept until it has stopped them."""
    docs = [d for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        for expression in doc["spec"].get("selector", {}).get("matchExpressions", []):
            if expression["key"] == COMMAND_KEY and expression["values"] == ["tandem"]:
                expression["values"] = ["tandem", "vllm"]
    return yaml.safe_dump_all(docs, sort_keys=False)


def up(
    cdir: ClusterDir,
    *,
    timeout: float = 180.0,
    owner_pid: int = 0,
    pod_runner: bool = True,
    vllm: realvllm.EngineSetup | None = None,
    audit: bool = False,
    lws: bool = False,
    profiling: bool = False,
) -> State:
    """Starts the cluster in `cdir`, or returns the state of the one already running there.

    With `owner_pid`, the cluster counts as an orphan once that process is gone (`reap_orphans`).
    With `pod_runner=False` (scale benches: thousands of pods, no processes), the pod runner is not
    started and KWOK makes every pod Ready at once, tandem's own (routers, sim engines) included
    (`kwok_only_stages`): nothing answers on their ports. Node leases are then renewed every 10 min
    and the node lifecycle controller waits an hour for a heartbeat (see `fleet_flags`).
    With `vllm` (tests/real/), the pod runner also runs pods whose command is `vllm serve`, with the
    CPU build of vLLM that `vllm` names (`tandem.devcluster.realvllm`); otherwise such pods take
    KWOK's fast lifecycle and no process runs for them.
    With `audit`, the apiserver writes an audit log (`ClusterDir.audit_log`, `AUDIT_POLICY`): every
    request for tandem's kinds, pods, Secrets and Leases with its user agent, which
    `apiserver_request_total` does not carry (`fleet.audit_requests` counts them by client).
    With `lws`, the LeaderWorkerSet controller runs too (`start_lws`); it can also be started later.
    With `profiling`, the apiserver serves Go's CPU and heap profiles at /debug/pprof (benches:
    where its time goes under load); every other component keeps `--profiling=false`.
    """
    if is_running(cdir):
        if lws:
            start_lws(cdir)
        running = load_state(cdir)
        assert running is not None
        _log(f"already running in {cdir.path}")
        return running
    if cdir.state.exists():
        _log(f"stale cluster state in {cdir.path}; cleaning up first")
        down(cdir)

    bins = layout.bin_dir()
    missing = layout.missing_binaries(bins)
    if missing:
        raise ClusterError(
            f"missing binaries in {bins}: {', '.join(missing)}. Build them with `make tools` "
            "(e2e/build-tools.sh), or point TANDEM_BIN_DIR at a directory that has them."
        )

    # Without the pod runner (scale runs, hundreds of fake nodes on a shared machine): KWOK renews
    # each node's lease every 10 min instead of 40 s, and the node lifecycle controller waits an
    # hour for a heartbeat, so a busy apiserver never gets nodes marked NotReady and their pods
    # unready (which would flap every PDDeployment's Ready condition). With it, 2 min instead of
    # 40 s: in a CI run the controller marked every node, and so every pod, not ready 21 s after a
    # 23 s kube-apiserver restart, though KWOK had renewed each lease twice since (on a loaded
    # machine the controller-manager's watches come back late).
    # The controller-manager's client is rate-limited to 20 requests a second by default (burst 30):
    # the pods of 100 PDDeployments then took it 45 s after a bare client had applied every workload
    # in 4 s (idle machine, bench/operator_scale.py). Managed clusters raise the limit with their size
    # (Huawei CCE: 100 by default, 200 from 1,000 nodes, the scale bench's fleet): 200, burst 400.
    fleet_flags: dict[str, list[str]] = {
        "kube-controller-manager": [
            "--node-monitor-grace-period=2m" if pod_runner else "--node-monitor-grace-period=1h",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
        ],
        "lease": ["40"] if pod_runner else ["600"],
    }
    t0 = time.monotonic()
    cdir.path.mkdir(parents=True, exist_ok=True)
    for sub in (cdir.etcd_data, cdir.prometheus_data, cdir.kwok_workdir, cdir.pki, cdir.logs, cdir.pod_logs):
        shutil.rmtree(sub, ignore_errors=True)
    cdir.runner_ready.unlink(missing_ok=True)
    cdir.logs.mkdir(parents=True, exist_ok=True)
    cdir.pod_logs.mkdir(parents=True, exist_ok=True)
    cdir.kwok_workdir.mkdir(parents=True, exist_ok=True)
    certs = pki.create(cdir.pki)

    state = State(
        dir=str(cdir.path),
        bin_dir=str(bins),
        apiserver_port=procs.free_port(),
        etcd_port=procs.free_port(),
        prometheus_port=procs.free_port(),
        kwok_port=procs.free_port(),
        started_at=time.time(),
        owner_pid=owner_pid,
    )
    state.etcd_peer_port = procs.free_port()
    # Held until etcd runs with this cluster's marker and state.json names the octet.
    lock = OCTET_LOCK.open("a")
    fcntl.flock(lock, fcntl.LOCK_EX)

    def start(name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = cdir.logs / f"{name}.log"
        state.pids[name] = procs.spawn(argv, log=log, marker=cdir.marker, env=env, cwd=cdir.path).pid
        state.save(cdir.state)

    def check_alive(name: str) -> None:
        if not procs.has_marker(state.pids[name], cdir.marker):
            raise _fail(cdir, f"{name} exited during startup", cdir.logs / f"{name}.log")

    def wait(what: str, check: Any, component: str, limit: float = timeout) -> None:
        log = cdir.logs / f"{component}.log"

        def probe() -> bool:
            check_alive(component)
            # Some servers (KWOK's) log a failed listen and run on without it: fail now, not at the
            # deadline.
            if log.exists() and b"bind: address already in use" in log.read_bytes():
                raise _fail(cdir, f"{component} could not listen on its port", log)
            return bool(check())

        try:
            procs.wait_until(probe, timeout=limit, interval=0.3, what=what)
        except TimeoutError as e:
            raise _fail(cdir, str(e), cdir.logs / f"{component}.log") from e

    try:
        state.pod_octet = _pick_pod_octet(cdir)
        etcd_url = f"http://127.0.0.1:{state.etcd_port}"
        start("etcd", _etcd_argv(cdir, state))
        fcntl.flock(lock, fcntl.LOCK_UN)
        wait("etcd /health", lambda: _http_ok(f"{etcd_url}/health"), "etcd")

        # Both kept in the directory so that a restarted apiserver (chaos tests) keeps them; a
        # directory reused from a cluster started with either loses it unless asked again.
        if audit:
            cdir.audit_policy.write_text(AUDIT_POLICY)
        else:
            cdir.audit_policy.unlink(missing_ok=True)
        if profiling:
            cdir.apiserver_profiling.touch()
        else:
            cdir.apiserver_profiling.unlink(missing_ok=True)
        start("kube-apiserver", _apiserver_argv(cdir, state, certs))
        wait(
            "kube-apiserver /readyz",
            lambda: _apiserver_ready(cdir, state),
            "kube-apiserver",
        )
        write_kubeconfig(cdir.kubeconfig, state.apiserver_url, certs)
        kc = str(cdir.kubeconfig)

        start(
            "kube-controller-manager",
            [
                str(bins / "kube-controller-manager"),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--leader-elect=false",
                f"--root-ca-file={certs.ca_crt}",
                f"--service-account-private-key-file={certs.sa_key}",
                "--use-service-account-credentials=false",
                # Loopback pod IPs are refused in Endpoints/EndpointSlices; these controllers
                # would only retry forever. tandem discovers pods directly.
                "--controllers=*,-endpoint,-endpointslice,-endpointslicemirroring",
                *fleet_flags["kube-controller-manager"],
                "--profiling=false",
                "--v=0",
            ],
        )
        start(
            "kube-scheduler",
            [
                str(bins / "kube-scheduler"),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--leader-elect=false",
                f"--feature-gates={GANG_FEATURE_GATES}",
                "--profiling=false",
                "--v=0",
            ],
        )
        stages = layout.KWOK_STAGES
        cdir.vllm_setup.unlink(missing_ok=True)
        if not pod_runner:
            stages = cdir.path / "kwok-stages.yaml"
            stages.write_text(kwok_only_stages(layout.KWOK_STAGES.read_text()))
        elif vllm is not None:
            vllm.save(cdir.vllm_setup)
            stages = cdir.path / "kwok-stages.yaml"
            stages.write_text(vllm_pod_stages(layout.KWOK_STAGES.read_text()))
        logs_crd = bins / "kwok-logs-crd.yaml"
        kwok_logs: list[str] = []
        if logs_crd.exists():
            api = kube.client_from(cdir.kubeconfig)
            try:
                kube.apply_crd(api, yaml.safe_load(logs_crd.read_text()))
            finally:
                kube.close(api)
            kwok_logs = ["--enable-crds=Logs"]
        start(
            "kwok",
            [
                str(bins / "kwok"),
                *kwok_logs,
                f"--kubeconfig={kc}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-label-selector=type=kwok",
                f"--cidr=127.{state.pod_octet}.{KWOK_FALLBACK_SUBNET}.0/24",
                "--node-ip=127.0.0.1",
                "--node-name=kwok",
                f"--node-port={state.kwok_port}",
                f"--server-address=127.0.0.1:{state.kwok_port}",
                f"--tls-cert-file={certs.apiserver_crt}",
                f"--tls-private-key-file={certs.apiserver_key}",
                f"--node-lease-duration-seconds={fleet_flags['lease'][0]}",
            ],
            env={**_base_env(), "KWOK_WORKDIR": str(cdir.kwok_workdir)},
        )

        api = kube.client_from(cdir.kubeconfig)
        try:
            nodes = _load_nodes(state.pod_octet)
            for node in nodes:
                kube.create_or_keep_node(api, node)
            names = [n["metadata"]["name"] for n in nodes]
            # Kubernetes' own gang scheduling of multi-node groups (groupPlacement.gangScheduling).
            kube.create_or_keep_admission_policy(api, admission.pod_group_policy())
            wait(f"{len(names)} nodes Ready", lambda: kube.nodes_ready(api, names), "kwok")
            # The controller-manager is working once it has made the default ServiceAccount.
            wait(
                "the default ServiceAccount",
                lambda: kube.has_service_account(api, "default", "default"),
                "kube-controller-manager",
            )
            check_alive("kube-scheduler")
        finally:
            kube.close(api)

        cdir.scrape_targets.mkdir(exist_ok=True)
        config = layout.PROMETHEUS_CONFIG.read_text().replace("__KUBECONFIG__", kc)
        cdir.prometheus_config.write_text(config.replace("__TARGETS_DIR__", str(cdir.scrape_targets)))
        start("prometheus", _prometheus_argv(cdir, state))
        if pod_runner:
            start(
                "pod-runner",
                [layout.tandem_executable(), "dev", "runner", "--dir", str(cdir.path)],
                env={**_base_env(), "PYTHONUNBUFFERED": "1"},
            )
        wait("Prometheus /-/ready", lambda: _http_ok(f"{state.prometheus_url}/-/ready"), "prometheus")
        if pod_runner:
            wait("the pod runner's first pod list", cdir.runner_ready.exists, "pod-runner")
    except BaseException:
        down(cdir, quiet=True)
        raise
    finally:
        lock.close()

    if lws:
        start_lws(cdir, timeout=timeout)
        # start_lws recorded its process in state.json; keep that record.
        with_lws = load_state(cdir)
        assert with_lws is not None
        state.pids, state.lws_webhook_port = with_lws.pids, with_lws.lws_webhook_port
    state.startup_seconds = round(time.monotonic() - t0, 1)
    state.save(cdir.state)
    _log(f"up in {state.startup_seconds}s; KUBECONFIG={cdir.kubeconfig}")
    return state


def start_lws(cdir: ClusterDir, *, timeout: float = 120.0) -> float:
    """Starts the LeaderWorkerSet controller on the running cluster in `cdir` (a no-op while it
    runs): installs LWS's CRD, starts its controller manager with webhooks served on 127.0.0.1
    under a cert from the cluster's CA, registers its webhook configurations by URL, and waits
    until a dry-run create of a LeaderWorkerSet passes both webhooks. Returns the seconds it took.
    `tandem.devcluster.lws` says why the webhooks are wired this way; `down` stops it."""
    t0 = time.monotonic()
    state = load_state(cdir)
    if state is None:
        raise ClusterError(f"no cluster state in {cdir.path}")
    pid = state.pids.get(LWS_COMPONENT)
    if pid is not None and procs.has_marker(pid, cdir.marker):
        return 0.0
    bins = Path(state.bin_dir)
    missing = lws.missing_files(bins)
    if missing:
        raise ClusterError(
            f"missing LeaderWorkerSet files in {bins}: {', '.join(missing)}. Build them with "
            "`make tools` (e2e/build-tools.sh, tool `lws`)."
        )
    work = cdir.path / "lws"
    shutil.rmtree(work, ignore_errors=True)
    cert_dir = work / "certs"
    certs = pki.Pki(cdir.pki)
    lws.write_certs(certs, cert_dir)
    port = procs.free_port()
    config = work / "config.yaml"
    config.write_text(lws.config_text(port=port, cert_dir=cert_dir))
    log = cdir.logs / f"{LWS_COMPONENT}.log"

    api = kube.client_from(cdir.kubeconfig)
    try:
        kube.apply_crd(api, yaml.safe_load((bins / lws.CRD_FILE).read_text()))
        env = {**_base_env(), "KUBECONFIG": str(cdir.kubeconfig)}
        state.pids[LWS_COMPONENT] = procs.spawn(
            lws.argv(bins, config), log=log, marker=cdir.marker, env=env, cwd=cdir.path
        ).pid
        state.lws_webhook_port = port
        state.save(cdir.state)
        configs = lws.webhook_configurations(
            (bins / lws.WEBHOOKS_FILE).read_text(), port=port, ca_bundle=certs.ca_crt.read_bytes()
        )
        lws.apply_webhook_configurations(api, configs)

        deadline = time.monotonic() + timeout
        while not lws.webhooks_answer(api):
            if not procs.has_marker(state.pids[LWS_COMPONENT], cdir.marker):
                raise _fail(cdir, f"{LWS_COMPONENT} exited during startup", log)
            if time.monotonic() > deadline:
                raise _fail(cdir, f"the LeaderWorkerSet webhooks did not answer in {timeout:.0f}s", log)
            time.sleep(0.5)
    finally:
        kube.close(api)
    took = round(time.monotonic() - t0, 1)
    _log(f"LeaderWorkerSet controller up in {took}s (webhooks on 127.0.0.1:{port})")
    return took


def _etcd_argv(cdir: ClusterDir, state: State) -> list[str]:
    etcd_url = f"http://127.0.0.1:{state.etcd_port}"
    peer_url = f"http://127.0.0.1:{state.etcd_peer_port}"
    return [
        str(Path(state.bin_dir) / "etcd"),
        "--name=tandem",
        f"--data-dir={cdir.etcd_data}",
        f"--listen-client-urls={etcd_url}",
        f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=tandem={peer_url}",
        "--listen-metrics-urls=",
        "--unsafe-no-fsync=true",
        "--quota-backend-bytes=1073741824",
        "--auto-compaction-retention=1",
        "--log-level=warn",
    ]


# Kubernetes' own gang scheduling (scheduling.k8s.io/v1alpha2 PodGroups, pods' spec.schedulingGroup),
# alpha in 1.36, for groupPlacement.gangScheduling: Kubernetes (docs/multinode.md).
GANG_FEATURE_GATES = "GangScheduling=true,GenericWorkload=true"


def _apiserver_argv(cdir: ClusterDir, state: State, certs: pki.Pki) -> list[str]:
    return [
        str(Path(state.bin_dir) / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{state.etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        "--endpoint-reconciler-type=none",
        f"--secure-port={state.apiserver_port}",
        f"--cert-dir={cdir.pki}",
        f"--tls-cert-file={certs.apiserver_crt}",
        f"--tls-private-key-file={certs.apiserver_key}",
        f"--client-ca-file={certs.ca_crt}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={certs.sa_pub}",
        f"--service-account-signing-key-file={certs.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=RBAC",
        "--allow-privileged=true",
        "--enable-priority-and-fairness=false",
        f"--profiling={'true' if cdir.apiserver_profiling.exists() else 'false'}",
        "--event-ttl=1h",
        f"--feature-gates={GANG_FEATURE_GATES}",
        "--runtime-config=scheduling.k8s.io/v1alpha2=true",
        # logs/exec/port-forward dial a node's InternalIP (127.0.0.1: KWOK's server), never
        # its hostname; KWOK serves with the apiserver's cert, which this CA signed.
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-certificate-authority={certs.ca_crt}",
        "--v=0",
        *(
            [
                f"--audit-policy-file={cdir.audit_policy}",
                f"--audit-log-path={cdir.audit_log}",
                "--audit-log-format=json",
                "--audit-log-maxsize=0",  # no rotation: readers window it by byte offset
            ]
            if cdir.audit_policy.exists()
            else []
        ),
    ]


# Metadata (who, verb, resource, user agent; no bodies) of the requests an operator makes: its
# kinds, pods, Secrets and Leases (KWOK's node leases are renewed every 10 min in a fleet cluster).
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: Metadata
    resources:
      - group: tandem.dev
      - group: apps
        resources: [statefulsets, deployments]
      - group: policy
        resources: [poddisruptionbudgets]
      - group: rbac.authorization.k8s.io
        resources: [roles, rolebindings]
      - group: networking.k8s.io
        resources: [networkpolicies]
      - group: coordination.k8s.io
        resources: [leases]
      - group: ""
        resources: [pods, services, serviceaccounts, secrets]
  - level: None
"""


CONTROL_PLANE = ("etcd", "kube-apiserver")


def stop_control_plane(cdir: ClusterDir) -> None:
    """Stops the running cluster's kube-apiserver, then etcd (an outage of the whole control plane:
    every client, the operator and the routers too, loses the API); pods' processes, KWOK, the
    controllers and Prometheus keep running. `start_control_plane` brings both back."""
    state = load_state(cdir)
    if state is None:
        raise ClusterError(f"no cluster state in {cdir.path}")
    for name in reversed(CONTROL_PLANE):
        pid = state.pids.get(name)
        if pid is not None and procs.has_marker(pid, cdir.marker):
            procs.stop([pid], cdir.marker, grace=10.0)
    _log("etcd and kube-apiserver stopped")


def start_control_plane(cdir: ClusterDir, *, timeout: float = 120.0) -> None:
    """Starts etcd and kube-apiserver again after `stop_control_plane`, with the same data directory,
    ports, certificates and flags (a component still running is left alone), and waits until etcd
    answers /health and the apiserver /readyz."""
    state = load_state(cdir)
    if state is None:
        raise ClusterError(f"no cluster state in {cdir.path}")
    if not state.etcd_peer_port:
        raise ClusterError("this cluster was started without a recorded etcd peer port; restart it")
    checks = {
        "etcd": lambda: _http_ok(f"http://127.0.0.1:{state.etcd_port}/health"),
        "kube-apiserver": lambda: _apiserver_ready(cdir, state),
    }
    argvs = {
        "etcd": _etcd_argv(cdir, state),
        "kube-apiserver": _apiserver_argv(cdir, state, pki.Pki(cdir.pki)),
    }
    for name in CONTROL_PLANE:
        pid = state.pids.get(name)
        if pid is None or not procs.has_marker(pid, cdir.marker):
            log = cdir.logs / f"{name}.log"
            state.pids[name] = procs.spawn(argvs[name], log=log, marker=cdir.marker, cwd=cdir.path).pid
            state.save(cdir.state)
        try:
            procs.wait_until(checks[name], timeout=timeout, interval=0.3, what=f"{name} ready")
        except TimeoutError as e:
            raise _fail(cdir, str(e), cdir.logs / f"{name}.log") from e
    _log("etcd and kube-apiserver started")


def restart_control_plane(cdir: ClusterDir, *, timeout: float = 120.0) -> None:
    """`stop_control_plane`, then `start_control_plane`."""
    stop_control_plane(cdir)
    start_control_plane(cdir, timeout=timeout)


def _prometheus_argv(cdir: ClusterDir, state: State) -> list[str]:
    return [
        str(Path(state.bin_dir) / "prometheus"),
        f"--config.file={cdir.prometheus_config}",
        f"--storage.tsdb.path={cdir.prometheus_data}",
        f"--web.listen-address=127.0.0.1:{state.prometheus_port}",
        "--storage.tsdb.retention.time=6h",
        "--web.enable-lifecycle",
        "--log.level=warn",
    ]


def stop_prometheus(cdir: ClusterDir) -> None:
    """Stops the running cluster's Prometheus alone (an outage the autoscaler must ride out); the
    rest of the cluster keeps running. `start_prometheus` brings it back on the same port and data."""
    state = load_state(cdir)
    if state is None:
        raise ClusterError(f"no cluster state in {cdir.path}")
    pid = state.pids.get("prometheus")
    if pid is not None and procs.has_marker(pid, cdir.marker):
        procs.stop([pid], cdir.marker, grace=10.0)
    _log("prometheus stopped")


def start_prometheus(cdir: ClusterDir, *, timeout: float = 60.0) -> None:
    """Starts the cluster's Prometheus again after `stop_prometheus` (a no-op while it runs) and
    waits until it is ready."""
    state = load_state(cdir)
    if state is None:
        raise ClusterError(f"no cluster state in {cdir.path}")
    pid = state.pids.get("prometheus")
    if pid is None or not procs.has_marker(pid, cdir.marker):
        log = cdir.logs / "prometheus.log"
        proc = procs.spawn(_prometheus_argv(cdir, state), log=log, marker=cdir.marker, cwd=cdir.path)
        state.pids["prometheus"] = proc.pid
        state.save(cdir.state)
    try:
        procs.wait_until(
            lambda: _http_ok(f"{state.prometheus_url}/-/ready"), timeout=timeout, what="Prometheus /-/ready"
        )
    except TimeoutError as e:
        raise _fail(cdir, str(e), cdir.logs / "prometheus.log") from e
    _log("prometheus started")


def _base_env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    for k in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "KUBECONFIG"):
        env.pop(k, None)
    return env


def down(cdir: ClusterDir, *, quiet: bool = False) -> list[int]:
    """Stops every process of the cluster in `cdir`; returns the pids that needed a stop."""
    state = load_state(cdir)
    stopped: list[int] = []
    if state is not None:
        # The runner first (it stops the pods' processes), then the rest in reverse start order.
        for name in reversed(START_ORDER):
            pid = state.pids.get(name)
            if pid is not None and procs.has_marker(pid, cdir.marker):
                procs.stop([pid], cdir.marker, grace=20.0 if name == "pod-runner" else 10.0)
                stopped.append(pid)
    leftovers = procs.marked_pids(cdir.marker)
    if leftovers:
        procs.stop(leftovers, cdir.marker, grace=5.0)
        stopped += leftovers
    cdir.state.unlink(missing_ok=True)
    cdir.runner_ready.unlink(missing_ok=True)
    if not quiet:
        _log(f"down: stopped {len(stopped)} process(es) in {cdir.path}")
    return stopped


def status(cdir: ClusterDir) -> dict[str, Any]:
    """A JSON-able report: components, nodes, kubeconfig, Prometheus URL."""
    state = load_state(cdir)
    if state is None:
        return {"running": False, "dir": str(cdir.path)}
    report: dict[str, Any] = {
        "running": is_running(cdir),
        "dir": str(cdir.path),
        "kubeconfig": str(cdir.kubeconfig),
        "apiserver": state.apiserver_url,
        "prometheus": state.prometheus_url,
        "bin_dir": state.bin_dir,
        "pod_cidrs": f"127.{state.pod_octet}.0.0/16",
        "startup_seconds": state.startup_seconds,
        "lws_webhook": f"https://127.0.0.1:{state.lws_webhook_port}" if state.lws_webhook_port else "",
        "components": {
            name: {"pid": state.pids[name], "alive": ok} for name, ok in alive(cdir, state).items()
        },
    }
    if report["running"]:
        api = kube.client_from(cdir.kubeconfig)
        try:
            report["nodes"] = kube.node_summary(api)
        finally:
            kube.close(api)
    return report
