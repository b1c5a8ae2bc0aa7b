"""`make demo`: the local cluster, the Helm chart, a sim P/D model and a real trace, live.

- `trace`: reading a window of a request trace and scaling its arrival rate (pure).
- `stats`: latency samples, percentiles and SLO attainment (pure).
- `load`: replaying the trace through the router over HTTP, measuring TTFT and TPOT per request.
- `view`: the live terminal panel and the final report, as text (pure).
- `main`: the script: cluster, helm, apply, replay, watch, report, stop (`__main__` dispatches).
- `gray` and `rollout`: the second scenario (`--scenario rollout`), a gray rollout colocated -> P/D
  and an automatic rollback: its manifest, path attribution, panel and report (pure), and the script.
- `e2e`: what the e2e tests and benches that drive this load through a deployed stack share.
"""
