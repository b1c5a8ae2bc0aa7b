"""tandem's vLLM-compatible simulation engine: `tandem engine serve MODEL [vllm serve args]`.

It takes exactly the arguments `vllm serve` gets (see `args.py`; flags vLLM lacks are refused with
exit status 2, configurations vLLM would refuse exit 1 with vLLM's message), speaks vLLM's OpenAI
API, `/metrics` and NIXL two-phase P/D protocol, and paces continuous batching by `tandem.perf`.

Modules: `args` (command line) -> `config` (defaults and start-up checks) + `settings` (env);
`scheduler`/`blocks` (continuous batching, pure); `kvheld` (prefill-side leases, pure);
`tokens` (deterministic tokenizer and output); `openai` (request/response formats, pure);
`metrics` (vLLM metric families); `core` (real-time step loop, KV pulls); `streaming` (SSE
streams, written by the step loop); `sidechannel` (NIXL side channel over TCP); `server` (aiohttp
routes); `main` (entry point, signals, drain).

Generation: prompt tokens are words and punctuation; output token i is a pure function of
(prompt, seed, i) (seed: the request's, else `--seed`), so a P/D answer equals a colocated one.
With `max_tokens` set, exactly that many tokens come back (finish_reason "length"); without it
(and without `ignore_eos`), the "model" stops at a deterministic 64..511 tokens ("stop").

P/D (reference section 2.1), with `--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":...}'`:
  prefill (kv_producer|kv_both): a request with `kv_transfer_params: {"do_remote_decode": true}`
    that finishes length-capped (max_tokens 1) keeps its KV blocks and answers, non-streaming, with
    top-level `kv_transfer_params`: do_remote_prefill=true, do_remote_decode=false, remote_block_ids,
    remote_engine_id, remote_request_id ("cmpl-<X-Request-Id>-0-<8 hex>" / "chatcmpl-<id>-<8 hex>"),
    remote_host (VLLM_NIXL_SIDE_CHANNEL_HOST), remote_port (side-channel port), tp_size.
    Blocks are freed when a decode engine has read them, on a `release`, or when the lease lapses
    (kv_connector_extra_config.kv_lease_duration, else VLLM_NIXL_ABORT_REQUEST_TIMEOUT, else 30 s);
    decode engines heartbeat leases of requests still queued for blocks.
  decode (kv_consumer|kv_both): the same body plus those params; the engine reads the KV over the
    side channel (size: prompt tokens x KV bytes/token / TANDEM_SIM_KV_SCALE; time: KV per TP rank
    at TANDEM_SIM_KV_BANDWIDTH_GBPS), then computes only the last prompt token and samples every
    output token itself. A failed read (unknown/expired handle, unreachable prefill, block or
    prompt mismatch, decode TP not a multiple of prefill TP, injected fault) follows
    `kv_load_failure_policy`: "fail" (default) -> HTTP 500 (streams too: a stream's 200 is only
    sent with its first token), "recompute" -> local prefill, HTTP 200.
SIGTERM: stop accepting (503), finish in-flight requests for up to `--shutdown-timeout` seconds
(vLLM's default 0: abort them at once), exit 0.

Environment (all optional):
  TANDEM_SIM_GPU                GPU profile to use (default H100).
  TANDEM_SIM_PERF_MODEL         HF id whose architecture/profile to simulate when MODEL is not a known
                                HF id (unknown models fall back to meta-llama/Llama-3.1-8B-Instruct).
  TANDEM_SIM_TIME_SCALE         multiplies every modelled latency (steps and KV transfer); 0 = no model
                                latency (as fast as the CPU allows), 1 = real time (default).
  TANDEM_SIM_KV_BANDWIDTH_GBPS  P->D link speed in Gb/s for KV transfer time (default 400).
  TANDEM_SIM_KV_SCALE           bytes actually sent over the side channel = modelled KV bytes / this
                                (default 1024: an 8k-token Llama-3.1-8B prompt sends 1 MiB, not 1 GiB).
  TANDEM_SIM_RANDOM_SEED        seed of the fault-injection dice (default 0).
  TANDEM_SIM_NIXL_HANDSHAKE_SECONDS  extra delay of a decode engine's first read from each prefill
                                engine id (NIXL handshake; ~5 s measured by llm-d; default 0).
  TANDEM_SIM_REQUEST_LATENCY_SECONDS  the serving process's own work on each generation request (x
                                TIME_SCALE), outside the engine's steps, before the request reaches the
                                scheduler, one request at a time: requests arriving together wait for
                                those before them (vLLM's API server is one process; it took 1.4 ms of a
                                24-token prompt's 4.2 ms on the CPU engine, docs/real-vllm.md). It adds to
                                TTFT and takes no step time (default 0).
  TANDEM_SIM_LOAD_SECONDS       model-load time: the engine listens at once but answers 503 to /health,
                                /v1/*, /ping and /metrics for this many seconds from start, as vLLM is
                                unready while it loads weights (default 0). Wall-clock seconds, NOT
                                multiplied by TANDEM_SIM_TIME_SCALE: load time is set per deployment
                                (engine.env) to what the test or replay wants, e.g. 120 for an 8B model.
  TANDEM_SIM_FAULTS             JSON object of faults active from the start (fields below).
  TANDEM_SERVING_REVISION       the pod's serving revision (rendered by the operator for every P/D
                                revision but the first): a prefill engine puts it in its
                                kv_transfer_params, a decode engine refuses (500, counted in
                                tandem:kv_revision_mismatch_refusals) KV of another revision.
  VLLM_NIXL_SIDE_CHANNEL_HOST   side-channel bind address, also advertised as `remote_host`
                                (default localhost, as vLLM); tests set 127.x.
  VLLM_NIXL_SIDE_CHANNEL_PORT   side-channel port (default 5600; 0 = any free port).
  VLLM_NIXL_ABORT_REQUEST_TIMEOUT  lease of held prefill KV in seconds when kv_connector_extra_config
                                has no `kv_lease_duration` (default 30).
  VLLM_API_KEY                  as `--api-key`.

Faults (`settings.Faults`), off by default; set at start with TANDEM_SIM_FAULTS='{"slowdown": 3}' or at
run time with `POST /admin/faults` (JSON merged into the current faults; `GET` shows, `DELETE` clears):
  crash: true                   exit(1) at once (at start when given in the env).
  crash_after_requests: N       exit(1) when the Nth completion request arrives (counted from start).
  hang: true                    stop stepping; /health, /v1/* and /metrics stop answering
                                until hang is set back to false.
  slowdown: F                   every step and KV transfer takes F times longer.
  kv_pull_failure_rate: R       fraction of KV reads that fail: on a decode engine its pulls fail, on a
                                prefill engine it refuses reads (NIXL_ERR_BACKEND); policy decides.
  kv_bandwidth_factor: F        0 < F <= 1: KV reads run at F x the configured link (a slow link, as a
                                silent TCP fallback), shown truthfully in vllm:nixl_xfer_time_seconds.
                                Either end's factor slows a read (the lower of the two wins).
  error_rate: R, error_status   fraction of completion requests answered at once with HTTP error_status
                                (default 500) and an OpenAI error body.
  local_prefill_error_rate: R   on a decode engine (kv_consumer): fraction of the requests it would
                                prefill itself (no remote KV: a router's local prefill) answered with
                                error_status; requests with remote KV are served (a decode engine that
                                cannot prefill locally).
  stream_error_rate: R, stream_error_after_tokens: N
                                fraction of streams that, after N tokens, send
                                `data: {"error": {...}}` then `data: [DONE]` inside the 200 response.
  metrics_error: true            /metrics answers 500 (a scrape fails) while the engine serves and
                                its /health answers as before; with MultiPortExternal, set on one
                                rank's port: that rank's scrape alone fails.

Debug: `GET /debug/kv` (held prefill KV with age and expiry, pool usage, expired leases),
`GET /debug/state` (queue sizes, profile, faults). Leaked/held KV is also in `/metrics` as
`tandem:kv_held_blocks`, `tandem:kv_held_requests` and `vllm:nixl_num_kv_expired_reqs_total`.
"""
