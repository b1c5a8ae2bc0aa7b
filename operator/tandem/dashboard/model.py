"""A pydantic model of the parts of Grafana's dashboard JSON (schemaVersion 39) the dashboard uses.

Strict where it matters to Grafana (panel types, grid positions inside the 24-column grid, unique
panel ids and target refIds, every `$variable` a query uses defined in `templating`), open where
Grafana adds its own keys (`extra="allow"` on objects Grafana fills in when it saves).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

GRID_COLUMNS = 24
BUILTIN_VARIABLES = frozenset({"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"})
_VARIABLE = re.compile(r"\$\{?(\w+)")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class DataSourceRef(_Open):
    type: Literal["prometheus"] = "prometheus"
    uid: Annotated[str, Field(min_length=1)]


class Target(_Open):
    ref_id: Annotated[str, Field(alias="refId", pattern=r"^[A-Z]$")]
    expr: Annotated[str, Field(min_length=1)]
    legend_format: Annotated[str, Field(alias="legendFormat")] = ""
    datasource: DataSourceRef


class GridPos(_Open):
    h: Annotated[int, Field(ge=1, le=64)]
    w: Annotated[int, Field(ge=1, le=GRID_COLUMNS)]
    x: Annotated[int, Field(ge=0, lt=GRID_COLUMNS)]
    y: Annotated[int, Field(ge=0)]

    @model_validator(mode="after")
    def _inside(self) -> GridPos:
        if self.x + self.w > GRID_COLUMNS:
            raise ValueError(f"panel at x={self.x} of width {self.w} leaves the {GRID_COLUMNS}-column grid")
        return self


class Defaults(_Open):
    unit: str = "short"


class FieldConfig(_Open):
    defaults: Defaults = Defaults()


class Panel(_Open):
    id: Annotated[int, Field(ge=1)]
    type: Literal["timeseries", "row", "stat"]
    title: Annotated[str, Field(min_length=1)]
    grid_pos: Annotated[GridPos, Field(alias="gridPos")]
    description: str = ""
    datasource: DataSourceRef | None = None
    targets: list[Target] = []
    field_config: Annotated[FieldConfig, Field(alias="fieldConfig")] = FieldConfig()

    @model_validator(mode="after")
    def _targets(self) -> Panel:
        if self.type == "row":
            if self.targets:
                raise ValueError(f"row {self.title!r} has queries")
            return self
        if not self.targets:
            raise ValueError(f"panel {self.title!r} has no query")
        refs = [t.ref_id for t in self.targets]
        if len(set(refs)) != len(refs):
            raise ValueError(f"panel {self.title!r} repeats a refId: {refs}")
        return self


class VariableOption(_Open):
    text: str | list[str]
    value: str | list[str]


class Variable(_Open):
    name: Annotated[str, Field(pattern=r"^\w+$")]
    type: Literal["datasource", "query", "custom", "interval", "constant"]
    label: str = ""
    query: Any = None
    datasource: DataSourceRef | None = None
    multi: bool = False
    include_all: Annotated[bool, Field(alias="includeAll")] = False
    current: VariableOption | dict[str, Any] = {}


class Templating(_Open):
    list: list[Variable]


class TimeRange(_Open):
    from_: Annotated[str, Field(alias="from")]
    to: str


class Dashboard(_Open):
    uid: Annotated[str, Field(pattern=r"^[-\w]{1,40}$")]
    title: Annotated[str, Field(min_length=1)]
    schema_version: Annotated[int, Field(alias="schemaVersion", ge=36)]
    tags: list[str] = []
    time: TimeRange
    refresh: str = ""
    templating: Templating
    panels: list[Panel]

    @model_validator(mode="after")
    def _consistent(self) -> Dashboard:
        ids = [p.id for p in self.panels]
        if len(set(ids)) != len(ids):
            raise ValueError(f"panel ids repeat: {ids}")
        defined = {v.name for v in self.templating.list} | BUILTIN_VARIABLES
        for panel in self.panels:
            for target in panel.targets:
                for name in _VARIABLE.findall(target.expr):
                    if name not in defined:
                        raise ValueError(f"panel {panel.title!r} uses ${name}, which is not defined")
        return self

    def query_panels(self) -> list[Panel]:
        return [p for p in self.panels if p.type != "row"]


def variables_in(expr: str) -> set[str]:
    return set(_VARIABLE.findall(expr))


def substitute(expr: str, values: dict[str, str]) -> str:
    """`expr` with `$name` and `${name}` replaced (longest names first, so `$__range_s` is not `$__range`)."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr


def panel_queries(dashboard: Dashboard, values: dict[str, str]) -> dict[str, str]:
    """Every panel query with the variables substituted, by `<panel title> [<refId>]`."""
    return {
        f"{panel.title} [{target.ref_id}]": substitute(target.expr, values)
        for panel in dashboard.query_panels()
        for target in panel.targets
    }
