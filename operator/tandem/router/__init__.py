"""The P/D router: the data plane that runs each request through prefill then decode, or colocated.

Pure parts: `balancer` (pod choice), `sse` (stream parsing), `protocol` (leg bodies), `failure`
(what to do when a leg fails), `discovery` (pod events -> endpoint view), `paths` (which path a
request takes). Shell parts: `upstream` (HTTP to engines), `flow` (one request's legs), `server`
(the HTTP front), `main` (flags and wiring).
"""
