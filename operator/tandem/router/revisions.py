"""Which serving revision's P/D pair takes a request: pure, by the operator's weight, ready pairs only.

The operator writes `status.revisions` (docs/rollout.md, Revisions): the current revision with the
percent of P/D requests it gets, and during a change the previous one with the rest. A pod's
revision is its `tandem.dev/revision` label; the legacy revision's pods have none (key "").
A prefill pod and a decode pod are only ever paired within one revision: a decode engine cannot use
KV written by another engine build, model or connector (the sim engine refuses such a pull).

The draw is a function of the request id (salted apart from the path draw), so a retry with the same
`X-Request-Id` meets the same revision and every router replica agrees. A revision without a ready
prefill and a ready decode pod gets none of its share: the request goes to another revision whose
pair is ready (never to a pair that is not), and when none is, there is no P/D pair.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

LEGACY: str = ""  # the key of the legacy revision (pods without a revision label)


def draw_for(request_id: str) -> float:
    """A number in [0, 1), uniform over ids, the same for the same id, independent of the path draw."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=8, person=b"tandem-rev").digest()
    return int.from_bytes(digest, "big") / 2**64


def meant_revision(shares: Sequence[tuple[str, int]] | None, draw: float) -> str | None:
    """The revision whose share the draw falls in, ready or not (None: no shares, or the weights add up
    to less than the draw). When `choose_revision` picks another, that one stood in for it."""
    point, edge = draw * 100, 0.0
    for rev, weight in shares or ():
        edge += max(0, weight)
        if point < edge:
            return rev
    return None


def choose_revision(
    shares: Sequence[tuple[str, int]] | None,
    draw: float,
    complete: Mapping[str, bool],
) -> str | None:
    """The revision whose pair serves the request, or None when no revision has a ready pair.

    `shares`: (revision key, percent) from status, current first; None before the operator wrote any.
    `complete`: revision key -> whether it has a ready prefill and a ready decode pod.
    """
    ready = sorted(rev for rev, ok in complete.items() if ok)
    if not ready:
        return None
    if shares:
        meant = meant_revision(shares, draw)
        if meant is not None and complete.get(meant, False):
            return meant
        for rev, weight in shares:  # the chosen pair is not ready: another known one that is
            if weight > 0 and complete.get(rev, False):
                return rev
        for rev, _ in shares:
            if complete.get(rev, False):
                return rev
    return ready[0]
