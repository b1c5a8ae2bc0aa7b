"""Gray rollout, the pure core: `judge(window, analysis) -> Verdict` and
`step(state, verdict, command, now, config, observed) -> Transition` (no I/O, no clock).

`arms` sizes the colocated and P/D arms for their share of the traffic. The operator runs them from
`tandem.controller.rollout` with `spec.rollout` / `status.rollout`; docs/rollout.md describes both.
"""
