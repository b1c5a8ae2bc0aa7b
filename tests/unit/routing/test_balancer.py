"""The balancer: least outstanding work by power-of-two choices, quarantine of failed pods."""

from __future__ import annotations

import random

import pytest

from tandem.routing.balancer import Balancer

A, B, C = "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"


def make(*pods: str, seed: int = 7) -> Balancer:
    balancer = Balancer(rng=random.Random(seed), tokens_per_request=100.0, quarantine_s=5.0)
    balancer.set_pool("decode", pods)
    return balancer


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        ({A: (0, 0), B: (3, 0)}, A),  # fewer requests wins
        ({A: (2, 0), B: (0, 0)}, B),
        ({A: (1, 500), B: (2, 0)}, B),  # 1 request + 500 tokens (=5 requests) weighs more than 2
        ({A: (1, 50), B: (1, 0)}, B),  # equal requests: fewer tokens wins
    ],
)
def test_two_pods_the_lighter_one_wins(loads: dict[str, tuple[int, int]], expected: str) -> None:
    balancer = make(A, B)
    for pod, (requests, tokens) in loads.items():
        for _ in range(requests):
            balancer.acquire(pod, tokens // max(requests, 1))
        balancer.load(pod).tokens = tokens
    for _ in range(20):
        assert balancer.pick("decode", now=0.0) == expected


def test_power_of_two_never_picks_the_heaviest_of_three() -> None:
    balancer = make(A, B, C)
    for _ in range(10):
        balancer.acquire(C, 0)
    picks = {balancer.pick("decode", now=0.0) for _ in range(200)}
    assert C not in picks
    assert picks == {A, B}


def test_empty_or_unknown_pool_gives_none() -> None:
    balancer = make()
    assert balancer.pick("decode", now=0.0) is None
    assert balancer.pick("prefill", now=0.0) is None


@pytest.mark.parametrize(
    ("exclude", "expected"),
    [({A}, {B}), ({B}, {A}), ({A, B}, set())],
)
def test_exclude(exclude: set[str], expected: set[str]) -> None:
    balancer = make(A, B)
    picks = {balancer.pick("decode", now=0.0, exclude=exclude) for _ in range(50)}
    assert picks == (expected or {None})


def test_failed_pod_sits_out_then_returns() -> None:
    balancer = make(A, B)
    until = balancer.mark_failed(A, now=100.0)
    assert until == 105.0
    assert {balancer.pick("decode", now=101.0) for _ in range(50)} == {B}
    assert balancer.healthy_count("decode", now=101.0) == 1
    assert A in {balancer.pick("decode", now=106.0) for _ in range(50)}


@pytest.mark.parametrize(("failures", "hold"), [(1, 5.0), (2, 10.0), (3, 20.0), (10, 60.0)])
def test_quarantine_doubles_up_to_a_cap(failures: int, hold: float) -> None:
    balancer = make(A, B)
    until = 0.0
    for _ in range(failures):
        until = balancer.mark_failed(A, now=0.0)
    assert until == hold


def test_success_clears_quarantine() -> None:
    balancer = make(A, B)
    balancer.mark_failed(A, now=0.0)
    balancer.mark_ok(A)
    assert balancer.healthy_count("decode", now=1.0) == 2


def test_all_quarantined_offers_the_one_that_returns_first() -> None:
    balancer = make(A, B)
    balancer.mark_failed(A, now=0.0)
    balancer.mark_failed(B, now=1.0)
    assert balancer.pick("decode", now=2.0) == A


def test_release_never_goes_negative_and_load_survives_pool_changes() -> None:
    balancer = make(A, B)
    balancer.acquire(A, 10)
    balancer.set_pool("decode", [B])
    assert balancer.load(A).requests == 1  # still outstanding: kept until released
    balancer.release(A, 10)
    balancer.release(A, 10)
    assert balancer.load(A).requests == 0
    assert balancer.load(A).tokens == 0
    assert balancer.pool("decode") == [B]
