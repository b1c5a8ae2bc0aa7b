"""Trace readers on the repository's copies and on malformed input; reshaping; ServeGen's generator."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from tandem.sim import Request
from tandem.sim.traces import (
    ServeGenData,
    TraceError,
    aggregate_rate,
    generate,
    load,
    read_azure,
    read_mooncake,
    read_plain,
    repeat,
    scale_rate,
    scale_time,
    spread_ticks,
    window,
)
from tandem.sim.traces.servegen import LengthDistribution

TRACES = Path(__file__).resolve().parents[3] / "traces"
SERVEGEN_RATES = TRACES / "servegen-alibaba" / "language_m-mid_client_rates.csv.gz"
SERVEGEN_LENGTHS = TRACES / "servegen-alibaba" / "language_m-mid_client_lengths.csv.gz"


# --- the repository's copies --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "rows", "span", "mean_input"),
    [
        ("AzureLLMInferenceTrace_code.csv", 8819, 3436, 2048),
        ("AzureLLMInferenceTrace_conv.csv", 19366, 3502, 1155),
    ],
)
def test_azure_traces_match_their_readme(name: str, rows: int, span: float, mean_input: float) -> None:
    requests = read_azure(TRACES / "azure-llm-2023" / name)
    assert len(requests) == rows
    assert requests[0].arrival == 0.0
    assert requests[-1].arrival == pytest.approx(span, abs=1)
    assert sum(r.prompt_tokens for r in requests) / rows == pytest.approx(mean_input, abs=1)
    assert all(a.arrival <= b.arrival for a, b in itertools.pairwise(requests))


def test_azure_first_row_to_the_100_ns() -> None:
    requests = read_azure(TRACES / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv")
    # 18:15:46.6805900 -> 18:15:50.9951690, 374 -> 44 and 396 -> 109 tokens
    assert requests[0] == Request(0.0, 374, 44)
    assert requests[1].arrival == pytest.approx(4.314579, abs=1e-9)
    assert requests[1][1:] == (396, 109, None, None, None)


def test_mooncake_keeps_hash_ids_and_reads_ms() -> None:
    requests = read_mooncake(TRACES / "mooncake-fast25" / "conversation_trace.jsonl.gz")
    assert len(requests) == 12031
    assert requests[0] == Request(0.0, 6758, 500, None, tuple(range(14)))
    assert requests[-1].arrival == pytest.approx(3537, abs=1)
    assert all(
        r.hash_ids is not None and len(r.hash_ids) == math.ceil(r.prompt_tokens / 512) for r in requests
    )


def test_the_copies_are_byte_identical_to_the_shared_traces() -> None:
    shared = Path("/work/shared/traces")
    if not shared.is_dir():
        pytest.skip("the shared trace folder is not on this machine")
    for path in sorted(TRACES.glob("*/*")):
        original = shared / path.parent.name / path.name
        assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(original.read_bytes()).digest(), (
            path
        )


# --- malformed input ------------------------------------------------------------------------------------
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_ROW = "2023-11-16 18:17:03.9799600,4808,10\n"
AT = "2023-11-16 18:17:03.9799600"
PLAIN = "timestamp,input_tokens,output_tokens\n"


def mooncake(**fields: object) -> str:
    record = {"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}
    record.update(fields)
    return json.dumps({k: v for k, v in record.items() if v is not None}) + "\n"


@pytest.mark.parametrize(
    ("reader", "text", "message"),
    [
        (read_azure, "", "no requests"),
        (read_azure, AZURE_HEADER, "no requests"),
        (read_azure, "time,in,out\n" + AZURE_ROW, ":1: expected the header"),
        (read_azure, AZURE_HEADER + AZURE_ROW + "2023-11-16 18:17:04,12\n", ":3: expected 3 comma-separated"),
        (read_azure, AZURE_HEADER + "yesterday,1,2\n", ":2: TIMESTAMP must look like"),
        (read_azure, AZURE_HEADER + f"{AT},-4,10\n", ":2: ContextTokens must be a whole"),
        (read_azure, AZURE_HEADER + f"{AT},4,0\n", ":2: GeneratedTokens must be"),
        (read_azure, AZURE_HEADER + f"{AT},4.5,3\n", ":2: ContextTokens must be"),
        (read_mooncake, "", "no requests"),
        (read_mooncake, "\n\n", "no requests"),
        (read_mooncake, mooncake() + "{oops\n", ":2: not valid JSON"),
        (read_mooncake, "[1, 2]\n", ":1: expected a JSON object"),
        (read_mooncake, mooncake(output_length=None), ":1: missing field 'output_length'"),
        (read_mooncake, mooncake(hash_ids="x"), "hash_ids must be"),
        (read_mooncake, mooncake(timestamp=-3), ":1: timestamp must"),
        (read_mooncake, mooncake(input_length=True), "input_length must"),
        (read_plain, "", "no requests"),
        (read_plain, "timestamp,input_tokens\n1,2\n", ":1: the CSV header must name"),
        (read_plain, PLAIN + "1,2\n", ":2: expected 3 fields"),
        (read_plain, PLAIN + "soon,2,3\n", ":2: timestamp must be a number"),
        (read_plain, PLAIN + "nan,2,3\n", ":2: timestamp must be a finite"),
        (read_plain, '{"timestamp": 1, "input_tokens": 2}\n', ":1: missing field 'output_tokens'"),
        (
            read_plain,
            '{"timestamp": 1, "input_tokens": 2, "output_tokens": 3, "tenant": [1]}\n',
            ":1: tenant must",
        ),
    ],
)
def test_malformed_lines_name_the_file_and_line(
    reader: Callable[[Path], object], text: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "trace.txt"
    path.write_text(text)
    with pytest.raises(TraceError, match=message) as caught:
        reader(path)
    assert str(path) in str(caught.value)


def test_a_missing_file_and_a_broken_gzip_are_trace_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        read_plain(tmp_path / "absent.csv")
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(b'{"timestamp": 0}\n')[:-12])
    with pytest.raises(TraceError, match="cannot read"):
        read_mooncake(broken)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"timestamp,input_tokens,output_tokens\n\xff\xfe,1,1\n")
    with pytest.raises(TraceError, match="not UTF-8"):
        read_plain(binary)


def test_plain_csv_jsonl_and_gzip_read_alike(tmp_path: Path) -> None:
    csv_text = "timestamp,input_tokens,output_tokens,tenant\n10.5,100,20,a\n10.0,50,5,\n"
    jsonl_text = '{"timestamp": 10.5, "input_tokens": 100, "output_tokens": 20, "tenant": "a"}\n\n'
    jsonl_text += '{"timestamp": 10.0, "input_tokens": 50, "output_tokens": 5}\n'
    (tmp_path / "t.csv").write_text(csv_text)
    (tmp_path / "t.jsonl").write_text(jsonl_text)
    (tmp_path / "t.jsonl.gz").write_bytes(gzip.compress(jsonl_text.encode()))
    expected = [Request(0.0, 50, 5), Request(0.5, 100, 20, "a")]  # sorted and re-based to the first
    for name in ("t.csv", "t.jsonl", "t.jsonl.gz"):
        assert read_plain(tmp_path / name) == expected


# --- reshaping ------------------------------------------------------------------------------------------
REQUESTS = [Request(0.0, 10, 1), Request(1.0, 20, 2), Request(3.0, 30, 3), Request(7.0, 40, 4)]


def test_rate_scaling_compresses_time_and_keeps_tokens() -> None:
    faster = scale_rate(REQUESTS, 4.0)
    assert [r.arrival for r in faster] == [0.0, 0.25, 0.75, 1.75]
    assert [(r.prompt_tokens, r.output_tokens) for r in faster] == [(10, 1), (20, 2), (30, 3), (40, 4)]
    assert scale_time(REQUESTS, 2.0)[-1].arrival == 14.0
    with pytest.raises(ValueError, match="positive"):
        scale_rate(REQUESTS, 0)


def test_a_window_is_half_open_and_rebased() -> None:
    assert window(REQUESTS, 1.0, 6.0) == [Request(0.0, 20, 2), Request(2.0, 30, 3)]


def test_repeat_keeps_the_rate() -> None:
    twice = repeat(REQUESTS, 2)
    assert len(twice) == 8
    gap = 7.0 / 3
    assert twice[4].arrival == pytest.approx(7.0 + gap)
    assert twice[-1].arrival == pytest.approx(14.0 + gap)


def test_spread_ticks_stays_in_the_tick_and_is_seeded() -> None:
    ticks = [Request(0.0, 1, 1), Request(0.0, 2, 1), Request(3.0, 3, 1), Request(3.0, 4, 1)]
    spread = spread_ticks(ticks, 3.0, seed=5)
    assert spread == spread_ticks(ticks, 3.0, seed=5)
    assert spread != spread_ticks(ticks, 3.0, seed=6)
    for r in spread:
        tick = 0.0 if r.prompt_tokens <= 2 else 3.0
        assert tick <= r.arrival < tick + 3.0


# --- ServeGen -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def servegen() -> ServeGenData:
    return load(SERVEGEN_RATES, SERVEGEN_LENGTHS)


def test_servegen_is_deterministic_with_a_seed(servegen: ServeGenData) -> None:
    first = generate(servegen, start=3 * 3600, duration=600, rate_scale=0.01, seed=7)
    again = generate(servegen, start=3 * 3600, duration=600, rate_scale=0.01, seed=7)
    other = generate(servegen, start=3 * 3600, duration=600, rate_scale=0.01, seed=8)
    assert first == again
    assert first != other
    assert all(0 <= r.arrival < 600 for r in first)
    assert all(r.tenant is not None and r.tenant.startswith("client-") for r in first)


@pytest.mark.parametrize("start", [0.0, 16 * 3600.0, 3 * 86400 + 3 * 3600.0])
def test_servegen_mean_rate_follows_the_curve(servegen: ServeGenData, start: float) -> None:
    scale = 0.005
    requests = generate(servegen, start=start, duration=3600, rate_scale=scale, seed=1)
    expected = sum(aggregate_rate(servegen, start + 600 * k) for k in range(6)) / 6 * scale
    assert len(requests) / 3600 == pytest.approx(expected, rel=0.08)


@pytest.mark.parametrize(
    ("stats", "mean"),
    [
        ((371.989, 375, 445, 518), 371.989),  # a regular row: the mean is met through hi
        ((150.0, 60, 200, 900), 150.0),  # a long tail: hi far above p99
        ((70.0, 80, 90, 100), 70.0),  # a mean below the median: met through lo
    ],
)
def test_length_distribution_meets_the_published_stats(stats: tuple[float, ...], mean: float) -> None:
    dist = LengthDistribution.from_stats(*stats)
    assert dist.mean == pytest.approx(mean, rel=1e-9)
    _, p50, p90, p99 = stats
    assert [dist.sample(q) for q in (0.5, 0.9, 0.99)] == [round(p50), round(p90), round(p99)]


def test_servegen_malformed_rows_are_errors(tmp_path: Path) -> None:
    rates = tmp_path / "rates.csv"
    header = "client_id,window_start_s,rate_rps,iat_cv,iat_dist,dist_param1,dist_param2\n"
    rates.write_text(header + "2,0,1.0,1.0,Lognormal,1,1\n")
    with pytest.raises(TraceError, match=r"rates.csv:2: iat_dist must be Gamma or Weibull"):
        load(rates, SERVEGEN_LENGTHS)
    rates.write_text(header)
    with pytest.raises(TraceError, match="no rows"):
        load(rates, SERVEGEN_LENGTHS)
