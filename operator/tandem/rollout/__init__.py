"""Gray rollout, the pure core: `judge(window, analysis) -> Verdict` and
`step(state, verdict, command, now, config, observed) -> Transition` (no I/O, no clock).

The operator wiring, the `spec.rollout` / `status.rollout` API and the routers' traffic split are
not built yet (issue 12); docs/rollout.md, "The state machine", describes what is here.
"""
