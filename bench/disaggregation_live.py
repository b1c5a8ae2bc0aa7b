"""Auto against Always, live, on multi-turn sessions through the operator's router (issue 26, item 4).

Starts a dev cluster (or uses the one named by TANDEM_KUBECONFIG), the CRD and `tandem operator`,
and applies two sim PDDeployments side by side that differ only in `spec.router.disaggregation.mode`:
`disagg-always` (the mode absent: every prompt prefilled on a prefill pod) and `disagg-auto` (Auto:
per request, on a prefill pod or on the decode pod, docs/router.md "Remote or local prefill"). Each
has 1 prefill pod, 2 decode pods and 1 router, a 25 Gb/s KV link (`kvTransfer.bandwidthGbps`: a
2,000-token prompt moves 250 MiB of Llama-3.1-8B KV, about 84 ms) and sim engines of Llama-3.1-8B
on H100 TP1 at `TANDEM_SIM_TIME_SCALE=3`. Every request of the trace is sent to both routers at the
same moment (the arms' order alternating), so whatever else loads the machine loads both alike and
the ratios between the arms are measured within one run. Each session's turns go in order on each
arm: a turn is sent at its time, or as soon as the session's previous turn has its answer if that
is later (a conversation's next turn resends the previous one: it cannot come before its answer).

The trace: `sim/traces/prefix.py`'s sessions (`session_turns`) from the Azure conversation trace at
3x its rate, 4 turns a session, exponential think time of mean 5 s, a 2,000-token system prompt out
of 8; the first 300 requests (`--quick`: 120), replayed at the time scale. Texts as
`bench/prefix_routing_live.py` makes them (a prefix run's 16-token blocks become 16 deterministic
words, so the engines' block hashes and the router's chunks see what a session shares), salted per
arm: the two arms share no text, so neither finds the other's KV (they have their own pods anyway).
`max_tokens` 4: the next turn resends the trace's reply (its length, as text), not the engine's 4
tokens, so a decode pod holding turn k lacks turn k's reply and the new message for turn k+1.

Per arm and turn it reports the client's TTFT p50 / p90 (wall seconds from sending a streamed
completion to its first text) and Auto's over Always's, the requests that failed, Auto's choices by
reason (`tandem_router_disaggregation_total` from its router), and the machine's load average
(`os.getloadavg`, 1 minute) before and after the replay.

    .venv/bin/python bench/disaggregation_live.py [--quick] [--requests N] [--json]

Runtime: about 2 minutes of replay (`--quick`: about 1) plus the cluster's start (1-2 minutes) on 2
cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT / "bench"))

import prefix_routing_live as live  # noqa: E402
from prefix_routing_live import _get, _words, poll, ttft  # noqa: E402
from tandem.api import meta  # noqa: E402
from tandem.sim.requests import Request  # noqa: E402
from tandem.sim.traces import read_azure, scale_rate  # noqa: E402
from tandem.sim.traces.prefix import ENGINE_BLOCK_TOKENS, SessionParams, session_turns  # noqa: E402

MAX_MODEL_LEN = live.MAX_MODEL_LEN
TIME_SCALE = live.TIME_SCALE  # the engines' env in live.manifest
PREFILL, DECODE = 1, 2
LINK_GBPS = 25
ARMS: tuple[tuple[str, str | None], ...] = (("Always", None), ("Auto", "Auto"))
SESSION_RATE = 3.0
SESSIONS = SessionParams(turns=4, think_seconds=5.0, system_prompt_tokens=2000, system_prompts=8, seed=0)
AZURE_CONV = ROOT / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
REQUESTS, QUICK_REQUESTS = 300, 120
DECISIONS = "tandem_router_disaggregation_total"


# --- pure parts: trace -> turns and texts, figures -> table -------------------------------------------
@dataclass(frozen=True)
class Turn:
    at: float  # wall seconds after the trace's start
    session: int
    turn: int  # 0: the session's first
    prompt_tokens: int
    texts: dict[str, str]  # per arm


def arm_text(arm: str, prefix: Sequence[tuple[int, int]] | None, prompt_tokens: int, salt: int) -> str:
    """A prompt of `prompt_tokens` words: its prefix runs' blocks, then words unique to the request;
    every word salted by `arm` (two arms share no text)."""
    tag = arm.encode()
    words: list[str] = []
    for key, blocks in prefix or ():
        for j in range(blocks):
            seed = b"run" + tag + key.to_bytes(8, "little") + j.to_bytes(4, "little")
            words += _words(seed, ENGINE_BLOCK_TOKENS)
    words = words[:prompt_tokens]
    if len(words) < prompt_tokens:
        words += _words(b"own" + tag + salt.to_bytes(8, "little"), prompt_tokens - len(words))
    return " ".join(words)


def live_turns(numbered: Sequence[tuple[Request, int, int]], time_scale: float) -> list[Turn]:
    """The trace's requests as turns with a text per arm, their arrivals stretched by `time_scale`."""
    if not numbered:
        return []
    start = numbered[0][0].arrival
    return [
        Turn(
            (r.arrival - start) * time_scale,
            session,
            turn,
            r.prompt_tokens,
            {arm: arm_text(arm, r.prefix, r.prompt_tokens, i) for arm, _ in ARMS},
        )
        for i, (r, session, turn) in enumerate(numbered)
    ]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile `q` (0-1); NaN without values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 1))
    return ordered[int(rank) - 1]


@dataclass
class ArmFigures:
    arm: str
    ttfts: dict[int, list[float]] = field(default_factory=dict)  # turn -> client TTFTs, wall seconds
    failed: int = 0
    decisions: dict[str, float] = field(default_factory=dict)  # "side/reason" -> count

    def all_ttfts(self) -> list[float]:
        return [t for found in self.ttfts.values() for t in found]


def _ms(value: float) -> str:
    return "-" if value != value else f"{value * 1e3:,.0f}"


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base > 0 and value == value else "-"


def table(always: ArmFigures, auto: ArmFigures) -> str:
    """Markdown: TTFT p50 / p90 per turn per arm, and Auto's over Always's."""
    lines = [
        "| turn | requests | Always TTFT p50 / p90 ms | Auto TTFT p50 / p90 ms | Auto / Always p50 | p90 |",
        "|---|---|---|---|---|---|",
    ]
    rows: list[tuple[str, list[float], list[float]]] = [
        (f"turn {turn + 1}", always.ttfts.get(turn, []), auto.ttfts.get(turn, []))
        for turn in sorted(set(always.ttfts) | set(auto.ttfts))
    ]
    rows.append(("all", always.all_ttfts(), auto.all_ttfts()))
    for label, a, b in rows:
        a50, a90, b50, b90 = percentile(a, 0.5), percentile(a, 0.9), percentile(b, 0.5), percentile(b, 0.9)
        lines.append(
            f"| {label} | {len(a)} / {len(b)} | {_ms(a50)} / {_ms(a90)} | {_ms(b50)} / {_ms(b90)} "
            f"| {_ratio(b50, a50)} | {_ratio(b90, a90)} |"
        )
    return "\n".join(lines)


def decisions(metrics_text: str) -> dict[str, float]:
    """`side/reason` -> count of `tandem_router_disaggregation_total` in a router's /metrics."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith(DECISIONS + "{"):
            continue
        series, _, value = line.rpartition(" ")
        labels = dict(part.split("=", 1) for part in series[len(DECISIONS) + 1 : -1].split(","))
        key = f"{labels['prefill'].strip(chr(34))}/{labels['reason'].strip(chr(34))}"
        if float(value) > 0:
            out[key] = out.get(key, 0.0) + float(value)
    return out


# --- the live run -------------------------------------------------------------------------------------
def manifest(name: str, mode: str | None) -> dict[str, Any]:
    """The prefix bench's sim PDDeployment (PrefixAware, the default) with this bench's pools, link and
    mode (None: absent, Always)."""
    doc: dict[str, Any] = live.manifest(name, "PrefixAware")
    spec = doc["spec"]
    spec["prefill"]["replicas"], spec["decode"]["replicas"] = PREFILL, DECODE
    spec["kvTransfer"]["bandwidthGbps"] = LINK_GBPS
    spec["colocated"] = {"replicas": 0}
    if mode is not None:
        spec["router"]["disaggregation"] = {"mode": mode}
    return doc


def replay(turns: Sequence[Turn], routers: dict[str, str], figures: dict[str, ArmFigures]) -> None:
    """Every turn to each arm's router at its time (the arms' order alternating), each session's turns in
    order on each arm (one thread per session and arm); waits for all."""
    lock = threading.Lock()
    by_session: dict[int, list[Turn]] = {}
    for t in turns:
        by_session.setdefault(t.session, []).append(t)
    start = time.monotonic() + 1.0

    def run(arm: str, session: list[Turn]) -> None:
        for t in session:
            delay = start + t.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                seconds = ttft(routers[arm], t.texts[arm])
            except Exception as error:  # counted, and the first few printed
                with lock:
                    figures[arm].failed += 1
                    if figures[arm].failed <= 3:
                        print(f"  {arm}: failed: {error}", flush=True)
                continue
            with lock:
                figures[arm].ttfts.setdefault(t.turn, []).append(seconds)

    threads = []
    for k, session in enumerate(by_session.values()):
        order = [arm for arm, _ in ARMS]
        for arm in order if k % 2 == 0 else reversed(order):
            thread = threading.Thread(target=run, args=(arm, session), daemon=True)
            thread.start()
            threads.append(thread)
    for thread in threads:
        thread.join()
    lag = time.monotonic() - start - (turns[-1].at if turns else 0.0)
    print(f"  replayed {len(turns)} requests x {len(routers)} arms; done {lag:.0f} s after the last was due")


def _serves(router: str) -> bool:
    return ttft(router, "hello there") > 0


def run_live(handle: Any, turns: Sequence[Turn]) -> tuple[dict[str, ArmFigures], tuple[float, float]]:
    from tandem.devcluster import kube
    from tandem.devcluster.testing import OperatorProcess

    handle.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds" / "pddeployment.yaml")
    )
    handle.kubectl("wait", "--for=condition=Established", "crd/pddeployments.tandem.dev", "--timeout=60s")
    log = Path(tempfile.mkdtemp(prefix="tandem-bench-disagg-")) / "operator.log"
    lease = f"tandem-bench-disagg-{uuid.uuid4().hex[:6]}"
    operator = OperatorProcess(handle, ["--lease-namespace", "default", "--lease-name", lease], log)
    namespace = f"bench-disagg-{int(time.time())}"
    names = {arm: f"disagg-{arm.lower()}" for arm, _ in ARMS}
    try:
        operator.wait_leader(timeout=90)
        handle.kubectl("create", "namespace", namespace)
        for arm, mode in ARMS:
            handle.kubectl(
                "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest(names[arm], mode))
            )
        started = time.monotonic()

        def ips(arm: str, role: str) -> list[str]:
            with handle.api_client() as api:
                found: list[str] = kube.ready_pod_ips(api, namespace, names[arm], role)
            if not all(ip.startswith("127.") for ip in found):
                raise RuntimeError(f"not a loopback address: {found}")
            return found

        wanted = {"prefill": PREFILL, "decode": DECODE, "router": 1}
        poll(
            "every arm's pods Ready",
            lambda: all(len(ips(a, role)) == n for a, _ in ARMS for role, n in wanted.items()),
            420,
        )
        routers = {arm: ips(arm, "router")[0] for arm, _ in ARMS}
        for arm, router in routers.items():
            poll(f"{arm}'s router serving", functools.partial(_serves, router), 120)
        print(f"cluster: 2 PDDeployments Ready and serving in {time.monotonic() - started:.0f} s", flush=True)
        before = {
            arm: decisions(_get(f"http://{ip}:{meta.ROUTER_PORT}/metrics").decode())
            for arm, ip in routers.items()
        }
        figures = {arm: ArmFigures(arm) for arm in routers}
        load_before = os.getloadavg()[0]
        replay(turns, routers, figures)
        load_after = os.getloadavg()[0]
        for arm, ip in routers.items():
            after = decisions(_get(f"http://{ip}:{meta.ROUTER_PORT}/metrics").decode())
            moved = {k: v - before[arm].get(k, 0.0) for k, v in after.items()}
            figures[arm].decisions = {k: v for k, v in moved.items() if v > 0}
        return figures, (load_before, load_after)
    finally:
        operator.stop()
        handle.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        handle.kubectl("delete", "lease", lease, "-n", "default", check=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=None, help=f"requests of the trace ({REQUESTS})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_REQUESTS} requests")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON object")
    args = parser.parse_args(argv)
    count = args.requests or (QUICK_REQUESTS if args.quick else REQUESTS)
    from tandem.devcluster import cluster as devcluster
    from tandem.devcluster import layout
    from tandem.devcluster.handle import ClusterHandle

    begun = time.monotonic()
    base = scale_rate(read_azure(AZURE_CONV), SESSION_RATE)
    numbered = session_turns(base, dataclasses.replace(SESSIONS, max_prompt_tokens=MAX_MODEL_LEN))[:count]
    turns = live_turns(numbered, TIME_SCALE)
    sessions = len({t.session for t in turns})
    what = (
        f"{len(turns)} requests of {sessions} sessions over {turns[-1].at:.0f} s of wall time (Azure"
        f" conversation x{SESSION_RATE:g}, 4 turns, think 5 s, system prompt 2,000 tokens of 8, time scale"
        f" {TIME_SCALE:g})"
    )
    print(
        f"Live: 2 PDDeployments ({PREFILL} prefill + {DECODE} decode sim pods, 1 router, {LINK_GBPS} Gb/s KV"
        f" link each), Always and Auto; every request sent to both routers at once; {what}",
        flush=True,
    )
    if kubeconfig := os.environ.get("TANDEM_KUBECONFIG"):
        figures, load = run_live(ClusterHandle.from_kubeconfig(Path(kubeconfig)), turns)
    else:
        cdir = layout.ClusterDir(Path(tempfile.mkdtemp(prefix="tandem-bench-cluster-")))
        devcluster.up(cdir, owner_pid=os.getpid())
        try:
            figures, load = run_live(ClusterHandle.from_dir(cdir.path, owned=True), turns)
        finally:
            devcluster.down(cdir)
    always, auto = figures["Always"], figures["Auto"]
    print("\n" + table(always, auto))
    for arm in (always, auto):
        print(f"{arm.arm}: failed {arm.failed}; choices {dict(sorted(arm.decisions.items()))}")
    print(
        f"load average (1 min): {load[0]:.1f} before the replay, {load[1]:.1f} after; {os.cpu_count()} CPUs"
    )
    if args.json:
        dump = {
            arm.arm: {
                "ttft_p50_s": {t: percentile(v, 0.5) for t, v in sorted(arm.ttfts.items())},
                "ttft_p90_s": {t: percentile(v, 0.9) for t, v in sorted(arm.ttfts.items())},
                "failed": arm.failed,
                "decisions": arm.decisions,
            }
            for arm in (always, auto)
        }
        print(json.dumps({"arms": dump, "load_average": load}))
    print(f"\nlive bench: {time.monotonic() - begun:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
