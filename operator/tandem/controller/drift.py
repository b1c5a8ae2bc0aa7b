"""Decides whether a child object needs applying: is the desired state already in the observed one?

Pure. Server-side apply of an unchanged object is still a write request, so the operator applies
only when some field it sets differs from the live object. The live object carries defaults and
fields of other managers, so the check is "desired is a subset of observed", with Kubernetes'
normalisations forgiven: empty values the apiserver drops, integers that come back as strings,
and resource quantities written in another unit.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    suffix: Decimal(10) ** exponent
    for suffix, exponent in {
        "n": -9,
        "u": -6,
        "m": -3,
        "": 0,
        "k": 3,
        "M": 6,
        "G": 9,
        "T": 12,
        "P": 15,
        "E": 18,
    }.items()
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes resource quantity as a number, or None if it is not one."""
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        return None
    number, exponent, suffix = match.groups()
    try:
        base = Decimal(number + (exponent or ""))
    except InvalidOperation:
        return None
    suffix = suffix or ""
    return base * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix])


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == [] or value is False or value == ""


def _scalar_equal(desired: Any, observed: Any) -> bool:
    if desired == observed:
        return True
    if isinstance(desired, bool) or isinstance(observed, bool):
        return False
    if str(desired) == str(observed):
        return True
    left, right = parse_quantity(desired), parse_quantity(observed)
    return left is not None and left == right


def is_subset(desired: Any, observed: Any) -> bool:
    """True when every field set in `desired` has the same value in `observed`."""
    if isinstance(desired, dict):
        if not isinstance(observed, dict):
            return _empty(desired) and observed is None
        for key, value in desired.items():
            if key not in observed or observed[key] is None:
                if not _empty(value):
                    return False
            elif not is_subset(value, observed[key]):
                return False
        return True
    if isinstance(desired, list):
        if not isinstance(observed, list):
            return _empty(desired) and observed is None
        return len(desired) == len(observed) and all(
            is_subset(d, o) for d, o in zip(desired, observed, strict=True)
        )
    return _scalar_equal(desired, observed)
