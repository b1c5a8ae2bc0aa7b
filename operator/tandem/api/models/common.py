"""Shared pieces of the PDDeployment models: the base model (camelCase aliases, unknown fields
refused), quantities, label and object-name patterns.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from tandem.api import rules

# A non-negative Kubernetes resource quantity ("500m", "1Gi", "2", 4): what a pod's resources take.
QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
Quantity = Annotated[
    Annotated[int, Field(ge=0)] | Annotated[str, Field(max_length=64, pattern=QUANTITY_PATTERN)],
    Field(
        json_schema_extra={
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
            "maxLength": 64,
            "minimum": 0,
        }
    ),
]


# A label key (an optional DNS subdomain prefix and '/', then a name of at most 63 characters) and a
# label value, as Kubernetes validates them on the pods tandem renders.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# An image reference has no whitespace (a pod's image may not begin or end with any); empty is left
# to the rule that names it ("must not be empty").
IMAGE_PATTERN = r"^\S*$"


LABEL_MAP_MESSAGE = (
    "keys must be label keys: an optional DNS subdomain prefix and '/', then a name of at most 63 "
    "letters, digits, '-', '_' or '.', beginning and ending alphanumeric"
)


def _check_label_keys(labels: dict[str, str]) -> dict[str, str]:
    if bad := [key for key in labels if re.match(LABEL_KEY_PATTERN, key) is None]:
        raise ValueError(f"{LABEL_MAP_MESSAGE}: {', '.join(repr(k) for k in bad)}")
    return labels


LABEL_MAP_CEL = f"self.all(k, k.matches({rules._cel_string(LABEL_KEY_PATTERN)}))"
# Node selectors and label selectors: Kubernetes validates them on the objects tandem renders, so
# they are checked at admission (a stored spec always renders objects the apiserver takes): values by
# the schema, keys by CEL (a structural schema cannot constrain map keys).
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
Labels = Annotated[
    dict[str, LabelValue],
    Field(
        max_length=16,
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": LABEL_MAP_CEL, "message": LABEL_MAP_MESSAGE, "reason": "FieldValueInvalid"}
            ]
        },
    ),
    AfterValidator(_check_label_keys),
]


class ApiModel(BaseModel):
    """Base for every API model: camelCase aliases, unknown fields refused, values validated."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )


# An object's name (a DNS subdomain) and a key of a Secret's or ConfigMap's data, as Kubernetes
# checks them where the pods refer to them.
OBJECT_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DATA_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
ObjectName = Annotated[str, Field(min_length=1, max_length=253, pattern=OBJECT_NAME_PATTERN)]
DataKey = Annotated[str, Field(min_length=1, max_length=253, pattern=DATA_KEY_PATTERN)]


def _unique(names: list[str]) -> list[str]:
    if len(set(names)) != len(names):
        raise ValueError("must not repeat a name")
    return names


LengthBounds = Annotated[list[Annotated[int, Field(ge=1, le=10_000_000)]], Field(min_length=1, max_length=16)]
