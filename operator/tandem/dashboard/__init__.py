"""The Grafana dashboard shipped with the chart: its definition, its schema, and a PNG renderer.

`panels` defines the dashboard in Python and writes `charts/tandem/dashboards/tandem.json`
(`tandem dashboard json`); `model` is a pydantic model of the parts of Grafana's dashboard JSON
it uses (the schema test); `render` draws every panel's queries from a Prometheus into PNGs for
the docs (`tandem dashboard render`). docs/observability.md describes the panels.
"""
