"""The `tandem` command: dispatches each subcommand to the module that owns it.

Subcommands are imported lazily so that, say, `tandem engine` never loads the Kubernetes client.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

# subcommand -> (module, one-line help); each module exposes `main(argv: Sequence[str]) -> int`
# ("module:function" names another entry of that signature).
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "crd": ("tandem.api.crdgen", "print the PDDeployment CustomResourceDefinition generated from the models"),
    "render": ("tandem.render.cli", "render a PDDeployment file into the child objects the operator applies"),
    "operator": ("tandem.controller.main", "run the operator (kopf) against the current kubeconfig"),
    "probe": ("tandem.controller.probe", "check that the pods matching a selector answer HTTP health checks"),
    "router": ("tandem.router.main", "run the P/D router for one PDDeployment"),
    "engine": ("tandem.engine.main", "run the vLLM-compatible simulation engine (`vllm serve` arguments)"),
    "dev": (
        "tandem.devcluster.cli",
        "local control plane for tests and the demo: `dev cluster up|down|status`",
    ),
    "sim": ("tandem.sim.cli:sim_main", "replay a trace through a PDDeployment in the cluster simulator"),
    "advise": ("tandem.sim.cli:advise_main", "P/D or colocated, which P:D ratio, how many GPUs (simulated)"),
    "dashboard": (
        "tandem.dashboard.render",
        "the Grafana dashboard: `dashboard json`, `dashboard render` (PNG)",
    ),
}


def _usage() -> str:
    lines = ["usage: tandem <command> [args...]", "", "commands:"]
    lines += [f"  {name:<10} {text}" for name, (_, text) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"tandem: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, _, function = SUBCOMMANDS[name][0].partition(":")
    module = importlib.import_module(module_name)
    entry: Callable[[Sequence[str]], int] = getattr(module, function or "main")
    return entry(rest)


if __name__ == "__main__":
    sys.exit(main())
