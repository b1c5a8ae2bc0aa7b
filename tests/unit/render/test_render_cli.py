"""`tandem render`: YAML stream out, replica overrides, clear errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tandem.render import cli

ROOT = Path(__file__).resolve().parents[3]


def test_prints_every_object_as_a_yaml_stream(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-f", str(ROOT / "examples" / "sim-pd.yaml")]) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    assert ("StatefulSet", "sim-pd-decode") in {(o["kind"], o["metadata"]["name"]) for o in objects}


def test_replicas_override_the_spec(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "-f",
        str(ROOT / "examples" / "sim-pd.yaml"),
        "--replicas",
        "decode=5",
        "--replicas",
        "colocated=1",
    ]
    assert cli.main(args) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    replicas = {o["metadata"]["name"]: o["spec"]["replicas"] for o in objects if o["kind"] == "StatefulSet"}
    assert replicas == {"sim-pd-prefill": 1, "sim-pd-decode": 5, "sim-pd-colocated": 1}


def test_bad_replicas_argument_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["-f", "x.yaml", "--replicas", "router=2"])
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("spec_patch", "want_error"),
    [
        pytest.param(
            {"prefill": {"tensorParallelSize": 3}},
            "spec.prefill.tensorParallelSize must be a power of two",
            id="cross-field rule",
        ),
        pytest.param(
            {"decode": {"replicas": "many"}},
            "spec.decode.replicas: Input should be a valid integer",
            id="type",
        ),
        pytest.param(
            {"engine": {"imagee": "x"}},
            "spec.engine.imagee: Extra inputs are not permitted",
            id="unknown field",
        ),
        pytest.param(
            {"model": {"maxModelLen": 1}}, "spec.model.maxModelLen: Input should be greater than", id="range"
        ),
    ],
)
def test_invalid_file_names_the_field_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec_patch: dict[str, object], want_error: str
) -> None:
    document = yaml.safe_load((ROOT / "examples" / "sim-pd.yaml").read_text())
    for section, fields in spec_patch.items():
        document["spec"].setdefault(section, {}).update(fields)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(document))
    assert cli.main(["-f", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert want_error in captured.err


def test_unreadable_or_empty_files_are_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-f", str(tmp_path / "missing.yaml")]) == 1
    (tmp_path / "empty.yaml").write_text("")
    assert cli.main(["-f", str(tmp_path / "empty.yaml")]) == 1
    (tmp_path / "broken.yaml").write_text("spec: [")
    assert cli.main(["-f", str(tmp_path / "broken.yaml")]) == 1
    assert capsys.readouterr().err.count("error:") == 3
