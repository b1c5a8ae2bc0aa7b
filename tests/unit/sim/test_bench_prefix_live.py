"""The live prefix-routing bench's pure parts (`bench/prefix_routing_live.py`): prefix runs expanded into
text the sim engine tokenizes back to the same blocks (shared blocks -> shared text and shared engine
block hashes), and the report table from made-up figures. The live run itself is not in `make test`."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from types import ModuleType

from tandem.devcluster.testing import load_file
from tandem.engine.prefixcache import block_hashes
from tandem.engine.tokens import prompt_tokens_of
from tandem.routing.prefix import chain_keys
from tandem.sim.requests import Request
from tandem.sim.traces.prefix import SessionParams, mooncake_prefix, sessions

ROOT = Path(__file__).resolve().parents[3]


def _bench() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))
    return load_file("bench_prefix_routing_live", ROOT / "bench" / "prefix_routing_live.py")


live = _bench()


def shared_engine_blocks(a: str, b: str) -> int:
    ha, hb = block_hashes(prompt_tokens_of(a), 16), block_hashes(prompt_tokens_of(b), 16)
    n = 0
    for x, y in zip(ha, hb, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_mooncake_blocks_become_shared_text() -> None:
    # Two requests sharing their first two 512-token Mooncake blocks, then different.
    a = live.prompt_text(mooncake_prefix([7, 8, 9], 1300), 1300, salt=1)
    b = live.prompt_text(mooncake_prefix([7, 8, 10], 1300), 1300, salt=2)
    assert len(prompt_tokens_of(a)) == len(prompt_tokens_of(b)) == 1300  # one word a token
    assert shared_engine_blocks(a, b) == 64  # 2 x 512 tokens = 64 engine blocks, not one more
    assert a == live.prompt_text(mooncake_prefix([7, 8, 9], 1300), 1300, salt=1)  # deterministic
    # The router's chunks see the same shared prefix (about 1024 tokens x 6 characters / 64): chained
    # over every chunk (what `text_keys` samples), the keys part at chunk 95 or 96.
    ka, kb = (chain_keys([t[i : i + 64] for i in range(0, len(t) - 63, 64)]) for t in (a, b))
    common = next(i for i, (x, y) in enumerate(zip(ka, kb, strict=False)) if x != y)
    assert 1024 * 6 // 64 - 1 <= common <= 1024 * 6 // 64


def test_no_prefix_is_text_of_its_own() -> None:
    a = live.prompt_text(None, 100, salt=1)
    b = live.prompt_text(None, 100, salt=2)
    assert len(prompt_tokens_of(a)) == 100
    assert shared_engine_blocks(a, b) == 0


def test_a_session_turn_resends_the_previous_one() -> None:
    base = [Request(float(i), 300, 50) for i in range(4)]
    turns = sessions(
        base, SessionParams(turns=4, think_seconds=0.0, system_prompt_tokens=64, system_prompts=1)
    )
    texts = live.live_requests(turns, 3.0)
    assert [r.at for r in texts] == [0.0, 0.0, 0.0, 0.0]
    assert [r.prompt_tokens for r in texts] == [364, 714, 1064, 1414]
    for previous, following in itertools.pairwise(texts):
        # All of the previous prompt's full blocks, as the simulator's prefix runs say.
        assert shared_engine_blocks(previous.text, following.text) == previous.prompt_tokens // 16
    stretched = live.live_requests([Request(10.0, 20, 1), Request(12.5, 20, 1)], 3.0)
    assert [r.at for r in stretched] == [0.0, 7.5]


def test_the_table_from_made_up_figures() -> None:
    aware = live.ArmFigures(
        "prefix-aware", queries=1000, hits=800, busy_seconds=36, ttfts=[0.1, 0.2, 0.3, 0.4]
    )
    load = live.ArmFigures("load-only", queries=1000, hits=400, busy_seconds=72, ttfts=[0.2, 0.4, 0.6, 0.8])
    rr = live.ArmFigures("round-robin", queries=1000, hits=300, busy_seconds=90, ttfts=[], failed=2)
    assert aware.ttft(0.5) == 0.2
    assert aware.ttft(0.9) == 0.4
    assert rr.ttft(0.9) == 0.0
    text = live.table("T", [aware, load, rr], {"prefix-aware": (0.75, 0.5, 1.0, 0.02)})
    rows = text.splitlines()
    assert rows[0] == "### T"
    assert (
        rows[4] == "| prefix-aware | 80.0% | +40.0 pts | 200 / 400 | 0.50x / 0.50x | 0.0100 | 0.50x | 0 "
        "| 75.0% | 500 / 1,000 | 0.0200 |"
    )
    assert rows[5].startswith(
        "| load-only | 40.0% | +0.0 pts | 400 / 800 | 1.00x / 1.00x | 0.0200 | 1.00x | 0 |"
    )
    assert (
        rows[6]
        == "| round-robin | 30.0% | -10.0 pts | 0 / 0 | 0.00x / 0.00x | 0.0250 | 1.25x | 2 | - | - | - |"
    )
