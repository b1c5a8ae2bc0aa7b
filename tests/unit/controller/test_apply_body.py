"""The operator's server-side apply body: what the apiserver's YAML reader takes, for any string a spec
can carry (found by the hostile-spec test: an emoji in spec.router.image made every apply fail)."""

from __future__ import annotations

import json

import pytest
import yaml

from tandem.kube.rest import apply_body

STRINGS = [
    "plain",
    "~y\x8d\u00afiD\U0001f3fb",  # a C1 control character and an emoji (beyond the BMP)
    "tab\there\nnewline",
    "\x7f\x00\x1b",
    "\u2028\ufeff\ufffe",
    "Ω-ünïcode $(POD_IP) 'quotes' \"double\" \\backslash",
]


@pytest.mark.parametrize("value", STRINGS)
def test_the_body_reads_back_as_json_and_as_yaml(value: str) -> None:
    obj = {"metadata": {"name": "x"}, "spec": {"image": value, "args": [value]}}
    body = apply_body(obj)
    assert json.loads(body) == obj
    assert yaml.safe_load(body.decode()) == obj  # YAML 1.1 reader, stricter than the apiserver's here


def test_no_surrogate_escape_and_no_control_character_is_sent() -> None:
    text = apply_body({"v": "\U0001f3fb\x8d"}).decode()
    assert "\\ud83c" not in text  # json.dumps' ASCII form of the emoji: a surrogate pair YAML refuses
    assert "\U0001f3fb" in text
    assert "\x8d" not in text
    assert "\\u008d" in text
