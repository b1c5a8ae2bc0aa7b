"""P/D with real vLLM engines through the operator's router: answers equal token for token to a
colocated engine's, the KV transferred and not recomputed, and the metric contract.

On the dev cluster with the CPU build of vLLM and the tiny model (docs/real-vllm.md), one
PDDeployment with all three pools (conftest.py's `deployed`, which `test_pd_failures_e2e.py` goes on
with), in `make test`; the gray rollout is `test_pd_rollout_e2e.py`, in `make test-real`:
1. Colocated (one engine) answers every request through its router; the answers are recorded.
2. `spec.serving.mode` goes to Disaggregated with no `spec.rollout` (a direct cut-over) and the
   colocated pool to 0: one prefill and one decode engine, NixlConnector over loopback.
3. The P/D answers must equal the colocated ones token for token (temperature 0, --dtype float32):
   completions and chat, streamed and not, over the 24 CHECKED prompts of 1 to 900 words. The
   decode engine's counters must show the prompt's KV arrived by transfer, with no prompt token
   computed there, and the prefill engine's prefix cache must count a repeated prompt as hits.
   Prometheus scrapes the engines like any pod; every series and query tandem reads answers.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tandem.api import meta
from tandem.devcluster import tinymodel
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import eventually, metric_total
from tandem.metrics import queries

from .pdkit import CHECKED, FORMS, Deployed, Run, ask, engine_rss, latency, run_all

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def disaggregated(pd: Deployed) -> Run:
    before = {role: pd.metrics(role) for role in ("prefill", "decode")}
    started = time.monotonic()
    answers = run_all(pd.router(), CHECKED)
    seconds = time.monotonic() - started
    after = {role: pd.metrics(role) for role in ("prefill", "decode")}
    # Still P/D throughout: a steady-P/D fall-back to colocated (autoRollback) would answer the same.
    seen = json.loads(pd.cluster.kubectl("get", "-n", pd.namespace, "pdd", pd.name, "-o", "json").stdout)
    assert seen["status"].get("mode") == "Disaggregated", seen["status"].get("rollout")
    rss = ", ".join(f"{role} {engine_rss(pd.pod(role)):.2f} GB" for role in ("prefill", "decode"))
    print(f"engine RSS: {rss}; P/D latency {latency(answers)}")
    return Run(answers, seconds, before, after)


def delta(run: Run, role: str, name: str, **labels: str) -> float:
    return metric_total(run.after[role], name, **labels) - metric_total(run.before[role], name, **labels)


def test_pd_answers_equal_the_colocated_ones_token_for_token(colocated: Run, disaggregated: Run) -> None:
    ref, got = colocated.answers, disaggregated.answers
    assert set(ref) == set(got)
    assert len(ref) == len(CHECKED) * len(FORMS)
    prompt_lengths = sorted({a.prompt_tokens for (_, e, _), a in ref.items() if e == "completions"})
    assert prompt_lengths[0] <= 3, prompt_lengths
    assert prompt_lengths[-1] >= 900, prompt_lengths
    # token ids come back in every form, so the comparison is of tokens, not only of text
    assert all(a.token_ids is not None and len(a.token_ids) == a.completion_tokens for a in ref.values())
    assert all(a.completion_tokens > 0 for a in ref.values())
    # The router streams: a multi-token answer comes in several chunks. Not every one: vLLM's API
    # server merges the deltas it has queued when it falls behind its engine (a clean-clone run on a
    # loaded machine got one 24-token answer in one chunk, with a P/D answer taking 11.8 s); a router
    # that buffered whole answers would give one chunk to all of them.
    streamed = [a for (_, _, s), a in got.items() if s and a.completion_tokens > 1]
    in_chunks = sum(a.chunks > 1 for a in streamed)
    assert streamed
    assert in_chunks >= 0.75 * len(streamed), f"{in_chunks} of {len(streamed)} streamed in several chunks"
    different = {key: (ref[key], got[key]) for key in ref if ref[key] != got[key]}
    equal = len(ref) - len(different)
    print(
        f"\nP/D vs colocated: {equal}/{len(ref)} answers equal token for token "
        f"({len(CHECKED)} prompts x {len(FORMS)} forms); colocated {colocated.seconds:.1f} s, "
        f"P/D {disaggregated.seconds:.1f} s for the {len(ref)} requests, one at a time "
        f"({sum(a.completion_tokens for a in ref.values())} and "
        f"{sum(a.completion_tokens for a in got.values())} tokens generated)"
    )
    assert not different, different
    # the same prompt's streamed and unstreamed answers agree too
    for i in range(len(CHECKED)):
        for endpoint in ("completions", "chat"):
            assert ref[(i, endpoint, False)] == ref[(i, endpoint, True)]


def test_decode_received_the_prompt_kv_and_computed_none_of_it(disaggregated: Run) -> None:
    prompt = delta(disaggregated, "decode", "vllm:prompt_tokens_total")
    transferred = delta(
        disaggregated, "decode", "vllm:prompt_tokens_by_source_total", source="external_kv_transfer"
    )
    computed = delta(disaggregated, "decode", "vllm:prompt_tokens_by_source_total", source="local_compute")
    cached = delta(disaggregated, "decode", "vllm:prompt_tokens_by_source_total", source="local_cache_hit")
    sent = sum(a.prompt_tokens for a in disaggregated.answers.values())
    print(
        f"\ndecode: {prompt:.0f} prompt tokens, {transferred:.0f} transferred, {cached:.0f} from its own "
        f"cache, {computed:.0f} computed; {sent} prompt tokens sent"
    )
    assert prompt == sent
    assert computed == 0
    assert transferred + cached == prompt
    # Each form of a prompt repeats what decode already holds from the form before; the first of
    # each (and every chat/completions switch) arrives by NIXL.
    assert transferred > 0.4 * prompt
    assert delta(disaggregated, "decode", "vllm:nixl_xfer_time_seconds_count") > 0
    assert delta(disaggregated, "decode", "vllm:nixl_num_failed_transfers_total") == 0
    # prefill computed the prompts
    assert delta(disaggregated, "prefill", "vllm:prompt_tokens_total") == sent


def test_prefill_prefix_cache_counts_a_repeated_prompt(pd: Deployed, disaggregated: Run) -> None:
    words = " ".join(tinymodel.corpus(99, lines=200)).split()
    prompt = " ".join(words[:700])
    router = pd.router()
    first = ask(router, "completions", False, prompt)
    before = pd.metrics("prefill")
    again = ask(router, "completions", False, prompt)
    after = pd.metrics("prefill")
    assert again == first
    hits = metric_total(after, "vllm:prefix_cache_hits_total") - metric_total(
        before, "vllm:prefix_cache_hits_total"
    )
    queries = metric_total(after, "vllm:prefix_cache_queries_total") - metric_total(
        before, "vllm:prefix_cache_queries_total"
    )
    print(f"\nprefill prefix cache on the repeat: {hits:.0f} hits of {queries:.0f} queried tokens")
    assert queries == first.prompt_tokens
    assert hits >= 0.9 * first.prompt_tokens


def test_prometheus_scrapes_the_engines(cluster: ClusterHandle, pd: Deployed, disaggregated: Run) -> None:
    names = {
        p["metadata"]["name"] for p in pd.pods() if p["metadata"]["labels"].get(meta.LABEL_ROLE) != "router"
    }

    def scraped() -> set[str] | None:
        query = urllib.parse.urlencode({"query": f'vllm:prompt_tokens_total{{namespace="{pd.namespace}"}}'})
        with urllib.request.urlopen(f"{cluster.prometheus_url}/api/v1/query?{query}", timeout=10) as answer:
            result = json.load(answer)["data"]["result"]
        pods = {r["metric"].get("pod") for r in result if float(r["value"][1]) > 0}
        return pods if names <= pods else None

    eventually(scraped, timeout=60, interval=2, what=f"Prometheus series of {sorted(names)}")


# --- the metric contract: what tandem reads from engines, against real vLLM -----------------------

ROOT = Path(__file__).resolve().parents[2]
# Where tandem reads engine metrics: the autoscaler's and KV-transport queries, rollout/revision
# analysis (tandem.metrics), the dashboard, the router's KV watch, the controller's KV status.
READERS = (
    "operator/tandem/metrics",
    "operator/tandem/dashboard",
    "operator/tandem/signals.py",
    "operator/tandem/router/kvwatch.py",
    "operator/tandem/controller/kv_transport.py",
    "charts/tandem/dashboards/tandem.json",
)
# Read only as a fallback for vLLM before 0.10 (router/kvwatch.py); real 0.32 has kv_cache_usage_perc.
LEGACY = {"vllm:gpu_cache_usage_perc"}
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")


def names_tandem_reads() -> set[str]:
    found: set[str] = set()
    for entry in READERS:
        path = ROOT / entry
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            found |= set(re.findall(r"vllm:[a-z0-9_]+", f.read_text()))
    return found - LEGACY


def families(text: str) -> set[str]:
    return {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if line.startswith("vllm:")}


def exported(name: str, present: set[str]) -> bool:
    if name.endswith("_"):  # a family prefix in prose, e.g. vllm:nixl_*
        return any(p.startswith(name) for p in present)
    return any(name + suffix in present for suffix in SUFFIXES)


def test_every_engine_series_tandem_reads_is_exported_in_each_role(
    colocated: Run, pd: Deployed, disaggregated: Run
) -> None:
    names = names_tandem_reads()
    assert {
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:nixl_xfer_time_seconds_bucket",
    } <= names
    texts = {"colocated": colocated.after["colocated"], **{r: pd.metrics(r) for r in ("prefill", "decode")}}
    missing = {}
    for role, text in texts.items():
        present = families(text)
        # No KV connector on a colocated engine: no NIXL series there, by design.
        wanted = {n for n in names if role != "colocated" or not n.startswith("vllm:nixl")}
        missing[role] = sorted(n for n in wanted if not exported(n, present))
    assert missing == {"colocated": [], "prefill": [], "decode": []}, missing
    # cache_config_info carries num_gpu_blocks, which the prefill drain reads (held-KV estimate)
    for role, text in texts.items():
        info = [line for line in text.splitlines() if line.startswith("vllm:cache_config_info{")]
        assert info, role
        assert re.search(r'num_gpu_blocks="[1-9][0-9]*"', info[0]), (role, info[0])


def test_every_engine_query_tandem_runs_answers_for_each_pool(
    cluster: ClusterHandle, pd: Deployed, disaggregated: Run
) -> None:
    """The autoscaler's engine queries, the drain's pod queries and the KV-transport queries, as
    tandem renders them, on the dev cluster's Prometheus: every one answers, for both pools where it
    groups by pool. tandem:kv_held_blocks is the sim engine's alone (queries.py estimates held KV from
    kv_cache_usage_perc x num_gpu_blocks on real vLLM)."""

    def query(promql: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{cluster.prometheus_url}/api/v1/query?{q}", timeout=10) as answer:
            data = json.load(answer)
        assert data["status"] == "success", (promql, data)
        result: list[dict[str, Any]] = data["data"]["result"]
        return result

    window = 600.0
    engine_queries = queries.snapshot_queries(pd.namespace, pd.name, window, 0.95)
    engine_queries = {q.name: engine_queries[q.name] for q in queries.ENGINE_QUERIES}
    pods = [p["metadata"]["name"] for p in pd.pods() if p["metadata"]["labels"][meta.LABEL_ROLE] != "router"]
    pod_queries = queries.pod_load_queries(pd.namespace, pods)
    kv_queries = queries.kv_transport_queries(pd.namespace, pd.name, window)
    # waiting_before and running_before look one window back: only once the pools are that old.
    wanted = {**engine_queries, **pod_queries, **kv_queries}
    sim_only = {"pod_kv_held_blocks"}
    empty: dict[str, str] = {}

    def all_answer() -> bool:
        empty.clear()
        for name, promql in wanted.items():
            if name in sim_only or name in ("waiting_before", "running_before"):
                continue
            result = query(promql)
            roles = {r["metric"].get(queries.LABEL_ROLE) for r in result}
            if not result or ("by (tandem_dev_role" in promql and not {"prefill", "decode"} <= roles):
                empty[name] = promql
        return not empty

    with contextlib.suppress(AssertionError):
        eventually(all_answer, timeout=60, interval=5, what="every engine query answering")
    assert not empty, empty
    assert query(pod_queries["pod_kv_held_blocks"]) == []  # sim-only: absent on real vLLM, by design
