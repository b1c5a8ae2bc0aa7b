"""The P/D router: the data plane that runs each request through prefill then decode, or colocated.

Pure parts: `balancer` (which pod), `sse` (stream events), `protocol` (leg bodies, request checks),
`failure` (what a failed leg leads to, retry budget), `discovery` (pod events -> endpoints),
`paths` (disaggregated or colocated), `errors` (OpenAI error bodies). Shell parts: `http1` and
`upstream` (HTTP to engines), `front` (the HTTP/1.1 server), `relay` (a streamed answer passed on
inside socket callbacks), `state` (the live view), `metrics`, `flow` (one request's legs),
`server` (the endpoints), `main` (flags and wiring). Pod and PDDeployment watching lives in
`tandem.kube.pods`.
"""
