"""Which pod octets a new dev cluster must not hand out: those some socket listens on."""

from __future__ import annotations

import pytest

from tandem.devcluster.cluster import listening_octets

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"


def row(local: str, state: str) -> str:
    return f"   0: {local} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000     0        0 1"


@pytest.mark.parametrize(
    ("rows", "octets"),
    [
        ([], set()),
        # 127.21.7.1:8080 listening (little-endian 01 07 15 7F), 127.20.7.2:8000 too
        ([row("0107157F:1F90", "0A"), row("0207147F:1F40", "0A")], {20, 21}),
        # established, not listening: a client's socket says nothing about pod IPs
        ([row("0107167F:1F90", "01")], set()),
        # 127.0.0.1 (the control plane) and 0.0.0.0
        ([row("0100007F:1F90", "0A"), row("00000000:0016", "0A")], {0}),
        # another network's address
        ([row("0101A8C0:1F90", "0A")], set()),
    ],
)
def test_listening_octets(rows: list[str], octets: set[int]) -> None:
    assert listening_octets("\n".join([HEADER, *rows])) == octets
