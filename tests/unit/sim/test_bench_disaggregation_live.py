"""The live disaggregation bench's pure parts (`bench/disaggregation_live.py`): the sessions trace as
numbered turns with a text per arm (a session's turns share text within an arm, the arms share none),
the manifests of the two arms, the per-turn table and the choices read from a router's /metrics. The
live run itself is not in `make test`."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path
from types import ModuleType

from tandem.devcluster.testing import load_file
from tandem.engine.prefixcache import block_hashes
from tandem.engine.tokens import prompt_tokens_of
from tandem.sim.requests import Request
from tandem.sim.traces.prefix import SessionParams, session_turns

ROOT = Path(__file__).resolve().parents[3]


def _bench() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))
    return load_file("bench_disaggregation_live", ROOT / "bench" / "disaggregation_live.py")


bench = _bench()
BASE = [Request(10.0 * i, 100 + i, 20) for i in range(8)]


def shared_blocks(a: str, b: str) -> int:
    """The leading engine blocks (16 tokens) two texts share."""
    pairs = zip(block_hashes(prompt_tokens_of(a), 16), block_hashes(prompt_tokens_of(b), 16), strict=False)
    return len(list(itertools.takewhile(lambda pair: pair[0] == pair[1], pairs)))


def test_turns_share_text_within_an_arm_and_none_across_arms() -> None:
    params = SessionParams(turns=4, think_seconds=0.0, system_prompt_tokens=320, system_prompts=1, seed=0)
    turns = bench.live_turns(session_turns(BASE, params), 3.0)
    assert [t.turn for t in turns if t.session == 0] == [0, 1, 2, 3]
    assert turns[0].at == 0.0
    first, second = (t for t in turns if t.session == 0 and t.turn in (0, 1))
    for arm in ("Always", "Auto"):
        assert len(prompt_tokens_of(first.texts[arm])) == first.prompt_tokens
        # The next turn resends the first's full blocks (system prompt, message, reply's place).
        assert shared_blocks(first.texts[arm], second.texts[arm]) == first.prompt_tokens // 16
    assert shared_blocks(first.texts["Always"], first.texts["Auto"]) == 0
    # Two sessions on the one system prompt share its 20 blocks, within an arm.
    other = next(t for t in turns if t.session == 1 and t.turn == 0)
    assert shared_blocks(first.texts["Auto"], other.texts["Auto"]) == 320 // 16


def test_the_two_arms_differ_only_in_the_mode() -> None:
    always, auto = bench.manifest("a", None), bench.manifest("b", "Auto")
    assert "disaggregation" not in always["spec"]["router"]
    assert auto["spec"]["router"]["disaggregation"] == {"mode": "Auto"}
    auto["spec"]["router"].pop("disaggregation")
    assert always["spec"] == auto["spec"]
    spec = always["spec"]
    assert (spec["prefill"]["replicas"], spec["decode"]["replicas"]) == (1, 2)
    assert spec["kvTransfer"]["bandwidthGbps"] == 25
    assert spec["colocated"] == {"replicas": 0}


def test_the_table_has_ratios_per_turn() -> None:
    always = bench.ArmFigures("Always", {0: [0.1, 0.2, 0.3], 1: [0.1, 0.1]})
    auto = bench.ArmFigures("Auto", {0: [0.1, 0.2, 0.3], 1: [0.05, 0.05]})
    text = bench.table(always, auto)
    assert "| turn 1 | 3 / 3 | 200 / 300 | 200 / 300 | 1.00 | 1.00 |" in text
    assert "| turn 2 | 2 / 2 | 100 / 100 | 50 / 50 | 0.50 | 0.50 |" in text
    assert "| all | 5 / 5 | 100 / 300 | 100 / 300 | 1.00 | 1.00 |" in text
    assert math.isnan(bench.percentile([], 0.5))


def test_choices_are_read_from_a_routers_metrics() -> None:
    text = "\n".join(
        [
            "# TYPE tandem_router_disaggregation_total counter",
            'tandem_router_disaggregation_total{prefill="remote",reason="too_long"} 3.0',
            'tandem_router_disaggregation_total{prefill="local",reason="local_faster"} 7.0',
            'tandem_router_disaggregation_total{prefill="remote",reason="unmeasured"} 0.0',
            'tandem_router_disaggregation_created{prefill="remote",reason="too_long"} 1.7e9',
        ]
    )
    assert bench.decisions(text) == {"remote/too_long": 3.0, "local/local_faster": 7.0}
