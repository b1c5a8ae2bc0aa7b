"""The P/D router: the data plane that runs each request through prefill then decode, or colocated.

The per-request policy it shares with the cluster simulator (which path, which pod, prefix
affinity, admission, tenants, histogram buckets) is the pure package `tandem.routing`. Pure parts
here: `sse` (stream events), `protocol` (leg bodies, request checks), `failure` (what a failed leg
leads to, retry budget), `discovery` (pod events -> endpoints), `revisions` (which serving revision),
`slo` (within the SLO or not), `errors` (OpenAI error bodies). Shell parts: `http1` and
`upstream` (HTTP to engines), `front` (the HTTP/1.1 server), `relay` (a streamed answer passed on
inside socket callbacks), `state` (the live view), `metrics`, `flow` (one request's legs),
`server` (the endpoints), `main` (flags and wiring). Pod and PDDeployment watching lives in
`tandem.kube.pods`.
"""
