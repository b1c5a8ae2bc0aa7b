"""`tandem sim` and `tandem advise` from the command line (`tandem.sim.cli`): bad input is one `error:`
line and exit code 2, never a traceback; a recommendation written by advise replays through sim."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tandem.cli import main

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
SMALL_LOAD = ["--input-tokens", "800", "--output-tokens", "100", "--rate", "4", "--seconds", "60"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _bad(argv: list[str], capsys: pytest.CaptureFixture[str], message: str) -> None:
    code, _, err = _run(argv, capsys)
    assert code == 2
    assert err.startswith("error: ")
    assert message in err
    assert "Traceback" not in err


def test_advise_unknown_model_needs_kv_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["advise", "--model", "acme/secret-13b", *SMALL_LOAD, "--ttft-ms", "1000", "--tpot-ms", "50"]
    _bad(argv, capsys, "unknown model 'acme/secret-13b': give --kv-bytes-per-token")
    code, out, _ = _run([*argv, "--kv-bytes-per-token", "163840", "--max-gpus", "8"], capsys)
    assert code == 0
    assert "163,840 KV bytes/token" in out
    assert "note: acme/secret-13b: step times of" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "no load: give --trace, or --input-tokens, --output-tokens, --rate"),
        (["--input-tokens", "800"], "no load: give --trace, or --output-tokens, --rate"),
        ([*SMALL_LOAD, "--trace", "x.csv"], "give either --trace or --input-tokens"),
        ([*SMALL_LOAD, "--gpu", "TPU"], "no profile on GPU 'TPU'"),
        ([*SMALL_LOAD, "--prefill-tp", "3"], "1, 2, 4 or 8"),
        ([*SMALL_LOAD, "--attainment", "120"], "--attainment is a percentage"),
        ([*SMALL_LOAD, "--max-gpus", "1"], "--max-gpus must be at least 2"),
        ([*SMALL_LOAD, "--bandwidth-gbps", "0"], "link bandwidth must be positive"),
        (["--input-tokens", "800", "--output-tokens", "100", "--rate", "0"], "rate and the duration"),
        ([*SMALL_LOAD, "--decode-dp", "0"], "a decode replica needs at least one data-parallel rank"),
        ([*SMALL_LOAD, "--decode-tp", "4", "--decode-dp", "4"], "TP4 x DP4 must fit one pod of 8 GPUs"),
        ([*SMALL_LOAD, "--colocated-dp", "0"], "a colocated replica needs at least one data-parallel rank"),
    ],
)
def test_advise_bad_input(extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    _bad(["advise", "--model", LLAMA_8B, "--ttft-ms", "1000", "--tpot-ms", "50", *extra], capsys, message)


def test_advise_bad_ratio_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "advise",
                "--model",
                LLAMA_8B,
                *SMALL_LOAD,
                "--ttft-ms",
                "1",
                "--tpot-ms",
                "1",
                "--ratios",
                "1:x",
            ]
        )
    assert exit_info.value.code == 2
    assert "expected ratios like 1:1,1:2,2:1" in capsys.readouterr().err


def test_advise_not_achievable_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["advise", "--model", LLAMA_8B, "--input-tokens", "8000", "--output-tokens", "50", "--rate", "1"]
    code, out, _ = _run(
        [
            *argv,
            "--seconds",
            "60",
            "--length-cv",
            "0",
            "--ttft-ms",
            "50",
            "--tpot-ms",
            "50",
            "--max-gpus",
            "4",
        ],
        capsys,
    )
    assert code == 0
    assert (
        "recommendation: not achievable: 100.0% of requests miss the 50 ms TTFT even on an idle replica"
        in out
    )
    assert "apiVersion" not in out


def test_advise_writes_a_deployment_that_sim_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deployment = tmp_path / "advised.yaml"
    argv = ["advise", "--model", LLAMA_8B, *SMALL_LOAD, "--ttft-ms", "1000", "--tpot-ms", "50"]
    code, out, _ = _run([*argv, "-o", str(deployment), "--name", "advised"], capsys)
    assert code == 0
    assert "KV transfer share" in out
    assert "transfer" in out
    assert f"PDDeployment written to {deployment}" in out
    modes = out.split("Remote or local prefill on P/D ")[1].split("\n\n")[0].splitlines()[1:]
    assert [line.split()[0] for line in modes[:-1]] == ["Always", "Auto", *["Threshold"] * 4, "Colocated"]
    assert modes[-1].startswith("  best on these ")
    obj = yaml.safe_load(deployment.read_text())
    assert obj["kind"] == "PDDeployment"
    assert obj["metadata"]["name"] == "advised"
    assert obj["spec"]["slo"] == {"ttftMs": 1000, "tpotMs": 50, "attainmentPercent": 95.0}


# --- tandem sim ---------------------------------------------------------------------------------------------


def test_sim_bad_deployment_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n0.0,100,10\n")
    _bad(["sim", "-f", str(tmp_path / "missing.yaml"), "--trace", str(trace)], capsys, "missing.yaml")
    not_pdd = tmp_path / "cm.yaml"
    not_pdd.write_text("kind: ConfigMap\nmetadata: {name: x}\n")
    _bad(["sim", "-f", str(not_pdd), "--trace", str(trace)], capsys, "no PDDeployment in the file")
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: PDDeployment\nmetadata: {name: x}\nspec: {model: {name: m}}\n")
    _bad(["sim", "-f", str(broken), "--trace", str(trace)], capsys, "spec.model.uri")
    garbage = tmp_path / "garbage.yaml"
    garbage.write_text("kind: [unclosed\n")
    _bad(["sim", "-f", str(garbage), "--trace", str(trace)], capsys, "garbage.yaml")


def test_sim_needs_an_slo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n0.0,100,10\n")
    argv = ["sim", "-f", "examples/sim-pd.yaml", "--trace", str(trace)]
    _bad(argv, capsys, "no SLO: set spec.slo in the deployment or give --ttft-ms and --tpot-ms")


def _plain_trace(path: Path, rate: float = 4.0, seconds: float = 120.0) -> Path:
    lines = ["timestamp,input_tokens,output_tokens"]
    n = int(rate * seconds)
    lines += [f"{i / rate:.3f},{600 + (i * 37) % 900},{60 + (i * 13) % 120}" for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "the trace has no requests"),
        ("timestamp,input_tokens,output_tokens\n", "the trace has no requests"),
        ("timestamp,input_tokens\n0,10\n", "missing output_tokens"),
        ("timestamp,input_tokens,output_tokens\n0,ten,5\n", "input_tokens must be a whole number"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 3}\n', "missing field 'hash_ids'"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,5\n", "TIMESTAMP must look like"),
    ],
)
def test_bad_traces_are_one_error_line(
    content: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text(content)
    argv = ["advise", "--model", LLAMA_8B, "--trace", str(trace), "--ttft-ms", "1000", "--tpot-ms", "50"]
    _bad(argv, capsys, message)
    deployment = tmp_path / "d.yaml"
    deployment.write_text(Path("examples/sim-pd.yaml").read_text())
    _bad(
        ["sim", "-f", str(deployment), "--trace", str(trace), "--ttft-ms", "1000", "--tpot-ms", "50"],
        capsys,
        message,
    )


def test_trace_window_and_scale_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _plain_trace(tmp_path / "t.csv")
    base = ["advise", "--model", LLAMA_8B, "--trace", str(trace), "--ttft-ms", "1000", "--tpot-ms", "50"]
    _bad([*base, "--start", "500"], capsys, "no request in the window")
    _bad([*base, "--rate-scale", "0"], capsys, "--rate-scale must be positive")
    _bad([*base, "--format", "parquet"], capsys, "--format must be one of azure, mooncake, plain")
    _bad([*base, "--trace", str(tmp_path / "nope.csv")], capsys, "cannot read")


def test_advise_on_a_trace_then_sim_replays_its_deployment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _plain_trace(tmp_path / "t.csv", rate=6.0)
    deployment = tmp_path / "advised.yaml"
    argv = ["advise", "--model", LLAMA_8B, "--trace", str(trace), "--ttft-ms", "800", "--tpot-ms", "25"]
    code, out, _ = _run([*argv, "-o", str(deployment), "--max-gpus", "8"], capsys)
    assert code == 0
    assert "recommendation: " in out
    code, out, err = _run(
        ["sim", "-f", str(deployment), "--trace", str(trace), "--out", str(tmp_path)], capsys
    )
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("| t.csv | static |"))
    attainment = float(row.split("|")[3].strip().rstrip("%"))
    assert attainment >= 95.0
    assert "seed 0" in out
    assert list(tmp_path.glob("advised-t-static.png"))


def test_advise_with_data_parallel_replicas_then_sim_replays_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Replicas of 2 data-parallel ranks: advise shows the shape, counts 2 GPUs a replica and writes
    `parallelism.data`; sim shows the shape and holds the GPUs advise counted."""
    trace = _plain_trace(tmp_path / "t.csv", rate=6.0)
    deployment = tmp_path / "advised.yaml"
    argv = ["advise", "--model", LLAMA_8B, "--trace", str(trace), "--ttft-ms", "800", "--tpot-ms", "25"]
    dp = ["--prefill-dp", "2", "--decode-dp", "2"]
    code, out, err = _run([*argv, *dp, "-o", str(deployment), "--max-gpus", "8"], capsys)
    assert code == 0, err
    assert (
        "a replica: prefill 1x2 TP1 DP2 Internal (2 GPUs), decode 1x2 TP1 DP2 Internal (2 GPUs), "
        "colocated 1x2 TP1 DP2 Internal (2 GPUs)" in out
    )
    verdict = next(line for line in out.splitlines() if line.startswith("recommendation: "))
    layout, gpus = verdict.split()[2], int(verdict.split("(")[1].split()[0])
    replicas = sum(int(part[:-1]) for part in layout.split("+"))
    assert gpus == 2 * replicas
    spec = yaml.safe_load(deployment.read_text())["spec"]
    pools = [role for role in ("prefill", "decode", "colocated") if role in spec]
    assert all(spec[role]["parallelism"] == {"data": 2} for role in pools)
    code, out, err = _run(
        ["sim", "-f", str(deployment), "--trace", str(trace), "--out", str(tmp_path)], capsys
    )
    assert code == 0, err
    for role in pools:
        count = f"{spec[role]['replicas']} replica" + ("" if spec[role]["replicas"] == 1 else "s")
        assert f"{role}: {count} of 1x2 TP1 DP2 Internal (2 engines at TP1, 2 GPUs each)" in out
    assert f"(mean {gpus:.2f} GPUs, peak {gpus})" in out


def test_sim_runs_each_policy_on_an_autoscaled_deployment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _plain_trace(tmp_path / "t.csv", rate=8.0, seconds=300.0)
    deployment = tmp_path / "auto.yaml"
    deployment.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "tandem.dev/v1alpha1",
                "kind": "PDDeployment",
                "metadata": {"name": "auto"},
                "spec": {
                    "model": {"name": "llama", "uri": f"hf://{LLAMA_8B}"},
                    "engine": {"image": "vllm/vllm-openai:v0.33.0"},
                    "slo": {"ttftMs": 1000, "tpotMs": 30},
                    "maxGPUs": 8,
                    "autoscaling": {"enabled": True},
                    "prefill": {"replicas": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}},
                    "decode": {"replicas": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}},
                },
            }
        )
    )
    for policy, label in (("auto", "tandem"), ("hpa", "hpa"), ("dynamo-60s-trend", "dynamo-60s-trend")):
        code, out, err = _run(
            [
                "sim",
                "-f",
                str(deployment),
                "--trace",
                str(trace),
                "--policy",
                policy,
                "--out",
                str(tmp_path),
                "--no-progress",
            ],
            capsys,
        )
        assert code == 0, err
        assert f"| t.csv | {label} |" in out
    _bad(["sim", "-f", str(deployment), "--trace", str(trace), "--policy", "magic"], capsys, "unknown policy")
    # The Dynamo-style planner sizes replicas of one engine; the HPA counts a group's GPUs.
    obj = yaml.safe_load(deployment.read_text())
    obj["spec"]["decode"]["parallelism"] = {"data": 2}
    deployment.write_text(yaml.safe_dump(obj))
    argv = ["sim", "-f", str(deployment), "--trace", str(trace), "--out", str(tmp_path), "--no-progress"]
    _bad([*argv, "--policy", "dynamo-60s"], capsys, "the Dynamo-style planner sizes one engine per replica")
    code, out, err = _run([*argv, "--policy", "hpa"], capsys)
    assert code == 0, err
    assert "decode: 1 replica of 1x2 TP1 DP2 Internal (2 engines at TP1, 2 GPUs each)" in out


@pytest.mark.parametrize("value", ["1024", "8192:1024", "0:10", "a:b"])
def test_advise_reasoning_outputs_need_a_range(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _plain_trace(tmp_path / "t.csv")
    argv = ["advise", "--model", LLAMA_8B, "--trace", str(trace), "--ttft-ms", "1000", "--tpot-ms", "50"]
    _bad([*argv, "--reasoning-outputs", value], capsys, "--reasoning-outputs must be LOW:HIGH")


def test_advise_reasoning_outputs_need_a_trace(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["advise", "--model", LLAMA_8B, *SMALL_LOAD, "--ttft-ms", "1000", "--tpot-ms", "50"]
    _bad([*argv, "--reasoning-outputs", "1024:8192"], capsys, "give --trace")


def test_advise_on_decode_heavy_traffic_says_whether_colocated_beats_pd(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _plain_trace(tmp_path / "t.csv", rate=1.0, seconds=120.0)
    argv = ["advise", "--model", LLAMA_8B, "--trace", str(trace), "--ttft-ms", "1000", "--tpot-ms", "30"]
    code, out, err = _run([*argv, "--reasoning-outputs", "1024:8192", "--max-gpus", "8"], capsys)
    assert code == 0, err
    assert "outputs log-uniform in 1024-8192 tokens (seed 0)" in out
    lines = out.splitlines()
    pd = next(line for line in lines if line.startswith("  P/D "))
    colocated = next(line for line in lines if line.startswith("  colocated "))
    gpus = {name: int(line.split("GPUs")[0].split()[-1]) for name, line in (("pd", pd), ("co", colocated))}
    verdict = next(line for line in lines if line.startswith("recommendation: "))
    if gpus["co"] <= gpus["pd"]:
        assert verdict.startswith("recommendation: colocated")
        assert "P/D does not pay here" in verdict
    else:
        assert verdict.startswith("recommendation: P/D")
        assert f"colocated needs {gpus['co']}" in verdict
