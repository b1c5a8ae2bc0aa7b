"""The router's gateway policy: who a request is from, whether it is admitted, where transfers may go.

Ties together `tenants` (identity: API keys or the tenant header, bounded labels), `admission`
(per-tenant token buckets, the long-prompt cap) and decode backpressure (the decode pods' KV usage
as their engines report it), configured from the PDDeployment's `spec.router` (`auth`, `tenants`,
`admission`) and `spec.rollout.tenants`, or in static mode from `--gateway FILE`. The decisions
are the pure functions of those modules; the I/O that feeds this object (the keys Secret, the
engines' /metrics) lives in `kube.secrets` and `kvwatch`.

Metrics (on the router's registry): `tandem_router_refusals_total{reason, tenant}` (429s by
admission: tenant_requests, tenant_prompt_tokens, long_prompts, decode_kv_full),
`tandem_router_long_prompts_in_flight`, `tandem_router_decode_kv_full_endpoints` and
`tandem_router_api_keys_loaded` (0 while keys are required and not loaded: every request refused).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import TypeAdapter, ValidationError

from tandem.api.models import AdmissionSpec, RouterAuthSpec, TenantLimits, TenantSpec
from tandem.routing.admission import (
    REFUSAL_REASONS,
    Admission,
    Limits,
    LongPromptCap,
    Policy,
    Refusal,
    Ticket,
    pods_with_room,
)
from tandem.routing.tenants import DEFAULT_TENANT, OTHER_TENANT, KeysError, Tenancy, Unauthorized, parse_keys

log = logging.getLogger(__name__)

_TENANTS = TypeAdapter(list[TenantSpec])


def refusal_body(message: str, error_type: str, code: str) -> bytes:
    """An OpenAI-style error with OpenAI's `type` and `code` strings (401 and 429 answers)."""
    error = {"message": message, "type": error_type, "param": None, "code": code}
    return json.dumps({"error": error}).encode()


def unauthorized_body(message: str) -> bytes:
    return refusal_body(message, "invalid_request_error", "invalid_api_key")


def rate_limited_body(refusal: Refusal) -> bytes:
    return refusal_body(refusal.message, "rate_limit_exceeded", refusal.reason)


def limits_of(spec: TenantLimits | None) -> Limits | None:
    if spec is None:
        return None
    limits = Limits(
        spec.requests_per_second, spec.request_burst, spec.prompt_tokens_per_second, spec.prompt_token_burst
    )
    return None if limits.requests_per_second is None and limits.prompt_tokens_per_second is None else limits


class Gateway:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.tenancy = Tenancy()
        self.admission = Admission()
        self.keys_secret: str | None = None  # the Secret to read keys from (PDDeployment mode)
        self.rollout_tenants: frozenset[str] = frozenset()
        # status.rollout.target while the target takes traffic (kube.pods.PddInfo.rollout_target)
        self.rollout_target: str | None = None
        # admission.maxBodyBytes; None: the router's --max-body-bytes.
        self.max_body_bytes: int | None = None
        # Decode backpressure: None when off; else the usage (0..1) at which a decode pod is full.
        self.kv_full_at: float | None = None
        self.kv_scrape_interval_s = 2.0
        self.kv_queue_s = 2.0
        self.kv_usage: dict[str, float] = {}  # decode pod URL -> its engine's last KV usage, 0..1
        self._applied: Any = None
        r = registry
        self.refusals = Counter(
            "tandem_router_refusals_total",
            "Requests refused 429 by admission control, by reason (tenant_requests, tenant_prompt_tokens,"
            " long_prompts, decode_kv_full) and tenant label; limits are per router replica.",
            ["reason", "tenant"], registry=r,
        )  # fmt: skip
        self.long_in_flight = Gauge(
            "tandem_router_long_prompts_in_flight",
            "Admitted requests with a long prompt (spec.router.admission.longPrompts) not yet finished.",
            registry=r,
        )  # fmt: skip
        self.long_in_flight.set_function(lambda: float(self.admission.long_in_flight))
        self.kv_full = Gauge(
            "tandem_router_decode_kv_full_endpoints",
            "Decode pods whose reported KV-cache usage is at or over spec.router.admission."
            "decodeBackpressure.kvUsagePercent (they get no new transfers while another has room).",
            registry=r,
        )  # fmt: skip
        self.keys_loaded = Gauge(
            "tandem_router_api_keys_loaded",
            "0 while API keys are required and not loaded (every request is refused 503); 1 while they"
            " are loaded or none are required.",
            registry=r,
        )  # fmt: skip
        self.keys_loaded.set(1)
        self._known_labels: set[str] = set()
        self._know_labels([DEFAULT_TENANT, OTHER_TENANT])

    # -- configuration ------------------------------------------------------------------------
    def configure(
        self,
        router: Mapping[str, Any] | None,
        rollout_tenants: Iterable[str] = (),
        *,
        rollout_target: str | None = None,
        keys_required: bool | None = None,
    ) -> None:
        """From `spec.router` (camelCase; its auth, tenants and admission) and `spec.rollout.tenants`.

        `keys_required`: static mode decides by the flags; otherwise keys are required when
        `auth.apiKeysSecret` is set. A spec that does not parse keeps the settings in use.
        """
        router = router or {}
        wanted = (router.get("auth"), router.get("tenants"), router.get("admission"), keys_required)
        self.rollout_tenants = frozenset(rollout_tenants)
        self.rollout_target = rollout_target
        if wanted == self._applied:
            return
        try:
            auth = RouterAuthSpec.model_validate(router.get("auth") or {})
            tenants = _TENANTS.validate_python(router.get("tenants") or [])
            admission = AdmissionSpec.model_validate(router.get("admission") or {})
        except ValidationError as error:
            log.error("spec.router's gateway settings do not parse; keeping the ones in use: %s", error)
            return
        self._applied = wanted
        required = auth.api_keys_secret is not None if keys_required is None else keys_required
        self.keys_secret = auth.api_keys_secret
        self.tenancy.configure(
            keys_required=required, header=auth.tenant_header, tenants=[t.name for t in tenants]
        )
        limits = {t.name: found for t in tenants if (found := limits_of(t.limits)) is not None}
        long = admission.long_prompts
        self.admission.configure(
            Policy(
                limits=limits,
                default=limits_of(admission.default_limits),
                long_prompts=None if long is None else LongPromptCap(long.min_tokens, long.max_concurrent),
            )
        )
        self.max_body_bytes = admission.max_body_bytes
        pressure = admission.decode_backpressure
        self.kv_full_at = None if pressure is None else pressure.kv_usage_percent / 100
        if pressure is not None:
            self.kv_scrape_interval_s = pressure.scrape_interval_seconds
            self.kv_queue_s = pressure.queue_seconds
        else:
            self.kv_usage.clear()
            self.kv_full.set(0)
        self._know_labels(t.name for t in tenants)
        self._show_keys()
        log.info(
            "gateway: keys %s, tenants %s, limits %s, long prompts %s, decode backpressure %s",
            "required" if required else f"off (tenant header {auth.tenant_header})",
            sorted(t.name for t in tenants),
            sorted(limits),
            long,
            pressure,
        )

    def _know_labels(self, labels: Iterable[str]) -> None:
        """A tenant's refusal series exist from 0 (a series born at 1 hides its first refusal from rate())."""
        for label in labels:
            if label not in self._known_labels:
                self._known_labels.add(label)
                for reason in REFUSAL_REASONS:
                    self.refusals.labels(reason, label)

    # -- keys -----------------------------------------------------------------------------------
    def on_keys(
        self, data: Mapping[str, str] | None, *, gone: bool = False, error: str | None = None
    ) -> None:
        """The keys Secret's decoded data; None with `error` when it is unreadable (`gone`: not found).

        Fails closed: until a good read, every request is refused. A bad read after a good one keeps
        the good keys (still authenticated); a Secret that is gone drops them.
        """
        tenancy = self.tenancy
        if data is None:
            if gone:
                tenancy.keys = None
            tenancy.keys_error = error
            log.warning("API keys: %s", error)
        else:
            try:
                tenancy.keys = parse_keys(data)
                tenancy.keys_error = None
            except KeysError as bad:
                tenancy.keys_error = f"Secret {self.keys_secret!r}: {bad}"
                log.error("API keys not usable: %s", tenancy.keys_error)
        self._show_keys()

    def _show_keys(self) -> None:
        self.keys_loaded.set(1 if self.tenancy.ready else 0)

    @property
    def ready(self) -> bool:
        return self.tenancy.ready

    # -- per request ----------------------------------------------------------------------------
    def identify(self, headers: Mapping[str, str]) -> str | Unauthorized:
        """The request's tenant label (bounded), or why it is refused 401."""
        found = self.tenancy.identify(headers)
        return found if isinstance(found, Unauthorized) else self.tenancy.label(found)

    def admit(self, tenant: str, prompt_tokens: int, now: float) -> Ticket | Refusal:
        decision = self.admission.admit(tenant, prompt_tokens, now)
        if isinstance(decision, Refusal):
            self.refuse(decision.reason, tenant)
        return decision

    def refuse(self, reason: str, tenant: str) -> None:
        self.refusals.labels(reason, tenant).inc()

    # -- rollout by tenant ----------------------------------------------------------------------
    def goes_first(self, tenant: str) -> bool:
        """Whether the tenant is one of spec.rollout.tenants (sent to a rollout's target first)."""
        return tenant in self.rollout_tenants

    def first_share(self, tenant: str) -> int | None:
        """The P/D share (percent) for a rollout's chosen tenant: all of it on the target arm while the
        target takes traffic (`rollout_target` set: from the first step on, the tenants stage at weight
        0 included); None: by the weight, as everyone (no rollout, before its first step, rolled back).
        """
        if self.rollout_target is None or tenant not in self.rollout_tenants:
            return None
        return 100 if self.rollout_target == "Disaggregated" else 0

    # -- decode backpressure --------------------------------------------------------------------
    def set_kv_usage(self, usage: Mapping[str, float]) -> None:
        self.kv_usage = dict(usage)
        full_at = self.kv_full_at
        self.kv_full.set(0 if full_at is None else sum(1 for value in usage.values() if value >= full_at))

    def decode_with_room(self, pods: Iterable[str]) -> list[str] | None:
        """Decode pods with KV room among `pods`; None when backpressure is off (all may be used)."""
        if self.kv_full_at is None:
            return None
        return pods_with_room(pods, self.kv_usage, self.kv_full_at)
