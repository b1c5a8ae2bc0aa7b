"""The live half of bench/prefix_routing.py: the three prefill policies through the local cluster.

Starts a dev cluster (or uses the one named by TANDEM_KUBECONFIG), the CRD and `tandem operator`,
and applies three sim PDDeployments side by side, one per policy (`spec.router.prefillPolicy`
PrefixAware, LeastLoaded, RoundRobin), each with 3 prefill pods, 1 decode pod and 1 router. Every
request of a trace is sent to the three routers at the same moment (the arms interleaved, their
order rotating), so whatever else loads the machine loads each arm alike and the ratios between
arms are measured within one run. Per trace and arm it reports:

- **prefix hit rate**: the prefill pods' `vllm:prefix_cache_hits` / `vllm:prefix_cache_queries`
  (tokens), read from each pod's /metrics before and after the trace;
- **TTFT p50 / p90**: the client's, from sending the request to the first streamed text (wall
  seconds; the engines' modelled time runs `TIME_SCALE` times slower than on the GPU);
- **prefill GPU-hours**: the prefill pods' modelled busy time (the sim engine's
  `modelled_busy_seconds` in /debug/state: the sum of its steps' modelled durations, GPU seconds at
  the GPU's speed, not stretched by the time scale) / 3600;

and the ratios against load-only, beside the simulator's figures for the same requests on the same
layout (3 prefill + 1 decode, `tandem.sim.simulate`, printed in the same run).

Conditions (stated): sim engines of Llama-3.1-8B on H100 TP1 (their default KV cache, vLLM's
16-token blocks, prefix caching on), `TANDEM_SIM_TIME_SCALE=3`; the router's prefix knobs at their
defaults; `max_tokens` 4 (TTFT and prefill are what is measured; the next turn's prompt carries the
trace's reply length as text, not the engine's 4 tokens). Two traces, played one after the other on
the same pods (their texts share nothing, so the second starts with cold caches for its prefixes):

1. **Multi-turn sessions**: `sim/traces/prefix.py`'s sessions from the Azure conversation trace at
   3x its rate, 4 turns per session, exponential think time of mean 5 s (short, to fit turns in the
   window), a 2,000-token system prompt out of 8; the first 300 requests (35 s of trace time, 104 s
   of wall time at the time scale).
2. **Mooncake conversation**: the trace's first 150 requests at its own rate (3 s ticks spread
   uniformly, seed 0), prompts as its hash ids say (53 s of trace, 160 s of wall time).

Text. The sim engine's tokenizer counts words (`\\w+`), so a prompt of n tokens is n words. Each of
the prompt's full 16-token blocks, as the simulator's prefix runs name them (`Request.prefix`:
`(key, blocks)`, block j of run `key` being the same tokens wherever it appears), becomes 16
deterministic 5-character words from blake2b(key, j) (`block_words`), so two prompts that share
blocks share text, and the engines' block hashes and the router's 64-character chunks both see the
shared prefix; the rest of the prompt (the part past the last shared block, or all of it when the
request has no prefix information) is words unique to the request. The router has no tokenizer:
its chunks (64 characters, about 11 of these words) do not line up with the engine's blocks, as in
production.

    .venv/bin/python bench/prefix_routing_live.py [--sessions 300] [--mooncake 150] [--json]
    .venv/bin/python bench/prefix_routing.py --quick --live   # simulator tables, then this

Runtime: about 3-4 minutes of replay plus the cluster's start (about 1-2 minutes) on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import http.client
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from tandem.api import meta  # noqa: E402
from tandem.sim.requests import Request  # noqa: E402
from tandem.sim.traces import read_azure, read_mooncake, scale_rate, spread_ticks  # noqa: E402
from tandem.sim.traces.prefix import ENGINE_BLOCK_TOKENS, SessionParams, sessions, with_mooncake_prefix  # noqa: E402

MODEL_NAME = "llama-3.1-8b"
MODEL_URI = "hf://meta-llama/Llama-3.1-8B-Instruct"
MAX_MODEL_LEN = 131_072
IMAGE = "ghcr.io/tandem-dev/tandem:0.1.0"
TIME_SCALE = 3.0
PREFILL, DECODE = 3, 1
MAX_TOKENS = 4
ARMS: tuple[tuple[str, str], ...] = (
    ("prefix-aware", "PrefixAware"),
    ("load-only", "LeastLoaded"),
    ("round-robin", "RoundRobin"),
)
SIM_ROUTING = {"prefix-aware": "prefix", "load-only": "power-of-two", "round-robin": "round-robin"}
SESSION_RATE = 3.0
SESSIONS = SessionParams(turns=4, think_seconds=5.0, system_prompt_tokens=2000, system_prompts=8, seed=0)
MOONCAKE = ROOT / "traces" / "mooncake-fast25" / "conversation_trace.jsonl.gz"
AZURE_CONV = ROOT / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


# --- pure parts: trace -> text, figures -> table ------------------------------------------------------
def _words(seed: bytes, count: int) -> list[str]:
    """`count` deterministic 5-character words (one sim-engine token each) from `seed`."""
    words: list[str] = []
    i = 0
    while len(words) < count:
        digest = hashlib.blake2b(seed + i.to_bytes(4, "little"), digest_size=64).digest()
        for k in range(0, 64, 4):
            n = int.from_bytes(digest[k : k + 4], "little")
            word = ["w"]
            for _ in range(4):
                n, r = divmod(n, 36)
                word.append(_ALPHABET[r])
            words.append("".join(word))
        i += 1
    return words[:count]


def block_words(key: int, block: int) -> list[str]:
    """The 16 words of block `block` of the prefix run `key` (the same wherever the run appears)."""
    return _words(b"run" + key.to_bytes(8, "little") + block.to_bytes(4, "little"), ENGINE_BLOCK_TOKENS)


def prompt_text(prefix: Sequence[tuple[int, int]] | None, prompt_tokens: int, salt: int) -> str:
    """A prompt of `prompt_tokens` words: its prefix runs' blocks, then words unique to `salt`."""
    words: list[str] = []
    for key, blocks in prefix or ():
        for j in range(blocks):
            words += block_words(key, j)
    words = words[:prompt_tokens]
    if len(words) < prompt_tokens:
        words += _words(b"own" + salt.to_bytes(8, "little"), prompt_tokens - len(words))
    return " ".join(words)


@dataclass(frozen=True)
class LiveRequest:
    at: float  # wall seconds after the trace's start
    text: str
    prompt_tokens: int


def live_requests(requests: Sequence[Request], time_scale: float) -> list[LiveRequest]:
    """The requests as texts, their arrivals (from the first's) stretched by `time_scale`."""
    if not requests:
        return []
    start = requests[0].arrival
    return [
        LiveRequest(
            (r.arrival - start) * time_scale, prompt_text(r.prefix, r.prompt_tokens, i), r.prompt_tokens
        )
        for i, r in enumerate(requests)
    ]


@dataclass
class ArmFigures:
    policy: str
    queries: float = 0.0  # prefill pods' prefix-cache queries (tokens) over the trace
    hits: float = 0.0
    busy_seconds: float = 0.0  # prefill pods' modelled busy time over the trace
    ttfts: list[float] = field(default_factory=list)  # client TTFT, wall seconds
    failed: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def gpu_hours(self) -> float:
        return self.busy_seconds / 3600

    def ttft(self, q: float) -> float:
        """Nearest-rank percentile `q` (0-1) of the TTFTs (0 when there are none)."""
        if not self.ttfts:
            return 0.0
        ordered = sorted(self.ttfts)
        rank = max(1, -(-len(ordered) * q // 1))
        return ordered[int(rank) - 1]


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base > 0 else "-"


def table(title: str, arms: Sequence[ArmFigures], sim: dict[str, tuple[float, float, float, float]]) -> str:
    """Markdown: one row per arm, ratios against load-only; `sim` (policy -> hit rate, TTFT p50 s,
    p90 s, prefill GPU-h) adds the simulator's figures for the same requests."""
    base = next(a for a in arms if a.policy == "load-only")
    lines = [
        f"### {title}",
        "",
        "| policy | hit rate (live) | vs load-only | TTFT p50 / p90 ms (live) | vs load-only "
        "| prefill GPU-h (live) | vs load-only | failed "
        "| sim: hit rate | sim: TTFT p50 / p90 ms | sim: prefill GPU-h |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in arms:
        s = sim.get(a.policy)
        sim_cells = (
            f"{s[0]:.1%} | {s[1] * 1e3:,.0f} / {s[2] * 1e3:,.0f} | {s[3]:.4f}"
            if s is not None
            else "- | - | -"
        )
        lines.append(
            f"| {a.policy} | {a.hit_rate:.1%} | {(a.hit_rate - base.hit_rate) * 100:+.1f} pts "
            f"| {a.ttft(0.5) * 1e3:,.0f} / {a.ttft(0.9) * 1e3:,.0f} "
            f"| {_ratio(a.ttft(0.5), base.ttft(0.5))} / {_ratio(a.ttft(0.9), base.ttft(0.9))} "
            f"| {a.gpu_hours:.4f} | {_ratio(a.gpu_hours, base.gpu_hours)} | {a.failed} | {sim_cells} |"
        )
    return "\n".join(lines)


# --- the traces ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Trace:
    name: str
    what: str
    requests: list[Request]


def traces(session_requests: int, mooncake_requests: int) -> list[Trace]:
    base = scale_rate(read_azure(AZURE_CONV), SESSION_RATE)
    s = sessions(base, dataclasses.replace(SESSIONS, max_prompt_tokens=MAX_MODEL_LEN))[:session_requests]
    m = with_mooncake_prefix(spread_ticks(read_mooncake(MOONCAKE), 3.0, 0))[:mooncake_requests]
    return [
        Trace(
            "Multi-turn sessions",
            f"{len(s)} requests over {s[-1].arrival - s[0].arrival:.0f} s of trace (Azure conversation x"
            f"{SESSION_RATE:g}, 4 turns, think 5 s, system prompt 2,000 tokens of 8)",
            s,
        ),
        Trace(
            "Mooncake conversation",
            f"first {len(m)} requests, {m[-1].arrival - m[0].arrival:.0f} s of trace at its rate",
            m,
        ),
    ]


def simulated(requests: Sequence[Request]) -> dict[str, tuple[float, float, float, float]]:
    """The simulator's figures for `requests` on 3 prefill + 1 decode, per policy, with `MAX_TOKENS`
    output tokens each as the live run asks for (the trace's reply lengths would load the decode pod
    the live run does not)."""
    from prefix_routing import _layout  # the simulator half's layout (Llama-3.1-8B, H100, 131k)
    from tandem.routing.prefix import PrefixKnobs
    from tandem.sim import SLO, SimConfig, simulate

    out = {}
    for policy, routing in SIM_ROUTING.items():
        config = SimConfig(slo=SLO(ttft_ms=5000, tpot_ms=50), routing=routing, prefix_knobs=PrefixKnobs())
        short = [r._replace(output_tokens=MAX_TOKENS) for r in requests]
        s = simulate(short, _layout(PREFILL, DECODE), config).summary
        queries = s.prefix_queries.get("prefill", 0)
        hit = s.prefix_hits.get("prefill", 0) / queries if queries else 0.0
        out[policy] = (hit, s.ttft_p50, s.ttft_p90, s.busy_gpu_hours.get("prefill", 0.0))
    return out


# --- the live run -------------------------------------------------------------------------------------
def manifest(name: str, policy: str) -> dict[str, Any]:
    def pool(replicas: int) -> dict[str, Any]:
        return {
            "replicas": replicas,
            "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "2Gi"}},
        }

    return {
        "apiVersion": meta.API_VERSION,
        "kind": meta.KIND,
        "metadata": {"name": name},
        "spec": {
            "model": {"name": MODEL_NAME, "uri": MODEL_URI, "maxModelLen": MAX_MODEL_LEN},
            "engine": {
                "type": "sim",
                "image": IMAGE,
                "env": [{"name": "TANDEM_SIM_TIME_SCALE", "value": f"{TIME_SCALE:g}"}],
            },
            "kvTransfer": {"connector": "NixlConnector"},
            "prefill": pool(PREFILL),
            "decode": pool(DECODE),
            "router": {"replicas": 1, "image": IMAGE, "prefillPolicy": policy},
            "serving": {"mode": "Disaggregated"},
        },
    }


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as answer:
        data: bytes = answer.read()
        return data


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def snapshot(prefill_ips: Sequence[str]) -> tuple[float, float, float]:
    """(prefix-cache queries, hits, modelled busy seconds) summed over the prefill pods."""
    queries = hits = busy = 0.0
    for ip in prefill_ips:
        text = _get(f"http://{ip}:{meta.ENGINE_PORT}/metrics").decode()
        queries += _metric(text, "vllm:prefix_cache_queries_total")
        hits += _metric(text, "vllm:prefix_cache_hits_total")
        busy += float(
            json.loads(_get(f"http://{ip}:{meta.ENGINE_PORT}/debug/state"))["modelled_busy_seconds"]
        )
    return queries, hits, busy


def ttft(router_ip: str, text: str) -> float:
    """Wall seconds from sending a streamed completion to its first text."""
    conn = http.client.HTTPConnection(router_ip, meta.ROUTER_PORT, timeout=600)
    body = {"model": MODEL_NAME, "prompt": text, "max_tokens": MAX_TOKENS, "stream": True}
    try:
        started = time.monotonic()
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        answer = conn.getresponse()
        if answer.status != 200:
            raise RuntimeError(f"HTTP {answer.status}: {answer.read()[:300]!r}")
        first: float | None = None
        for raw in answer:
            line = raw.decode().strip()
            if first is None and line.startswith("data: {"):
                event = json.loads(line[len("data: ") :])
                if any(c.get("text") for c in event.get("choices", [])):
                    first = time.monotonic() - started
        if first is None:
            raise RuntimeError("no text streamed")
        return first
    finally:
        conn.close()


def replay(requests: Sequence[LiveRequest], routers: dict[str, str], figures: dict[str, ArmFigures]) -> None:
    """Each request to every arm's router at its time, the arms' order rotating; waits for all."""
    lock = threading.Lock()
    names = list(routers)

    def send(policy: str, text: str) -> None:
        try:
            seconds = ttft(routers[policy], text)
        except Exception as error:  # counted, and the first few printed
            with lock:
                figures[policy].failed += 1
                if figures[policy].failed <= 3:
                    print(f"  {policy}: failed: {error}", flush=True)
            return
        with lock:
            figures[policy].ttfts.append(seconds)

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=192) as pool:
        for i, r in enumerate(requests):
            delay = start + r.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            for k in range(len(names)):
                pool.submit(send, names[(i + k) % len(names)], r.text)
    lag = time.monotonic() - start - (requests[-1].at if requests else 0.0)
    print(
        f"  replayed {len(requests)} requests x {len(names)} arms; done {lag:.0f} s after the last was sent"
    )


def _serves(router: str) -> Callable[[], bool]:
    return lambda: ttft(router, "hello there") > 0


def poll(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # not ready yet
            pass
        time.sleep(2)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def run_live(handle: Any, built: Sequence[Trace]) -> list[tuple[Trace, list[ArmFigures]]]:
    from tandem.devcluster import kube
    from tandem.devcluster.testing import OperatorProcess

    handle.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds" / "pddeployment.yaml")
    )
    handle.kubectl("wait", "--for=condition=Established", "crd/pddeployments.tandem.dev", "--timeout=60s")
    log = Path(tempfile.mkdtemp(prefix="tandem-bench-prefix-")) / "operator.log"
    lease = f"tandem-bench-prefix-{uuid.uuid4().hex[:6]}"
    operator = OperatorProcess(handle, ["--lease-namespace", "default", "--lease-name", lease], log)
    namespace = f"bench-prefix-{int(time.time())}"
    names = {policy: f"prefix-{spec.lower()}" for policy, spec in ARMS}
    out: list[tuple[Trace, list[ArmFigures]]] = []
    try:
        operator.wait_leader(timeout=90)
        handle.kubectl("create", "namespace", namespace)
        for policy, spec in ARMS:
            handle.kubectl(
                "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest(names[policy], spec))
            )
        started = time.monotonic()

        def ips(policy: str, role: str) -> list[str]:
            with handle.api_client() as api:
                found: list[str] = kube.ready_pod_ips(api, namespace, names[policy], role)
            if not all(ip.startswith("127.") for ip in found):
                raise RuntimeError(f"not a loopback address: {found}")
            return found

        wanted = {"prefill": PREFILL, "decode": DECODE, "router": 1}
        poll(
            "every arm's pods Ready",
            lambda: all(len(ips(p, role)) == n for p, _ in ARMS for role, n in wanted.items()),
            420,
        )
        routers = {policy: ips(policy, "router")[0] for policy, _ in ARMS}
        prefills = {policy: ips(policy, "prefill") for policy, _ in ARMS}
        for policy, router in routers.items():
            poll(f"{policy}'s router serving", _serves(router), 120)
        print(f"cluster: 3 PDDeployments Ready and serving in {time.monotonic() - started:.0f} s", flush=True)
        for trace in built:
            live = live_requests(trace.requests, TIME_SCALE)
            print(f"\n{trace.name}: {trace.what}; {live[-1].at:.0f} s of wall time", flush=True)
            before = {p: snapshot(prefills[p]) for p in routers}
            figures = {p: ArmFigures(p) for p in routers}
            replay(live, routers, figures)
            for p in routers:
                after = snapshot(prefills[p])
                f = figures[p]
                f.queries, f.hits, f.busy_seconds = (a - b for a, b in zip(after, before[p], strict=True))
            out.append((trace, [figures[p] for p, _ in ARMS]))
        return out
    finally:
        operator.stop()
        handle.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        handle.kubectl("delete", "lease", lease, "-n", "default", check=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=300, help="requests of the multi-turn trace")
    parser.add_argument("--mooncake", type=int, default=150, help="requests of the Mooncake window")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON object")
    args = parser.parse_args(argv)
    from tandem.devcluster import cluster as devcluster
    from tandem.devcluster import layout
    from tandem.devcluster.handle import ClusterHandle

    begun = time.monotonic()
    built = traces(args.sessions, args.mooncake)
    print(
        f"Live: 3 PDDeployments ({PREFILL} prefill + {DECODE} decode sim pods and 1 router each), one per "
        f"prefill policy, TANDEM_SIM_TIME_SCALE={TIME_SCALE:g}, max_tokens {MAX_TOKENS}; every request sent "
        "to the three routers at once",
        flush=True,
    )
    if kubeconfig := os.environ.get("TANDEM_KUBECONFIG"):
        results = run_live(ClusterHandle.from_kubeconfig(Path(kubeconfig)), built)
    else:
        cdir = layout.ClusterDir(Path(tempfile.mkdtemp(prefix="tandem-bench-cluster-")))
        devcluster.up(cdir, owner_pid=os.getpid())
        try:
            results = run_live(ClusterHandle.from_dir(cdir.path, owned=True), built)
        finally:
            devcluster.down(cdir)
    dump = {}
    for trace, arms in results:
        sim = simulated(trace.requests)
        print("\n" + table(f"{trace.name} (live): {trace.what}", arms, sim))
        dump[trace.name] = {
            a.policy: {
                "hit_rate": a.hit_rate,
                "ttft_p50_s": a.ttft(0.5),
                "ttft_p90_s": a.ttft(0.9),
                "prefill_gpu_hours": a.gpu_hours,
                "requests": len(a.ttfts),
                "failed": a.failed,
                "sim": sim[a.policy],
            }
            for a in arms
        }
    if args.json:
        print(json.dumps(dump))
    print(f"\nlive bench: {time.monotonic() - begun:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
