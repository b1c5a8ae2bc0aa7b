"""`bench/autoscale.py --trace FILE --format F`: a trace the bench does not know, in each format, read with
its window, rate scale and time compression; a bad file is an error naming the file and line; and the
whole comparison end to end on a small plain trace (`--quick`: one planner factor)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from types import ModuleType

import pytest

from tandem.devcluster.testing import load_file

ROOT = Path(__file__).resolve().parents[3]
RATES_HEADER = "client_id,window_start_s,rate_rps,iat_cv,iat_dist,dist_param1,dist_param2\n"
LENGTHS_HEADER = (
    "client_id,window_start_s,input_tokens_mean,input_tokens_p50,input_tokens_p90,input_tokens_p99,"
    "output_tokens_mean,output_tokens_p50,output_tokens_p90,output_tokens_p99\n"
)


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_file("bench_autoscale_trace", ROOT / "bench" / "autoscale.py")


def _write(tmp_path: Path, fmt: str, good: bool = True) -> Path:
    """A small trace of 40 requests one second apart (ServeGen: a curve of two 10-minute windows)."""
    if fmt == "plain":
        path = tmp_path / "mine.csv"
        rows = [f"{t},{100 + t},{10 + t}" for t in range(40)]
        if not good:
            rows[5] = "5,lots,10"
        path.write_text("timestamp,input_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    elif fmt == "azure":
        path = tmp_path / "azure.csv"
        rows = [f"2023-11-16 18:{t // 60:02d}:{t % 60:02d}.0000000,{100 + t},{10 + t}" for t in range(40)]
        if not good:
            rows[2] = "16/11/2023 18:00:02,102,12"
        path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    elif fmt == "mooncake":
        path = tmp_path / "mooncake.jsonl"
        records = [
            {"timestamp": 1000 * t, "input_length": 100 + t, "output_length": 10 + t, "hash_ids": [t]}
            for t in range(40)
        ]
        if not good:
            del records[7]["output_length"]
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        path = tmp_path / "mine_client_rates.csv"
        dist = "Gamma" if good else "Lognormal"
        path.write_text(RATES_HEADER + f"1,0,0.5,1.0,{dist},1.0,2.0\n1,600,1.0,1.0,Gamma,1.0,1.0\n")
        (tmp_path / "mine_client_lengths.csv").write_text(
            LENGTHS_HEADER + "1,0,300,280,450,700,50,40,90,200\n"
        )
    return path


def _case(bench: ModuleType, path: Path, fmt: str, **kw: object) -> object:
    fields: dict[str, object] = {"rate_scale": 1.0, "seconds": None, "start": 0.0, "compress": 1.0}
    fields.update(kw)
    return bench.Case(
        path.stem, path.name, "file", fields["rate_scale"], 1000, 30, 16, False,
        fields["seconds"], fields["start"], fields["compress"], str(path), fmt,
    )  # fmt: skip


@pytest.mark.parametrize("fmt", ["plain", "azure", "mooncake"])
def test_each_request_format_reads_with_window_rate_and_compression(
    bench: ModuleType, fmt: str, tmp_path: Path
) -> None:
    path = _write(tmp_path, fmt)
    assert bench.detect_format(path) == fmt
    whole = bench.requests_of(_case(bench, path, fmt))
    assert len(whole) == 40
    if fmt != "mooncake":  # Mooncake's ms timestamps are spread within their 3-s ticks
        assert [r.arrival for r in whole[:3]] == [0.0, 1.0, 2.0]
        assert (whole[0].prompt_tokens, whole[0].output_tokens) == (100, 10)
    # the window [10, 30) s re-based to 0, then time compressed 2x: 20 requests within 10 s
    part = bench.requests_of(_case(bench, path, fmt, start=10.0, seconds=20.0, compress=2.0))
    assert len(part) == 20 if fmt != "mooncake" else 18 <= len(part) <= 22
    assert max(r.arrival for r in part) < 10.0
    # rate x3 keeps the duration (copies laid over each other)
    tripled = bench.requests_of(_case(bench, path, fmt, rate_scale=3.0))
    assert len(tripled) == 120
    assert max(r.arrival for r in tripled) <= max(r.arrival for r in whole) + 1e-9


def test_servegen_reads_its_curve_with_the_lengths_file_beside(bench: ModuleType, tmp_path: Path) -> None:
    path = _write(tmp_path, "servegen")
    assert bench.detect_format(path) == "servegen"
    assert bench.servegen_lengths_path(path) == tmp_path / "mine_client_lengths.csv"
    requests = bench.requests_of(_case(bench, path, "servegen", seconds=1200.0))
    # 0.5 req/s for 600 s and 1 req/s for 600 s: ~900 requests (a seeded draw)
    assert 750 < len(requests) < 1050
    assert all(r.tenant == "client-1" for r in requests)
    compressed = bench.requests_of(_case(bench, path, "servegen", seconds=1200.0, compress=4.0))
    assert len(compressed) == len(requests)
    assert max(r.arrival for r in compressed) < 300.0
    (tmp_path / "mine_client_lengths.csv").unlink()
    with pytest.raises(bench.TraceError, match=r"no lengths file mine_client_lengths\.csv"):
        bench.requests_of(_case(bench, path, "servegen", seconds=600.0))


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        ("plain", r"mine.csv:7: input_tokens must be a whole number >= 1, got 'lots'"),
        ("azure", r"azure.csv:4: TIMESTAMP must look like"),
        ("mooncake", r"mooncake.jsonl:8: missing field 'output_length'"),
        ("servegen", r"mine_client_rates.csv:2: iat_dist must be Gamma or Weibull"),
    ],
)
def test_a_bad_file_is_an_error_naming_the_line(
    bench: ModuleType, fmt: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, fmt, good=False)
    code = bench.main(["--trace", str(path), "--format", fmt, "--out", str(tmp_path / "out"), "--quick"])
    assert code == 2
    err = capsys.readouterr().err
    assert "error:" in err
    assert len(re.findall(message, err)) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--window", "10"], "--window must be START:SECONDS"),
        (["--window", "10:0"], "--window must be START:SECONDS"),
        (["--rate-scale", "0"], "--rate-scale and --compression must be positive"),
        (["--compression", "-1"], "--rate-scale and --compression must be positive"),
        (["--planner-factors", "1.5"], "not within"),
        (["--traces", "azure-code"], "leave out --traces"),
    ],
)
def test_bad_options_are_usage_errors(
    bench: ModuleType, args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "plain")
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--trace", str(path), *args])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_the_whole_comparison_on_a_plain_trace(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Five minutes of a plain JSONL trace at ~8 requests/s through every quick policy."""
    rng = random.Random(7)
    t, lines = 0.0, []
    while t < 300:
        record = {"timestamp": round(t, 3), "input_tokens": rng.randint(200, 3000), "output_tokens": 150}
        lines.append(json.dumps(record))
        t += rng.expovariate(8.0 if t < 150 else 16.0)
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    args = ["--trace", str(path), "--format", "plain", "--quick", "--max-gpus", "16", "--out", str(out)]
    assert bench.main([*args, "--jobs", "1", "--window", "0:300"]) == 0
    text = capsys.readouterr().out
    assert f"plain trace {path}" in text
    table = (out / "table.md").read_text()
    for policy in ("static peak", "hpa", "dynamo-180s", "dynamo-180s@0.5", "dynamo-load", "tandem"):
        assert f"| mine | {policy} |" in table
    assert "| mine | dynamo-180s @ tandem's attainment |" in table
    results = {r["policy"]: r for r in json.loads((out / "results.json").read_text())}
    assert results["static peak"]["summary"]["requests"] == len(lines)
    derived = json.loads((out / "planner_at_tandem.json").read_text())["mine"]
    assert set(derived) == {"dynamo-180s", "dynamo-180s+load"}
    assert derived["dynamo-180s"]["attainment"] == results["tandem"]["summary"]["attainment"]
