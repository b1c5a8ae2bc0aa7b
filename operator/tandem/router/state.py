"""The router's live view: ready endpoints per role, the PDDeployment's serving settings, the models.

Fed by the pod watcher (or fixed by static flags) and read by every request. All updates happen on
the event loop (the watcher's threads hop over with `call_soon_threadsafe`), so no locks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from tandem.api.meta import POOL_ROLES
from tandem.kube.pods import PddInfo, PodEventKind, PodInfo
from tandem.router.disaggregation import Disaggregation
from tandem.router.discovery import (
    Endpoint,
    apply_pod_event,
    draining_by_role,
    endpoint_list,
    endpoints_by_revision,
    endpoints_by_role,
    pool_key,
)
from tandem.router.gateway import Gateway
from tandem.router.metrics import RouterMetrics
from tandem.router.revisions import choose_revision, meant_revision
from tandem.router.revisions import draw_for as revision_draw
from tandem.router.slo import SloTargets
from tandem.routing.balancer import Balancer
from tandem.routing.buckets import (
    DEFAULT_CONCURRENCY_BOUNDS,
    DEFAULT_INPUT_LENGTH_BOUNDS,
    DEFAULT_OUTPUT_LENGTH_BOUNDS,
)
from tandem.routing.disaggregation import DisaggregationKnobs
from tandem.routing.paths import disaggregated_share
from tandem.routing.prefix import PrefixIndex, PrefixSettings

log = logging.getLogger(__name__)


@dataclass
class ModelCatalog:
    """Served model names and their context limits, from flags, the PDDeployment and the engines."""

    configured: dict[str, int | None] = field(default_factory=dict)  # flags and the PDDeployment
    from_engines: dict[str, dict[str, Any]] = field(default_factory=dict)  # model id -> engine card

    def names(self) -> set[str]:
        return set(self.configured) | set(self.from_engines)

    def max_model_len(self, name: str) -> int | None:
        configured = self.configured.get(name)
        if configured is not None:
            return configured
        card = self.from_engines.get(name, {})
        value = card.get("max_model_len")
        return value if isinstance(value, int) else None

    def learn_from_engine(self, body: bytes) -> bool:
        try:
            cards = json.loads(body).get("data", [])
        except (ValueError, AttributeError):
            return False
        learned = False
        for card in cards if isinstance(cards, list) else []:
            if isinstance(card, dict) and isinstance(card.get("id"), str):
                self.from_engines[card["id"]] = card
                learned = True
        return learned

    def cards(self) -> list[dict[str, Any]]:
        cards = {name: dict(card) for name, card in self.from_engines.items()}
        for name, limit in self.configured.items():
            card = cards.setdefault(name, {"id": name, "object": "model", "owned_by": "tandem"})
            if limit is not None:
                card["max_model_len"] = limit
        return [cards[name] for name in sorted(cards)]


@dataclass
class RouterState:
    balancer: Balancer
    metrics: RouterMetrics
    pdd_name: str | None = None
    engine_port: int = 8000
    serving_mode: str | None = None
    rollout_weight: int | None = None
    colocated_fallback: bool = True
    # The SLO requests are judged by: the PDDeployment's `spec.slo`, else `slo_default` (flags).
    slo: SloTargets | None = None
    slo_default: SloTargets | None = None
    # Bucket bounds (input length, output length, concurrency) when the PDDeployment sets none: the flags'.
    buckets_default: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] = (
        DEFAULT_INPUT_LENGTH_BOUNDS,
        DEFAULT_OUTPUT_LENGTH_BOUNDS,
        DEFAULT_CONCURRENCY_BOUNDS,
    )
    catalog: ModelCatalog = field(default_factory=ModelCatalog)
    pods: dict[str, PodInfo] = field(default_factory=dict)
    endpoints: dict[str, list[str]] = field(default_factory=lambda: {role: [] for role in POOL_ROLES})
    # URL -> its pod, port and group (watched pods); static URLs have none.
    endpoint_info: dict[str, Endpoint] = field(default_factory=dict)
    _leg_labels: dict[str, tuple[str, str, str]] = field(default_factory=dict, init=False, repr=False)
    # Serving revision -> prefill/decode -> URLs; the balancer has a pool per (role, revision).
    revision_endpoints: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # (revision, percent of P/D requests) from status.revisions; None: any revision with a ready pair.
    revision_shares: tuple[tuple[str, int], ...] | None = None
    # A revision rollout's new revision takes traffic (status.revisions.rollout Shifting, Paused,
    # Promoted): spec.rollout.tenants go to it at any weight, 0 included (the tenants stage).
    revision_rollout_serving: bool = False
    # Bumped whenever the endpoint set changes; the model refresher watches it.
    generation: int = 0
    # True once the router has a view to route by: static endpoints, or the first pod list.
    synced: bool = False
    # Tenants, API keys, admission and decode backpressure (spec.router; `--gateway` in static mode).
    gateway: Gateway = field(init=False)
    # The prefix-aware prefill choice: spec.router.prefixAware over the flags' `prefix_default`.
    prefix_default: PrefixSettings = field(default_factory=PrefixSettings)
    prefix: PrefixSettings = field(init=False)
    prefix_index: PrefixIndex = field(init=False)  # which pod was sent which prompt chunks
    # Remote or local prefill per request: spec.router.disaggregation, else the flags' default.
    disaggregation_default: DisaggregationKnobs = field(default_factory=DisaggregationKnobs)
    disaggregation: Disaggregation = field(init=False)

    def __post_init__(self) -> None:
        self.gateway = Gateway(self.metrics.registry)
        self.prefix = self.prefix_default
        self.prefix_index = PrefixIndex(self.prefix.index_blocks_per_pod)
        self.disaggregation = Disaggregation(self.metrics, self.disaggregation_default)
        self.disaggregation.configure(self.disaggregation_default, self.prefix.index_blocks_per_pod)

    def set_static(self, endpoints: Mapping[str, Iterable[str]]) -> None:
        self._set_endpoints({role: sorted(endpoints.get(role, ())) for role in POOL_ROLES})
        self.synced = True

    def on_pods(self, kind: PodEventKind, infos: list[PodInfo]) -> None:
        self.pods = apply_pod_event(self.pods, kind, infos)
        self.synced = self.synced or kind == "SYNC"
        if self.pdd_name is not None:
            listed = endpoint_list(self.pods, self.pdd_name, self.engine_port)
            self.endpoint_info = {endpoint.url: endpoint for endpoint in listed}
            self._leg_labels.clear()
            if kind in ("DELETED", "SYNC"):  # the only events that take pods away
                self.metrics.forget_endpoint_legs(self.pods.keys())
            self._set_endpoints(endpoints_by_role(self.pods, self.pdd_name, self.engine_port))
            self._set_revisions(endpoints_by_revision(self.pods, self.pdd_name, self.engine_port))
            for role, count in draining_by_role(self.pods, self.pdd_name).items():
                self.metrics.draining_endpoints.labels(role).set(count)

    def on_pdd(self, info: PddInfo | None) -> None:
        if info is None:
            log.warning("PDDeployment %s not found; keeping the last serving settings", self.pdd_name)
            return
        self.serving_mode = info.serving_mode
        self.rollout_weight = info.rollout_weight
        if info.revisions != self.revision_shares:
            log.info("serving revisions: %s", info.revisions)
        self.revision_shares = info.revisions
        self.revision_rollout_serving = info.revision_rollout_serving
        for rev, _ in info.revisions or ():
            self.metrics.know_revision(rev or "legacy")
        if info.model_name:
            self.catalog.configured[info.model_name] = info.max_model_len
        self.set_buckets(info.input_length_buckets, info.output_length_buckets, info.concurrency_buckets)
        self.set_prefix(PrefixSettings.from_spec(info.prefix_aware, self.prefix_default, info.prefill_policy))
        knobs, target = self.disaggregation_default, None
        if info.disaggregation is not None:
            knobs = DisaggregationKnobs.from_spec(info.disaggregation)
            if info.disaggregation_target is not None:
                target = DisaggregationKnobs.from_spec(
                    {**info.disaggregation, "mode": info.disaggregation_target}
                )
        self.disaggregation.configure(
            knobs,
            self.prefix.index_blocks_per_pod,
            target,
            info.disaggregation_weight,
            tenants_first=info.disaggregation_tenants_first,
        )
        self.gateway.configure(info.router_gateway, info.rollout_tenants, rollout_target=info.rollout_target)
        if info.slo_ttft_ms is not None and info.slo_tpot_ms is not None:
            self.set_slo(SloTargets.from_ms(info.slo_ttft_ms, info.slo_tpot_ms))
        else:
            self.set_slo(self.slo_default)

    def set_buckets(
        self, inputs: Sequence[int] | None, outputs: Sequence[int] | None, concurrency: Sequence[int] | None
    ) -> None:
        """The spec's bucket bounds (the flags' when unset); bad bounds keep the ones in use."""
        default_in, default_out, default_concurrency = self.buckets_default
        try:
            self.metrics.set_buckets(
                inputs or default_in, outputs or default_out, concurrency or default_concurrency
            )
        except ValueError as error:
            log.warning("histogram buckets not changed: %s", error)

    def set_prefix(self, settings: PrefixSettings) -> None:
        if settings == self.prefix:
            return
        log.info("prefix-aware choice: %s", settings)
        self.prefix = settings
        self.prefix_index.resize(settings.index_blocks_per_pod)
        disagg = self.disaggregation
        disagg.configure(
            disagg.knobs, settings.index_blocks_per_pod, disagg.target, disagg.weight, disagg.tenants_first
        )

    def set_slo(self, targets: SloTargets | None) -> None:
        if targets != self.slo:
            log.info("SLO: %s", targets)
        self.slo = targets
        self.metrics.set_slo(targets)

    def _set_endpoints(self, endpoints: dict[str, list[str]]) -> None:
        if endpoints == self.endpoints:
            return
        log.info("endpoints: %s", {role: len(urls) for role, urls in endpoints.items()})
        live = {url for urls in endpoints.values() for url in urls}
        for gone in {url for urls in self.endpoints.values() for url in urls} - live:
            self.prefix_index.forget_pod(gone)  # a pod back at the address is a new, empty cache
            self.disaggregation.forget_pod(gone)
        self.endpoints = endpoints
        self.generation += 1
        for role, urls in endpoints.items():
            self.balancer.set_pool(role, urls)
            self.metrics.endpoints.labels(role).set(len(urls))

    def _set_revisions(self, by_revision: dict[str, dict[str, list[str]]]) -> None:
        if by_revision == self.revision_endpoints:
            return
        for rev in set(self.revision_endpoints) - set(by_revision):
            for role in ("prefill", "decode"):
                self.balancer.set_pool(pool_key(role, rev), ())
        self.revision_endpoints = by_revision
        for rev in by_revision:
            self.metrics.know_revision(rev or "legacy")
        for rev, roles in by_revision.items():
            for role, urls in roles.items():
                self.balancer.set_pool(pool_key(role, rev), urls)

    def endpoint_labels(self, url: str) -> tuple[str, str, str]:
        """(pod, port, group) of an endpoint for its leg counter; a static URL's pod is its host."""
        labels = self._leg_labels.get(url)
        if labels is None:
            info, parts = self.endpoint_info.get(url), urlsplit(url)
            pod, group = (parts.hostname or url, "") if info is None else (info.pod, info.group or "")
            labels = self._leg_labels[url] = (pod, str(parts.port or ""), group)
        return labels

    def revision_for(self, request_id: str, first: bool = False) -> str | None:
        """The serving revision whose pair takes this request (None: no ready pair, or static mode).

        `first`: a tenant of spec.rollout.tenants, sent to the current (target) revision at any weight
        above 0, and at weight 0 too while a revision rollout's new revision takes traffic (its tenants
        stage)."""
        if not self.revision_endpoints:
            return None
        complete = {
            rev: bool(r["prefill"]) and bool(r["decode"]) for rev, r in self.revision_endpoints.items()
        }
        shares, draw = self._revision_split(request_id, first)
        return choose_revision(shares, draw, complete)

    def revision_meant(self, request_id: str, first: bool = False) -> str | None:
        """The serving revision the weights meant this request for, whether its pair is ready or not."""
        if not self.revision_endpoints:
            return None
        return meant_revision(*self._revision_split(request_id, first))

    def _revision_split(
        self, request_id: str, first: bool
    ) -> tuple[tuple[tuple[str, int], ...] | None, float]:
        """The revision shares (a tenant of the tenants stage: all on the current revision) and the draw."""
        shares = self.revision_shares
        if first and self.revision_rollout_serving and shares:
            shares = ((shares[0][0], 100), *((rev, 0) for rev, _ in shares[1:]))
        return shares, 0.0 if first else revision_draw(request_id)

    def disaggregated_share(self) -> int:
        mode = self.serving_mode
        if mode is None:
            # No PDDeployment (static mode): serve P/D when both pools exist.
            has_pd = bool(self.endpoints["prefill"]) and bool(self.endpoints["decode"])
            mode = "Disaggregated" if has_pd or not self.endpoints["colocated"] else "Colocated"
        return disaggregated_share(mode, self.rollout_weight)
