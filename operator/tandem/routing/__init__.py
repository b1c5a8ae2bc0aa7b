"""Routing policy: the pure decisions the router (`tandem.router`) and the cluster simulator
(`tandem.sim`) share, so that what the simulator predicts is what the router does.

- `paths`: disaggregated or colocated for one request (`choose_path`, the gray weight's draw);
- `prefix`: the prefix index and bounded-load prefix affinity (`choose_prefill`, `PrefixIndex`);
- `disaggregation`: remote prefill or prefill on the decode pod, per request (`decide`, `CostModel`,
  `DecodeIndex`);
- `balancer`: which pod of a pool, by load (power of two choices, round robin);
- `admission`: token buckets per tenant, long-prompt and decode-backpressure refusals;
- `tenants`: who sent a request (the keys Secret's format, also checked by the operator);
- `buckets`: histogram bounds shared by the router's metrics, the sim engine and the simulator.

Pure: no I/O, no clock (time is an argument), no asyncio. Above `api` and `perf` only; the router,
the simulator, the operator and the tools import it, never the other way round.
"""
