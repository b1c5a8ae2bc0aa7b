"""Spec + decisions -> desired Kubernetes objects, and the exact engine command lines.

Pure package: no I/O, no clock, no Kubernetes client import; plain dicts out.

- `render(pdd, replicas=None)`: every child object, in apply order (`desired.py`).
- `CHILD_KINDS`: (apiVersion, kind, plural) of every kind `render` produces, for pruning;
  `GROUP_KINDS`: the kinds of multi-node pools (`group.py`): LeaderWorkerSet, PodGroup (gang).
- `engine_command(pdd, role)`: the container command of a pool (`command.py`).
"""

from tandem.render.command import engine_command, kv_transfer_config
from tandem.render.desired import CHILD_KINDS, GROUP_KINDS, Manifest, desired_pools, render

__all__ = [
    "CHILD_KINDS",
    "GROUP_KINDS",
    "Manifest",
    "desired_pools",
    "engine_command",
    "kv_transfer_config",
    "render",
]
