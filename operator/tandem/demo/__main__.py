"""`python -m tandem.demo`: runs the scenario `--scenario` names, `autoscale` (`main.Demo`) or
`rollout` (`rollout.RolloutDemo`, which extends it). The dispatch lives here, above both, so that
`main` does not import `rollout` back (they formed a cycle).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from tandem.demo.main import Demo, parse_args
from tandem.demo.rollout import RolloutDemo


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    demo = RolloutDemo(args) if args.scenario == "rollout" else Demo(args)
    try:
        return asyncio.run(demo.run())
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
