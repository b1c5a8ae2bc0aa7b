"""Small cases computed by hand from the 8B H100 TP1 profile (ms):
prefill step `max(6.5, 1.0 + 0.0218 n) + 6.6e-7 ((o+n)^2 - o^2)`, decode step `6.7 + 5.2e-5 sumC`,
KV 131,072 bytes/token at 400 Gb/s."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tandem.sim import Request, ScheduledPolicy, simulate
from tandem.sim.cluster import Cluster

if TYPE_CHECKING:
    from conftest import SimKit

MS = 1e-3


def test_one_request_through_prefill_transfer_and_decode(kit: SimKit) -> None:
    result = simulate([Request(0.0, 1000, 3)], kit.pd(), kit.config())
    prefill = (1.0 + 0.0218 * 1000 + 6.6e-7 * 1000**2) * MS  # 23.46 ms
    transfer = 1000 * 131_072 * 8 / 400e9  # 2.62144 ms
    # D recomputes the last prompt token (a 1-token chunk at offset 999) and samples the first token.
    first_step = (6.5 + 6.6e-7 * (1000**2 - 999**2)) * MS
    record = result.records[0]
    assert record.path == "disaggregated"
    assert record.ttft == pytest.approx(prefill + transfer + first_step, abs=1e-12)
    assert record.ttft == pytest.approx(32.58275934 * MS, abs=1e-12)
    # Two decode steps over 1001 then 1002 context tokens.
    assert record.tpot == pytest.approx((6.7 + 5.2e-5 * 1001 + 6.7 + 5.2e-5 * 1002) / 2 * MS, abs=1e-12)
    assert record.within_slo


def test_requests_queue_fcfs_when_a_step_holds_one_prompt(kit: SimKit) -> None:
    requests = [Request(0.0, 1000, 1), Request(0.0, 1000, 1), Request(0.0, 1000, 1)]
    result = simulate(requests, kit.colocated(kit.spec(seqs=4, batched=1000)), kit.config())
    step = 23.46 * MS
    assert [result.records[i].ttft for i in range(3)] == pytest.approx([step, 2 * step, 3 * step], abs=1e-12)
    assert result.records[0].tpot is None  # one output token: judged on TTFT alone


def test_a_request_arriving_mid_step_waits_for_the_step_to_end(kit: SimKit) -> None:
    requests = [Request(0.0, 1000, 1), Request(0.001, 1000, 1)]
    result = simulate(requests, kit.colocated(), kit.config())
    assert result.records[1].ttft == pytest.approx(2 * 23.46 * MS - 0.001, abs=1e-12)


def test_chunked_prefill_on_colocated(kit: SimKit) -> None:
    result = simulate([Request(0.0, 3000, 1)], kit.colocated(kit.spec(seqs=4, batched=1024)), kit.config())
    chunks = [
        1.0 + 0.0218 * 1024 + 6.6e-7 * 1024**2,  # 24.01526016
        1.0 + 0.0218 * 1024 + 6.6e-7 * (2048**2 - 1024**2),  # 25.39938048
        1.0 + 0.0218 * 952 + 6.6e-7 * (3000**2 - 2048**2),  # 24.92535936
    ]
    assert result.records[0].ttft == pytest.approx(74.34 * MS, abs=1e-12)
    assert result.records[0].ttft == pytest.approx(sum(chunks) * MS, abs=1e-12)


def test_a_prefill_chunk_delays_the_decodes_sharing_its_step(kit: SimKit) -> None:
    decoding = Request(0.0, 100, 1000)
    alone = simulate([decoding], kit.colocated(), kit.config())
    shared = simulate([decoding, Request(1.0, 4000, 1)], kit.colocated(), kit.config())
    # One decode step (6.7 + KV read) became a mixed step over 4001 tokens (same KV read term).
    extra = (1.0 + 0.0218 * 4001 + 6.6e-7 * 4000**2 - 6.7) * MS
    finish_alone = alone.records.finished[0]
    finish_shared = shared.records.finished[0]
    assert finish_shared - finish_alone == pytest.approx(extra, abs=1e-9)


def test_preemption_when_the_kv_cache_is_full(kit: SimKit) -> None:
    # 250 tokens of KV: two 100-token prompts fit (the second joins the first's first decode step), and
    # their decodes grow until the cache is full; the newer one is preempted and recomputes its prompt and
    # the tokens it had once the first has finished.
    requests = [Request(0.0, 100, 50), Request(0.0, 100, 50)]
    for closed_form in (True, False):
        result = simulate(
            requests, kit.colocated(kit.spec(cap=250, seqs=4, batched=1024)), kit.config(closed_form)
        )
        first, second = result.records[0], result.records[1]
        assert (first.preemptions, second.preemptions) == (0, 1)
        assert first.ttft == pytest.approx(6.5066 * MS, abs=1e-12)  # 100 tokens: the 6.5 ms floor + attention
        assert result.records.finished[1] > result.records.finished[0]
        assert result.summary.finished == 2
    # The second's TPOT includes its recompute wait: longer than the first's.
    assert first.tpot is not None
    assert second.tpot is not None
    assert second.tpot > first.tpot


def test_a_new_replica_is_ready_after_the_load_time_and_counts_gpus_from_its_request(kit: SimKit) -> None:
    requests = [Request(float(t), 10, 2) for t in range(200)]
    policy = ScheduledPolicy(steps=[(15.0, {"colocated": 2})], interval_seconds=15.0)
    cluster = Cluster(requests, kit.colocated(load=120.0), kit.config(), policy)
    result = cluster.run()
    added = cluster.all_replicas[1]
    assert (added.requested_at, added.ready_at) == (15.0, 135.0)
    by_time = {round(s.time): s for s in result.series}
    assert by_time[30].replicas["colocated"] == 2
    assert by_time[30].ready["colocated"] == 1
    assert by_time[150].ready["colocated"] == 2
    end = result.summary.duration_seconds
    assert result.summary.gpu_hours == pytest.approx((end + (end - 15.0)) / 3600)
    assert result.summary.scale_actions == 1
    assert result.summary.peak_gpus == 2


def test_a_removed_replica_drains_and_counts_until_gone(kit: SimKit) -> None:
    # Two long requests, one on each replica (the second pick sees the first's load); at 15 s the pool
    # shrinks to one: the newer replica stops taking work but finishes its request before it goes.
    requests = [Request(0.0, 100, 20_000), Request(0.001, 100, 20_000), Request(20.0, 100, 10)]
    policy = ScheduledPolicy(steps=[(15.0, {"colocated": 1})], interval_seconds=15.0)
    cluster = Cluster(requests, kit.colocated(replicas=2), kit.config(), policy)
    result = cluster.run()
    kept, removed = cluster.all_replicas
    finished = {result.records.finished[0], result.records.finished[1]}
    assert removed.gone_at in finished
    assert removed.gone_at > 100.0  # it drained for minutes after the decision at 15 s
    assert cluster.ready["colocated"] == [kept]
    end = result.summary.duration_seconds
    assert result.summary.gpu_hours == pytest.approx((end + removed.gone_at) / 3600)


def test_gpu_hours_of_a_static_layout(kit: SimKit) -> None:
    requests = [Request(0.5 * i, 500, 20) for i in range(40)]
    result = simulate(requests, kit.pd(prefill=1, decode=2), kit.config())
    end = result.summary.duration_seconds
    assert end == pytest.approx(max(result.records.finished))
    assert result.summary.gpu_hours == pytest.approx(3 * end / 3600)
    assert result.summary.goodput_per_gpu_hour == pytest.approx(
        result.summary.within_slo / result.summary.gpu_hours
    )
    assert result.summary.mean_gpus == pytest.approx(3.0)


def test_no_ready_pod_refuses_the_request(kit: SimKit) -> None:
    result = simulate([Request(0.0, 10, 5), Request(1.0, 10, 5)], kit.colocated(replicas=0), kit.config())
    assert result.summary.refused == 2
    assert result.summary.attainment == 0.0
    assert result.records[0].path is None
    assert not result.records[0].within_slo


def test_a_request_longer_than_the_kv_cache_is_refused(kit: SimKit) -> None:
    result = simulate(
        [Request(0.0, 900, 200)], kit.colocated(kit.spec(cap=1000, seqs=4, batched=1024)), kit.config()
    )
    assert result.summary.refused == 1


def test_the_queue_counters_match_a_scan_of_the_queue(kit: SimKit, monkeypatch: pytest.MonkeyPatch) -> None:
    """The waiting queue's tokens and its count of pulled sequences are kept incrementally (an overload
    does not rescan the queue every scrape or blocked step): at every scrape of an overloaded P/D layout
    with a small decode KV cache (preemptions, pulls waiting for blocks) they equal a scan."""
    checked: list[int] = []
    scrape = Cluster.scrape

    def checking(self: Cluster, now: float) -> None:
        for replica in self.all_replicas:
            waiting = list(replica.waiting)
            assert replica.waiting_tokens == sum(q.prompt + q.num_output - q.computed for q in waiting)
            assert replica.waiting_resident == sum(1 for q in waiting if q.computed)
            checked.append(len(waiting))
        scrape(self, now)

    monkeypatch.setattr(Cluster, "scrape", checking)
    requests = [Request(0.02 * i, 3000 + 500 * (i % 7), 200 + 50 * (i % 5)) for i in range(3000)]
    result = simulate(requests, kit.pd(kit.spec(cap=60_000), prefill=1, decode=1), kit.config())
    assert max(checked) > 100  # the prefill queue grew long
    assert sum(result.records.preemptions) > 0
